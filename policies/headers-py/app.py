"""Header hygiene, the Python port of policies/headers (same behaviour).

Strips tracking query parameters (``utm_*``, ``fbclid``, ``gclid``) before
the cache lookup, so they do not split the cache or reach the origin; on
delivery removes ``Server`` and ``X-Powered-By`` and adds
``x-inlay-policy: headers``.
"""

from typing import Optional

from inlay_policy import HostError, Policy, builtin, error_message, export, log


def is_tracking(name: str) -> bool:
    """Whether a query parameter name is a tracking parameter (any ASCII case)."""
    lower = name.translate(_ASCII_LOWER)
    return lower.startswith("utm_") or lower in ("fbclid", "gclid")


# Only ASCII letters are folded, like Rust's to_ascii_lowercase.
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def strip_tracking_params(url: str) -> Optional[str]:
    """``url`` without tracking query parameters, the others kept in order and
    exact text; the ``?`` goes when none is left. None when unchanged."""
    path, mark, query = url.partition("?")
    if not mark:
        return None
    params = query.split("&")
    if not any(is_tracking(param.partition("=")[0]) for param in params):
        return None
    kept = [p for p in params if p and not is_tracking(p.partition("=")[0])]
    return f"{path}?{'&'.join(kept)}" if kept else path


class Headers(Policy):
    """The header-hygiene policy."""

    def on_request(self, req):
        clean = strip_tracking_params(req.url())
        if clean is not None:
            try:
                req.set_url(clean)
            except HostError as err:
                # A sub-string of a valid URL: not expected; the original stays.
                log.warn(f"could not strip tracking parameters: {error_message(err)}")
        return builtin.recv(req)

    def on_deliver(self, req, resp):
        resp.remove_header("server")
        resp.remove_header("x-powered-by")
        try:
            resp.set_header("x-inlay-policy", "headers")
        except HostError as err:
            log.warn(f"could not set x-inlay-policy: {error_message(err)}")


Handler = export(Headers)
