"""Recorded answers for the product's Http, in-process: `async with mock_http(handler) as http:` gives an
Http (gen_pipeline/http.py) whose transport is httpx.MockTransport(handler). A handler takes an
httpx.Request and returns an httpx.Response, or raises what the network would (httpx.ReadTimeout: the
server stalls past the read timeout; httpx.RemoteProtocolError: it cuts the answer; httpx.ConnectError:
nothing listens), which costs no real time."""

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
