"""SIGHUP (a closed terminal) stops a run as SIGTERM does; a signal during the CLI's imports is held; a
second signal right after the first leaves "+N this run" equal to what was committed. Real processes,
synchronised on what they write or import, never on sleeps."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import time
from pathlib import Path

import orjson

from gen_pipeline.store.lock import read_lock
from sglang_sim.testing import start_sim

from pipeline_helpers import REPO, SIM_FAST, cli_cmd, make_rows, start_cli, wait_lines, write_dataset

SIM = [*SIM_FAST, "--max-total-tokens", "20000", "--time-scale", "0.3"]  # a run of 300: long enough to interrupt


def shard_lines(folder: Path) -> int:
    return sum(len(p.read_bytes().splitlines()) for p in folder.glob("shard-*.jsonl"))


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
    written = shard_lines(out / "T")
    assert f"T: {written}/300 samples ({100 * written / 300:.1f}%), +{written} this run in " in line, (line, written)
    assert committed(out / "T") == written
    lock = read_lock(out / "T")
    assert lock is None or not lock.held, lock
    assert "Traceback" not in run_log


def test_sigterm_while_the_cli_imports_is_held_until_the_run_listens(tmp_path: Path) -> None:
    """SIGTERM sent by the CLI process to itself the moment it imports its configuration code (a
    sitecustomize import hook: the heavy imports of its first second, deterministically): the set-up
    stops with the summary and 143, nothing made."""
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
            before = shard_lines(out / "T") if (out / "T").exists() else 0
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
            written = shard_lines(out / "T")
            assert committed(out / "T") == written
            line = summary_line(text)
            head = f"T: {written:,}/3,000 samples ({100 * written / 3000:.1f}%), +{written - before} this run in "
            assert head in line, (line, written, before)
