"""`python -m gen_pipeline.server.parent_watch CMD...`: exec CMD so that it gets SIGTERM when its
parent (the pipeline) dies, even by SIGKILL, which the pipeline cannot catch to stop its server.

Without this a killed orchestrator leaves the server (its own session) holding the GPUs, and the
next run starts a second one beside it. Linux prctl(PR_SET_PDEATHSIG) survives execve; elsewhere
CMD is exec'd unchanged. SGLang stops its process tree on SIGTERM (TokenizerManager.sigterm_watchdog
→ kill_process_tree, sglang PRs #1838/#16484); the simulator is one process that exits on it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def arm(parent_pid: int) -> None:
    """Ask the kernel for SIGTERM when the parent dies; exit at once if it already has."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl: nobody would stop us
        sys.exit(143)


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        sys.exit("usage: python -m gen_pipeline.server.parent_watch PARENT_PID CMD [ARGS...]")
    arm(int(argv[0]))
    try:
        os.execvp(argv[1], argv[1:])
    except OSError as e:
        sys.exit(f"parent_watch: cannot run {argv[1]!r}: {e.strerror or e}")


if __name__ == "__main__":
    main(sys.argv[1:])
