vcl 4.1;
# wrk pass-through ceiling: every request is passed to the origin (no cache
# lookup), the cost of proxying alone.
include "backend.vcl";

sub vcl_recv {
    return (pass);
}
