"""What status, validate and the run lock tell a user, through the CLI as a subprocess: the whole
message and the exit code."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import orjson
import pytest
from cli_helpers import stored

from tests.pipeline_helpers import assert_exact, make_rows, run_cli, write_dataset

STARTED = "2026-03-01T11:02:03+00:00"
HMS = datetime.fromisoformat(STARTED).astimezone().strftime("%H:%M:%S")


# A run as the kernel sees it: it holds the flock of .lock (its file names its pid), until stdin closes.
HOLDER = """
import fcntl, os, socket, sys, orjson
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, orjson.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started_at": sys.argv[2]}))
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def holder(tmp_path: Path):
    (tmp_path / "out" / "T").mkdir(parents=True)
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "out" / "T" / ".lock"), STARTED],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "held\n"
    yield p
    p.communicate("")


@pytest.mark.e2e  # the process is the subject: make e2e
def test_a_live_holder_on_this_host_is_named_and_no_deletion_is_asked(tmp_path: Path, holder) -> None:
    toml = write_dataset(tmp_path / "cfg")
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", tmp_path / "out")
    where = tmp_path / "out" / "T"
    assert (r.returncode, r.stdout) == (4, "")
    assert r.stderr == (f"error: {where} is being written by another run on this host (pid {holder.pid}, started "
                        f"{HMS}). Wait for it to finish or stop it (kill {holder.pid}); when a run dies, the next "
                        "run takes its lock over by itself.\n")


@pytest.mark.e2e  # the process is the subject: make e2e
def test_a_dead_holders_lock_is_taken_over_without_asking(tmp_path: Path) -> None:
    """The store's takeovers (pid 1 after a container restart, another host on a local disk) are
    tests/store/test_lock.py's; here the note reaches the user and the run completes."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    toml = write_dataset(tmp_path / "cfg", target=10)
    (tmp_path / "out" / "T").mkdir(parents=True)
    (tmp_path / "out" / "T" / ".lock").write_bytes(orjson.dumps({"pid": p.pid, "host": socket.gethostname(),
                                                                "started_at": STARTED}))
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", tmp_path / "out",
                "--progress", "log")
    assert r.returncode == 0, r.stderr
    said = r.stdout + r.stderr
    assert f"took over the lock of a run that is gone (pid {p.pid}, started {HMS})" in said
    assert_exact(tmp_path / "out", 10)
    assert not (tmp_path / "out" / "T" / ".lock").exists()


def test_status_says_demo_is_not_part_of_the_total(tmp_path: Path) -> None:
    stored(tmp_path, "demo", 240, target=240, shard_max_samples=100, stats={"samples_per_s": 12.5, "tokens_per_s": 1250.0},
           meta={"finish_reason": "stop", "prompt_tokens": 10, "completion_tokens": 90})
    r = run_cli("status", "--output-dir", tmp_path)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == (
        "dataset  done/target  %       shards  prompt tok  compl tok  trunc  errors  rejects  state                    samples/s  tok/s  ETA\n"
        "-------  -----------  ------  ------  ----------  ---------  -----  ------  -------  -----------------------  ---------  -----  ----\n"
        "B1       0/30,000     0.0%    0       0           0          0.0%   0       0        not started              -          -      -\n"
        "B2       0/18,000     0.0%    0       0           0          0.0%   0       0        not started              -          -      -\n"
        "B6       0/20,000     0.0%    0       0           0          0.0%   0       0        not started              -          -      -\n"
        "B7       0/20,000     0.0%    0       0           0          0.0%   0       0        not started              -          -      -\n"
        "demo     240/240      100.0%  3       2.4k        21.6k      0.0%   0       0        finished (not in total)  12.5       1.2k   done\n"
        "-------  -----------  ------  ------  ----------  ---------  -----  ------  -------  -----------------------  ---------  -----  ----\n"
        "total    0/88,000     0.0%\n")


def test_status_says_source_exhausted(tmp_path: Path) -> None:
    toml = write_dataset(tmp_path / "cfg", rows=make_rows(15), target=20)
    out = tmp_path / "out"
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", out, "--progress", "quiet",
                "--proceed-anyway")  # past the pre-launch check, which refuses a source short of the target
    assert r.returncode == 5 and "15/20 samples" in r.stdout and "5 samples short of the target" in r.stdout, r.stdout
    assert_exact(out, 15)
    r = run_cli("status", "--dataset", toml, "--output-dir", out, "--config-dir", tmp_path / "cfg")
    assert (r.returncode, r.stderr) == (0, "")
    head, rule, row, blank, gpu_head, gpu_row, projection = r.stdout.splitlines()
    assert (blank, gpu_head) == ("", "GPU-hours (tp × dp × servers × wall time):")
    assert re.fullmatch(r"  T: \d+\.\d\d GPU-h over \S+ for 15 samples = \d+\.\d\d GPU-h per 1,000 samples "
                        r"\(tp 8 × dp 1 × 1 server\)", gpu_row), gpu_row
    assert projection == "  job: no projected completion: T cannot reach its target (source exhausted)"
    cells = [c.strip() for c in row.split("  ") if c.strip()]
    assert (cells[:4], cells[-4], cells[-1]) == (["T", "15/20", "75.0%", "1"], "source exhausted", "-")
    j = run_cli("status", "--json", "--dataset", toml, "--output-dir", out, "--config-dir", tmp_path / "cfg")
    t = orjson.loads(j.stdout)["datasets"]["T"]
    assert (j.returncode, t["state"], t["done"], t["remaining"], t["eta_s"]) == (0, "source exhausted", 15, 5, None)


def test_validate_with_no_samples_says_there_is_nothing_to_validate(tmp_path: Path) -> None:
    stored(tmp_path, "B7", 0, target=10)  # a run that wrote nothing: an empty shard and a manifest
    r = run_cli("validate", "--dataset", "B7", "--output-dir", tmp_path)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"error: {tmp_path}/B7: nothing to validate: no samples yet (1 shard, all empty). "
                        "Generate it first (make generate DATASET=B7).\n")
