"""ServerHandle: what the pipeline holds of a server (URLs, model, capacity) and its readiness."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from gen_pipeline.display import count
from gen_pipeline.errors import ServerError
from gen_pipeline.records import Capacity
from gen_pipeline.server.fleet import Fleet


def server_gpus(info: Mapping[str, Any], servers: int, gpus_per_server: int | None = None) -> tuple[int | None, str]:
    """(GPUs a run holds, how that is known): `--gpus-per-server` wins, else tp_size × dp_size of the
    server's info (dp_size absent: 1), else (None, "unknown")."""
    servers = max(1, servers)
    per = f"{servers} servers" if servers > 1 else "1 server"
    if gpus_per_server:
        return gpus_per_server * servers, f"--gpus-per-server {gpus_per_server} × {per}"
    tp, dp = info.get("tp_size"), info.get("dp_size")
    if isinstance(tp, int) and not isinstance(tp, bool) and tp > 0:
        dp = dp if isinstance(dp, int) and not isinstance(dp, bool) and dp > 0 else 1
        return tp * dp * servers, f"tp {tp} × dp {dp} × {per}"
    return None, "unknown"


@dataclass
class ServerHandle:
    """Handed out by run_server / run_attached once /health answered; updated on every restart."""

    base_urls: list[str]
    model: str  # the name requests carry
    capacity: Capacity
    info: dict[str, Any] = field(default_factory=dict)  # model_path, tp_size, kv_cache_dtype, hicache_size, ...
    restarts: int = 0
    log_path: Path | None = None
    metrics: bool = False
    pid: int | None = None  # the launched server's process (group leader); None when attached
    fleet: Fleet | None = None  # attached: which URL gets the next request, which are out
    worker_urls: list[str] = field(default_factory=list)  # the servers behind (routers') base_urls, up ones
    down_since_s: float | None = None  # attached: no server has answered since then (monotonic); the run waits
    wait_limit_s: float | None = None  # ... this long at most (--server-wait-s)

    _ready: bool = field(default=True, repr=False)
    _error: ServerError | None = field(default=None, repr=False)
    _wakeup: anyio.Event | None = field(default=None, repr=False)

    @property
    def load_urls(self) -> list[str]:
        """Where load is read: the servers themselves (a router's workers), never the router."""
        return self.worker_urls or self.base_urls

    @property
    def ready(self) -> bool:
        return self._ready and self._error is None

    async def wait_ready(self) -> None:
        """Return at once when healthy; block while a restart is under way; raise ServerError once given up."""
        while True:
            if self._error is not None:
                raise ServerError(str(self._error))
            if self._ready:
                return
            if self._wakeup is None:
                self._wakeup = anyio.Event()
            await self._wakeup.wait()

    def mark_down(self) -> None:
        """The server is being restarted: wait_ready blocks from now on."""
        self._ready = False

    def mark_ready(self) -> None:
        self._ready = True
        self._wake()

    def mark_failed(self, error: ServerError) -> None:
        """Supervision gave up: every wait_ready (current and later) raises `error`'s message."""
        self._error = error
        self._wake()

    def _wake(self) -> None:
        event, self._wakeup = self._wakeup, None
        if event is not None:
            event.set()

    def gpus(self, gpus_per_server: int | None = None) -> tuple[int | None, str]:
        """(GPUs this handle's servers hold, how known): server_gpus over its load URLs."""
        return server_gpus(self.info, len(self.load_urls), gpus_per_server)

    def summary_line(self) -> str:
        """"Kimi-K2.5 tp=8 kv=fp8_e4m3 376,000 KV tokens, max running 1024, hicache 48 GB"."""
        info = self.info
        parts = [str(info.get("model_path") or self.model).rstrip("/").rsplit("/", 1)[-1]]
        if info.get("tp_size"):
            parts.append(f"tp={info['tp_size']}")
        if info.get("dp_size", 1) not in (1, None):
            parts.append(f"dp={info['dp_size']}")
        if info.get("kv_cache_dtype"):
            parts.append(f"kv={info['kv_cache_dtype']}")
        cap = self.capacity
        tokens = f"{count(cap.max_total_num_tokens)} KV tokens" if cap.max_total_num_tokens else "KV tokens unknown"
        running = (f"max running {count(cap.max_running_requests)}" if cap.max_running_requests
                   else "max running unknown")
        line = f"{' '.join(parts)} {tokens}, {running}"
        if info.get("enable_hierarchical_cache") and info.get("hicache_size"):
            line += f", hicache {info['hicache_size']} GB"
        # attached, the fleet's URLs taken out (one unreachable at start among them) are not up; a router's
        # workers count one each
        down = len(self.fleet.down_urls) if self.fleet is not None else 0
        up = max(len(self.base_urls) - down, len(self.worker_urls), self.capacity.servers if down == 0 else 0)
        if down:
            line = f"{count(up)} of {count(up + down)} servers up: {line}"
        elif up > 1:
            line = f"{count(up)} servers: {line}"
        return line
