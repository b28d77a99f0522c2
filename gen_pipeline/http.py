"""The product's one HTTP seam (httpx is imported nowhere else): `open_http` makes an `Http`. Every failure to
get an answer becomes one of these (`kind` is the short key a Failure records):

    HttpError            the URL and what happened
     ├── CannotConnect   "connect": refused, unknown host, or no connection within connect_timeout_s (a
     │                   black-holed server): nothing is there; the fleet takes such a server out
     ├── NoAnswer        "timeout": no answer within the read timeout (busy or stalled: it stays in the fleet)
     ├── ConnectionLost  "connection": the connection dropped mid-request or mid-response
     ├── BadBody         "bad_body": an answer whose body is not what was asked for (not JSON, bad encoding)
     └── BadStatus       "status": get_json/get_text/open_stream got a status other than 200 (`reply` holds
                         the answer); `get` and `post_json` return any status as a Reply
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

import anyio
import httpcore
import httpx
import orjson

from gen_pipeline.config.dataset import GenerationConfig

# SGLang's uvicorn closes a connection idle for 5 s (srt/entrypoints/http_server.py: timeout_keep_alive=5);
# ours expire first, so a request is never sent on a connection the server is closing at that moment.
KEEPALIVE_EXPIRY_S = 4.0
DRAIN_S = 1.0  # Stream.drain: how long the rest of an answer may take after its last event
# httpcore 1.0's pool is quadratic in its size (connection_pool.py, _assign_requests_to_connections, on every
# request's start and end): requests go round robin over pools of at most this many connections each.
CONNECTIONS_PER_POOL = 16
_GET_HEADERS = {"user-agent": "gen-pipeline"}
_POST_HEADERS = {**_GET_HEADERS, "content-type": "application/json"}
_ERROR_BODY_BYTES = 64 * 1024  # what a refused stream keeps of the server's error body


class HttpError(Exception):
    """No usable answer from `url`: `str(e)` says so, `why` only the cause ("Connection refused")."""

    kind = "http"

    def __init__(self, url: str, message: str, why: str = ""):
        super().__init__(message)
        self.url, self.why = url, why or message


class CannotConnect(HttpError):
    kind = "connect"


class NoAnswer(HttpError):
    kind = "timeout"


class ConnectionLost(HttpError):
    kind = "connection"


class BadBody(HttpError):
    kind = "bad_body"


class BadStatus(HttpError):
    kind = "status"

    def __init__(self, url: str, reply: Reply):
        super().__init__(url, f"HTTP {reply.status} from {url}")
        self.reply = reply


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer, read whole: status, content type and body bytes."""

    url: str
    status: int
    content_type: str
    body: bytes
    reason: str = ""  # the status line's phrase ("Service Unavailable")

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The parsed body; raises BadBody when it is not JSON."""
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            raise BadBody(self.url, f"the body from {self.url} is not JSON "
                                    f"(content-type {self.content_type or 'none'})") from None


class Http:
    """GETs and POSTs with the errors above. Straight to the transport, not through httpx.AsyncClient: client
    CPU on every request (docs/measurements.md, "HTTP client library")."""

    def __init__(self, transports: list[httpx.AsyncBaseTransport], timeout: httpx.Timeout):
        self._transports = transports
        self._turn = itertools.cycle(transports)
        self.connect_timeout_s = timeout.connect or 0.0
        self._default = timeout, {"timeout": timeout.as_dict()}
        self._per_call: dict[float, tuple[httpx.Timeout, dict[str, Any]]] = {}

    async def get(self, url: str, *, timeout_s: float | None = None) -> Reply:
        """GET `url`, any status; raises HttpError when no answer came."""
        return await self._send("GET", url, None, timeout_s)

    async def post_json(self, url: str, body: bytes | Mapping[str, Any], *, timeout_s: float | None = None) -> Reply:
        """POST a JSON body (bytes are sent as they are), any status; raises HttpError when no answer came."""
        return await self._send("POST", url, body if isinstance(body, bytes) else orjson.dumps(body), timeout_s)

    async def get_text(self, url: str, *, timeout_s: float | None = None) -> str:
        """The body of a 200 answer as text (bad UTF-8 replaced); raises BadStatus for another status."""
        return (await self._get_ok(url, timeout_s)).text

    async def get_json(self, url: str, *, timeout_s: float | None = None) -> Any:
        """The parsed JSON of a 200 answer; raises BadBody when it is not JSON, else as get_text."""
        return (await self._get_ok(url, timeout_s)).json()

    async def _get_ok(self, url: str, timeout_s: float | None) -> Reply:
        reply = await self.get(url, timeout_s=timeout_s)
        if reply.status != 200:
            raise BadStatus(url, reply)
        return reply

    @asynccontextmanager
    async def open_stream(self, url: str, body: bytes | Mapping[str, Any], *, timeout_s: float | None = None,
                          bounded: bool = False) -> AsyncIterator[Stream]:
        """POST a JSON body and read the 200 answer as it comes (events() or read()); `bounded`: no read timeout,
        the caller bounds the whole answer (less client CPU). Raises BadStatus, HttpError (also inside the loop).
        Leaving the block early closes the connection: SGLang aborts the request and frees its KV."""
        timeout, extensions = self._timeouts(timeout_s)
        if bounded:
            extensions = {"timeout": {**extensions["timeout"], "read": None}}
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        request = httpx.Request("POST", url, content=content, headers=_POST_HEADERS, extensions=extensions)
        with _mapped(url, timeout):
            response = await next(self._turn).handle_async_request(request)
        stream = Stream(url, timeout, response)
        try:
            if response.status_code != 200:
                head = bytearray()
                with _mapped(url, timeout):
                    async for chunk in response.aiter_bytes():
                        head += chunk
                        if len(head) >= _ERROR_BODY_BYTES:
                            break
                raise BadStatus(url, _reply(url, response, bytes(head[:_ERROR_BODY_BYTES])))
            yield stream
        finally:
            await stream.aclose()
            await response.aclose()

    async def aclose(self) -> None:
        for transport in self._transports:
            await transport.aclose()

    async def _send(self, method: str, url: str, content: bytes | None, timeout_s: float | None) -> Reply:
        timeout, extensions = self._timeouts(timeout_s)
        request = httpx.Request(method, url, content=content, headers=_POST_HEADERS if content else _GET_HEADERS,
                                extensions=extensions)
        with _mapped(url, timeout):
            response = await next(self._turn).handle_async_request(request)
            try:
                body = await response.aread()
            finally:
                await response.aclose()
        return _reply(url, response, body)

    def _timeouts(self, timeout_s: float | None) -> tuple[httpx.Timeout, dict[str, Any]]:
        if timeout_s is None:
            return self._default
        found = self._per_call.get(timeout_s)
        if found is None:  # a control call: bounded as a whole, connect never longer than the call
            timeout = httpx.Timeout(timeout_s, connect=min(self.connect_timeout_s, timeout_s))
            found = self._per_call[timeout_s] = timeout, {"timeout": timeout.as_dict()}
        return found


class Stream:
    """A 200 answer being read (Http.open_stream), httpx's errors mapped to ours. Read it one way only."""

    def __init__(self, url: str, timeout: httpx.Timeout, response: httpx.Response):
        self.url, self._timeout, self._response = url, timeout, response
        self.content_type: str = str(response.headers.get("content-type", ""))
        self._open: list[Any] = []  # async generators to close with the stream

    @property
    def is_event_stream(self) -> bool:
        return self.content_type.startswith("text/event-stream")

    async def read(self) -> bytes:
        with _mapped(self.url, self._timeout):
            return await self._response.aread()

    def events(self) -> AsyncIterator[bytes]:
        """Each server-sent event's data (its `data:` lines joined by newlines; events without data skipped)."""
        it = _sse_events(self._response.aiter_bytes())
        self._open.append(it)
        return _Mapped(self.url, self._timeout, it)

    async def drain(self, limit_s: float = DRAIN_S) -> None:
        """Read the rest of the answer so that its connection goes back to the pool (an unread body closes it)."""
        with anyio.move_on_after(limit_s):
            try:
                for it in self._open:
                    async for _ in it:
                        pass
            except httpx.HTTPError:  # the answer was whole already: only the connection is not kept
                pass

    async def aclose(self) -> None:
        for it in self._open:
            close = getattr(it, "aclose", None)  # httpx's iterators are async generators
            if close is not None:
                await close()


