"""`python -I .../gen_pipeline/server/parent_watch.py PARENT_PID GRACE_S CMD...`: run CMD so that it is stopped
when the pipeline dies, even by SIGKILL (else the server keeps the GPUs). On Linux it leads CMD's group, hears of
the death from the kernel (PR_SET_PDEATHSIG) and stops the group (SIGTERM, GRACE_S, SIGKILL); elsewhere CMD is
exec'd unchanged. Stdlib only, not `-m`: it lives as long as the server; the package's imports would cost memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_DIED = signal.SIGUSR1  # what the kernel sends this process when the pipeline dies
SCRIPT = os.path.abspath(__file__)


def arm(parent_pid: int, sig: int) -> None:
    """Ask the kernel for `sig` when the parent dies; exit at once if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl: nobody would stop us
        os._exit(143)


def main(argv: list[str]) -> None:
    if len(argv) < 3 or not argv[0].isdigit():
        sys.exit(f"usage: python -I {SCRIPT} PARENT_PID GRACE_S CMD [ARGS...]")
    parent_pid, grace_s, cmd = int(argv[0]), float(argv[1]), argv[2:]
    if not sys.platform.startswith("linux"):
        _exec(cmd)
    watched = (PARENT_DIED, signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)  # taken one at a time by sigwaitinfo below
    arm(parent_pid, PARENT_DIED)
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; CMD gets the defaults (as subprocess does)
            signal.signal(sig, signal.SIG_DFL)
        arm(os.getppid(), signal.SIGKILL)  # this watcher SIGKILLed: nothing must outlive it
        _exec(cmd)
    _watch(child, parent_pid, grace_s)


def _exec(cmd: list[str]) -> None:
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        sys.stderr.write(f"parent_watch: cannot run {cmd[0]!r}: {e.strerror or e}\n")
        os._exit(127)


def _watch(child: int, parent_pid: int, grace_s: float) -> None:
    """Relay until CMD ends (then end the same way), or stop it if the pipeline dies."""
    while True:
        info = signal.sigwaitinfo({PARENT_DIED, signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
        status = _reap(child)
        if status is not None:
            _exit_like(status)
        if info.si_signo == PARENT_DIED or os.getppid() != parent_pid:
            _stop_group(child, grace_s)
        elif info.si_signo != signal.SIGCHLD and info.si_pid != parent_pid:
            # Sent to this process alone (the pipeline's stop signals the whole group): pass it on.
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, info.si_signo)


def _reap(child: int) -> int | None:
    with contextlib.suppress(ChildProcessError):
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid == child:
            return status
    return None


def _stop_group(child: int, grace_s: float) -> None:
    """The pipeline died: SIGTERM the group, wait up to `grace_s` for CMD, then SIGKILL the group (this
    process included: nothing of the server may outlive it)."""
    pgid = os.getpgrp()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)  # this process has SIGTERM blocked: it goes on
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if signal.sigtimedwait({signal.SIGCHLD}, max(0.0, deadline - time.monotonic())) is None:
            break
        if _reap(child) is not None:
            break
    os.killpg(pgid, signal.SIGKILL)  # the leader too: the group ends here


def _exit_like(status: int) -> None:
    """End this process the way CMD ended: its exit code, or death by its signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # these two have no handler to reset (EINVAL)
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal that does not kill (SIGCHLD...): its conventional code
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main(sys.argv[1:])
