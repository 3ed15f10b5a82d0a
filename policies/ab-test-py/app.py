"""A sticky A/B test that still caches: the Python port of policies/ab-test
(same cookie, headers and cache key).

The bucket comes from the cookie ``inlay_ab`` (``a`` or ``b``). A client
without a valid cookie gets a bucket derived from a hash of its IP and
``User-Agent``, and the cookie is set on delivery. The origin sees the
bucket as ``x-ab-bucket``; the bucket is added to the cache key. The
``inlay_ab`` cookie is removed from the request; other cookies still pass.
"""

from inlay_policy import HostError, Policy, builtin, cookie, error_message, export, log, remove_cookie

#: The cookie holding the bucket.
COOKIE = "inlay_ab"
#: The request header the origin reads the bucket from.
BUCKET_HEADER = "x-ab-bucket"
#: Marks a bucket assigned by this request, so on_deliver sets the cookie.
NEW_BUCKET_HEADER = "x-ab-new"
#: How long the cookie lives: 30 days.
COOKIE_MAX_AGE = 30 * 24 * 3600

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1


def assign_bucket(client_ip: str, user_agent: str) -> str:
    """FNV-1a (64-bit) of IP, a zero byte and user agent; even hashes go to ``a``."""
    h = _FNV_OFFSET
    for byte in client_ip.encode() + b"\0" + user_agent.encode():
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return "a" if h % 2 == 0 else "b"


def _set(req, name: str, value: str) -> None:
    """Set a request header whose value we built; log if the host refuses it."""
    try:
        req.set_header(name, value)
    except HostError as err:
        log.warn(f"could not set {name}: {error_message(err)}")


class AbTest(Policy):
    """The A/B test policy."""

    def on_request(self, req):
        # Only this policy may set the marker, never the client.
        req.remove_header(NEW_BUCKET_HEADER)
        bucket = cookie(req, COOKIE)
        if bucket not in ("a", "b"):
            bucket = assign_bucket(req.client_ip(), req.header("user-agent") or "")
            _set(req, NEW_BUCKET_HEADER, "1")
        remove_cookie(req, COOKIE)
        _set(req, BUCKET_HEADER, bucket)
        req.add_to_cache_key(f"ab={bucket}")
        return builtin.recv(req)

    def on_deliver(self, req, resp):
        if req.header(NEW_BUCKET_HEADER) is None:
            return
        bucket = req.header(BUCKET_HEADER)
        if bucket is None:
            return
        value = f"{COOKIE}={bucket}; Path=/; Max-Age={COOKIE_MAX_AGE}; SameSite=Lax"
        try:
            resp.append_header("set-cookie", value)
        except HostError as err:
            log.warn(f"could not set the A/B cookie: {error_message(err)}")


Handler = export(AbTest)
