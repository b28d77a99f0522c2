"""Servers the GPU check keeps across runs: started from a server.toml profile with the launcher's own
command and environment builders (gen_pipeline.server.command), detached, stopped by process group.

The sweep attaches many runs to one server (start-up is ~80 s on the H200); `launch` mode runs go
through the full launcher instead (bench/gpu/h200_check.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from gen_pipeline.config.server import load_server_profile
from gen_pipeline.run.stats import group_processes
from gen_pipeline.server.command import build_command, build_env

_CHILDREN: dict[int, subprocess.Popen] = {}  # kept so a live server's Popen is never garbage-collected


@dataclass
class Server:
    name: str
    url: str
    pid: int
    log: Path
    ready_s: float = 0.0

    def to_dict(self) -> dict:
        return {"name": self.name, "url": self.url, "pid": self.pid, "log": str(self.log),
                "ready_s": round(self.ready_s, 1)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(cfg_dir: Path, profile_name: str, log_dir: Path) -> Server:
    """Start the profile's server in its own session, log to a file; does not wait."""
    profile = load_server_profile(profile_name, cfg_dir / "server.toml")
    port = free_port()
    argv = build_command(profile, port=port, python=os.environ.get("BENCH_PYTHON", sys.executable))
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{profile_name}.log"
    with open(log, "ab") as f:
        f.write(("$ " + " ".join(argv) + "\n").encode())
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=build_env(profile), start_new_session=True)
    _CHILDREN[proc.pid] = proc
    return Server(profile_name, f"http://127.0.0.1:{port}", proc.pid, log)


def wait_ready(server: Server, started: float, timeout_s: float = 900.0) -> Server:
    """Poll /health until 200; raises RuntimeError with the log tail if the process dies or time runs out."""
    while time.monotonic() - started < timeout_s:
        if not alive(server.pid):
            raise RuntimeError(f"{server.name} exited during start-up:\n{tail(server.log)}")
        try:
            if httpx.get(server.url + "/health", timeout=5.0).status_code == 200:
                server.ready_s = time.monotonic() - started
                return server
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{server.name} not healthy after {timeout_s:.0f} s:\n{tail(server.log)}")


def start(cfg_dir: Path, profile_name: str, log_dir: Path, timeout_s: float = 900.0) -> Server:
    started = time.monotonic()
    return wait_ready(spawn(cfg_dir, profile_name, log_dir), started, timeout_s)


def alive(pid: int) -> bool:
    proc = _CHILDREN.get(pid)
    if proc is not None:
        if proc.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # reap our own child if it exited
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def stop(server: Server, grace_s: float = 20.0) -> None:
    """SIGTERM the server's process group, SIGKILL it after `grace_s` (SGLang leaves children otherwise)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _group_alive(server.pid):
                return
            alive(server.pid)
            time.sleep(0.5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def group_cpu_s(pgid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of each process in the group, by its name (SGLang names its
    processes: the HTTP server and tokenizer manager run in the group's leader, `sglang::scheduler` and
    `sglang::detokenizer` beside it; /proc/PID/comm keeps 15 characters). Same-named processes add up."""
    out: dict[str, float] = {}
    for pid, name, cpu_s in group_processes(pgid):
        key = "leader" if pid == pgid else name
        out[key] = out.get(key, 0.0) + cpu_s
    return out


def gpu_name() -> str | None:
    """The GPU the runs had (nvidia-smi's name), for the report: the lent machine may be an H100 or an H200."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.splitlines()[0].strip() if p.returncode == 0 and p.stdout.strip() else None


def flush_cache(server: Server) -> bool:
    """Empty the prefix cache between measured runs (SGLang POST /flush_cache; refused while busy)."""
    for _ in range(20):
        try:
            if httpx.post(server.url + "/flush_cache", timeout=10.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return False


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def leftover_processes(patterns: tuple[str, ...]) -> list[str]:
    """Processes whose command line mentions a pattern (ours: the check must leave none behind)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmd and any(p in cmd for p in patterns) and "h200_check" not in cmd:
            out.append(f"{entry.name} {cmd[:160]}")
    return out
