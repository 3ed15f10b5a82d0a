# Shared by every scenario VCL (included after backend.vcl, which the harness
# writes with the test origin's address). It makes Varnish follow the same
# rules as Inlay's defaults, so a comparison measures the engines and not the
# settings:
#  - ESI only when the origin opts in with Surrogate-Control: content="ESI/1.0"
#    (Inlay's rule; Varnish has no default), the header consumed at the edge;
#  - Surrogate-Control: max-age wins over Cache-Control for the edge TTL
#    (Inlay honours it, Varnish's built-in VCL does not);
#  - everything else is the built-in VCL: max-age/s-maxage/Expires, no-store,
#    private and Set-Cookie uncacheable (hit-for-miss), default_ttl 120 s and
#    default_grace 10 s, the same as Inlay's cache.default_ttl/default_grace.
import std;

sub inlay_like_backend_response {
    if (beresp.http.Surrogate-Control ~ {"(?i)content="?ESI/1\.0"}) {
        set beresp.do_esi = true;
    }
    if (beresp.http.Surrogate-Control ~ "(?i)(^|[,; ])max-age=[0-9]+") {
        set beresp.ttl = std.duration(
            regsub(beresp.http.Surrogate-Control,
                   "(?i)^.*max-age=([0-9]+).*$", "\1s"),
            beresp.ttl);
    }
    unset beresp.http.Surrogate-Control;
}
