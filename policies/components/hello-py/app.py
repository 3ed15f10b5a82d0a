"""A wasi:http/proxy 0.2 component in Python (componentize-py): a page with
an ESI include and the fragment it includes. Built by
policies/components/build.sh py.

    inlay serve --component target/components/hello-py.wasm
"""

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.imports import outgoing_handler
from wit_world.imports.types import (
    Fields,
    IncomingRequest,
    Method_Get,
    OutgoingBody,
    OutgoingRequest,
    OutgoingResponse,
    ResponseOutparam,
    Scheme_Http,
)

PAGE = b"""<html><body><h1>Python component</h1>
<esi:include src="/fragment"/>
</body></html>
"""


def big(kb: int) -> bytes:
    line = "<p>Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do.</p>\n"
    parts = ["<html><body>\n"]
    size = len(parts[0])
    while size + len(line) + 16 <= kb * 1024:
        parts.append(line)
        size += len(line)
    parts.append("</body></html>\n")
    return "".join(parts).encode()


def fetch(url: str) -> bytes:
    """GETs `url` (http:// only); its status and body, or the error."""
    if not url.startswith("http://"):
        return b"error: only http:// URLs"
    authority, _, path = url[len("http://"):].partition("/")
    req = OutgoingRequest(Fields())
    req.set_method(Method_Get())
    req.set_scheme(Scheme_Http())
    req.set_authority(authority)
    req.set_path_with_query("/" + path)
    try:
        future = outgoing_handler.handle(req, None)
    except Err as e:  # the host refused it
        return f"error: {e.value}".encode()
    with future.subscribe() as ready:
        ready.block()
    result = future.get()
    if result is None or isinstance(result, Err):
        return b"error: no response"
    if isinstance(result.value, Err):
        return f"error: {result.value.value}".encode()
    resp = result.value.value
    status = resp.status()
    data = b""
    body = resp.consume()
    with body.stream() as stream:
        while True:
            try:
                data += stream.blocking_read(65536)
            except Err:
                break
    return f"{status} ".encode() + data


def query_param(query: str, name: str):
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        if key == name:
            return value.replace("%2F", "/").replace("%3A", ":")
    return None


class IncomingHandler(exports.IncomingHandler):
    def handle(self, request: IncomingRequest, response_out: ResponseOutparam) -> None:
        path, _, query = (request.path_with_query() or "/").partition("?")
        if path == "/":
            send(response_out, 200, [
                ("content-type", "text/html; charset=utf-8"),
                ("cache-control", "max-age=60"),
                ("surrogate-control", 'content="ESI/1.0"'),
            ], PAGE)
        elif path == "/fragment":
            send(response_out, 200, [
                ("content-type", "text/html"),
                ("cache-control", "max-age=60"),
            ], b"<p>fragment from a Python component</p>")
        elif path == "/hello":
            send(response_out, 200, [
                ("content-type", "text/plain"),
                ("cache-control", "max-age=60"),
            ], b"hello from a Python component\n")
        elif path == "/big":
            kb = int(query_param(query, "kb") or 16)
            send(response_out, 200, [("content-type", "text/html")], big(min(kb, 4096)))
        elif path == "/fetch":
            answer = fetch(query_param(query, "url") or "")
            send(response_out, 200, [("cache-control", "no-store")], answer)
        else:
            send(response_out, 404, [("content-type", "text/plain")], b"not found\n")


def send(out: ResponseOutparam, status: int, headers, body: bytes) -> None:
    resp = OutgoingResponse(Fields.from_list([(k, v.encode()) for k, v in headers]))
    resp.set_status_code(status)
    outgoing = resp.body()
    ResponseOutparam.set(out, Ok(resp))
    with outgoing.write() as stream:
        # The host takes at most 4096 bytes per blocking write.
        for at in range(0, len(body), 4096):
            stream.blocking_write_and_flush(body[at:at + 4096])
    OutgoingBody.finish(outgoing, None)
