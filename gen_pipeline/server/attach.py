"""Attach mode (SERVER_URL): no process; the same health checks and capacity reading as a launch.
Behind an sglang-router (its `/workers` list), capacity and load are summed over the workers."""

from __future__ import annotations

import functools
import logging
import time

import anyio
import orjson
from anyio.abc import TaskStatus

from gen_pipeline.config.run import RunFlags
from gen_pipeline.errors import ServerError
from gen_pipeline.http import Http, HttpError
from gen_pipeline.server.capacity import combine
from gen_pipeline.server.fleet import Fleet
from gen_pipeline.server.fleet_watch import FleetWatch, read_fleet_load
from gen_pipeline.server.handle import ServerHandle
from gen_pipeline.server.hang import HANG_AFTER_S

log = logging.getLogger(__name__)

ATTACH_READY_TIMEOUT_S = 600.0  # a server still loading its model when we attach
GIVE_UP_AFTER_S = RunFlags.server_wait_s  # we cannot restart someone else's server: wait for it (--server-wait-s)
IDENTIFY_TIMEOUT_S = 10.0  # GET /v1/models: a server that takes longer is not one to send work to


async def run_attached(urls: list[str], *, http: Http, first_model: str | None = None,
                       health_interval_s: float = 5.0, unhealthy_after: int = 3,
                       give_up_after_s: float = GIVE_UP_AFTER_S, routing: str = "affinity",
                       hang_after_s: float = HANG_AFTER_S, asked: dict[str, str] | None = None,
                       task_status: TaskStatus[ServerHandle] = anyio.TASK_STATUS_IGNORED) -> None:
    """Check each URL is an SGLang/OpenAI server, report the handle, then watch health until cancelled.
    A URL unreachable at start is taken out and probed back in later; raises ServerError when none can be
    reached, one is foreign, they serve different models, or none has answered for give_up_after_s."""
    models, unreachable = await _identify_all(http, urls, asked or {})
    fleet = Fleet(urls, fail_after=unhealthy_after, probe_initial_s=health_interval_s, routing=routing)
    handle = ServerHandle(base_urls=urls, model=first_model or next(iter(models.values())), capacity=combine([]),
                          fleet=fleet, wait_limit_s=give_up_after_s)
    watch = FleetWatch(http, handle, interval_s=health_interval_s, give_up_after_s=give_up_after_s,
                       hang_after_s=hang_after_s)
    watch.served = next(iter(models.values())), functools.partial(identify, http)  # checked again when back
    for url in urls:
        if url in unreachable:
            fleet.mark_down(url, time.monotonic())
            fleet.why[url] = unreachable[url]
            watch.report_taken_out(url, f"it could not be reached at start ({unreachable[url]})")
        else:
            await watch.refresh(url)
            fleet.answered(url, time.monotonic())
    watch.resum()
    await read_fleet_load(http, handle, time.monotonic())  # the first requests already go by free KV
    log.info("attached to %s: %s", ", ".join(urls), handle.summary_line())
    task_status.started(handle)
    await watch.run()


async def _identify_all(http: Http, urls: list[str],
                        asked: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The models the reachable URLs serve (url → model), and the unreachable ones (url → why); raises
    the first URL's ServerError when none is reachable, and when they serve different models (a foreign
    server always raises)."""
    models: dict[str, str] = {}
    unreachable: dict[str, str] = {}
    first: Unreachable | None = None
    for url in urls:
        if url in asked:
            models[url] = asked[url]
            continue
        try:
            models[url] = await identify(http, url)
        except Unreachable as e:
            unreachable[url], first = e.why, first or e
    if not models:
        assert first is not None
        raise ServerError(str(first))
    if len(set(models.values())) > 1:
        said = ", ".join(f"{u} serves {m!r}" for u, m in models.items())
        raise ServerError(f"The servers serve different models: {said}. Every --server-url must serve the same "
                          "model (or put an sglang-router in front of the ones that do).")
    return models, unreachable


class Unreachable(ServerError):
    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


async def identify(http: Http, url: str) -> str:
    """The model id `url` serves (the first GET /v1/models lists); waits while it answers 503 (still
    starting). Raises ServerError when it cannot be reached or is not an SGLang/OpenAI server."""
    waited_s = 0.0
    while True:
        try:
            reply = await http.get(url + "/v1/models", timeout_s=IDENTIFY_TIMEOUT_S)
        except HttpError as e:
            raise Unreachable(f"Cannot reach {url}: {e.why}. Check SERVER_URL and that the "
                               "server is running (and listening on that host and port).", e.why) from None
        status, ctype, body = reply.status, reply.content_type or "no content-type", reply.body
        if status != 503 or waited_s >= ATTACH_READY_TIMEOUT_S:
            break
        if waited_s % 10 < 1:
            log.info("waiting for %s to finish starting (%.0f s)", url, waited_s)
        await anyio.sleep(1.0)
        waited_s += 1.0
    try:
        model = str(orjson.loads(body).get("data")[0]["id"]) if status == 200 else None
    except (orjson.JSONDecodeError, AttributeError, LookupError, TypeError):
        model = None
    if model is None:
        snippet = " ".join(body[:120].decode("utf-8", "replace").split())
        raise ServerError(
            f"{url} does not look like an SGLang or OpenAI-compatible server: GET /v1/models answered "
            f"{status} ({ctype}): {snippet!r}. Set SERVER_URL to the server's base URL "
            "(e.g. http://host:30000, without /v1).")
    return model
