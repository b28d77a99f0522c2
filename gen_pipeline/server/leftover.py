"""A launched server's record (`server.pid.json` beside its log), checked at the next start: a server left behind
is stopped only when provably ours and orphaned (same pid and start time in /proc, its gen-pipeline gone);
anything else alive is refused (always, off Linux), never started beside (two model loads on one GPU)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio

from gen_pipeline.display import display_path
from gen_pipeline.errors import ServerStartupError
from gen_pipeline.store.lock import pid_alive

log = logging.getLogger(__name__)

RECORD_NAME = "server.pid.json"
GONE_AFTER_KILL_S = 10.0  # a group SIGKILLed is reaped by init within moments; longer means stuck (D state)


@dataclass(frozen=True)
class ServerRecord:
    pid: int  # the group's leader (parent_watch, or the server itself where it is exec'd bare)
    started: int | None  # its start time (/proc/PID/stat field 22, clock ticks since boot); None off Linux
    url: str
    owner_pid: int  # the gen-pipeline process that started it
    owner_started: int | None


def process_started(pid: int) -> int | None:
    """The start time of `pid` (clock ticks since boot), None when it is gone or /proc is absent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])  # field 22; the name (field 2) may hold spaces


def write_record(folder: Path, pid: int, url: str) -> None:
    """Record a server just started (tmp + rename: a reader never sees half)."""
    rec = ServerRecord(pid, process_started(pid), url, os.getpid(), process_started(os.getpid()))
    tmp = folder / f".{RECORD_NAME}.tmp"
    tmp.write_text(json.dumps(asdict(rec)) + "\n")
    tmp.replace(folder / RECORD_NAME)


def remove_record(folder: Path, pid: int) -> None:
    """Forget the server `pid` (stopped); a record of another server is kept."""
    rec = read_record(folder)
    if rec is not None and rec.pid == pid:
        with contextlib.suppress(FileNotFoundError):
            (folder / RECORD_NAME).unlink()


def read_record(folder: Path) -> ServerRecord | None:
    try:
        return ServerRecord(**json.loads((folder / RECORD_NAME).read_text()))
    except (OSError, ValueError, TypeError):
        return None  # none, or unreadable: nothing to go by


def group_alive(pgid: int) -> bool:
    """True while any process of group `pgid` exists."""
    return pid_alive(pgid, group=True)


def _ours(rec: ServerRecord) -> bool | None:
    """Whether the live group `rec.pid` is the server we recorded: True (the same leader: a pid and its
    start time name one process; or the leader gone and its group left: a group's id is not reused while
    it has members), False (another process has the pid since), None (cannot tell: no /proc)."""
    if rec.started is None:
        return None
    started = process_started(rec.pid)
    return started is None or started == rec.started


async def stop_leftover(folder: Path, grace_s: float) -> None:
    """Before starting a server whose record lives in `folder`: stop the one an earlier run left (provably
    ours and orphaned), or raise ServerStartupError naming its pid. Does nothing when none is left."""
    rec = read_record(folder)
    if rec is None:
        return
    where = display_path(folder / RECORD_NAME)
    ours = _ours(rec) if group_alive(rec.pid) else False
    if ours is False:
        remove_record(folder, rec.pid)
        return
    if ours is None:
        raise ServerStartupError(
            f"A server recorded in {where} (pid {rec.pid}, {rec.url}) may still be running, and it cannot be "
            f"told apart from another process here. Check it (ps -o pid,stat,args -g {rec.pid}); if it is "
            f"the old server, stop it (kill -TERM -{rec.pid}), then run the same command again.")
    if rec.owner_pid != os.getpid() and process_started(rec.owner_pid) == rec.owner_started:  # its run lives
        raise ServerStartupError(
            f"The server pid {rec.pid} ({rec.url}) recorded in {where} is still run by gen-pipeline pid "
            f"{rec.owner_pid}. Stop that run first (kill {rec.owner_pid}: it stops its server), or wait for "
            "it to end, then run the same command again.")
    log.warning("a server an earlier run started (pid %d, %s) is still running since that run was killed: "
                "stopping it before starting a new one (SIGTERM, SIGKILL after %g s)", rec.pid, rec.url, grace_s)
    await _stop_group(rec.pid, grace_s)
    if group_alive(rec.pid):
        raise ServerStartupError(
            f"The server pid {rec.pid} an earlier run left behind did not end on SIGKILL within "
            f"{GONE_AFTER_KILL_S:.0f} s (stuck in the kernel: a GPU driver call?). Check ps -o pid,stat,args "
            f"-g {rec.pid} and nvidia-smi; run the same command again once it is gone.")
    remove_record(folder, rec.pid)
    log.warning("stopped the server pid %d an earlier run left behind", rec.pid)


async def _stop_group(pgid: int, grace_s: float) -> None:
    """SIGTERM the group, wait up to `grace_s` for it to end, SIGKILL it, wait for it to be gone."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, GONE_AFTER_KILL_S)):
        killpg(pgid, sig)
        if not await wait_group_gone(pgid, wait_s, poll_s=0.05):
            return


def killpg(pgid: int, sig: int) -> None:
    """Signal process group `pgid`; one gone (or no longer ours) is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def wait_group_gone(pgid: int, timeout_s: float, poll_s: float) -> bool:
    """Wait up to `timeout_s` for group `pgid` to end; whether it is still alive then. Killed grandchildren
    are reaped by init, not us: nothing signals their end, so this polls."""
    with anyio.move_on_after(timeout_s):
        while group_alive(pgid):  # noqa: ASYNC110 - nothing signals a process group's end: poll it
            await anyio.sleep(poll_s)
    return group_alive(pgid)
