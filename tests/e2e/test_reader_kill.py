"""Reader processes (run/readers.py) killed, and the CLI killed or interrupted under them: a reader SIGKILLed
mid-stream loses and duplicates nothing (its requests are sent again, a new reader takes its place); readers
outlive no main process (their own session: only the pipes tie them to it); Ctrl-C to the process group drains
as without readers."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import httpx
import pytest
from servers import sim_in_thread

from pipeline_helpers import SIM_FAST, assert_exact, finish_cli, frozen, run_cli, start_cli, wait_for, write_dataset

STARTED = re.compile(r"reader process (\d+) started")
# time scale 1: a ~400-token answer takes seconds, so a kill lands while answers stream
SLOW = [*SIM_FAST[:2], "--time-scale", "1", *SIM_FAST[4:6], "--sim-output-mean", "400", "--sim-output-spread", "0.3"]
TARGET = 24


@pytest.fixture
def sim():
    with sim_in_thread(SLOW) as s:
        yield s


def _readers(out: Path) -> list[int]:
    log = out / "T" / "run.log"
    return [int(p) for p in STARTED.findall(log.read_text())] if log.exists() else []


def _streaming(url: str) -> bool:
    stats = httpx.get(url + "/sim/stats", timeout=5).json()
    return stats["requests_seen"] - stats["requests_completed"] >= 4


def _gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def _start(tmp_path: Path, url: str, readers: int) -> tuple[object, Path, Path, Path]:
    toml = write_dataset(tmp_path / "ds", target=TARGET, max_new_tokens=512)
    out, log = tmp_path / "out", tmp_path / "cli.log"
    proc = start_cli("generate", "--dataset", toml, "--server-url", url, "--output-dir", out, "--progress", "quiet",
                     "--readers", str(readers), "--window", "8", log=log)
    wait_for(lambda: len(_readers(out)) == readers and _streaming(url), timeout_s=60)
    return proc, toml, out, log


def test_a_reader_killed_mid_stream_loses_nothing(tmp_path: Path, sim) -> None:
    proc, _, out, log = _start(tmp_path, sim.url, 1)
    [pid] = _readers(out)
    os.kill(pid, signal.SIGKILL)
    text = finish_cli(proc, log)
    m = re.search(rf"reader process {pid} died \(signal 9\); (\d+) of its requests are sent again", text)
    assert m is not None, text  # the kill landed: the main process saw that reader end by SIGKILL ...
    assert int(m.group(1)) >= 1, text  # ... with answers streaming through it
    [_, new] = _readers(out)
    assert f"reader process {new} started (1 running): replacing reader {pid}" in (out / "T" / "run.log").read_text()
    assert_exact(out, TARGET)


def test_readers_do_not_outlive_a_killed_run(tmp_path: Path, sim) -> None:
    proc, toml, out, _ = _start(tmp_path, sim.url, 2)
    pids = _readers(out)
    os.kill(proc.pid, signal.SIGKILL)  # the main process alone, as the OOM killer would
    assert proc.wait(timeout=30) == -signal.SIGKILL
    wait_for(lambda: all(_gone(p) for p in pids), timeout_s=30)  # their stdin closed: they left
    r = run_cli("generate", "--dataset", toml, "--server-url", sim.url, "--output-dir", out, "--progress", "quiet",
                "--readers", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert_exact(out, TARGET)


def test_ctrl_c_to_the_process_group_drains_with_readers(tmp_path: Path, sim) -> None:
    """A terminal's Ctrl-C goes to the foreground process group: the readers, in their own session, read the
    answers in flight to the end while the main process drains."""
    proc, toml, out, log = _start(tmp_path, sim.url, 1)
    [pid] = _readers(out)
    with frozen(proc):
        os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    text = log.read_text()
    assert "died" not in text and "Traceback" not in text, text
    m = re.search(r"^T: (\d+)/24 samples .*; interrupted \(SIGINT\)", text, re.M)
    assert m is not None and int(m.group(1)) >= 1, text  # drained: the answers in flight were written
    wait_for(lambda: _gone(pid), timeout_s=30)
    r = run_cli("generate", "--dataset", toml, "--server-url", sim.url, "--output-dir", out, "--progress", "quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert_exact(out, TARGET)
