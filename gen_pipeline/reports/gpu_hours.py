"""Measured GPU-hours and the projected end of a job, from the manifests' run records (pure functions).
A dataset's GPU-hours count from `generating_at` (the job's datasets share one server in turn); the job's are the
union of its runs' whole times (the model load holds the GPUs), so a hand-over's overlap counts once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gen_pipeline.display import format_duration

Interval = tuple[float, float, int | None]  # (start, end) as POSIX seconds, GPUs (None: unknown)


def timestamp(iso: Any) -> float | None:
    """POSIX seconds of an ISO time (a naive one read as UTC, as the store writes them); None if unreadable."""
    try:
        t = datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def run_interval(run: Mapping[str, Any], *, generating: bool) -> Interval | None:
    """A run record's (start, end, GPUs), from its dataset's first request when `generating`; None without usable
    times or for a run with nothing to do (it held no server of its own)."""
    if run.get("stopped_by") == "nothing_to_do":
        return None
    start = timestamp(run.get("generating_at")) if generating else None
    start = start if start is not None else timestamp(run.get("started_at"))
    end = timestamp(run.get("ended_at") or run.get("updated_at"))
    if start is None or end is None or end < start:
        return None
    gpus = run.get("gpus")
    return start, end, gpus if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 else None


@dataclass
class GpuUsage:
    """GPU-hours of some runs: `gpu_hours` sums the runs whose GPUs are known (`unknown_runs`: the others,
    whose `unknown_s` of time is not in it); `samples` are those the known runs wrote."""

    gpu_hours: float = 0.0
    wall_s: float = 0.0
    samples: int = 0
    all_samples: int = 0  # every run's, known GPUs or not (the rate's)
    unknown_runs: int = 0
    unknown_s: float = 0.0
    how: str = ""  # how the GPUs were known (the last run's), e.g. "tp 8 × dp 1 × 1 server"
    gpus: int | None = None  # the last known run's GPUs (ranks: their sum)

    @property
    def recorded(self) -> bool:
        """Some run recorded its server (older versions did not)."""
        return bool(self.how)

    @property
    def known(self) -> bool:
        """Some run's GPUs are known (a run shorter than the records' 1 s resolution counts as 0 s)."""
        return self.unknown_runs == 0 and self.gpus is not None or self.wall_s > self.unknown_s

    @property
    def per_1k(self) -> float | None:
        """GPU-hours per 1,000 samples (None: no run with known GPUs wrote any)."""
        return 1000 * self.gpu_hours / self.samples if self.known and self.samples else None

    def add_time(self, wall_s: float, gpus: int | None) -> None:
        """`wall_s` seconds held on `gpus` GPUs (None: unknown, counted apart)."""
        self.wall_s += wall_s
        if gpus is None:
            self.unknown_runs += 1
            self.unknown_s += wall_s
        else:
            self.gpu_hours += gpus * wall_s / 3600

    def to_dict(self) -> dict[str, Any]:
        return {"gpu_hours": round(self.gpu_hours, 4) if self.known else None, "wall_s": round(self.wall_s, 1),
                "samples": self.samples, "gpu_hours_per_1k": round(p, 4) if (p := self.per_1k) is not None else None,
                "unknown_runs": self.unknown_runs, "gpus": self.how or "unknown"}


def dataset_usage(runs: Sequence[Mapping[str, Any]]) -> GpuUsage:
    """One dataset part's runs (a rank's part: its own); each run's generating time × its GPUs."""
    u = GpuUsage()
    for run in runs:
        iv = run_interval(run, generating=True)
        if iv is None:
            continue
        u.add_time(iv[1] - iv[0], iv[2])
        u.all_samples += int(run.get("samples_written") or 0)
        if iv[2] is not None:
            u.samples += int(run.get("samples_written") or 0)
            u.gpus = iv[2]
        u.how = str(run.get("gpus_how") or u.how)
    return u


def add(parts: Sequence[GpuUsage]) -> GpuUsage:
    """Parts that held different GPUs at once (a ranked dataset's ranks): their sum."""
    hows, gpus = [p.how for p in parts if p.how], [p.gpus for p in parts if p.gpus is not None]
    return GpuUsage(sum((p.gpu_hours for p in parts), 0.0), max([0.0, *(p.wall_s for p in parts)]),
                    sum(p.samples for p in parts), sum(p.all_samples for p in parts),
                    sum(p.unknown_runs for p in parts), max([0.0, *(p.unknown_s for p in parts)]),
                    "mixed" if len(set(hows)) > 1 else (hows[-1] if hows else ""), sum(gpus) if gpus else None)


