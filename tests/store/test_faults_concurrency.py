"""Issue 5.5: two runs on one dataset (the second refused with the holder's pid); status while a run writes."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest
from servers import sim_in_thread

from pipeline_helpers import SIM_FAST, _shard_lines, assert_exact, frozen, run_cli, start_cli, wait_for, write_dataset


@pytest.fixture(scope="module")
def sim_url():
    with sim_in_thread(SIM_FAST, ready_timeout_s=30) as sim:
        # 0.1 s stalls on half the requests: with a window of 2, the 60 samples take >= 1.5 s, so the run
        # cannot finish in the moment between seeing a line count and freezing it
        r = httpx.post(sim.url + "/sim/faults", json={"stall_rate": 0.5, "stall_s": 0.1}, timeout=5)
        assert r.status_code == 200, r.text
        yield sim.url


@pytest.mark.e2e  # the process is the subject: make e2e
def test_second_run_refused_and_status_while_running(tmp_path: Path, sim_url: str) -> None:
    toml = write_dataset(tmp_path / "ds", target=60, max_new_tokens=96, fsync_every=1)
    out = tmp_path / "out"
    args = ("generate", "--dataset", toml, "--server-url", sim_url, "--output-dir", out, "--progress", "quiet")
    first = start_cli(*args, "--window", "2", log=tmp_path / "first.log")
    try:
        wait_for(lambda: (out / "T").is_dir() and _shard_lines(out / "T") >= 2, timeout_s=30, interval_s=0.01)
        status = ("status", "--json", "--output-dir", out, "--dataset", "T", "--config-dir", tmp_path / "ds")
        with frozen(first):  # still running however long the second run and status take
            second = run_cli(*args)
            assert second.returncode == 4, second.stdout + second.stderr
            assert second.stderr.startswith("error: ") and f"pid {first.pid}" in second.stderr, second.stderr
            assert "Traceback" not in second.stderr
            a = orjson.loads(run_cli(*status).stdout)["datasets"]["T"]
        wait_for(lambda: _shard_lines(out / "T") >= a["done"] + 3, timeout_s=30, interval_s=0.01)
        with frozen(first):
            b = orjson.loads(run_cli(*status).stdout)["datasets"]["T"]
        assert (a["state"], b["state"]) == (f"running (pid {first.pid})",) * 2
        assert 0 < a["done"] < b["done"] < 60
    finally:
        assert first.wait(timeout=60) == 0
    assert_exact(out, 60)
    done = orjson.loads(run_cli(*status).stdout)["datasets"]["T"]
    assert (done["state"], done["done"]) == ("finished", 60)
