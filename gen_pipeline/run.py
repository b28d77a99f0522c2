"""What a run is asked to do (RunOptions) and what it reports when it ends (RunSummary)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from .config import DEFAULT_OUTPUT_DIR
from .controller.config import ControllerConfig
from .progress import Figures, format_duration
from .ranks import RankSpec
from .server.profile import ServerProfile


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
    def exit_code(self) -> int:
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
                                + ("; run again to retry the failed ones." if retryable else "."),
            "SIGINT": "interrupted (SIGINT); run the same command to resume.",
            "SIGTERM": "stopped (SIGTERM); run the same command to resume.",
        }[self.stopped_by]
        return f"{head}, {', '.join(parts)}; {tail}"
