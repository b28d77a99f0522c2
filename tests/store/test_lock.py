"""The run lock: the flock decides, not the pid. A holder of the flock is refused (by its pid: tests/cli's
test_a_live_holder_on_this_host_...); a stale lock naming a live unrelated pid is taken over, as status says. Another
host's lock: test_store's test_a_requeued_slurm_job_..."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import orjson
import pytest
from store_helpers import dead_pid, make

import gen_pipeline.store.lock as lock_mod
from gen_pipeline.display import display_path
from gen_pipeline.errors import LockedError
from gen_pipeline.reports.status import read_status

STARTED = "2026-03-01T11:02:03+00:00"
HMS = datetime.fromisoformat(STARTED).astimezone().strftime("%H:%M:%S")

# A run as the kernel sees it: holds the flock of .lock, its file names pid argv[2].
HOLDER = """
import fcntl, os, sys, orjson
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, orjson.dumps({"pid": int(sys.argv[2]), "host": sys.argv[3], "started_at": sys.argv[4]}))
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that has nothing to do with any lock (whatever got the dead run's pid)."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield p
    p.communicate(b"")


@pytest.mark.e2e  # the process is the subject: make e2e
def test_a_holder_whose_pid_this_host_cannot_see_is_not_named_for_kill(tmp_path: Path) -> None:
    dead = dead_pid()  # a run in another pid namespace holds the flock: its file names a pid that is not it here
    (tmp_path / "B2").mkdir()
    args = [str(tmp_path / "B2" / ".lock"), str(dead), socket.gethostname(), STARTED]
    with subprocess.Popen([sys.executable, "-c", HOLDER, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as p:
        assert p.stdout is not None and p.stdout.readline() == "held\n"  # the flock is held from here on
        with pytest.raises(LockedError) as e:
            make(tmp_path).open()  # leaving `with` closes its stdin: it exits, its flock with it
    where = display_path(tmp_path / "B2")
    assert str(e.value) == (f"{where} is locked by a live run, but not by pid {dead} that {where}/.lock names (no such "
                            "process here): a run in another container or pid namespace on this host shares this "
                            "folder. Wait for it or stop it there; its lock frees itself when it ends.")
    assert "kill" not in str(e.value)


@pytest.mark.e2e  # the process is the subject: make e2e
@pytest.mark.parametrize("who", ["pid 1 (a container restart)", "an unrelated live process (a reused pid)"])
def test_a_stale_lock_naming_a_live_unrelated_pid_is_taken_over(tmp_path: Path, sleeper, who: str) -> None:
    pid = 1 if who.startswith("pid 1") else sleeper.pid
    (tmp_path / "B2").mkdir()
    (tmp_path / "B2" / ".lock").write_bytes(orjson.dumps({"pid": pid, "host": socket.gethostname(),
                                                          "started_at": STARTED}))
    assert read_status(tmp_path, "B2", 10).state == f"died (pid {pid} gone)"
    with make(tmp_path) as s:
        state = s.open()
        assert state.notes == [f"took over the lock of a run that is gone (pid {pid}, started {HMS}; pid {pid} is "
                               "another process now)"]
        assert orjson.loads((tmp_path / "B2" / ".lock").read_bytes())["pid"] == os.getpid()
    assert not (tmp_path / "B2" / ".lock").exists()


def test_the_filesystem_of_a_folder_is_read_from_mountinfo(tmp_path: Path) -> None:
    assert lock_mod.shared_filesystem(Path("/proc")) is True  # proc: not a disk this host owns
    fstype = next(line.split(" - ")[1].split()[0] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                  if line.split()[4] == "/")
    assert lock_mod.shared_filesystem(Path("/")) is (fstype not in lock_mod._LOCAL_FILESYSTEMS)
