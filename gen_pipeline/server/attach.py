"""Attach mode (SERVER_URL): no process; the same health checks and capacity reading as a launch.

An sglang-router in front of several servers is recognised by its worker list (`/workers`, old
`/list_workers`); capacity and load are then read from the workers themselves and summed, while
requests go through the router.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import aiohttp
import orjson
from anyio.abc import TaskStatus

from ..errors import ServerError
from .capacity import combine, get_json, probe
from .handle import ServerHandle
from .health import check_timeout_s, is_healthy

log = logging.getLogger(__name__)

ATTACH_READY_TIMEOUT_S = 600.0  # a server still loading its model when we attach
GIVE_UP_AFTER_S = 1800.0  # we cannot restart someone else's server; wait this long for it to return


async def run_attached(urls: list[str], *, http: aiohttp.ClientSession, health_interval_s: float = 5.0, unhealthy_after: int = 3,
                       give_up_after_s: float = GIVE_UP_AFTER_S,
                       task_status: TaskStatus[ServerHandle] = anyio.TASK_STATUS_IGNORED) -> None:
    """Check each URL is an SGLang/OpenAI server, report the handle, then watch health until cancelled.

    Raises ServerError for an unreachable or foreign URL, or when the server stays down give_up_after_s.
    """
    urls = [u.rstrip("/") for u in urls]
    models = [await identify(http, url) for url in urls]
    handle = ServerHandle(base_urls=urls, model=models[0], capacity=combine([]))
    await _refresh(http, handle)
    log.info("attached to %s: %s", ", ".join(urls), handle.summary_line())
    task_status.started(handle)
    await _watch(http, handle, health_interval_s, unhealthy_after, give_up_after_s)


async def identify(http: aiohttp.ClientSession, url: str) -> str:
    """The model id `url` serves (the first GET /v1/models lists); waits while it answers 503 (still
    starting). Raises ServerError when it cannot be reached or is not an SGLang/OpenAI server."""
    waited_s = 0.0
    while True:
        try:
            async with http.get(url + "/v1/models", timeout=aiohttp.ClientTimeout(total=10.0)) as r:
                status, ctype, body = r.status, r.headers.get("content-type", "no content-type"), await r.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ServerError(f"Cannot reach {url}: {_describe(e)}. Check SERVER_URL and that the "
                              "server is running (and listening on that host and port).") from None
        if status != 503 or waited_s >= ATTACH_READY_TIMEOUT_S:
            break
        if waited_s % 10 < 1:
            log.info("waiting for %s to finish starting (%.0f s)", url, waited_s)
        await anyio.sleep(1.0)
        waited_s += 1.0
    model = _model_id(status, body)
    if model is None:
        snippet = " ".join(body[:120].decode("utf-8", "replace").split())
        raise ServerError(
            f"{url} does not look like an SGLang or OpenAI-compatible server: GET /v1/models answered "
            f"{status} ({ctype}): {snippet!r}. Set SERVER_URL to the server's base URL "
            "(e.g. http://host:30000, without /v1).")
    return model


def _describe(e: BaseException) -> str:
    """aiohttp's connection errors carry the OS reason (e.g. Connect call failed ... ); timeouts none."""
    if isinstance(e, TimeoutError):
        return "no answer within 10 s"
    return f"{type(e).__name__} {e}"


def _model_id(status: int, body: bytes) -> str | None:
    if status != 200:
        return None
    try:
        data = orjson.loads(body).get("data")
        return str(data[0]["id"])
    except (orjson.JSONDecodeError, AttributeError, LookupError, TypeError):
        return None


async def worker_urls(http: aiohttp.ClientSession, url: str) -> list[str]:
    """The servers behind an sglang-router at `url`, or [url] when it is a server itself."""
    for path in ("/workers", "/list_workers"):
        body = await get_json(http, url + path)
        found = _urls_in(body)
        if found:
            return found
    return [url]


def _urls_in(body: Any) -> list[str]:
    items = body.get("workers", body.get("urls")) if isinstance(body, dict) else body
    if not isinstance(items, list):
        return []
    urls = [(it.get("url") if isinstance(it, dict) else it) for it in items]
    return [u.rstrip("/") for u in urls if isinstance(u, str) and u.startswith("http")]


async def _refresh(http: aiohttp.ClientSession, handle: ServerHandle) -> None:
    """Re-read capacity and info from the servers (behind routers too)."""
    caps, info = [], {}
    for url in handle.base_urls:
        for worker in await worker_urls(http, url):
            cap, worker_info = await probe(http, worker)
            caps.append(cap)
            info = info or worker_info
    handle.capacity = combine(caps)
    handle.info = info
    handle.metrics = bool(info.get("enable_metrics"))


async def _watch(http: aiohttp.ClientSession, handle: ServerHandle, interval_s: float, unhealthy_after: int, give_up_after_s: float) -> None:
    failed, down_s = 0, 0.0
    timeout_s = check_timeout_s(interval_s)
    while True:
        await anyio.sleep(interval_s)
        oks = [await is_healthy(http, url, timeout_s) for url in handle.base_urls]
        if all(oks):
            if not handle.ready:
                await _refresh(http, handle)
                handle.mark_ready()
                log.info("server is back: %s", handle.summary_line())
            failed, down_s = 0, 0.0
            continue
        failed += 1
        if failed == unhealthy_after:
            handle.mark_down()
            bad = [u for u, ok in zip(handle.base_urls, oks) if not ok]
            log.warning("%s failed %d health checks in a row; dispatch paused", ", ".join(bad), failed)
        if not handle.ready:
            down_s += interval_s
            if down_s >= give_up_after_s:
                error = ServerError(f"The server at {', '.join(handle.base_urls)} has not answered /health for "
                                    f"{give_up_after_s:g} s; giving up. The run is resumable: run the same "
                                    "command once the server is back.")
                handle.mark_failed(error)
                raise error
