"""SIGINT/SIGTERM at any phase of `generate` end with 130/143, the summary line and the lock released, also with
the console's reader gone (`| tee log`); SIGHUP stops a run as SIGTERM does; a signal during the CLI's imports
is held; a second signal right after the first counts only what was committed. Real processes, synchronised on
what they write or import, never on sleeps."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import time
from pathlib import Path

import anyio
import orjson
import pytest

from gen_pipeline.config.dataset import load_dataset_config
from gen_pipeline.run import run_job
from gen_pipeline.run.setup import run_options
from gen_pipeline.run.shutdown import hold_signals
from gen_pipeline.store.lock import read_lock
from sglang_sim.testing import start_sim

from pipeline_helpers import (
    REPO,
    SIM_FAST,
    _shard_lines,
    assert_exact,
    cli_cmd,
    make_rows,
    run_cli,
    sim_profile,
    start_cli,
    wait_lines,
    wait_until,
    write_dataset,
)

SIM = [*SIM_FAST, "--max-total-tokens", "20000", "--time-scale", "0.3"]  # a run of 300: long enough to interrupt


def config_dir(tmp_path: Path, name: str, extra_args: list[str]) -> Path:
    base = ["--sim-profile", "fast", "--time-scale", "1", "--sim-output-mean", "160", "--sim-output-spread", "0.6"]
    return sim_profile(tmp_path, name, base + extra_args, stop_grace_s=3)


def assert_stopped(out: Path, text: str, name: str, done: int | None = None) -> None:
    """The summary line of a stopped run (in the console text and in run.log), the lock released."""
    run_log = (out / "T" / "run.log").read_text()
    tail = {"SIGTERM": "stopped (SIGTERM); run the same command to resume.",
            "SIGINT": "interrupted (SIGINT); run the same command to resume."}[name]
    summaries = [x for x in run_log.splitlines() if x.endswith(tail) and " T: " in x]
    assert len(summaries) == 1, run_log[-3000:]
    if done is not None:
        assert f" T: {done}/300 samples" in summaries[0], summaries
    lock = read_lock(out / "T")
    assert lock is None or not lock.held, lock
    assert "Traceback" not in text and "Traceback" not in run_log, text[-3000:]


def test_sigterm_during_server_start_up_stops_it_with_the_summary(tmp_path: Path) -> None:
    cfg = config_dir(tmp_path, "loading", ["--sim-never-healthy", "--sim-startup-log", "SIM-LOADING-WEIGHTS"])
    toml = write_dataset(tmp_path / "ds", target=300, rows=make_rows(340))
    out, log = tmp_path / "out", tmp_path / "cli.log"
    proc = start_cli("generate", "--dataset", toml, "--server", "loading", "--config-dir", cfg, "--output-dir", out,
                     "--progress", "log", log=log)
    server_log = out / "T" / "server.log"
    wait_until(lambda: server_log.exists() and "SIM-LOADING-WEIGHTS" in server_log.read_text(), proc, 60)
    os.kill(proc.pid, signal.SIGTERM)  # the CLI only (a scheduler's SIGTERM): it stops its server itself
    rc = proc.wait(timeout=60)
    text = log.read_text()
    assert rc == 143, text[-3000:]
    assert "SIGTERM during server start-up: stopping the server; run the same command to resume." in text, text
    assert text.rstrip().splitlines()[-1] == ("T: 0/300 samples (0.0%), +0 this run in 0s; stopped (SIGTERM); "
                                              "run the same command to resume."), text[-2000:]
    assert_stopped(out, text, "SIGTERM", done=0)


def test_third_sigterm_while_shutting_down_keeps_the_summary(tmp_path: Path) -> None:
    cfg = config_dir(tmp_path, "slowish", ["--time-scale", "0.3"])
    toml = write_dataset(tmp_path / "ds", target=300, rows=make_rows(340))
    out, log = tmp_path / "out", tmp_path / "cli.log"
    proc = start_cli("generate", "--dataset", toml, "--server", "slowish", "--config-dir", cfg, "--output-dir", out,
                     "--progress", "log", "--drain-grace-s", "60", log=log)
    wait_lines(out / "T", 20, proc, 120)
    os.kill(proc.pid, signal.SIGTERM)
    wait_until(lambda: "SIGTERM: no new requests" in log.read_text(), proc)
    os.kill(proc.pid, signal.SIGTERM)
    wait_until(lambda: "SIGTERM again: cancelling" in log.read_text(), proc)
    os.kill(proc.pid, signal.SIGTERM)  # while the requests end, the server stops, the stores commit
    rc = proc.wait(timeout=60)
    text = log.read_text()
    assert rc == 143, text[-3000:]
    assert_stopped(out, text, "SIGTERM")


def _interrupt_with_reader_gone(tmp_path: Path, *, stderr_too: bool) -> tuple[int, str, Path]:
    """`generate ... | tee log` (2>&1 when stderr_too), Ctrl-C: the test is tee; it reads the pipe until the run
    is mid-way, then closes it and sends SIGINT to the group, so the CLI's next write finds no reader."""
    toml = write_dataset(tmp_path / "ds", target=300, rows=make_rows(340))
    out, err_path = tmp_path / "out", tmp_path / "stderr.log"
    with start_sim(SIM) as sim, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            cli_cmd("generate", "--dataset", toml, "--server-url", sim.url, "--output-dir", out, "--progress", "log",
                    "--drain-grace-s", "0.5"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT if stderr_too else err, cwd=REPO,
            start_new_session=True)
        assert proc.stdout is not None
        seen = b""
        while b"attached to" not in seen:  # stdout carries the events (the attach line among them)
            line = proc.stdout.readline()
            assert line, seen.decode()[-2000:]
            seen += line
        wait_lines(out / "T", 20, proc)
        proc.stdout.close()  # tee is gone
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=60)
    return rc, err_path.read_text(), out


