"""One server process, in its own session with output to a file, stopped as a group: SGLang forks schedulers and
detokenizers that `Process.aclose()` leaves behind, and a pipe a grandchild holds open would hang."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

import anyio
from anyio.abc import Process

from gen_pipeline.server import logfile, parent_watch
from gen_pipeline.server.leftover import killpg, remove_record, wait_group_gone, write_record
from gen_pipeline.server.log_advice import COMMAND_ECHO


class ServerProcess:
    """A started server; `returncode` is None while it runs."""

    def __init__(self, proc: Process, log_path: Path):
        self.proc, self.log_path = proc, log_path
        self.pid = self.pgid = proc.pid  # leader of its own session/group
        self.started_s = time.monotonic()

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_s

    @classmethod
    async def start(cls, command: list[str], env: dict[str, str], log_path: Path, *,
                    stop_grace_s: float = 30.0, url: str = "") -> ServerProcess:
        """Rotate the log, spawn `command` writing to it and record it beside the log (server/leftover.py);
        raises OSError if it cannot be executed. `stop_grace_s`: what its watcher gives it between SIGTERM
        and SIGKILL if we die (server/parent_watch.py)."""
        def open_log() -> BinaryIO:
            logfile.rotate(log_path)
            f = open(log_path, "ab")  # noqa: SIM115 - returned to the caller, which closes it after the spawn
            f.write(f"{COMMAND_ECHO}{shlex.join(command)}\n".encode())
            f.flush()
            return f

        log = await anyio.to_thread.run_sync(open_log)
        try:
            proc = await anyio.open_process(_watched(command, stop_grace_s), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
        finally:
            log.close()  # the child holds its own descriptor
        await anyio.to_thread.run_sync(write_record, log_path.parent, proc.pid, url)
        return cls(proc, log_path)

    async def wait(self) -> int:
        return await self.proc.wait()

    async def stop(self, grace_s: float) -> int | None:
        """SIGTERM the group, wait up to `grace_s`, then SIGKILL the group; safe to call twice."""
        # Shielded: this runs while the caller is being cancelled and must finish anyway.
        with anyio.CancelScope(shield=True):
            if self.returncode is None:
                killpg(self.pgid, signal.SIGTERM)
                with anyio.move_on_after(grace_s):
                    await self.proc.wait()
            killpg(self.pgid, signal.SIGKILL)  # also reaches children that outlive the leader
            await self.proc.wait()
            await wait_group_gone(self.pgid, 2.0, poll_s=0.02)  # so callers see the group gone
            remove_record(self.log_path.parent, self.pgid)
        return self.returncode


def _watched(command: list[str], stop_grace_s: float) -> list[str]:
    """`command` behind parent_watch: the server is stopped (SIGTERM, `stop_grace_s`, SIGKILL) if we die
    by SIGKILL (see that module). A command that cannot be found is left bare, so spawning it raises
    OSError here as before. `-I`: the watcher imports nothing of the working directory's."""
    if shutil.which(command[0]) is None:
        return command
    return [sys.executable, "-I", parent_watch.SCRIPT, str(os.getpid()), f"{stop_grace_s:g}", *command]
