vcl 4.1;
# Scenario 3 (video on demand): 1 MiB objects with cc=max-age=3600. Varnish
# streams misses to the client while they are fetched (do_stream, on by
# default), as Inlay does. Its storages (malloc, file) are not persistent, so
# after a restart Varnish starts cold: the harness measures that as the
# "refetch from origin" run.
include "backend.vcl";
include "common.vcl";

sub vcl_backend_response {
    call inlay_like_backend_response;
    set beresp.do_stream = true;
}
