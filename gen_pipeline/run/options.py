"""What a run is asked to do (RunOptions), what it tells observers on every load poll (LoadPoll)
and what it reports when it ends (RunSummary)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from gen_pipeline.config.dataset import DEFAULT_OUTPUT_DIR
from gen_pipeline.config.server import ServerProfile
from gen_pipeline.controller.config import ControllerConfig
from gen_pipeline.display import format_duration
from gen_pipeline.run.progress import Figures
from gen_pipeline.store.ranks import RankSpec


@dataclass(frozen=True, slots=True)
class LoadPoll:
    """One load poll of a run, as `RunOptions.load_observers` receive it (a telemetry writer).

    Called on the event loop right after the controller saw the poll, every poll_interval_s, also
    when the poll failed (then the server figures are None): keep it fast and never raise; do file
    I/O off the loop (a queue and a thread)."""

    time_s: float  # wall clock, time.time()
    window: int  # requests allowed in flight after this poll
    in_flight: int
    running: int | None  # the server's figures, summed over servers and DP ranks
    queued: int | None
    kv_used_tokens: int | None
    kv_usage: float | None  # 0..1 of kv_capacity_tokens
    kv_capacity_tokens: int | None  # None when unknown
    gen_tokens_per_s: float | None  # the server's own generation throughput
    retractions_total: int | None  # cumulative, as the server reports it (restarts reset it)
    completions: int  # samples produced by this run so far
    controller_mode: str | None  # None with a fixed --window
    controller_reason: str | None


@dataclass(frozen=True)
class RunOptions:
    output_root: Path = DEFAULT_OUTPUT_DIR
    profile: ServerProfile | None = None  # launch this server ...
    server_urls: tuple[str, ...] = ()  # ... or attach to these
    model: str = ""  # the model id requests carry (and the resume fingerprint records)
    limit: int | None = None  # at most this many new samples in this run
    window: int | None = None  # fixed concurrency instead of the controller
    controller: ControllerConfig = ControllerConfig()  # server.toml's [controller] table
    drain_grace_s: float = 30.0
    poll_interval_s: float = 1.0
    commit_interval_s: float = 5.0
    progress: str = "auto"  # auto | bar | log | quiet
    file_opener: Callable[[Path, str], BinaryIO] | None = None  # the store's file layer (fault injection)
    on_figures: Callable[[Figures], None] | None = None  # called with the live figures every 0.5 s
    load_observers: Sequence[Callable[[LoadPoll], None]] = ()  # called with every load poll (see LoadPoll)
    rank: RankSpec = RankSpec()  # this run's rank: its prompts (ranks.py), share and rank-<R>-of-<W>/ part


@dataclass
class RunSummary:
    dataset: str
    done: int
    target: int
    written: int = 0
    failures: int = 0
    rejects: int = 0
    elapsed_s: float = 0.0
    stopped_by: str = "target"  # target | limit | source_exhausted | nothing_to_do | SIGINT | SIGTERM
    failure_reasons: dict[str, int] = field(default_factory=dict)
    final_failures: int = 0  # failures a retry would repeat (HTTP 400, truncated + drop): not sent again
    rank_label: str = ""  # "rank 1 of 4" when the run is one rank of several (done/target are its share)

    @property
    def short(self) -> int:
        """Samples the target still misses when the source ran out and no retry can supply them."""
        if self.stopped_by != "source_exhausted" or self.failures > self.final_failures:
            return 0
        return max(0, self.target - self.done)

    @property
    def exit_code(self) -> int:
        if self.short:
            return 5  # SourceShortError's code: the source has too few valid rows for the target
        return {"SIGINT": 130, "SIGTERM": 143}.get(self.stopped_by, 0)

    def line(self) -> str:
        pct = 100.0 * self.done / self.target if self.target else 100.0
        who = f"{self.dataset} ({self.rank_label})" if self.rank_label else self.dataset
        head = f"{who}: {self.done:,}/{self.target:,} samples ({pct:.1f}%)"
        if self.stopped_by == "nothing_to_do":
            return f"{head}; the target is already reached, nothing to do."
        parts = [f"+{self.written:,} this run in {format_duration(self.elapsed_s)}"]
        retryable = self.failures - self.final_failures
        if self.failures:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.failure_reasons.items()))
            parts.append(f"{self.failures} failed ({reasons}; {self.final_failures} final, "
                         f"{retryable} retried by the next run)")
        if self.rejects:
            parts.append(f"{self.rejects} invalid rows skipped")
        tail = {
            "target": "target reached.",
            "limit": "stopped at --limit; run again to continue.",
            "source_exhausted": (f"source exhausted: no more prompts of the source hash to {self.rank_label} "
                                 f"({self.target - self.done:,} short of its share; other ranks do not take "
                                 "over its prompts)" if self.rank_label else "the source has no more prompts")
                                + ("; run again to retry the failed ones." if retryable else
                                   f": {self.short:,} samples short of the target; add rows to the source or "
                                   "lower target_samples." if self.short and not self.rank_label else "."),
            "SIGINT": "interrupted (SIGINT); run the same command to resume.",
            "SIGTERM": "stopped (SIGTERM); run the same command to resume.",
        }[self.stopped_by]
        return f"{head}, {', '.join(parts)}; {tail}"
