vcl 4.1;
# Scenario 1 (parallel vs serial ESI) and the wrk "ESI page from 10 cached
# fragments" ceiling. Varnish processes includes one after another (serial
# ESI). The uncacheable pages and fragments of scenario 1 (no-store, private)
# become hit-for-miss objects, so every request reaches the origin, as with
# Inlay.
include "backend.vcl";
include "common.vcl";

sub vcl_backend_response {
    call inlay_like_backend_response;
}
