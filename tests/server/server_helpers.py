"""Helpers for the server tests: a sim profile with test-sized timings, process-group checks, the CLI
attached to simulators, an sglang-router in front of them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path

import anyio
import httpx
import pytest

from gen_pipeline.config.server import ServerProfile
from gen_pipeline.server import load_server_profile
from gen_pipeline.server.leftover import group_alive
from sglang_sim.testing import SimProcess, free_port

from pipeline_helpers import SIM_FAST, make_rows, start_cli, write_dataset

SIM_ARGS = ["--sim-profile", "fast", "--time-scale", "20", "--sim-startup-s", "0.2",
            "--max-total-tokens", "20000"]
SIM = [*SIM_FAST, "--max-total-tokens", "20000", "--time-scale", "1"]  # a run of 300 lasts a few seconds


def sim_profile(*extra: str, **overrides) -> ServerProfile:
    """The shipped sim profile with quick health checks and extra sim flags appended."""
    base = {"extra_args": SIM_ARGS + list(extra), "health_interval_s": 0.2, "unhealthy_after": 3,
            "restart_backoff_s": 0.1, "stop_grace_s": 3, "startup_timeout_s": 20}
    return load_server_profile("sim", overrides={**base, **overrides})


def group_gone(pgid: int) -> bool:
    return not group_alive(pgid)


@asynccontextmanager
async def started(run, *args, **kwargs) -> AsyncIterator:
    """run_server or run_attached started in a task group (its handle), cancelled on leaving."""
    async with anyio.create_task_group() as tg:
        yield await tg.start(partial(run, *args, **kwargs))
        tg.cancel_scope.cancel()


def dataset(tmp_path: Path, target: int, *, request_timeout_s: float = 20) -> Path:
    toml = write_dataset(tmp_path / "ds", target=target, max_new_tokens=64, rows=make_rows(target + 40))
    toml.write_text(toml.read_text().replace("request_timeout_s = 20", f"request_timeout_s = {request_timeout_s}"))
    return toml


def generate(tmp_path: Path, toml: Path, urls: str, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    """`generate --progress log` attached to `urls`, its output in tmp_path / "cli.log"."""
    log = tmp_path / "cli.log"
    proc = start_cli("generate", "--dataset", toml, "--server-url", urls, "--output-dir", tmp_path / "out",
                     "--progress", "log", *extra, log=log)
    (tmp_path / "out" / "T").mkdir(parents=True, exist_ok=True)
    return proc, log


@contextmanager
def router(workers: list[SimProcess], tmp_path: Path, *extra: str, on_failure=pytest.fail) -> Iterator[str]:
    """An sglang-router in front of `workers`, once it answers /health and has checked every worker healthy."""
    port = free_port()
    # The router fetches a tokenizer from the hub for the worker's model: a dead local proxy keeps that
    # attempt on this machine (it fails and the router carries on without one).
    env = {**os.environ, "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           "NO_PROXY": "127.0.0.1,localhost", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *[s.url for s in workers],
           "--host", "127.0.0.1", "--port", str(port), "--log-level", "warn",
           "--prometheus-port", str(free_port()), *extra]  # its default 29000 collides between parallel tests
    with open(tmp_path / "router.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        if not _router_up(url, proc, timeout_s=30):
            on_failure(f"sglang-router did not start: {(tmp_path / 'router.log').read_text()[-800:]}")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


def _router_up(url: str, proc: subprocess.Popen, timeout_s: float) -> bool:
    # it lists a worker with is_healthy false until its first check passes; attach counts healthy workers only
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                workers = httpx.get(url + "/workers", timeout=1).json().get("workers", [])
                if workers and all(w.get("is_healthy") for w in workers):
                    return True
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        time.sleep(0.1)
    return False
