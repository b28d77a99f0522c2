"""Run statistics (no async library): throughput, failures by reason, the fatal streak and the polled load."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from pathlib import Path

from gen_pipeline.display import count
from gen_pipeline.errors import ServerError
from gen_pipeline.records import Failure, LoadSnapshot

FAILURE_STREAK_FATAL = 50  # this many failures in a row, none succeeding: the server is unusable
# failures that say the server went away (a request is sent again meanwhile, run/chat.py, so these reach
# the streak only when one gave up after --server-wait-s), as against requests it refuses (4xx, model errors)
GONE_REASONS = frozenset({"connect", "connection", "server_gone"})
THROUGHPUT_WINDOW_S = 60.0
CPU_WINDOW_S = 10.0  # the client's CPU share is measured over about this long


class CpuMeter:
    """The share of one core this process used over about the last CPU_WINDOW_S (reports/diagnose.py, client_bound)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 cpu_clock: Callable[[], float] = time.process_time) -> None:
        self.clock, self.cpu_clock = clock, cpu_clock
        self._samples: deque[tuple[float, float]] = deque([(clock(), cpu_clock())])

    def share(self) -> float | None:
        """Cores in use (1.0 = one core busy) over the window; None over less than a second."""
        now, used = self.clock(), self.cpu_clock()
        samples = self._samples
        if now - samples[-1][0] >= 0.5:  # one sample per half second is plenty (callers poll more often)
            samples.append((now, used))
        while len(samples) > 1 and now - samples[1][0] >= CPU_WINDOW_S:
            samples.popleft()
        t0, c0 = samples[0]
        return (used - c0) / (now - t0) if now - t0 >= 1.0 else None


# /proc/PID/comm of SGLang 0.5.17's tokenizer workers (--tokenizer-worker-num > 1): their title is
# "sglang::tokenizer_worker:PID" (managers/multi_tokenizer_mixin.py), of which comm keeps 15 characters
TOKENIZER_WORKER_COMM = "sglang::tokeniz"
FRONT_END_RESCAN_S = 30.0  # the front end's processes are looked up again this often (a /proc scan)


def _stat(text: str) -> tuple[str, list[str]]:
    """/proc/PID/stat as (the process's name, the fields after it: state, ppid, pgrp, ... utime at [11])."""
    return text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()