class _Mapped:
    """An async iterator with httpx's errors mapped to ours."""

    def __init__(self, url: str, timeout: httpx.Timeout, it: AsyncIterator[Any]):
        self._url, self._timeout, self._it = url, timeout, it

    def __aiter__(self) -> _Mapped:
        return self

    async def __anext__(self) -> Any:
        with _mapped(self._url, self._timeout):
            return await self._it.__anext__()


async def _sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Server-sent events' data from a byte stream (lines end with \n, \r\n or \r)."""
    tail = b""
    data: list[bytes] = []
    async for chunk in chunks:
        buf, tail_cr = tail + chunk if tail else chunk, False
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
            tail_cr = buf.endswith(b"\r")  # maybe the first half of \r\n: wait for the next chunk
            buf = (buf[:-1] if tail_cr else buf).replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        tail = lines.pop() + (b"\r" if tail_cr else b"")
        for line in lines:
            if not line:
                if data:
                    yield data[0] if len(data) == 1 else b"\n".join(data)
                    data = []
            elif line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
    if tail.startswith(b"data:"):
        data.append(tail[6:] if tail[5:6] == b" " else tail[5:])
    if data:
        yield b"\n".join(data)


@asynccontextmanager
async def open_http(generation: GenerationConfig, max_connections: int, *,
                    transport: httpx.AsyncBaseTransport | None = None) -> AsyncIterator[Http]:
    """An Http with the [generation] timeouts (read = request_timeout_s: a long generation is one read) and up to
    `max_connections` connections (httpx's default of 100 would cap a run's window); `transport`: tests'."""
    timeout = httpx.Timeout(connect=generation.connect_timeout_s, read=generation.request_timeout_s,
                            write=generation.request_timeout_s, pool=None)
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                          keepalive_expiry=KEEPALIVE_EXPIRY_S)
    # No proxy from HTTP_PROXY: a cluster's proxy for the internet must not carry requests to the next node.
    # HTTP/1.1 (all SGLang's uvicorn speaks), one connection per request in flight. One TLS context for all
    # pools: one per transport held the first request back seconds on a GPU host (docs/measurements.md).
    shards = -(-max_connections // CONNECTIONS_PER_POOL)
    tls = httpx.create_ssl_context() if transport is None else True  # True: unused (a test transport)
    http = Http([transport] if transport else [_transport(limits, tls) for _ in range(shards)], timeout)
    try:
        yield http
    finally:
        await http.aclose()


def _transport(limits: httpx.Limits, tls: Any) -> httpx.AsyncHTTPTransport:
    """httpx's transport with no proxy (trust_env off), its pool's connections made by _Backend."""
    transport = httpx.AsyncHTTPTransport(limits=limits, trust_env=False, verify=tls)
    if hasattr(transport, "_pool"):  # the pool httpx made with these limits (httpx 0.2x), on _Backend's streams
        transport._pool = httpcore.AsyncConnectionPool(
            ssl_context=tls, max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            http1=True, http2=False, network_backend=_Backend())
    return transport


class _Backend(httpcore.AsyncNetworkBackend):
    """httpcore's AnyIO backend whose reads skip the timer scope without a read timeout (client CPU)."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    # httpcore's interface: its `timeout` arguments (noqa ASYNC109)
    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,  # noqa: ASYNC109
                          local_address: str | None = None, socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        return _UntimedReads(await self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _UntimedReads(httpcore.AsyncNetworkStream):
    """An httpcore connection whose reads without a timeout go straight to the anyio stream (same errors)."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._anyio: Any = getattr(inner, "_stream", None)  # httpcore's AnyIOStream keeps it there (1.0)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        if timeout is not None or self._anyio is None:
            return await self._inner.read(max_bytes, timeout)
        try:
            data: bytes = await self._anyio.receive(max_bytes)
            return data
        except anyio.EndOfStream:
            return b""
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as e:
            raise httpcore.ReadError(str(e) or type(e).__name__) from e

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:  # noqa: ASYNC109
        return _UntimedReads(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


@contextmanager
def _mapped(url: str, timeout: httpx.Timeout) -> Iterator[None]:
    try:
        yield
    except httpx.ConnectTimeout:
        _cannot_connect(url, f"no connection within {timeout.connect or 0:g} s (the host is down, or something "
                             "on the way drops the packets)")
    except (httpx.ConnectError, httpx.UnsupportedProtocol) as e:
        _cannot_connect(url, _os_reason(e))
    except httpx.InvalidURL as e:
        _cannot_connect(url, f"invalid URL ({e})")
    except httpx.TimeoutException:  # read or write (pool: none set)
        raise NoAnswer(url, f"no answer within the request timeout ({timeout.read or 0:g} s)") from None
    except httpx.DecodingError as e:
        raise BadBody(url, f"the body from {url} cannot be decoded: {e}") from None
    except httpx.TransportError as e:  # read/write errors, protocol errors: the connection went away
        why = f"{type(e).__name__}: {_os_reason(e) or 'no detail'}"
        raise ConnectionLost(url, f"the connection to {_where(url)} was lost ({why})", why) from None


def _cannot_connect(url: str, why: str) -> NoReturn:
    raise CannotConnect(url, f"cannot connect to {_where(url)}: {why}", why) from None


def _where(url: str) -> str:
    try:
        u = httpx.URL(url)
    except httpx.InvalidURL:
        return url
    port = u.port or {"http": 80, "https": 443}.get(u.scheme)
    return f"{u.host}:{port}" if port else u.host or url


def _os_reason(e: BaseException) -> str:
    """The OS's reason under httpx's wrappers ("Connection refused"; anyio keeps the OSError as its cause)."""
    reason = str(e)
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            # asyncio puts "Connect call failed (host, port)" in strerror; the errno says why
            code = seen.errno
            reason = os.strerror(code) if code and code > 0 and not isinstance(seen, socket.gaierror) else seen.strerror
        seen = seen.__cause__ or seen.__context__
    return reason


def _reply(url: str, response: httpx.Response, body: bytes) -> Reply:
    return Reply(url, response.status_code, response.headers.get("content-type", ""), body, response.reason_phrase)
