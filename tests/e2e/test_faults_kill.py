"""The orchestrator killed (SIGKILL at seeded moments aimed at writes, shard rotation and
manifest commits; SIGINT/SIGTERM), then resumed: exactly the target, no duplicate, every line parses."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from pipeline_helpers import (
    _shard_lines,
    assert_exact,
    frozen,
    kill_resume_trial,
    read_samples,
    run_cli,
    start_cli,
    wait_for,
    write_dataset,
)

FAST_SEEDS = range(5)
CHAOS_SEEDS = range(100, 125)


@pytest.fixture(scope="module")
def sim_url(shared_sim):
    """One simulator shared (tests/servers.py): only the CLI dies, the server lives on (attach mode)."""
    return shared_sim.url


def _check_trial(r: dict, target: int = 60, validate: bool = True) -> None:
    assert r["rc"] == 0, (r["aims"], r["stdout"], r["stderr"])
    assert "Traceback" not in r["stderr"]
    assert (r["lines"], r["unique"], r["unparseable"]) == (target, target, 0), r
    assert_exact(r["out"], target)
    if not validate:
        return
    v = run_cli("validate", "--dataset", "T", "--output-dir", r["out"])
    assert v.returncode == 0, v.stdout + v.stderr


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_sigkill_then_resume_is_exact(tmp_path: Path, sim_url: str, seed: int) -> None:
    _check_trial(kill_resume_trial(tmp_path, sim_url, seed, kills=1), validate=False)


@pytest.mark.slow
@pytest.mark.parametrize("seed", CHAOS_SEEDS)
def test_sigkill_chaos(tmp_path: Path, sim_url: str, seed: int) -> None:
    _check_trial(kill_resume_trial(tmp_path, sim_url, seed, kills=4))


SUMMARY = re.compile(r"^T: (\d+)/60 samples \(\d+\.\d%\), \+(\d+) this run in \d+s; "
                     r"(interrupted \(SIGINT\)|stopped \(SIGTERM\)); run the same command to resume\.$", re.M)


@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])
def test_signal_drains_prints_summary_and_resumes(tmp_path: Path, sim_url: str, sig: int, code: int,
                                                  word: str) -> None:
    toml = write_dataset(tmp_path / "ds", target=60, max_new_tokens=64, shard_max_samples=7, fsync_every=3)
    out, log = tmp_path / "out", tmp_path / "cli.log"
    args = ("generate", "--dataset", toml, "--server-url", sim_url, "--output-dir", out, "--progress", "quiet",
            "--drain-grace-s", "10", "--window", "4")
    proc = start_cli(*args, log=log)
    wait_for(lambda: (out / "T").is_dir() and _shard_lines(out / "T") >= 5, timeout_s=30, interval_s=0.005)
    with frozen(proc):  # the signal lands mid-run, wherever the run was when 5 lines were seen
        os.kill(proc.pid, sig)
    assert proc.wait(timeout=30) == code
    text = log.read_text()
    assert "Traceback" not in text
    m = SUMMARY.search(text)
    assert m is not None, text
    assert word in m.group(3)
    done = int(m.group(1))
    assert 5 <= done < 60 and int(m.group(2)) == done
    assert len(assert_exact_prefix(out)) == done
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"T: 60/60 samples \(100\.0%\), \+{60 - done} this run in \d+s; target reached\.", last), last
    assert_exact(out, 60)


def assert_exact_prefix(out: Path) -> list[dict]:
    """The partial output after a signal: every line parses, no duplicate, fields intact."""
    samples = read_samples(out)
    assert len({s["id"] for s in samples}) == len(samples)
    return samples


def test_sigkill_in_launch_mode_leaves_no_server_behind(tmp_path: Path) -> None:
    """SIGKILL of the CLI's group in launch mode: the server it started must not outlive it."""
    toml = write_dataset(tmp_path / "ds", target=60, max_new_tokens=64)
    out, log = tmp_path / "out", tmp_path / "cli.log"
    proc = start_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", out, "--progress", "quiet",
                     log=log)
    wait_for(lambda: (out / "T").is_dir() and _shard_lines(out / "T") >= 3, timeout_s=40, interval_s=0.01)
    port = re.search(r"on http://127\.0\.0\.1:(\d+)", (out / "T" / "server.log").read_text()
                     + log.read_text())
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert port is not None
    wait_for(lambda: not _listening(int(port.group(1))), timeout_s=10, interval_s=0.1)
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", out, "--progress", "quiet")
    assert r.returncode == 0, r.stderr
    assert_exact(out, 60)


def _listening(port: int) -> bool:
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout
    return bool(out.strip())
