"""A server under test: the simulator as a process (`sim_process`: to kill, freeze or restart it) or in a
thread of this process (`sim_in_thread`: no interpreter start-up). `shared_sim` (session, SIM_FAST, in a
thread) is for tests that only send requests (no /sim/faults, no /sim/stats counts, nothing stopped)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from sglang_sim.testing import SimProcess, free_port, start_sim

from pipeline_helpers import SIM_FAST

__all__ = ["SimProcess", "SimThread", "shared_sim", "sim_in_thread", "sim_process"]

sim_process = start_sim  # the process variant is the product's own helper (sglang_sim/testing.py)


@dataclass
class SimThread:
    """A simulator served in a thread of this process: `url` is http://127.0.0.1:<port>."""

    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def sim_in_thread(args: Sequence[str] = (), *, ready_timeout_s: float = 30.0) -> Iterator[SimThread]:
    """The simulator's app (`python -m sglang_sim`'s flags) under uvicorn in a daemon thread, once it listens."""
    import uvicorn

    from sglang_sim.app import SimServer, build_app
    from sglang_sim.cli import parse_args
    from sglang_sim.loop import build_engine

    port = free_port()
    ns = parse_args(["--host", "127.0.0.1", "--port", str(port), *args])
    engine, info = build_engine(ns)
    server = uvicorn.Server(uvicorn.Config(build_app(SimServer(ns, engine, info)), host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False, timeout_keep_alive=5,
                                           lifespan="on"))
    listening = threading.Event()

    def serve() -> None:
        import asyncio

        async def run() -> None:
            task = asyncio.ensure_future(server.serve())
            while not server.started and not task.done():
                await asyncio.sleep(0.005)  # uvicorn offers no event: its flag, read on its own loop
            listening.set()
            await task

        asyncio.run(run())
        listening.set()

    thread = threading.Thread(target=serve, name=f"sim-{port}", daemon=True)
    thread.start()
    if not listening.wait(ready_timeout_s) or not server.started:
        server.should_exit = True
        raise RuntimeError(f"the simulator in a thread did not listen on port {port} within {ready_timeout_s} s")
    try:
        yield SimThread(port)
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="session")
def shared_sim() -> Iterator[SimThread]:
    with sim_in_thread(SIM_FAST) as sim:
        yield sim
