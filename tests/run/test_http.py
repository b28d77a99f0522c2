"""gen_pipeline/http.py: httpx's failures mapped to ours, the timeouts told apart over real sockets, the pool
size, the streaming POST."""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import time
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

import gen_pipeline.http as seam
from gen_pipeline.config.dataset import GenerationConfig
from gen_pipeline.http import BadBody, BadStatus, CannotConnect, ConnectionLost, HttpError, NoAnswer, open_http

from mock_http import mock_http

URL = "http://s:30000/v1/chat/completions"


@contextlib.asynccontextmanager
async def tcp_server(serve, connections: int = 4) -> AsyncIterator[tuple[str, seam.Http]]:
    """`serve` (a raw TCP handler) on a local port: its chat URL, and a client of `connections`."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    url = f"http://127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}/v1/chat/completions"
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        async with open_http(GenerationConfig(), connections) as http:
            yield url, http
        tg.cancel_scope.cancel()


def raising(exc: type[Exception], message: str = "") -> object:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc(message, request=request)
    return handler


@pytest.mark.parametrize(("exc", "message", "ours", "kind", "text"), [
    (httpx.ConnectError, "All connection attempts failed", CannotConnect, "connect",
     "cannot connect to s:30000: All connection attempts failed"),
    (httpx.ConnectTimeout, "", CannotConnect, "connect",
     "cannot connect to s:30000: no connection within 10 s (the host is down, or something on the way drops "
     "the packets)"),
    (httpx.ReadTimeout, "", NoAnswer, "timeout", "no answer within the request timeout (3600 s)"),
    (httpx.WriteTimeout, "", NoAnswer, "timeout", "no answer within the request timeout (3600 s)"),
    (httpx.RemoteProtocolError, "peer closed connection without sending complete message body", ConnectionLost,
     "connection", "the connection to s:30000 was lost (RemoteProtocolError: peer closed connection without "
     "sending complete message body)"),
    (httpx.ReadError, "", ConnectionLost, "connection",
     "the connection to s:30000 was lost (ReadError: no detail)"),
    (httpx.DecodingError, "Error -3 while decompressing data", BadBody, "bad_body",
     f"the body from {URL} cannot be decoded: Error -3 while decompressing data"),
])
async def test_each_failure_has_its_kind_and_message(exc, message, ours, kind, text) -> None:
    async with mock_http(raising(exc, message)) as http:
        with pytest.raises(HttpError) as e:
            await http.post_json(URL, {"x": 1})
    assert type(e.value) is ours
    assert (e.value.kind, str(e.value), e.value.url) == (kind, text, URL)


async def test_a_status_is_an_answer_for_get_and_post_and_an_error_for_get_json() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/busy":
            return httpx.Response(503, json={"message": "busy"})
        if request.url.path == "/html":
            return httpx.Response(200, html="<h1>hi</h1>")
        return httpx.Response(200, json={"ok": True})

    async with mock_http(handler) as http:
        reply = await http.post_json("http://s/busy", b'{"pre": "serialised"}')
        assert (reply.status, reply.reason, reply.json()) == (503, "Service Unavailable", {"message": "busy"})
        assert seen[0].content == b'{"pre": "serialised"}' and seen[0].headers["content-type"] == "application/json"
        assert (await http.get("http://s/busy")).status == 503
        assert await http.get_json("http://s/ok") == {"ok": True}
        assert await http.get_text("http://s/html") == "<h1>hi</h1>"
        with pytest.raises(BadStatus) as e:
            await http.get_text("http://s/busy")
        assert (str(e.value), e.value.reply.status, e.value.kind) == ("HTTP 503 from http://s/busy", 503, "status")
        with pytest.raises(BadBody) as bad:
            await http.get_json("http://s/html")
        assert str(bad.value) == "the body from http://s/html is not JSON (content-type text/html; charset=utf-8)"
        with pytest.raises(BadStatus) as refused:  # a refused stream: no events, the error body kept
            async with http.open_stream("http://s/busy", {"stream": True}):
                raise AssertionError("no events for a refused request")
        assert (refused.value.reply.status, refused.value.reply.json()) == (503, {"message": "busy"})


@pytest.mark.parametrize(("where", "connect_s", "read_s", "ours", "why"), [
    ("black_hole", 0.3, 60, CannotConnect, "no connection within 0.3 s (the host is down, or something on the way "
                                           "drops the packets)"),
    ("silent_server", 30, 0.3, NoAnswer, "no answer within the request timeout (0.3 s)"),
    ("refused", 10, 60, CannotConnect, "Connection refused"),  # the OS's reason under httpx's wrappers
])
async def test_a_black_hole_a_silent_server_and_a_refusal_are_told_apart(request, where: str, connect_s: float,
                                                                          read_s: float, ours: type, why: str) -> None:
    url = request.getfixturevalue(where)
    async with open_http(GenerationConfig(connect_timeout_s=connect_s, request_timeout_s=read_s), 4) as http:
        started = time.monotonic()
        with pytest.raises(HttpError) as e:
            await http.post_json(url + "/v1/chat/completions", {"x": 1})
        assert time.monotonic() - started < 30  # the connect timeout ended the black hole's, not the read timeout
        said = why if ours is NoAnswer else f"cannot connect to {url[7:]}: {why}"
        assert (type(e.value), e.value.why, str(e.value)) == (ours, why, said)
        if where == "silent_server":
            with pytest.raises(NoAnswer) as control:  # a control call's own timeout
                await http.get(url + "/health", timeout_s=0.2)
            assert str(control.value) == "no answer within the request timeout (0.2 s)"


async def test_the_pool_holds_as_many_connections_as_asked_beyond_httpx_default_of_100() -> None:
    """The server answers none of 120 requests until it holds all 120 (httpx's default limit is 100)."""
    n, connections = 120, 0
    all_in = anyio.Event()

    async def serve(stream: anyio.abc.SocketStream) -> None:
        nonlocal connections
        async with stream:
            await stream.receive()
            connections += 1
            if connections == n:
                all_in.set()
            await all_in.wait()
            await stream.send(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")

    async with tcp_server(serve, n) as (url, http):
        replies = []

        async def one() -> None:
            replies.append(await http.get(url))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as requests:
                for _ in range(n):
                    requests.start_soon(one)
    assert connections == n and [r.json() for r in replies] == [{}] * n


async def test_the_pools_of_a_large_window_share_one_tls_context() -> None:
    """Each pool building its own TLS context held the first request back 8 s (docs/measurements.md)."""
    async with open_http(GenerationConfig(), 3750) as http:
        pools = [t._pool for t in http._transports]  # type: ignore[attr-defined]
    assert len(pools) == -(-3750 // seam.CONNECTIONS_PER_POOL)
    assert len({id(p._ssl_context) for p in pools}) == 1


class Chunks(httpx.AsyncByteStream):
    """A streamed body; `cut` ends it with the connection dropping."""

    def __init__(self, chunks: list[bytes], cut: bool = False):
        self.chunks, self.cut, self.closed = chunks, cut, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
            yield c
        if self.cut:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    async def aclose(self) -> None:
        self.closed = True


async def test_events_come_as_they_arrive_whatever_the_line_breaks() -> None:
    body = Chunks([b'data: {"a": 1}\n\nda', b'ta: {"a": 2}\r', b"\n\r\ndata: x\rdata:  y\r\rdata: [DONE]\n\n"])
    sent: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        return httpx.Response(200, stream=body, headers={"content-type": "text/event-stream"})

    async with mock_http(handler) as http, http.open_stream(URL, {"stream": True}) as answer:
        assert answer.is_event_stream
        got = [data async for data in answer.events()]
    assert got == [b'{"a": 1}', b'{"a": 2}', b"x\n y", b"[DONE]"]
    assert sent == [b'{"stream":true}'] and body.closed


@pytest.mark.parametrize("cut", [True, False], ids=["cut-short", "left-early"])
async def test_a_stream_cut_short_is_connection_lost_and_one_left_early_is_closed(cut: bool) -> None:
    body = Chunks([b"data: 1\n\n", b"data: 2\n\n"], cut=cut)
    got = []
    async with mock_http(lambda request: httpx.Response(200, stream=body)) as http:
        with pytest.raises(ConnectionLost) if cut else contextlib.nullcontext() as e:
            async with http.open_stream(URL, b"{}") as answer:
                async for data in answer.events():
                    got.append(data)
                    if not cut:
                        break
    assert got == ([b"1", b"2"] if cut else [b"1"]) and body.closed
    if cut:
        assert str(e.value) == ("the connection to s:30000 was lost (RemoteProtocolError: peer closed connection "
                                "without sending complete message body)")


async def test_a_request_imports_nothing() -> None:
    """After the first request, sending one looks up no module (httpcore imports sniffio per lock: pyproject.toml)."""
    looked_up: list[str] = []

    class Spy(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: object = None, target: object = None) -> None:
            looked_up.append(name)

    async def serve(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            while await stream.receive():  # keep-alive: one answer per request
                await stream.send(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")

    async with tcp_server(serve) as (url, http):
        assert (await http.post_json(url, {"warm": "up"})).status == 200
        sys.meta_path.insert(0, Spy())
        try:
            replies = [await http.post_json(url, {"n": n}) for n in range(3)]
        finally:
            sys.meta_path.pop(0)
    assert [r.json() for r in replies] == [{}] * 3 and looked_up == []


def test_only_the_seam_imports_an_http_library() -> None:
    """No product module but gen_pipeline/http.py names an HTTP library (so none has its types in a signature)."""
    import ast
    from pathlib import Path

    libraries = {"httpx", "httpx2", "httpcore", "httpcore2", "aiohttp", "requests", "urllib3", "h11"}
    package = Path(__file__).resolve().parents[2] / "gen_pipeline"
    importers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            if any(name.partition(".")[0] in libraries for name in names):
                importers.add(str(path.relative_to(package.parent)))
    assert importers == {"gen_pipeline/http.py"}


def _sse_server(hold_open: anyio.Event | None = None, cut: bool = False):
    """A server answering each POST with a chunked SSE body `data: 1`, `data: [DONE]`, then the body's end
    (or, with `hold_open`, no end until that event is set; `cut`: the connection closed after `data: 1`).
    Counts the connections it accepts."""
    accepted: list[int] = []

    async def serve(stream: anyio.abc.SocketStream) -> None:
        accepted.append(1)
        async with stream:
            while await stream.receive():
                await stream.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                  b"transfer-encoding: chunked\r\n\r\n")
                for event in (b"data: 1\n\n", b"data: [DONE]\n\n")[:1 if cut else 2]:
                    await stream.send(b"%x\r\n%s\r\n" % (len(event), event))
                if cut:
                    return
                if hold_open is not None:
                    await hold_open.wait()
                await stream.send(b"0\r\n\r\n")

    return serve, accepted


async def _events_until_done(http, url: str) -> list[bytes]:  # type: ignore[no-untyped-def]
    seen = []
    async with http.open_stream(url, b"{}") as answer:
        async for data in answer.events():
            seen.append(data)
            if data == b"[DONE]":
                await answer.drain(limit_s=0.2)
                break
    return seen


@pytest.mark.parametrize(("hold_open", "connections"), [(False, 1), (True, 3)], ids=["ended", "held-open"])
async def test_a_drained_stream_keeps_its_connection_unless_the_body_is_held_open(hold_open: bool,
                                                                                   connections: int) -> None:
    """Read to [DONE] and drained, three streamed answers travel on one connection; a body not ended after [DONE]
    is left after the drain's limit, and the next request gets a new connection."""
    serve, accepted = _sse_server(anyio.Event() if hold_open else None)  # never set: the server's end is cancelled
    async with tcp_server(serve) as (url, http):
        with anyio.fail_after(20):
            answers = [await _events_until_done(http, url) for _ in range(3)]
    assert answers == [[b"1", b"[DONE]"]] * 3 and len(accepted) == connections


@pytest.mark.parametrize("bounded", [False, True])
async def test_a_bounded_stream_reads_as_one_with_a_read_timeout_and_fails_the_same(bounded: bool) -> None:
    """A stream bounded as a whole (no timeout scope per read) reads and fails as one with a read timeout."""
    seen: list[bytes] = []
    async with tcp_server(_sse_server(cut=True)[0]) as (url, http):
        with anyio.fail_after(20), pytest.raises(ConnectionLost) as e:
            async with http.open_stream(url, b"{}", bounded=bounded) as answer:
                async for data in answer.events():
                    seen.append(data)
    assert seen == [b"1"]
    assert str(e.value) == (f"the connection to {url[7:].partition('/')[0]} was lost (RemoteProtocolError: peer "
                            "closed connection without sending complete message body (incomplete chunked read))")
