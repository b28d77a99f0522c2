"""The run counts its own retractions, and reads no load while the server is down."""

from __future__ import annotations

import anyio

from gen_pipeline.controller import Controller
from gen_pipeline.records import Capacity, LoadSnapshot
from gen_pipeline.run.connect import ServerPoller
from gen_pipeline.run.dispatch import Window
from gen_pipeline.run.stats import RunStats
from gen_pipeline.server.handle import ServerHandle


def test_the_run_counts_its_own_retractions_across_a_restart() -> None:
    stats = RunStats(clock=lambda: 0.0)
    # attached to a server that had retracted 500 before this run; it restarts (counter back to 0)
    for total in (500, 500, 503, None, 2, 6):
        stats.note_load(LoadSnapshot(t_s=0.0, running=1, queued=0, retractions_total=total))
    assert stats.retractions == 3 + 2 + 4


def test_no_load_is_read_while_the_server_restarts() -> None:
    handle = ServerHandle(base_urls=["http://127.0.0.1:9"], model="m", capacity=Capacity(60_000, None))
    window = Window()
    window.controller = Controller(handle.capacity, initial_tokens_per_request=1000)
    poller = ServerPoller(handle, window, interval_s=0.0)
    handle.mark_down()

    async def poll() -> LoadSnapshot | None:
        return await poller.next(None)  # type: ignore[arg-type]  # never reaches the network

    assert anyio.run(poll) is None
    before = window.controller.statistics()
    handle.capacity = Capacity(30_000, None)  # the restarted server came back smaller: not seen while down
    assert anyio.run(poll) is None
    assert window.controller.statistics() == before
