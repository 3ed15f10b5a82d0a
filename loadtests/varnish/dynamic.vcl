vcl 4.1;
# Scenario 4 (cache vs no cache in front of a slow dynamic origin): the
# "no cache" page is Cache-Control: no-store (hit-for-miss, every request
# waits ~150 ms for the origin), the "cache" page the same with
# cc=public, max-age=3600.
include "backend.vcl";
include "common.vcl";

sub vcl_backend_response {
    call inlay_like_backend_response;
}
