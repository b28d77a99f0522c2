"""Health checks and the start-up wait: /health polled while the log is watched for fatal lines."""

from __future__ import annotations

import logging

import anyio

from gen_pipeline.config.server import ServerProfile
from gen_pipeline.display import display_path
from gen_pipeline.errors import ServerStartupError
from gen_pipeline.http import Http, HttpError
from gen_pipeline.server import logfile
from gen_pipeline.server.log_advice import FatalLine, advice, find_fatal, find_warnings
from gen_pipeline.server.process import ServerProcess

STARTUP_POLL_S = 0.25  # start-up polling: cheap (connection refused) and keeps fast starts fast
PROGRESS_EVERY_S = 10.0
TAIL_LINES = 15
log_event = logging.getLogger(__name__)


async def why_unhealthy(http: Http, url: str, timeout_s: float) -> str | None:
    """None when GET /health answered 200 within `timeout_s` (503 while SGLang starts), else why not."""
    try:
        status = (await http.get(url + "/health", timeout_s=timeout_s)).status
    except HttpError as e:
        return e.why
    return None if status == 200 else f"/health answered HTTP {status}"


def check_timeout_s(health_interval_s: float) -> float:
    """How long one /health check may take: a busy server answers late; a few intervals (1..20 s)."""
    return min(20.0, max(1.0, 4 * health_interval_s))


async def wait_healthy(proc: ServerProcess, *, http: Http, url: str, profile: ServerProfile) -> None:
    """Return once /health answers 200; on a fatal log line, an early exit or the start-up timeout,
    stop the process group and raise ServerStartupError with the log's last lines and advice."""
    follower = logfile.LogFollower(proc.log_path)
    log = display_path(proc.log_path)
    next_progress_s = PROGRESS_EVERY_S
    warned: set[str] = set()
    while True:
        rc = proc.returncode  # read before the log so the log is complete when rc is set
        lines = await anyio.to_thread.run_sync(follower.new_lines)
        for kind, said in find_warnings(lines):
            if kind not in warned:
                warned.add(kind)
                log_event.warning("SGLang warning: %s (log: %s)", said, log)
        fatal = find_fatal(lines)
        if fatal is not None or rc is not None:
            await proc.stop(profile.stop_grace_s)
            raise ServerStartupError(await _failure_message(proc, profile, fatal, rc))
        elapsed_s = proc.elapsed_s()
        if elapsed_s > profile.startup_timeout_s:
            await proc.stop(profile.stop_grace_s)
            raise ServerStartupError(
                f"SGLang did not answer /health within {profile.startup_timeout_s:g} s; see {log}. "
                f"The server was stopped. Last lines of the log:\n{await _tail(proc)}\n"
                f"Raise startup_timeout_s in {profile.where} if loading the model takes longer.")
        if await why_unhealthy(http, url, timeout_s=check_timeout_s(profile.health_interval_s)) is None:
            return
        if elapsed_s >= next_progress_s:
            log_event.info("waiting for SGLang /health (%.0f s, log: %s)", elapsed_s, log)
            next_progress_s += PROGRESS_EVERY_S
        await anyio.sleep(STARTUP_POLL_S)


async def _failure_message(proc: ServerProcess, profile: ServerProfile, fatal: FatalLine | None,
                           rc: int | None) -> str:
    log = display_path(proc.log_path)
    if fatal is None:  # it exited: look for the cause in the whole log
        fatal = find_fatal(await anyio.to_thread.run_sync(logfile.LogFollower(proc.log_path).all_lines))
    elapsed = f"{proc.elapsed_s():.0f} s"
    if fatal is not None and fatal.kind == "bad_flag":  # argparse's usage text would drown the message
        return (f"SGLang rejected its command line ({elapsed}): {fatal.line} (full usage text in {log}).\n"
                f"{advice(fatal, profile)}")
    head = (f"SGLang exited with code {rc} before /health answered ({elapsed})." if rc is not None
            else f"SGLang hit a fatal error during start-up ({elapsed}) and was stopped.")
    return f"{head} Last lines of {log}:\n{await _tail(proc)}\n{advice(fatal, profile)}"


async def _tail(proc: ServerProcess) -> str:
    lines = await anyio.to_thread.run_sync(logfile.tail, proc.log_path, TAIL_LINES)
    return "\n".join(f"  {ln}" for ln in lines) or "  (the log is empty)"
