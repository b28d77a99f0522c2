"""How request bytes reach the server: the client's policy (retries, parsing) stays in
client.py; this module only moves bytes and maps each library's errors onto two kinds.

    TransportTimeout   no answer within the request timeout        (retried)
    TransportFailure   connect refused/reset, cut mid-body, ...    (retried)

Two implementations of `post(url, body) -> RawResponse`:
- AiohttpTransport, what a run uses: ~0.4 ms of CPU per request here against ~2-7 ms for
  httpx (bench: `python -m bench overhead`); aiohttp is already installed by `datasets`.
- HttpxTransport, for tests (httpx.MockTransport) and callers that already hold httpx clients.
Control traffic (health, /server_info, /v1/loads) stays on httpx: a few requests a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import httpx

_JSON = {"content-type": "application/json"}


@dataclass(frozen=True, slots=True)
class RawResponse:
    status: int
    content_type: str
    body: bytes
    reason: str = ""


class TransportTimeout(Exception):
    pass


class TransportFailure(Exception):
    pass


class Transport(Protocol):
    async def post(self, url: str, body: bytes) -> RawResponse: ...


class HttpxTransport:
    """Round-robin over httpx clients (httpcore scans its whole pool per request: keep pools small)."""

    def __init__(self, clients: httpx.AsyncClient | Sequence[httpx.AsyncClient]):
        self._clients = [clients] if isinstance(clients, httpx.AsyncClient) else list(clients)
        self._turn = 0

    async def post(self, url: str, body: bytes) -> RawResponse:
        self._turn += 1
        client = self._clients[self._turn % len(self._clients)]
        try:
            r = await client.post(url, content=body, headers=_JSON)
        except httpx.TimeoutException as e:
            raise TransportTimeout(f"{type(e).__name__}: no answer in time") from None
        except httpx.TransportError as e:
            raise TransportFailure(f"{type(e).__name__}: {e}") from None
        return RawResponse(r.status_code, r.headers.get("content-type", ""), r.content, r.reason_phrase)


class AiohttpTransport:
    """One aiohttp session; `async with AiohttpTransport(...)` opens and closes it."""

    def __init__(self, *, max_connections: int, connect_timeout_s: float, request_timeout_s: float):
        self._limit = max_connections
        # sock_read bounds the wait for each chunk; total bounds the whole request.
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, connect=connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AiohttpTransport:
        connector = aiohttp.TCPConnector(limit=self._limit, limit_per_host=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, raise_for_status=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def post(self, url: str, body: bytes) -> RawResponse:
        assert self._session is not None, "use `async with AiohttpTransport(...)`"
        try:
            async with self._session.post(url, data=body, headers=_JSON) as r:
                return RawResponse(r.status, r.headers.get("content-type", ""), await r.read(), r.reason or "")
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError):
            raise TransportTimeout("no answer within the request timeout") from None
        except aiohttp.ClientError as e:
            raise TransportFailure(f"{type(e).__name__}: {e}") from None
