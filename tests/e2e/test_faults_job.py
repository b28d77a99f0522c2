"""A job of three datasets killed (SIGKILL, SIGINT, SIGTERM) in the middle of its second
dataset: the first is intact, the second resumes exactly, the third starts from zero."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from pipeline_helpers import (
    _shard_lines,
    assert_exact,
    count_output,
    freeze,
    kill_group,
    run_cli,
    sim_profile,
    start_cli,
    thaw,
    wait_for,
    write_dataset,
)

JOB = (("A", 20), ("B", 40), ("C", 20))


@pytest.fixture(scope="module")
def sim_url(shared_sim):  # tests/servers.py: one simulator per worker
    return shared_sim.url


def _start_job(tmp_path: Path, url: str) -> tuple[tuple, Path, Path, object]:
    tomls = [write_dataset(tmp_path / "ds", name=n, target=t, max_new_tokens=64, shard_max_samples=7,
                           fsync_every=3) for n, t in JOB]
    out, log = tmp_path / "out", tmp_path / "cli.log"
    # a window of 3: the second dataset takes many rounds, so the kill lands well inside it
    args = ("generate", "--dataset", ",".join(map(str, tomls)), "--server-url", url, "--output-dir", out,
            "--progress", "log", "--window", "3", "--drain-grace-s", "10", "--poll-interval-s", "0.05")
    proc = start_cli(*args, log=log)
    wait_for(lambda: (out / "B").is_dir() and _shard_lines(out / "B") >= 6, timeout_s=60, interval_s=0.005)
    freeze(proc)  # the job stays where it is until the test signals it (thaw)
    assert proc.poll() is None, log.read_text()  # the kill lands in a live job ...
    assert _shard_lines(out / "B") < 40 and _shard_lines(out / "C") == 0  # ... in the middle of B
    return args, out, log, proc


def _resume_and_check(args: tuple, out: Path, b_before: int) -> None:
    r = run_cli(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "A: 20/20 samples (100.0%); the target is already reached, nothing to do." in r.stdout
    assert re.search(rf"^B: 40/40 samples \(100\.0%\), \+{40 - b_before} this run in \d+s; target reached\.$",
                     r.stdout, re.M), r.stdout
    assert re.search(r"^C: 20/20 samples \(100\.0%\), \+20 this run in \d+s; target reached\.$", r.stdout, re.M)
    for name, target in JOB:
        assert_exact(out, target, name)


def test_sigkill_in_second_dataset_then_exact_resume(tmp_path: Path, sim_url: str) -> None:
    args, out, log, proc = _start_job(tmp_path, sim_url)
    kill_group(proc, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert_exact(out, 20, "A")  # the first dataset: intact
    lines, unique, bad = count_output(out, "B")
    assert lines == unique and bad <= 1 and 6 <= unique < 40  # at most one torn line, cut on resume
    assert count_output(out, "C") == (0, 0, 0)
    _resume_and_check(args, out, unique)


@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted (SIGINT)"),
                                                   (signal.SIGTERM, 143, "stopped (SIGTERM)")])
def test_signal_in_second_dataset_drains_then_exact_resume(tmp_path: Path, sim_url: str, sig: int, code: int,
                                                            word: str) -> None:
    args, out, log, proc = _start_job(tmp_path, sim_url)
    os.kill(proc.pid, sig)
    thaw(proc)
    assert proc.wait(timeout=30) == code
    text = log.read_text()
    assert "Traceback" not in text
    # the live display: the job's samples toward its total, its ETA, and the dataset being sent
    assert re.search(r"^job [AB] \([12]/3\) \d+/80 \(\d+\.\d%\) .*eta ", text, re.M), text
    assert re.search(r"^A: 20/20 samples \(100\.0%\), \+20 this run in \d+s; target reached\.$", text, re.M), text
    m = re.search(rf"^B: (\d+)/40 samples \(\d+\.\d%\), \+(\d+) this run in \d+s; {re.escape(word)}; "
                  r"run the same command to resume\.$", text, re.M)
    assert m is not None, text
    done = int(m.group(1))
    assert 6 <= done < 40 and int(m.group(2)) == done
    assert re.search(rf"^C: 0/20 samples \(0\.0%\), \+0 this run in 0s; {re.escape(word)}", text, re.M), text
    assert_exact(out, 20, "A")
    assert count_output(out, "B") == (done, done, 0)
    assert count_output(out, "C") == (0, 0, 0)
    _resume_and_check(args, out, done)


def test_server_crash_in_second_dataset_is_restarted_and_the_job_completes(tmp_path: Path) -> None:
    """The supervisor works for a job as for one dataset: a crash in B restarts the server; all exact."""
    extra = ["--sim-profile", "fast", "--time-scale", "10", "--sim-startup-s", "0.5", "--sim-output-mean", "160",
             "--sim-output-spread", "0.6", "--sim-crash-after", "30"]
    cfg = sim_profile(tmp_path, "crashy", extra)  # A takes ~25 requests (multi-turn rows): the crash lands in B
    tomls = [write_dataset(tmp_path / "ds", name=n, target=t, max_new_tokens=64) for n, t in JOB]
    out = tmp_path / "out"
    r = run_cli("generate", "--dataset", ",".join(map(str, tomls)), "--server", "crashy", "--config-dir", cfg,
                "--output-dir", out, "--progress", "quiet", "--window", "4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(re.findall(r"^starting SGLang", r.stdout, re.M)) == 1
    assert "restarting SGLang in 0.5 s (restart 1 of 3)" in r.stdout, r.stdout
    for name, target in JOB:
        assert_exact(out, target, name)
