"""ServerHandle readiness and the log file helpers."""

import anyio
import pytest

from gen_pipeline.errors import ServerError
from gen_pipeline.records import Capacity
from gen_pipeline.server import ServerHandle
from gen_pipeline.server.logfile import LogFollower, rotate, tail


async def test_wait_ready_blocks_while_down_and_raises_once_failed():
    handle = ServerHandle(base_urls=["http://a"], model="m", capacity=Capacity(1000, 8))
    await handle.wait_ready()  # ready: returns at once
    handle.mark_down()
    woke: list[str] = []

    async def waiter(name: str) -> None:
        await handle.wait_ready()
        woke.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, "a")
        tg.start_soon(waiter, "b")
        await anyio.wait_all_tasks_blocked()  # both waiters are parked in wait_ready
        assert woke == [] and not handle.ready
        handle.mark_ready()
    assert sorted(woke) == ["a", "b"]
    handle.mark_down()
    raised: list[str] = []

    async def failing_waiter() -> None:
        with pytest.raises(ServerError) as e:
            await handle.wait_ready()
        raised.append(str(e.value))

    async with anyio.create_task_group() as tg:
        tg.start_soon(failing_waiter)
        await anyio.wait_all_tasks_blocked()
        handle.mark_failed(ServerError("gave up"))
    assert raised == ["gave up"]
    with pytest.raises(ServerError, match="^gave up$"):
        await handle.wait_ready()


def test_summary_line():
    handle = ServerHandle(base_urls=["http://a"], model="m", capacity=Capacity(376_000, 1024),
                          info={"model_path": "moonshotai/Kimi-K2.5", "tp_size": 8, "kv_cache_dtype": "fp8_e4m3",
                                "enable_hierarchical_cache": True, "hicache_size": 48})
    assert handle.summary_line() == "Kimi-K2.5 tp=8 kv=fp8_e4m3 376,000 KV tokens, max running 1,024, hicache 48 GB"
    handle.capacity = Capacity(0, None, source="unknown")
    handle.info = {}
    assert handle.summary_line() == "m KV tokens unknown, max running unknown"


def test_rotate_keeps_five(tmp_path):
    log = tmp_path / "B2" / "server.log"
    for i in range(7):
        rotate(log)
        log.write_text(f"start {i}\n")
    assert log.read_text() == "start 6\n"
    assert [(tmp_path / "B2" / f"server.log.{k}").read_text() for k in range(1, 6)] == [
        "start 5\n", "start 4\n", "start 3\n", "start 2\n", "start 1\n"]
    assert not (tmp_path / "B2" / "server.log.6").exists()


def test_follower_returns_complete_lines_once(tmp_path):
    log = tmp_path / "server.log"
    follower = LogFollower(log)
    assert follower.new_lines() == []
    log.write_text("one\ntw")
    assert follower.new_lines() == ["one"]
    with open(log, "a") as f:
        f.write("o\nthree\n")
    assert follower.new_lines() == ["two", "three"]
    assert follower.new_lines() == []
    assert tail(log, 2) == ["two", "three"]
