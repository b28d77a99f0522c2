"""open_http builds one TLS context for all its connection pools: each AsyncHTTPTransport that builds its
own loads the system's CA certificates (~0.1 s), and SGLang's max_running_requests 2048 means 128 pools
per dataset (it held a 4-dataset simulator job 80 s before its first request)."""

from __future__ import annotations

import ssl

import httpx
import pytest

from gen_pipeline.config.dataset import GenerationConfig
from gen_pipeline.http import CONNECTIONS_PER_POOL, open_http


async def test_every_pool_shares_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[ssl.SSLContext] = []
    real = httpx.create_ssl_context

    def counting(*args: object, **kwargs: object) -> ssl.SSLContext:
        ctx = real(*args, **kwargs)  # type: ignore[arg-type]
        built.append(ctx)
        return ctx

    monkeypatch.setattr(httpx, "create_ssl_context", counting)
    monkeypatch.setattr("httpx._transports.default.create_ssl_context", counting)
    async with open_http(GenerationConfig(), 2048) as http:
        pools = http._transports
        assert len(pools) == 2048 // CONNECTIONS_PER_POOL == 128
        contexts = {id(p._pool._ssl_context) for p in pools}  # type: ignore[attr-defined]
    # a transport given a context passes it through create_ssl_context unchanged: one context was built
    assert {id(c) for c in built} == contexts and len(contexts) == 1
