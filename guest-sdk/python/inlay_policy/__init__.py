"""The Python SDK for Inlay policies.

Idiomatic helpers over the ``inlay:policy/policy@0.1.0`` world as
componentize-py binds it (the generated ``wit_world`` package)::

    from inlay_policy import Policy, builtin, export

    class Hide(Policy):
        def on_deliver(self, req, resp):
            resp.remove_header("server")

    Handler = export(Hide)   # componentize-py looks for `Handler`

Module top-level code runs once at build time (componentize-py snapshots
the initialised interpreter), when no host is there: call host imports
(config, log, clock, ...) from hooks only.

Host calls that return a WIT ``result`` raise :class:`HostError` on error.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional, Union

from componentize_py_types import Err as HostError
from wit_world import exports
from wit_world.imports import cache, clock as _clock, config as _config, esi, fetch, kv
from wit_world.imports import log as _log
from wit_world.imports import sdk as _sdk
from wit_world.imports.types import (
    CacheSettings,
    Request,
    RequestAction,
    RequestAction_Lookup,
    RequestAction_Pass,
    RequestAction_Synthetic,
    Response,
    SyntheticResponse,
)

__all__ = [
    "Action",
    "CacheSettings",
    "HostError",
    "Policy",
    "Request",
    "RequestAction",
    "Response",
    "builtin",
    "cache",
    "clock",
    "config",
    "cookie",
    "error_message",
    "esi",
    "export",
    "fetch",
    "kv",
    "log",
    "path",
    "query",
    "remove_cookie",
]


def error_message(err: BaseException) -> str:
    """The message of an error raised by a host call (``HostError.value``)."""
    if isinstance(err, HostError):
        return str(err.value)
    return str(err)


class log:  # noqa: N801 - a namespace, used as `log.warn(...)` like the other SDKs
    """Log lines, written by the host's logger with the policy's name."""

    Level = _log.Level

    @staticmethod
    def write(level: "_log.Level", message: object) -> None:
        _log.write(level, str(message))

    @staticmethod
    def trace(message: object) -> None:
        _log.write(_log.Level.TRACE, str(message))

    @staticmethod
    def debug(message: object) -> None:
        _log.write(_log.Level.DEBUG, str(message))

    @staticmethod
    def info(message: object) -> None:
        _log.write(_log.Level.INFO, str(message))

    @staticmethod
    def warn(message: object) -> None:
        _log.write(_log.Level.WARN, str(message))

    @staticmethod
    def error(message: object) -> None:
        _log.write(_log.Level.ERROR, str(message))


class config:  # noqa: N801
    """The policy's own settings (``[policy.config]`` in the host config)."""

    @staticmethod
    def get(key: str) -> Optional[str]:
        return _config.get(key)

    @staticmethod
    def all() -> dict[str, str]:
        return dict(_config.all())


class clock:  # noqa: N801
    """The host's wall clock (policies get no WASI clocks: ``time.time()`` traps)."""

    @staticmethod
    def now_unix_ms() -> int:
        return _clock.now_unix_ms()


HeaderInit = Union[Iterable[tuple[str, str]], Mapping[str, str]]


def _header_pairs(headers: HeaderInit) -> list[tuple[str, str]]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(str(name).lower(), str(value)) for name, value in items]


class Action:
    """What ``on_request`` returns."""

    #: Look the request up in the cache.
    LOOKUP: RequestAction = RequestAction_Lookup()
    #: Go to the backend; do not use or fill the cache.
    PASS: RequestAction = RequestAction_Pass()

    @staticmethod
    def synthetic(status: int, headers: HeaderInit = (), body: Union[str, bytes] = b"") -> RequestAction:
        """Answer at once; a ``str`` body is sent as UTF-8."""
        data = body.encode() if isinstance(body, str) else bytes(body)
        return RequestAction_Synthetic(SyntheticResponse(status, _header_pairs(headers), data))

    @staticmethod
    def redirect(status: int, location: str) -> RequestAction:
        """A redirect answered at the edge (``Location``, empty body)."""
        return Action.synthetic(status, [("location", location)])


class builtin:  # noqa: N801
    """Varnish's built-in behaviour, which :class:`Policy` hooks default to."""

    @staticmethod
    def is_lookup_method(method: str) -> bool:
        """GET and HEAD are looked up (methods are case-sensitive)."""
        return method in ("GET", "HEAD")

    @staticmethod
    def has_credentials(req: Request) -> bool:
        """Whether the request has an ``Authorization`` or ``Cookie`` header."""
        return req.header("authorization") is not None or req.header("cookie") is not None

    @staticmethod
    def recv(req: Request) -> RequestAction:
        """PASS for methods other than GET/HEAD and for credentials, else LOOKUP.

        The host decides it in one call (the rules of :meth:`is_lookup_method`
        and :meth:`has_credentials`).
        """
        return Action.LOOKUP if _sdk.builtin_recv_lookup(req) else Action.PASS

    @staticmethod
    def backend_response(req: Request, resp: Response, settings: CacheSettings) -> CacheSettings:
        """Keep the host's settings (it applied RFC 9111 already)."""
        return settings

    @staticmethod
    def deliver(req: Request, resp: Response) -> None:
        """Change nothing."""


