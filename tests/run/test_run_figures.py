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


def test_the_front_end_meter_reads_a_launched_servers_busiest_front_end_and_starts_afresh_on_a_restart() -> None:
    from gen_pipeline.run.stats import FRONT_END_RESCAN_S, FrontEndMeter

    now, cpu = [0.0], {11: 5.0, 21: 1.0}
    group = {100: [11], 200: [21]}  # leader -> its front-end processes
    looked_up = []

    def pids(leader: int) -> list[int]:
        looked_up.append(leader)
        if leader not in group:
            raise OSError(f"server {leader} has no child process")
        return group[leader]

    def read(pid: int) -> float:
        if pid not in cpu:
            raise OSError(f"no process {pid}")
        return cpu[pid]

    meter = FrontEndMeter(lambda: now[0], pids, read)
    assert meter.share(None) is None  # attached: no process of ours to read
    assert meter.share(100) is None  # its first reading: less than a second measured
    now[0], cpu[11] = 2.0, 6.9
    assert meter.share(100) == pytest.approx(0.95)
    assert meter.share(300) is None  # not started yet (no child): no figure, and no error
    now[0] = 3.0
    assert meter.share(200) is None  # a restart: the new process is measured from now, not against the old
    now[0], cpu[21] = 5.0, 1.5
    assert meter.share(200) == pytest.approx(0.25)
    assert looked_up == [100, 300, 200]  # once per leader until FRONT_END_RESCAN_S has passed

    # --tokenizer-worker-num 2: the main process idles, its workers carry the load; the busiest binds
    group[200], cpu[22], cpu[23] = [21, 22, 23], 0.0, 0.0
    now[0] = 3.0 + FRONT_END_RESCAN_S
    meter.share(200)  # looked up again: the workers' first reading
    now[0] += 2.0
    cpu[21], cpu[22], cpu[23] = cpu[21] + 0.06, 1.8, 1.2
    assert meter.share(200) == pytest.approx(0.9)
    assert looked_up[-1] == 200 and len(looked_up) == 4
    del cpu[23]  # a worker gone: no figure now, and a fresh lookup at the next poll
    assert meter.share(200) is None
    group[200] = [21, 22]
    assert meter.share(200) is None and len(looked_up) == 5
