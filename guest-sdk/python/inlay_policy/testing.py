"""An in-memory Inlay host for unit-testing policies natively (CPython, no
build): request and response objects with the host's rules, and the
capabilities (log, config, clock, kv, esi) recorded in a :class:`Host`.

Needs the generated bindings on ``sys.path`` (``componentize-py -d
guest-sdk/wit -w policy bindings <dir>``; ``policies/build-lang.sh py
--test`` makes them)::

    from inlay_policy.testing import Host, Request, Response

    host = Host.install()
    req = Request(url="/?utm_source=x")
    Handler().on_request(req)
    assert req.url() == "/"
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

from componentize_py_types import Err
from wit_world.imports import clock, config, esi, kv, log, sdk

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_BAD_URL = re.compile(r"[\x00-\x20\x7f\"<>\\^`{|}]")


def _name(name: str) -> str:
    if not _TOKEN.match(name):
        raise Err(f"invalid header name {name!r}")
    return name.lower()


def _value(name: str, value: str) -> str:
    if _BAD_VALUE.search(value):
        raise Err(f"invalid value for header {name!r}")
    return value


class _Headers:
    def __init__(self, fields: Iterable[tuple[str, str]]):
        self.fields = [(_name(n), _value(n, v)) for n, v in fields]

    def header(self, name: str) -> Optional[str]:
        lower = name.lower()
        return next((v for n, v in self.fields if n == lower), None)

    def header_all(self, name: str) -> list[str]:
        lower = name.lower()
        return [v for n, v in self.fields if n == lower]

    def headers(self) -> list[tuple[str, str]]:
        return list(self.fields)

    def set_header(self, name: str, value: str) -> None:
        _value(name, value)
        lower = _name(name)
        at = next((i for i, (n, _) in enumerate(self.fields) if n == lower), len(self.fields))
        self.fields = [(n, v) for n, v in self.fields if n != lower]
        self.fields.insert(min(at, len(self.fields)), (lower, value))

    def append_header(self, name: str, value: str) -> None:
        _value(name, value)
        self.fields.append((_name(name), value))

    def remove_header(self, name: str) -> None:
        lower = name.lower()
        self.fields = [(n, v) for n, v in self.fields if n != lower]


class Request(_Headers):
    """The client's request, with the ``request`` resource's methods."""

    def __init__(self, method="GET", url="/", headers=(), client_ip="127.0.0.1",
                 backend="default", backends=("default",)):
        super().__init__(headers)
        self._method, self._url = method, url
        self._client_ip, self._backend, self._backends = client_ip, backend, tuple(backends)
        #: What the policy added with add_to_cache_key, in order.
        self.cache_key_data: list[str] = []

    def method(self) -> str:
        return self._method

    def set_method(self, method: str) -> None:
        self._method = method

    def url(self) -> str:
        return self._url

    def set_url(self, url: str) -> None:
        if not url.startswith("/"):
            raise Err(f"url must start with `/`: {url!r}")
        if _BAD_URL.search(url):
            raise Err(f"invalid url {url!r}")
        self._url = url

    def client_ip(self) -> str:
        return self._client_ip

    def backend(self) -> str:
        return self._backend

    def set_backend(self, name: str) -> None:
        if name not in self._backends:
            raise Err(f"unknown backend {name!r}")
        self._backend = name

    def add_to_cache_key(self, data: str) -> None:
        self.cache_key_data.append(data)


class Response(_Headers):
    """A response, with the ``response`` resource's methods."""

    def __init__(self, status=200, headers=()):
        super().__init__(headers)
        self._status = status

    def status(self) -> int:
        return self._status

    def set_status(self, status: int) -> None:
        if not 100 <= status <= 999:
            raise Err(f"invalid status {status}: must be 100-999")
        self._status = status


def _builtin_recv_lookup(req) -> bool:
    """The host's built-in recv decision (Inlay's ``RequestHead::builtin_lookup``)."""
    return (req.method() in ("GET", "HEAD") and req.header("authorization") is None
            and req.header("cookie") is None)


class Host:
    """What the capabilities see and record."""

    def __init__(self):
        #: Log lines as ``(level name, message)``.
        self.logs: list[tuple[str, str]] = []
        self.config: dict[str, str] = {}
        self.now_ms = 1_700_000_000_000
        self.kv: dict[str, bytes] = {}
        self.esi: list[tuple] = []
        #: The hooks whose SDK default ran (``"on-request"``, ...), each once.
        self.default_hooks: list[str] = []

    def _default_hook(self, hook) -> None:
        name = hook.name.lower().replace("_", "-")
        if name not in self.default_hooks:
            self.default_hooks.append(name)

    @classmethod
    def install(cls) -> "Host":
        """A fresh host, wired into the generated import modules."""
        host = cls()
        log.write = lambda level, message: host.logs.append((level.name.lower(), message))
        config.get = host.config.get
        config.all = lambda: list(host.config.items())
        clock.now_unix_ms = lambda: host.now_ms
        kv.get = host.kv.get
        kv.set = lambda key, value: host.kv.__setitem__(key, bytes(value))
        kv.delete = lambda key: host.kv.pop(key, None) is not None
        esi.set_enabled = lambda enabled: host.esi.append(("set-enabled", enabled))
        esi.set_var = lambda name, value: host.esi.append(("set-var", name, value))
        sdk.default_hook = host._default_hook
        sdk.builtin_recv_lookup = _builtin_recv_lookup
        return host
