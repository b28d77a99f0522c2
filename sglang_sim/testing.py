"""Start a simulator process for tests (shipped with the product, like anyio's test helpers).

    with start_sim(["--enable-metrics"], ready_timeout_s=20) as sim:
        httpx.get(sim.url + "/health")

The process runs in its own session with stdout/stderr to a log file (no pipes: no
grandchild-pipe hangs); on exit its whole process group gets SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class SimProcess:
    """A running simulator: `url` is http://127.0.0.1:<port>."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_exit(self, timeout_s: float) -> int:
        """The exit code once the process ended. Raises subprocess.TimeoutExpired."""
        return self.process.wait(timeout=timeout_s)

    def stop(self, grace_s: float = 3.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace_s`."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=grace_s)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sim_command(args: Sequence[str], port: int) -> list[str]:
    return [sys.executable, "-m", "sglang_sim", "--host", "127.0.0.1", "--port", str(port), *args]


@contextlib.contextmanager
def start_sim(args: Sequence[str] = (), *, ready_timeout_s: float = 30.0, log_path: Path | None = None,
              wait_ready: bool = True) -> Iterator[SimProcess]:
    """Run `python -m sglang_sim <args>` on a free port; yield once /health answers 200.

    wait_ready=False yields right after the spawn (for start-up failure tests). Raises
    RuntimeError (with the log tail) if the process exits first, TimeoutError after
    `ready_timeout_s`."""
    port = free_port()
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix=f"sim-{port}-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(sim_command(args, port), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    sim = SimProcess(proc, port, log_path)
    try:
        if wait_ready:
            wait_healthy(sim, ready_timeout_s)
        yield sim
    finally:
        sim.stop()


def wait_healthy(sim: SimProcess, timeout_s: float) -> None:
    """Poll /health until 200. Raises RuntimeError if the process exits, TimeoutError on timeout."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1.0) as client:
        while True:
            code = sim.process.poll()
            if code is not None:
                raise RuntimeError(f"simulator exited with code {code} before /health answered; "
                                   f"last lines of {sim.log_path}:\n{_tail(sim.log_text())}")
            with contextlib.suppress(httpx.TransportError):
                if client.get(sim.url + "/health").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"simulator /health not 200 after {timeout_s} s; last lines of "
                                   f"{sim.log_path}:\n{_tail(sim.log_text())}")
            time.sleep(0.05)


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.splitlines()[-lines:])
