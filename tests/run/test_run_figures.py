"""The run counts its own retractions, and reads no load while the server is down."""

from __future__ import annotations

import anyio
import pytest

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


def test_the_front_end_meter_reads_a_launched_servers_cores_and_starts_afresh_on_a_restart() -> None:
    from gen_pipeline.run.stats import FrontEndMeter

    now, cpu = [0.0], {100: 5.0, 200: 1.0}

    def read(leader: int) -> float:
        if leader not in cpu:
            raise OSError(f"server {leader} has no child process")
        return cpu[leader]

    meter = FrontEndMeter(lambda: now[0], read)
    assert meter.share(None) is None  # attached: no process of ours to read
    assert meter.share(100) is None  # its first reading: less than a second measured
    now[0], cpu[100] = 2.0, 6.9
    assert meter.share(100) == pytest.approx(0.95)
    assert meter.share(300) is None  # not started yet (no child): no figure, and no error
    now[0] = 3.0
    assert meter.share(200) is None  # a restart: the new process is measured from now, not against the old
    now[0], cpu[200] = 5.0, 1.5
    assert meter.share(200) == pytest.approx(0.25)
