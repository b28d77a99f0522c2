"""The job's side of the server: the model it serves, start or attach, the load poller, the clients' settings."""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import anyio
from anyio.abc import TaskGroup

from gen_pipeline.config.dataset import DatasetConfig
from gen_pipeline.http import Http
from gen_pipeline.records import LoadSnapshot
from gen_pipeline.run.dispatch import Window
from gen_pipeline.run.options import RunOptions
from gen_pipeline.run.wire import ClientSettings
from gen_pipeline.server import ServerHandle, run_attached, run_server
from gen_pipeline.server.attach import Unreachable, identify
from gen_pipeline.server.fleet_watch import read_fleet_load

FIRST_POLL_S = 0.25  # a short run still gets a load poll while its requests are in flight


async def server_model(opts: RunOptions, http: Http, asked: dict[str, str] | None = None) -> str:
    """The model id requests carry: --model, else what the first attached server that answers serves, else the
    profile's. `asked` gets {url: model} of the URL asked (the attach does not ask it again)."""
    if opts.model:
        return opts.model
    for i, url in enumerate(opts.server_urls):
        try:
            model = await identify(http, url)
        except Unreachable:
            if i == len(opts.server_urls) - 1:
                raise  # none answers: the last one's error
            continue
        if asked is not None:
            asked[url] = model
        return model
    assert opts.profile is not None, "RunOptions checks it has a server"
    return opts.profile.request_model


async def start_server(tg: TaskGroup, opts: RunOptions, log_dir: Path, http: Http,
                       model: str, asked: dict[str, str] | None = None,
                       leftover_dirs: Sequence[Path] = ()) -> ServerHandle:
    """Attach to opts.server_urls or launch opts.profile in `tg`; returns once the server answers /health."""
    if opts.server_urls:
        known = None if opts.model else model  # --model overrides; the server was not asked then
        start = partial(run_attached, list(opts.server_urls), http=http, first_model=known, asked=asked or {},
                        routing=opts.routing, health_interval_s=opts.health_interval_s,
                        give_up_after_s=opts.server_wait_s, hang_after_s=opts.hang_timeout_s)
    else:
        assert opts.profile is not None
        start = partial(run_server, opts.profile, log_dir=log_dir, http=http, leftover_dirs=leftover_dirs)
    return await tg.start(start)  # type: ignore[no-any-return]


def max_connections(opts: RunOptions, handle: ServerHandle) -> int:
    """One connection per request in flight: the window's ceiling (fixed, or the server's slots + slack)."""
    return opts.window or max(64, min(4096, 2 * (handle.capacity.max_running_requests or 1024)))


def client_settings(handle: ServerHandle, opts: RunOptions, cfg: DatasetConfig) -> ClientSettings:
    info = handle.info
    # a launched server's backend is what its profile says (the simulator's says "sim")
    backend = opts.profile.backend if opts.profile else str(info.get("backend", "openai"))
    return ClientSettings(model=handle.model or opts.model, backend=backend,
                          sampling=cfg.sampling, generation=cfg.generation, mix=cfg.mix,
                          kv_cache_dtype=str(info.get("kv_cache_dtype") or "unknown"),
                          token_ids=cfg.output.token_ids, speculative=info.get("speculative_algorithm") is not None)


class ServerPoller:
    """The server side of each load poll (the first early, so a short run gets figures), summed over the fleet."""

    def __init__(self, handle: ServerHandle, window: Window, interval_s: float) -> None:
        self.handle, self.window, self.interval_s = handle, window, interval_s
        self._capacity = handle.capacity
        self._delay_s = min(FIRST_POLL_S, interval_s)

    async def next(self, http: Http) -> LoadSnapshot | None:
        """The next poll's load; None while the server is down or restarting (its figures say nothing)."""
        await anyio.sleep(self._delay_s)
        self._delay_s = self.interval_s
        handle, controller = self.handle, self.window.controller
        if not handle.ready:
            return None
        if handle.capacity is not self._capacity and controller is not None:
            self._capacity = handle.capacity
            controller.update_capacity(handle.capacity)
        ctl = self.window.controller_stats()
        if handle.fleet is not None and ctl is not None and ctl.held_tokens_per_request > 0:
            handle.fleet.tokens_per_request = ctl.held_tokens_per_request  # KV a request sent holds
        return await read_fleet_load(http, handle, time.monotonic())
