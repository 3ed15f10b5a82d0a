vcl 4.1;
# wrk cache-hit ceilings (177 B, 16 KiB, 1 MiB) and scenario 2 (time to first
# byte on a cache hit): /static/N carries Cache-Control: public,
# max-age=3600, so after one miss every request is a hit.
include "backend.vcl";
include "common.vcl";

sub vcl_backend_response {
    call inlay_like_backend_response;
}