@pytest.mark.parametrize("stderr_too", [False, True], ids=["stdout", "stdout-and-stderr"])
def test_ctrl_c_with_the_reader_gone_exits_130_with_the_summary_in_run_log(tmp_path: Path, stderr_too: bool) -> None:
    rc, stderr, out = _interrupt_with_reader_gone(tmp_path, stderr_too=stderr_too)  # stderr: "" when piped too
    assert rc == 130, stderr[-3000:]
    assert "Logging error" not in stderr and "BrokenPipe" not in stderr, stderr[-3000:]
    assert_stopped(out, stderr, "SIGINT")


@pytest.mark.parametrize(("name", "code"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_signal_while_a_source_loads_abandons_the_load(tmp_path: Path, name: str, code: int) -> None:
    """A resume (12 of 30 written) whose source never loads (a FIFO nobody writes, as a stalled file system): the
    signal ends it at once with the summary, the claim released untouched; a third run resumes to exactly 30."""
    rows = make_rows(40)
    toml = write_dataset(tmp_path / "ds", target=30, rows=rows)
    data, saved = tmp_path / "ds" / "T.jsonl", tmp_path / "T.jsonl.saved"
    out, log = tmp_path / "out", tmp_path / "cli.log"
    with start_sim(SIM_FAST) as sim:
        args = ("generate", "--dataset", toml, "--server-url", sim.url, "--output-dir", out, "--progress", "log")
        first = run_cli(*args, "--limit", "12")
        assert first.returncode == 0, first.stdout + first.stderr
        shards = {p.name: p.read_bytes() for p in (out / "T").glob("shard-*.jsonl")}
        manifest = orjson.loads((out / "T" / "manifest.json").read_bytes())
        data.rename(saved)
        os.mkfifo(data)
        proc = start_cli(*args, log=log)
        wait_until(lambda: "T: loading the source T.jsonl" in log.read_text(), proc, 120)
        os.kill(proc.pid, getattr(signal, name))
        try:
            rc = proc.wait(timeout=30)  # a bound for the hang this test is about; it ends in about a second
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        text = log.read_text()
        assert rc == code, text[-3000:]
        assert "during set-up: stopping it (a source still loading is left behind)" in text, text
        tail = {"SIGTERM": "stopped (SIGTERM)", "SIGINT": "interrupted (SIGINT)"}[name]
        line = f"T: 12/30 samples (40.0%), +0 this run in 0s; {tail}; run the same command to resume."
        assert text.rstrip().splitlines()[-1] == line, text[-2000:]
        assert_stopped(out, text, name)
        assert {p.name: p.read_bytes() for p in (out / "T").glob("shard-*.jsonl")} == shards  # nothing lost
        assert orjson.loads((out / "T" / "manifest.json").read_bytes())["runs"] == manifest["runs"]  # no run
        data.unlink()
        saved.rename(data)
        last = run_cli(*args)  # takes the lock, resumes where the first run stopped
        assert last.returncode == 0, last.stdout + last.stderr
    assert_exact(out, 30)
    assert "+18 this run" in last.stdout, last.stdout


def test_signal_before_the_job_listens_is_held_and_stops_the_set_up(tmp_path: Path) -> None:
    """The CLI holds SIGINT/SIGTERM from its start (cli/commands.py): one that came before the job
    listened (imports, configs) stops the set-up the moment it does: 143, the summary, no folder made."""
    toml = write_dataset(tmp_path / "ds", target=30)
    cfg = load_dataset_config(toml)
    opts, _ = run_options([cfg], output_root=tmp_path / "out", server_urls=["http://127.0.0.1:9"], model="m")
    with hold_signals():
        os.kill(os.getpid(), signal.SIGTERM)  # held: without hold_signals it ends pytest
        summary = anyio.run(run_job, [cfg], opts)
    assert summary.exit_code == 143
    assert summary.lines() == ["T: 0/30 samples (0.0%), +0 this run in 0s; stopped (SIGTERM); run the same command "
                               "to resume."]
    assert not (tmp_path / "out").exists()


def committed(folder: Path) -> int:
    """Samples the manifest commits: its sealed shards' counts plus the open shard's."""
    m = orjson.loads((folder / "manifest.json").read_bytes())
    return sum(s["samples"] for s in m["sealed"]) + int((m.get("open") or {}).get("committed_samples", 0))


def summary_line(text: str) -> str:
    """The last summary line of console text or of run.log (whose lines start with a time and a level)."""
    lines = [x.split(" INFO ", 1)[-1] for x in text.splitlines()]
    return next(x for x in reversed(lines) if x.startswith("T: ") and " samples (" in x)


def test_sighup_with_the_terminal_gone_stops_the_run_like_sigterm(tmp_path: Path) -> None:
    """The CLI on a terminal (a pty); the terminal closes (its master end), then SIGHUP: 129, the summary
    in run.log, the lock released, every line written committed, no traceback."""
    toml = write_dataset(tmp_path / "ds", target=300, rows=make_rows(340))
    out = tmp_path / "out"
    master, slave = pty.openpty()
    with start_sim(SIM) as sim:
        proc = subprocess.Popen(cli_cmd("generate", "--dataset", toml, "--server-url", sim.url, "--output-dir", out,
                                        "--progress", "log", "--drain-grace-s", "0.5"),
                                stdin=slave, stdout=slave, stderr=slave, cwd=REPO, start_new_session=True)
        os.close(slave)
        try:
            wait_lines(out / "T", 20, proc, 120)
        finally:
            os.close(master)  # the terminal is gone: the CLI's next console write fails (EIO)
        os.kill(proc.pid, signal.SIGHUP)
        rc = proc.wait(timeout=60)
    run_log = (out / "T" / "run.log").read_text()
    assert rc == 129, run_log[-3000:]
    line = summary_line(run_log)
    assert line.endswith("; stopped (SIGHUP: the terminal closed); run the same command to resume."), line
    written = _shard_lines(out / "T")
    assert f"T: {written}/300 samples ({100 * written / 300:.1f}%), +{written} this run in " in line, (line, written)
    assert committed(out / "T") == written
    lock = read_lock(out / "T")
    assert lock is None or not lock.held, lock
    assert "Traceback" not in run_log


def test_sigterm_while_the_cli_imports_is_held_until_the_run_listens(tmp_path: Path) -> None:
    """SIGTERM sent to itself as the CLI imports its configuration code (a sitecustomize hook): the set-up stops
    with the summary and 143, nothing made."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, signal, sys\n"
        "class _Trap:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'gen_pipeline.config':\n"
        "            sys.meta_path.remove(self)\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Trap())\n")
    toml = write_dataset(tmp_path / "ds", target=30)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])}
    r = subprocess.run(cli_cmd("generate", "--dataset", toml, "--server-url", "http://127.0.0.1:9", "--output-dir",
                               out), capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert r.returncode == 143, (r.returncode, r.stdout, r.stderr)
    assert r.stdout.splitlines()[-2:] == [
        "SIGTERM during set-up: stopping it (a source still loading is left behind); run the same command to resume.",
        "T: 0/30 samples (0.0%), +0 this run in 0s; stopped (SIGTERM); run the same command to resume."], r.stdout
    assert not out.exists()


def test_second_sigterm_right_after_the_first_counts_only_what_was_committed(tmp_path: Path) -> None:
    """A second SIGTERM the moment the first one's drain began (the second cancels the requests the first
    let drain): "+N this run" is the samples the shards hold and the manifest commits, in each of three runs."""
    toml = write_dataset(tmp_path / "ds", target=3000, rows=make_rows(3000))
    out = tmp_path / "out"
    with start_sim(SIM) as sim:
        for i in range(3):
            before = _shard_lines(out / "T") if (out / "T").exists() else 0
            log = tmp_path / f"cli{i}.log"
            proc = start_cli("generate", "--dataset", toml, "--server-url", sim.url, "--output-dir", out,
                             "--progress", "log", "--drain-grace-s", "30", log=log)
            wait_lines(out / "T", before + 20, proc, 120)
            os.kill(proc.pid, signal.SIGTERM)
            while "SIGTERM: no new requests" not in log.read_text():  # read every ms: the second within ~50 ms
                assert proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.001)
            os.kill(proc.pid, signal.SIGTERM)  # two at once would be one: the kernel merges a pending signal
            rc = proc.wait(timeout=60)
            text = log.read_text()
            assert rc == 143, text[-3000:]
            written = _shard_lines(out / "T")
            assert committed(out / "T") == written
            line = summary_line(text)
            head = f"T: {written:,}/3,000 samples ({100 * written / 3000:.1f}%), +{written - before} this run in "
            assert head in line, (line, written, before)