# Unicode White_Space, as Rust's `str::trim` (Python's own strip also
# removes U+001C-U+001F), so cookies parse the same in every SDK.
_SPACE = "\t\n\v\f\r \u0085\u00a0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"


def _trim(s: str) -> str:
    return s.strip(_SPACE)


def _cookie_pairs(line: str) -> list[str]:
    return [pair for pair in map(_trim, line.split(";")) if pair]


def _cookie_name(pair: str) -> str:
    name, eq, _ = pair.partition("=")
    return _trim(name) if eq else pair


def cookie(req: Request, name: str) -> Optional[str]:
    """The value of the first cookie called ``name``, or None."""
    for line in req.header_all("cookie"):
        for pair in _cookie_pairs(line):
            if _cookie_name(pair) == name:
                _, _, value = pair.partition("=")
                return _trim(value)
    return None


def remove_cookie(req: Request, name: str) -> bool:
    """Remove every cookie called ``name``, keeping the others in order in
    one ``Cookie`` line (the header goes when none is left); whether it was there."""
    kept: list[str] = []
    found = False
    for line in req.header_all("cookie"):
        for pair in _cookie_pairs(line):
            if _cookie_name(pair) == name:
                found = True
            else:
                kept.append(pair)
    if found:
        if not kept:
            req.remove_header("cookie")
        else:
            try:
                req.set_header("cookie", "; ".join(kept))
            except HostError:
                # The pieces came from a valid header; drop it rather than keep the cookie.
                req.remove_header("cookie")
    return found


def path(req: Request) -> str:
    """The URL's path (before the first ``?``)."""
    return req.url().partition("?")[0]


def query(req: Request) -> Optional[str]:
    """The URL's query (after the first ``?``), or None."""
    _, mark, rest = req.url().partition("?")
    return rest if mark else None


class Policy:
    """A policy: override the hooks you need; the others behave like
    Varnish's built-in VCL. One value is made per instance, on the first hook."""

    def on_request(self, req: Request) -> RequestAction:
        """recv: rewrite the request, pick a backend, decide lookup, pass or synthetic."""
        return builtin.recv(req)

    def on_backend_response(self, req: Request, resp: Response, settings: CacheSettings) -> CacheSettings:
        """The backend answered: edit it and decide how it is cached."""
        return builtin.backend_response(req, resp, settings)

    def on_deliver(self, req: Request, resp: Response) -> None:
        """The response is about to be delivered: edit its status and headers."""
        builtin.deliver(req, resp)


_HOOKS = {
    "on_request": _sdk.Hook.ON_REQUEST,
    "on_backend_response": _sdk.Hook.ON_BACKEND_RESPONSE,
    "on_deliver": _sdk.Hook.ON_DELIVER,
}


def export(policy_type: type[Policy]) -> type:
    """The ``Handler`` class componentize-py exports, forwarding to a
    ``policy_type`` value; an exception is logged, then fails the request.

    A hook ``policy_type`` does not override costs nothing: the first time
    :class:`Policy`'s default runs, the host is told, and it applies the
    built-in rules itself from then on. (Decided here, by class, so that an
    override that ends in ``super()`` still runs every time.)"""

    instance: list[Policy] = []
    defaults = {
        name: hook for name, hook in _HOOKS.items() if getattr(policy_type, name) is getattr(Policy, name)
    }

    def policy() -> Policy:
        if not instance:
            instance.append(policy_type())
        return instance[0]

    def guarded(name: str, call):
        try:
            hook = defaults.get(name)
            if hook is not None:
                _sdk.default_hook(hook)
            return call(policy())
        except Exception as err:
            log.error(f"policy {name} raised {type(err).__name__}: {error_message(err)}")
            raise

    class Handler(exports.Handler):
        def on_request(self, req: Request) -> RequestAction:
            return guarded("on_request", lambda p: p.on_request(req))

        def on_backend_response(self, req: Request, resp: Response, settings: CacheSettings) -> CacheSettings:
            return guarded("on_backend_response", lambda p: p.on_backend_response(req, resp, settings))

        def on_deliver(self, req: Request, resp: Response) -> None:
            guarded("on_deliver", lambda p: p.on_deliver(req, resp))

    Handler.__name__ = Handler.__qualname__ = f"Handler[{policy_type.__name__}]"
    return Handler
