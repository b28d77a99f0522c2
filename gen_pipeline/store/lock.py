"""The run lock of a dataset folder, outputs/B2/.lock ({"pid", "host", "started_at"[, "slurm_job_id",
"slurm_restart"]}), flock()ed by the writing run. Sync. The flock is the truth, not the pid (pids wrap and containers
reuse them): a free flock is taken over, a held one refused naming the holder. A lock of another host on a shared
filesystem, whose flock this host may not see, is refused, unless a later run of the holder's own SLURM job takes it
(SLURM starts a job's next run only once the previous one ended).
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import orjson

from gen_pipeline.display import display_path
from gen_pipeline.errors import LockedError, StoreError
from gen_pipeline.store.manifest import now_iso

LOCK_NAME = ".lock"
# A lock file with no readable content is being created right now, unless it is older than this.
_EMPTY_LOCK_GRACE_S = 5.0
# `status` probes a lock's flock for an instant (LOCK_SH): a run taking the lock over retries this
# long before it believes the flock is held by a live run.
_PROBE_RACE_S = 0.25


def slurm_run() -> tuple[str, int] | None:
    """(SLURM_JOB_ID, SLURM_RESTART_COUNT) in a SLURM job, else None: a requeued job keeps its id, counts restarts."""
    job = os.environ.get("SLURM_JOB_ID", "").strip()
    restart = os.environ.get("SLURM_RESTART_COUNT", "").strip()
    return (job, int(restart) if restart.isdigit() else 0) if job else None


@dataclass(frozen=True)
class LockInfo:
    """Who holds (or held) a dataset's lock, as its file says; `held` is whether its flock is held now
    (None: not known, e.g. a lock of another host); `problem` says why the file is no lock at all."""

    pid: int | None
    host: str
    started_at: str
    age_s: float
    held: bool | None = None
    problem: str = ""
    slurm: tuple[str, int] | None = None  # the holder's (SLURM job id, restart count), if it ran in one

    @property
    def local(self) -> bool:
        return self.host == socket.gethostname()

    @property
    def alive(self) -> bool:
        """True when a run holds the lock (assumed for another host: it cannot be checked from here)."""
        if self.pid is None:  # no content yet: a run creating it (it takes the flock just after) or a crash then
            return bool(self.held) or self.age_s < _EMPTY_LOCK_GRACE_S
        if self.held is not None and self.local:
            return self.held
        return pid_alive(self.pid) if self.local else not self.superseded

    @property
    def superseded(self) -> bool:
        """This process is a later run (requeue) of the SLURM job that wrote the lock."""
        me = slurm_run()
        return self.slurm is not None and me is not None and me[0] == self.slurm[0] and me[1] > self.slurm[1]

    def started_hms(self) -> str:
        try:
            return datetime.fromisoformat(self.started_at).astimezone().strftime("%H:%M:%S")
        except ValueError:
            return self.started_at or "at an unknown time"


def pid_alive(pid: int, *, group: bool = False) -> bool:
    """Is process `pid` (with `group`: any process of process group `pid`) running on this host? A
    zombie (killed, not yet reaped) counts as gone; a group's leader being one says nothing of the rest."""
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if group:
        return True
    try:  # /proc/<pid>/stat: "pid (comm) S ..."; state Z = exited, waiting for its parent
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def read_lock(folder: Path) -> LockInfo | None:
    """The lock file's content and whether its flock is held now, or None when there is no lock."""
    path = folder / LOCK_NAME
    try:
        age_s = time.time() - path.stat().st_mtime
        if path.is_dir():
            return LockInfo(None, "", "", age_s, problem=f"{LOCK_NAME} is a directory")
        raw, held = path.read_bytes(), _probe(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return LockInfo(None, "", "", 0.0, problem=f"{LOCK_NAME} cannot be read: {e.strerror or e}")
    try:
        d = orjson.loads(raw)
        slurm = (str(d["slurm_job_id"]), int(d.get("slurm_restart") or 0)) if d.get("slurm_job_id") else None
        return LockInfo(int(d["pid"]), str(d.get("host", "")), str(d.get("started_at", "")), age_s, held, slurm=slurm)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return LockInfo(None, "", "", age_s, held)


def _probe(path: Path) -> bool | None:
    """Is the flock of `path` held? Takes a shared flock for an instant (see _PROBE_RACE_S)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return not _flock_within(fd, 0.0, fcntl.LOCK_SH)
        finally:
            os.close(fd)  # drops the probe's flock
    except OSError:
        return None


def locked_message(folder: Path, info: LockInfo) -> str:
    """Who holds the lock and what to do (a lock on this host whose holder is gone is taken over without asking)."""
    where = display_path(folder)
    if info.pid is None:
        return (f"{where} is locked by a run that is starting right now (its {LOCK_NAME} has no content yet). "
                "Wait for it, or run again in a few seconds.")
    if not info.local:
        job = f"SLURM job {info.slurm[0]}, " if info.slurm else ""
        stop, gone = (f" (scancel {info.slurm[0]})", f" (squeue -j {info.slurm[0]} shows nothing)") if info.slurm \
            else ("", "")
        return (f"{where} is being written by a run on host {info.host or 'unknown'} (pid {info.pid}, {job}started "
                f"{info.started_hms()}); this host cannot tell whether it still runs. Wait for it or stop it "
                f"there{stop}; if it is gone{gone}, delete {where}/{LOCK_NAME}.")
    if not pid_alive(info.pid):
        return (f"{where} is locked by a live run, but not by pid {info.pid} that {where}/{LOCK_NAME} names (no such "
                "process here): a run in another container or pid namespace on this host shares this folder. Wait "
                "for it or stop it there; its lock frees itself when it ends.")
    return (f"{where} is being written by another run on this host (pid {info.pid}, started {info.started_hms()}). "
            f"Wait for it to finish or stop it (kill {info.pid}); when a run dies, the next run takes its lock "
            "over by itself.")


class FolderGone(StoreError):
    """The folder vanished before its lock was created (a refused run removed the empty folder it made): remake it."""


class RunLock:
    """The `.lock` of one dataset folder, held by this process until `release()`. Created with O_CREAT|O_EXCL
    and flock()ed: two runs taking over one stale lock at the same time cannot both win."""

    def __init__(self, folder: Path, fd: int, note: str | None):
        self.folder, self._fd, self.note = folder, fd, note

    @classmethod
    def acquire(cls, folder: Path) -> RunLock:
        """Take the lock; raises LockedError if a live run holds it, StoreError if it cannot be used."""
        path = folder / LOCK_NAME
        for _ in range(20):  # retried only when the lock vanished or was replaced under us
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
            except FileExistsError:
                if (taken := cls._take_over(folder, path)) is not None:
                    return taken
                continue
            except FileNotFoundError:
                raise FolderGone(f"{display_path(folder)} vanished while its lock was being taken: another run "
                                 "removed it as it gave up. Run again.") from None
            except OSError as e:
                raise _unusable(folder, e) from None
            _flock_within(fd, math.inf)  # another run checking this new lock holds it for a moment
            _write_lock(fd)
            return cls(folder, fd, None)
        raise LockedError(f"Could not take {display_path(path)}: it keeps changing. Is another run starting?")

    @classmethod
    def _take_over(cls, folder: Path, path: Path) -> RunLock | None:
        """Take a lock whose flock is free (its run is gone); None = the file vanished, try again."""
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise _unusable(folder, e) from None
        if not _flock_within(fd, _PROBE_RACE_S):
            os.close(fd)
            raise LockedError(locked_message(folder, read_lock(folder) or LockInfo(None, "", "", 0.0)))
        info = read_lock(folder) if _same_file(fd, path) else None  # None: replaced or gone, try again
        if info is None or (info.pid is None and info.age_s < _EMPTY_LOCK_GRACE_S) or \
                (info.pid is not None and not info.local and not info.superseded and shared_filesystem(folder)):
            os.close(fd)
            if info is None:
                return None
            raise LockedError(locked_message(folder, info))
        _write_lock(fd)
        return cls(folder, fd, _takeover_note(info))

    def release(self) -> None:
        """Delete the lock file and drop the flock (idempotent)."""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            if _same_file(self._fd, self.folder / LOCK_NAME):
                (self.folder / LOCK_NAME).unlink()
        os.close(self._fd)
        self._fd = -1


def _takeover_note(info: LockInfo) -> str:
    if info.pid is not None and info.superseded and info.slurm is not None:
        return (f"took over the lock of SLURM job {info.slurm[0]}'s previous run (pid {info.pid} on "
                f"{info.host or 'unknown'}, started {info.started_hms()}): the job was requeued")
    if info.pid is None:
        who, now = "an unknown process", ""
    else:
        who = f"pid {info.pid}" + ("" if info.local else f" on host {info.host or 'unknown'}")
        now = f"; pid {info.pid} is another process now" if info.local and pid_alive(info.pid) else ""
    return f"took over the lock of a run that is gone ({who}, started {info.started_hms()}{now})"


# Filesystems whose flock one host owns whole; any other (nfs, lustre, gpfs, cifs, fuse.*) may be
# shared by hosts that do not see each other's flocks.
_LOCAL_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs", "tmpfs", "ramfs", "overlay"})


def shared_filesystem(folder: Path) -> bool:
    """Is `folder` on a filesystem other hosts may mount (by /proc/self/mountinfo; True when unknown)?"""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
        real = os.path.realpath(folder)
    except OSError:
        return True
    best, fstype = "", ""
    for line in lines:  # "36 35 98:0 / /mnt rw,noatime master:1 - ext3 /dev/root rw": mount point 5th, type after -
        left, _, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if len(fields) < 5 or not kind:
            continue
        mount = fields[4].replace("\\040", " ")
        if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
            best, fstype = mount, kind[0]
    return fstype not in _LOCAL_FILESYSTEMS


def _unusable(folder: Path, e: OSError) -> StoreError:
    where = display_path(folder)
    if isinstance(e, IsADirectoryError):
        return StoreError(f"{where}/{LOCK_NAME} is a directory, not a lock file (gen_pipeline never makes one). "
                          f"Remove it (rmdir {where}/{LOCK_NAME}) and run again.")
    return StoreError(f"Cannot write to {where}: {e.strerror or e}. "
                      "Fix the folder's permissions or choose another output folder.")


def _flock_within(fd: int, wait_s: float, how: int = fcntl.LOCK_EX) -> bool:
    """flock, retried for `wait_s`: a status probe holds a lock's flock for an instant only."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _write_lock(fd: int) -> None:
    lock: dict[str, object] = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": now_iso()}
    if (job := slurm_run()) is not None:
        lock |= {"slurm_job_id": job[0], "slurm_restart": job[1]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, orjson.dumps(lock), 0)
    os.fsync(fd)