def _cpu_s(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def process_cpu_s(pid: int, proc: Path = Path("/proc")) -> float:
    """CPU seconds (user + system) of one process; OSError when it is gone."""
    return _cpu_s(_stat((proc / str(pid) / "stat").read_text())[1])


def group_processes(pgid: int, proc: Path = Path("/proc")) -> list[tuple[int, str, float]]:
    """(pid, name, CPU seconds so far) of every process of a process group (a scan of /proc; the name is
    /proc/PID/comm's, 15 characters at most)."""
    out = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name, fields = _stat((entry / "stat").read_text())
        except OSError:  # gone since the listing
            continue
        if int(fields[2]) == pgid:  # fields[2]: the group
            out.append((int(entry.name), name, _cpu_s(fields)))
    return out


def front_end_pids(leader: int, proc: Path = Path("/proc")) -> list[int]:
    """A launched server's front end: the child of its group's leader (parent_watch leads the group and runs
    SGLang's main process, its HTTP server and tokenizer manager, as its one child; the scheduler and
    detokenizer are that child's children), then, with --tokenizer-worker-num > 1, the tokenizer workers of
    the group, each a front end of its own. OSError when there is no child (yet) or /proc cannot say."""
    try:
        child = int((proc / str(leader) / "task" / str(leader) / "children").read_text().split()[0])
    except (IndexError, ValueError) as e:
        raise OSError(f"server {leader} has no child process") from e
    workers = sorted(pid for pid, name, _ in group_processes(leader, proc)
                     if pid not in (leader, child) and name.startswith(TOKENIZER_WORKER_COMM))
    return [child, *workers]


class FrontEndMeter:
    """The cores the busiest process of a launched server's front end used over about CPU_WINDOW_S
    (reports/diagnose.py, front_end_bound): each is one event loop, so the busiest is the one that binds.
    None for an attached server, or where /proc cannot say. A restarted server (another leader) is measured
    afresh; the processes are looked up every FRONT_END_RESCAN_S, and again once one is gone."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 pids: Callable[[int], list[int]] = front_end_pids,
                 read: Callable[[int], float] = process_cpu_s) -> None:
        self.clock, self.pids, self.read = clock, pids, read
        self._leader: int | None = None
        self._meters: dict[int, CpuMeter] = {}
        self._looked_up: float | None = None

    def share(self, leader: int | None) -> float | None:
        if leader != self._leader:
            self._leader, self._meters, self._looked_up = leader, {}, None
        if leader is None:
            return None
        now = self.clock()
        try:
            if self._looked_up is None or now - self._looked_up >= FRONT_END_RESCAN_S:
                found = self.pids(leader)
                self._meters = {pid: self._meters.get(pid) or CpuMeter(self.clock, partial(self.read, pid))
                                for pid in found}
                self._looked_up = now
            shares = [m.share() for m in self._meters.values()]
        except OSError:  # not started yet, or one is gone: measured from the next lookup
            self._meters, self._looked_up = {}, None
            return None
        return max((x for x in shares if x is not None), default=None)


class RunStats:
    """Counts of one run; `fatal` is set once the failure streak says the server is unusable."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.failures = self.failure_streak = self.rejects = 0
        self.final_failures = 0  # failures a retry would repeat: not sent again
        self.failure_reasons: dict[str, int] = {}
        self.fatal: ServerError | None = None
        self._recent: deque[tuple[float, int]] = deque(maxlen=512)  # (t, completion tokens) per sample
        self.samples_total = self.tokens_total = 0  # samples and completion tokens of the whole run
        self.last_load: LoadSnapshot | None = None
        self.peak_running: int | None = None
        self.peak_queued: int | None = None
        self.peak_kv_usage: float | None = None
        self.retractions: int | None = None  # during this run: the server's counter restarts with it
        self._last_counter: int | None = None
        self.cpu = CpuMeter(clock)
        self.front_end_cpu = FrontEndMeter(clock)
        # the run's end (its writer's, after its last sample): its figures stop there, not where a launched
        # server's stop or the job's other datasets end the process (the clock's and the wall's time)
        self.ended: float | None = None
        self.ended_wall: float | None = None

    def end(self) -> None:
        self.ended, self.ended_wall = self.clock(), time.time()

    def now(self) -> float:
        return self.clock() if self.ended is None else self.ended

    def elapsed_s(self) -> float:
        return self.now() - self.started

    def note_load(self, snap: LoadSnapshot) -> None:
        """One successful load poll: the latest figures, and the highest of the run."""
        self.last_load = snap
        self.peak_running = max(snap.running, self.peak_running or 0)
        self.peak_queued = max(snap.queued, self.peak_queued or 0)
        if snap.token_usage is not None:
            self.peak_kv_usage = max(snap.token_usage, self.peak_kv_usage or 0.0)
        if (value := snap.retractions_total) is None:
            return
        # this run's retractions: the first reading is its baseline; a lower one, a restarted server
        prev, self._last_counter = self._last_counter, value
        added = 0 if prev is None else value if value < prev else value - prev
        self.retractions = (self.retractions or 0) + added

    def count_sample(self, completion_tokens: int) -> None:
        self.failure_streak = 0
        self._recent.append((self.clock(), completion_tokens))
        self.samples_total += 1
        self.tokens_total += completion_tokens

    def count_failure(self, failure: Failure, *, ok_so_far: int) -> None:
        """Count one failure; sets `fatal` when requests never worked or stopped working for long."""
        self.failures += 1
        self.final_failures += not failure.retryable
        self.failure_reasons[failure.reason] = self.failure_reasons.get(failure.reason, 0) + 1
        self.failure_streak += 1
        streak = self.failure_streak
        if (ok_so_far == 0 and streak >= FAILURE_STREAK_FATAL) or streak >= 4 * FAILURE_STREAK_FATAL:
            what, check = (("all failed because the server went away", "SERVER_URL and that the server is running")
                           if failure.reason in GONE_REASONS else
                           ("were all refused by the server, which answers /health",
                            "the model name, the sampling settings and the server log"))
            self.fatal = ServerError(f"The last {count(streak)} requests {what} (latest: {failure.reason}: "
                                     f"{failure.detail}). Check {check}; nothing written is lost, run the same "
                                     "command to resume.")

    def average(self) -> tuple[float, float]:
        """(samples/s, completion tokens/s) over the whole run, for the final progress line."""
        span = max(self.elapsed_s(), 1e-6)
        return self.samples_total / span, self.tokens_total / span

    def throughput(self) -> tuple[float, float]:
        """(samples/s, completion tokens/s) over the last minute of completions."""
        now = self.now()
        while self._recent and now - self._recent[0][0] > THROUGHPUT_WINDOW_S:
            self._recent.popleft()
        # a full deque covers less than a minute (fast runs): measure from its oldest entry
        full = len(self._recent) == self._recent.maxlen
        start = self._recent[0][0] if full else max(self.started, now - THROUGHPUT_WINDOW_S)
        span = max(now - start, 1e-6)
        return len(self._recent) / span, sum(tokens for _, tokens in self._recent) / span