def job_usage(lanes: Mapping[Any, Sequence[Mapping[str, Any]]]) -> GpuUsage:
    """The job's runs by lane (the datasets' runs of one rank, which share its server): per lane, the
    union of its runs' whole times (started_at on) × the GPUs held then (overlaps: the most); lanes add."""
    total = GpuUsage()
    for runs in lanes.values():
        # by time only: two runs of one second may tie, and GPUs may be None (a run with nothing to do)
        ivs = sorted((iv for r in runs if (iv := run_interval(r, generating=False)) is not None),
                     key=lambda iv: iv[:2])
        merged: list[list[Any]] = []  # [start, end, gpus or None]
        for start, end, gpus in ivs:
            if merged and start <= merged[-1][1]:
                last = merged[-1]
                last[1] = max(last[1], end)
                last[2] = None if last[2] is None or gpus is None else max(last[2], gpus)
            else:
                merged.append([start, end, gpus])
        for start, end, gpus in merged:
            total.add_time(end - start, gpus)
        total.samples += sum(int(r.get("samples_written") or 0) for r in runs
                             if (iv := run_interval(r, generating=False)) is not None and iv[2] is not None)
        total.how = next((str(r["gpus_how"]) for r in reversed(runs) if r.get("gpus_how")), total.how)
        held = [iv[2] for iv in ivs if iv[2] is not None]
        total.gpus = (total.gpus or 0) + max(held) if held else total.gpus
    return total


def format_usage(name: str, u: GpuUsage) -> str:
    """`B1: 3.20 GPU-h over 1 h 36 min for 1,200 samples = 2.67 GPU-h per 1,000 samples (tp 8 × dp 1 × 1 server)`."""
    if not u.wall_s and not u.recorded:
        return f"{name}: no run time recorded yet"
    if not u.known:
        return (f"{name}: GPU-hours unknown over {format_duration(u.wall_s)} (the server reported no tp_size; "
                "pass --gpus-per-server N)")
    per = f" = {p:.2f} GPU-h per 1,000 samples" if (p := u.per_1k) is not None else ""
    unknown = (f"; {u.unknown_runs} run{'s' if u.unknown_runs > 1 else ''} ({format_duration(u.unknown_s)}) "
               "of unknown GPUs not counted") if u.unknown_runs else ""
    return (f"{name}: {u.gpu_hours:.2f} GPU-h over {format_duration(u.wall_s)} for {u.samples:,} samples{per} "
            f"({u.how or 'unknown'}){unknown}")


@dataclass
class Projection:
    """The job's projected end: `remaining_s` of generating still to do (None: no rate known for some
    unfinished dataset), `at` the clock time when a run is live now (else None: it needs a run)."""

    remaining_s: float | None
    at: datetime | None
    live: bool
    blocked: tuple[str, ...] = ()  # unfinished datasets no run can finish (their source is exhausted)

    def line(self) -> str:
        if self.blocked:
            return (f"job: no projected completion: {', '.join(self.blocked)} cannot reach "
                    f"{'its' if len(self.blocked) == 1 else 'their'} target (source exhausted)")
        if self.remaining_s == 0:
            return "job: every dataset is done"
        if self.remaining_s is None:
            return "job: projected completion unknown (no measured rate yet)"
        if self.at is not None:
            return (f"job: projected completion {self.at.strftime('%Y-%m-%d %H:%M')} UTC "
                    f"(in {format_duration(self.remaining_s)} at the measured rates)")
        return f"job: {format_duration(self.remaining_s)} of generating left at the measured rates (no run is live)"

    def to_dict(self) -> dict[str, Any]:
        return {"remaining_s": None if self.remaining_s is None else round(self.remaining_s, 1),
                "at": self.at.isoformat(timespec="seconds") if self.at else None, "live": self.live,
                "blocked": list(self.blocked)}


def project(datasets: Sequence[tuple[int, float | None, float | None]], job_rate: float | None, *, live: bool,
            now: datetime | None = None, blocked: Sequence[str] = ()) -> Projection:
    """`datasets`: (remaining samples, own samples/s or None, own ETA s or None) of the job's datasets; the
    unfinished ones run one after another, each at its own rate (its ETA when it has one: a ranked
    dataset's slowest rank), else at `job_rate`. `blocked`: those that cannot finish (no projection)."""
    if blocked:
        return Projection(None, None, live, tuple(blocked))
    todo = [(remaining, rate, eta_s) for remaining, rate, eta_s in datasets if remaining > 0]
    if any(eta_s is None and not (rate or job_rate) for _, rate, eta_s in todo):
        return Projection(None, None, live)
    left = sum(remaining / float(rate or job_rate or 1) if eta_s is None else eta_s for remaining, rate, eta_s in todo)
    at = (now or datetime.now(UTC)) + timedelta(seconds=left) if live and left else None
    return Projection(left, at, live)


def job_rate(usages: Sequence[GpuUsage]) -> float | None:
    """The job's measured samples per generating second (the datasets' written samples over their time)."""
    wall, samples = sum(u.wall_s for u in usages), sum(u.all_samples for u in usages)
    return samples / wall if wall > 0 and samples else None
