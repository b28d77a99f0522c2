"""`async with mock_http(handler) as http:`: the product's Http over httpx.MockTransport(handler); a handler
returns an httpx.Response or raises what the network would (ReadTimeout, RemoteProtocolError, ConnectError)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import httpx

from gen_pipeline.config.dataset import GenerationConfig
from gen_pipeline.http import Http, open_http

Handler = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]


def mock_http(handler: Handler, generation: GenerationConfig | None = None,
              max_connections: int = 8) -> AbstractAsyncContextManager[Http]:
    return open_http(generation or GenerationConfig(), max_connections, transport=httpx.MockTransport(handler))
