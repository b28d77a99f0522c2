"""A server under test: the simulator (sglang_sim), one owner for how tests get one.

    sim_process(args)    `python -m sglang_sim` as a process (sglang_sim.testing.start_sim): for tests that
                         SIGKILL, freeze or restart it, read its log, or whose client is another process
    sim_in_thread(args)  the same ASGI app (sglang_sim/app.py) served by uvicorn in a thread of the test's
                         process: no interpreter start-up, no imports, ~0 CPU-s to start

Fixtures (imported by tests/conftest.py):
    shared_sim   session-scoped (one per xdist worker), SIM_FAST, in a thread: for tests that only send
                 requests (no /sim/faults, no counts read from /sim/stats, nothing stopped)
"""

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
    """The simulator's app (the flags of `python -m sglang_sim`) under uvicorn in a daemon thread; yields
    once uvicorn listens (its `started` flag, set after the lifespan started the engine), stops it after."""
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
