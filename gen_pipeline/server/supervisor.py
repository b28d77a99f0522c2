"""run_server: the one owner of a launched server's lifetime: start, wait healthy, read capacity, restart with
backoff on exit or failed health checks, and always stop the process group."""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus

from gen_pipeline.config.server import ServerProfile
from gen_pipeline.display import display_path
from gen_pipeline.errors import ServerError, ServerStartupError
from gen_pipeline.http import Http
from gen_pipeline.records import Capacity
from gen_pipeline.server import logfile
from gen_pipeline.server.capacity import capacity_from_log, probe
from gen_pipeline.server.command import build_command, build_env
from gen_pipeline.server.handle import ServerHandle
from gen_pipeline.server.health import check_timeout_s, wait_healthy, why_unhealthy
from gen_pipeline.server.leftover import stop_leftover
from gen_pipeline.server.process import ServerProcess

log = logging.getLogger(__name__)


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _listening(host: str, port: int) -> bool:
    """Something accepts connections on host:port now (a server started there would fail to bind, and its
    health check would pass against the other one)."""
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return True
    except OSError:
        return False


def connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


async def run_server(profile: ServerProfile, *, log_dir: Path, http: Http, leftover_dirs: Sequence[Path] = (),
                     task_status: TaskStatus[ServerHandle] = anyio.TASK_STATUS_IGNORED) -> None:
    """Start the server, report the ServerHandle once healthy, supervise until cancelled; the process group
    is always stopped on exit. Raises ServerStartupError if the first start fails (or a server an earlier run
    left in `log_dir` or `leftover_dirs` cannot be stopped), ServerError once restarts are exhausted."""
    for folder in dict.fromkeys([log_dir, *leftover_dirs]):  # a job's earlier run may have had another first dataset
        await stop_leftover(folder, profile.stop_grace_s)
    host = connect_host(profile.host)
    if profile.port and await anyio.to_thread.run_sync(_listening, host, profile.port):
        raise ServerStartupError(
            f"Port {profile.port} on {host} is already in use by another process (not a server "
            f"this job started). Stop it, or set port = 0 in {profile.where} (a free port is then picked).")
    port = profile.port or pick_free_port(host)
    sup = _Supervisor(profile, log_dir / "server.log", http, port)
    try:
        log.info("starting SGLang (%s) on %s, log: %s", profile.name, sup.url, display_path(sup.log_path))
        await sup.start()
        handle = ServerHandle(base_urls=[sup.url], model=profile.request_model, capacity=await sup.capacity(),
                              info=sup.info, log_path=sup.log_path, metrics=profile.enable_metrics, pid=sup.running.pid)
        log.info("SGLang ready after %.0f s, pid %d: %s", sup.running.elapsed_s(), sup.running.pid,
                 handle.summary_line())
        task_status.started(handle)
        await sup.supervise(handle)
    finally:
        if sup.proc is not None:
            await sup.proc.stop(profile.stop_grace_s)  # shielded inside


class _Supervisor:
    def __init__(self, profile: ServerProfile, log_path: Path, http: Http, port: int):
        self.profile, self.log_path, self.http = profile, log_path, http
        self.url = f"http://{connect_host(profile.host)}:{port}"
        self.command = build_command(profile, port=port, python=sys.executable)
        self.proc: ServerProcess | None = None
        self.info: dict[str, Any] = {}

    @property
    def running(self) -> ServerProcess:
        """The process of the last successful start() (asking before the first is a bug)."""
        if self.proc is None:
            raise RuntimeError("the server process was never started")
        return self.proc

    async def start(self) -> None:
        """Spawn and wait for /health; raises ServerStartupError (the group is already stopped then)."""
        try:
            self.proc = await ServerProcess.start(self.command, build_env(self.profile), self.log_path,
                                                  stop_grace_s=self.profile.stop_grace_s, url=self.url)
        except OSError as e:
            raise ServerStartupError(
                f"Could not run {self.command[0]!r}: {e}. Check command in {self.profile.where} "
                "(is SGLang installed in this Python?).") from None
        await wait_healthy(self.proc, http=self.http, url=self.url, profile=self.profile)

    async def capacity(self) -> Capacity:
        """Capacity from the API, cross-checked against the start-up log line (a warning if they differ)."""
        cap, info = await probe(self.http, self.url)
        self.info = info or {"model_path": self.profile.model_path, "tp_size": self.profile.tp_size,
                             "kv_cache_dtype": self.profile.kv_cache_dtype}
        logged = capacity_from_log(await anyio.to_thread.run_sync(logfile.LogFollower(self.log_path).all_lines))
        per_rank = info.get("max_total_num_tokens")
        if logged and per_rank and logged[0] != per_rank:
            log.warning("warning: /server_info reports max_total_num_tokens=%s but the start-up log says %s; "
                        "using /server_info.", f"{per_rank:,}", f"{logged[0]:,}")
        if cap is None and logged:
            cap = Capacity(logged[0], logged[1], servers=1, source="log")
        return cap or Capacity(0, None, servers=1, source="unknown")

    async def supervise(self, handle: ServerHandle) -> None:
        """Restart on exit / failed health checks until max_restarts; then fail the handle and raise."""
        crashes = 0
        while True:
            reason = await self._watch()
            handle.mark_down()
            crashes += 1
            log.warning("SGLang %s; dispatch paused (log: %s)", reason, display_path(self.log_path))
            last_rc = await self.running.stop(self.profile.stop_grace_s)
            while True:
                if handle.restarts >= self.profile.max_restarts:
                    error = ServerError(
                        f"SGLang crashed {crashes} times (last exit code {last_rc}); giving up. The run is "
                        f"resumable: fix the cause (see {display_path(self.log_path)}) and run the same command.")
                    handle.mark_failed(error)
                    raise error
                backoff_s = self.profile.restart_backoff_s * 2 ** handle.restarts
                log.info("restarting SGLang in %g s (restart %d of %d)", backoff_s, handle.restarts + 1,
                         self.profile.max_restarts)
                await anyio.sleep(backoff_s)
                handle.restarts += 1
                try:
                    await self.start()
                    break
                except ServerStartupError as e:
                    crashes += 1
                    last_rc = self.proc.returncode if self.proc else None
                    log.warning("restart failed: %s", e)
            handle.capacity = await self.capacity()
            handle.info, handle.pid = self.info, self.running.pid
            handle.mark_ready()
            log.info("SGLang is back (restart %d), pid %d: %s", handle.restarts, self.running.pid,
                     handle.summary_line())

    async def _watch(self) -> str:
        """Return why the server needs a restart: it exited, or failed unhealthy_after checks in a row."""
        reasons: list[str] = []
        proc, profile = self.running, self.profile

        async with anyio.create_task_group() as tg:
            async def exited() -> None:
                reasons.append(f"exited with code {await proc.wait()}")
                tg.cancel_scope.cancel()

            async def unhealthy() -> None:
                failed = 0
                while failed < profile.unhealthy_after:
                    await anyio.sleep(profile.health_interval_s)
                    why = await why_unhealthy(self.http, self.url, timeout_s=check_timeout_s(profile.health_interval_s))
                    failed = 0 if why is None else failed + 1
                reasons.append(f"failed {failed} health checks in a row")
                tg.cancel_scope.cancel()

            tg.start_soon(exited)
            tg.start_soon(unhealthy)
        return reasons[0]
