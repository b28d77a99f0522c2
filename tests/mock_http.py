"""Recorded answers for the product's aiohttp sessions, written as for httpx.MockTransport: a handler
takes an httpx.Request and returns an httpx.Response (or raises httpx.TimeoutException: the server
stalls past the client's timeout; any other httpx.TransportError: it cuts the body). A local
aiohttp server over real TCP serves them, and every host name (http://a, http://s) resolves to it."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import httpx
from aiohttp import web
from aiohttp.abc import AbstractResolver
from aiohttp.test_utils import RawTestServer

Handler = Callable[[httpx.Request], httpx.Response]
STALL_S = 5.0  # a "timeout" answer waits this long; sessions here time out after CLIENT_TIMEOUT_S
CLIENT_TIMEOUT_S = 0.5


class _EveryHostHere(AbstractResolver):
    def __init__(self, port: int) -> None:
        self.port = port

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict[str, Any]]:
        return [{"hostname": host, "host": "127.0.0.1", "port": self.port, "family": socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        pass


class MockServer:
    """One local server; `handler` may be swapped between requests."""

    def __init__(self, handler: Handler | None = None) -> None:
        self.handler = handler

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        req = httpx.Request(request.method, f"http://{request.host}{request.path_qs}", content=await request.read(),
                            headers={k: v for k, v in request.headers.items() if k.lower() != "content-length"})
        assert self.handler is not None, "MockServer needs a handler"
        try:
            resp = self.handler(req)
        except httpx.TimeoutException:
            await asyncio.sleep(STALL_S)
            return web.Response(status=504)
        except httpx.TransportError:  # a body cut short: the client sees the connection drop
            cut = web.StreamResponse(headers={"content-type": "application/json"})
            cut.content_length = 1000
            await cut.prepare(request)
            await cut.write(b'{"choices"')
            assert request.transport is not None
            request.transport.close()
            return cut
        headers = {"content-type": resp.headers["content-type"]} if "content-type" in resp.headers else {}
        return web.Response(status=resp.status_code, body=resp.content, headers=headers)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[aiohttp.ClientSession]:
        server = RawTestServer(self._serve, host="127.0.0.1", port=0)
        await server.start_server()
        try:
            connector = aiohttp.TCPConnector(resolver=_EveryHostHere(server.port), limit=0)
            timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                yield session
        finally:
            await server.close()


def mock_session(handler: Handler) -> Any:
    """`async with mock_session(handler) as http:` an aiohttp session that only reaches `handler`."""
    return MockServer(handler).session()
