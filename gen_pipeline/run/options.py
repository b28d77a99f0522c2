"""What a job is asked to do (RunOptions) and what it reports (RunSummary per dataset, JobSummary)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from gen_pipeline.config.dataset import DEFAULT_OUTPUT_DIR
from gen_pipeline.config.run import RunFlags
from gen_pipeline.config.schema import check_flags
from gen_pipeline.config.server import ServerProfile, normalise_server_url
from gen_pipeline.controller.config import ControllerConfig
from gen_pipeline.display import count, format_duration
from gen_pipeline.errors import ConfigError
from gen_pipeline.records import RunSnapshot
from gen_pipeline.signals import EXIT_CODES
from gen_pipeline.store.ranks import RankSpec

SnapshotObserver = Callable[[RunSnapshot], None]


@dataclass(frozen=True)
class RunOptions(RunFlags):
    """A job's options: the flags' (RunFlags, config/run.py) and what no flag sets; checked when constructed
    (ConfigError naming the flag), so a library caller gets the refusals `generate` gives."""

    output_root: Path = DEFAULT_OUTPUT_DIR
    profile: ServerProfile | None = None  # launch this server ...
    server_urls: tuple[str, ...] = ()  # ... or attach to these
    controller: ControllerConfig = ControllerConfig()  # server.toml's [controller] table
    commit_interval_s: float = 5.0
    file_opener: Callable[[Path, str], BinaryIO] | None = None  # the store's file layer (fault injection)
    on_progress: SnapshotObserver | None = None  # the job's snapshot every 0.5 s (a display), and the final one
    load_observers: Sequence[SnapshotObserver] = ()  # each active dataset's snapshot after every load poll
    rank: RankSpec = RankSpec()  # this run's rank: its prompts (ranks.py), share and rank-<R>-of-<W>/ part

    def __post_init__(self) -> None:
        check_flags(self)
        if self.window == 0:  # 0 means the adaptive controller, as generation.window = 0 does
            object.__setattr__(self, "window", None)
        object.__setattr__(self, "server_urls", tuple(normalise_server_url(u) for u in self.server_urls))
        if not self.server_urls and self.profile is None:
            raise ConfigError("RunOptions needs a server: a profile to launch or server_urls to attach to.")


@dataclass
class RunSummary:
    dataset: str
    done: int
    target: int
    written: int = 0
    failures: int = 0
    rejects: int = 0
    elapsed_s: float = 0.0
    stopped_by: str = "target"  # target | limit | source_exhausted | nothing_to_do | SIGINT | SIGTERM | SIGHUP
    failure_reasons: dict[str, int] = field(default_factory=dict)
    final_failures: int = 0  # failures a retry would repeat (HTTP 400, truncated + drop): not sent again
    rank_label: str = ""  # "rank 1 of 4" when the run is one rank of several (done/target are its share)

    @property
    def short(self) -> int:
        """Samples the target still misses when the source ran out and no retry can supply them."""
        exhausted = self.stopped_by == "source_exhausted" and self.failures <= self.final_failures  # no retry helps
        return max(0, self.target - self.done) if exhausted else 0

    @property
    def exit_code(self) -> int:
        # 5: SourceShortError's code, the source has too few valid rows for the target
        return 5 if self.short else EXIT_CODES.get(self.stopped_by, 0)

    def line(self) -> str:
        pct = 100.0 * self.done / self.target if self.target else 100.0
        who = f"{self.dataset} ({self.rank_label})" if self.rank_label else self.dataset
        head = f"{who}: {count(self.done)}/{count(self.target)} samples ({pct:.1f}%)"
        if self.stopped_by == "nothing_to_do":
            return f"{head}; the target is already reached, nothing to do."
        parts = [f"+{count(self.written)} this run in {format_duration(self.elapsed_s)}"]
        retryable = self.failures - self.final_failures
        if self.failures:
            reasons = ", ".join(f"{k} {count(v)}" for k, v in sorted(self.failure_reasons.items()))
            parts.append(f"{count(self.failures)} failed ({reasons}; {count(self.final_failures)} final, "
                         f"{count(retryable)} retried by the next run)")
        if self.rejects:
            parts.append(f"{count(self.rejects)} invalid rows skipped")
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
            "SIGHUP": "stopped (SIGHUP: the terminal closed); run the same command to resume.",
        }[self.stopped_by]
        return f"{head}, {', '.join(parts)}; {tail}"


@dataclass
class JobSummary:
    """The datasets' summaries, in the job's order."""

    runs: list[RunSummary] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """The worst dataset's: 143/130/129 (interrupted) over 5 (source short) over 0."""
        return max((r.exit_code for r in self.runs), default=0)

    def lines(self) -> list[str]:
        """One line per dataset; a job of several adds the job's own."""
        if len(self.runs) == 1:
            return [self.runs[0].line()]
        done, target = sum(r.done for r in self.runs), sum(r.target for r in self.runs)
        written = sum(r.written for r in self.runs)
        pct = 100.0 * done / target if target else 100.0
        tail = "every dataset at its target." if done >= target else "run the same command to resume."
        job = (f"job ({', '.join(r.dataset for r in self.runs)}): {done:,}/{target:,} samples ({pct:.1f}%), "
               f"+{written:,} this run; {tail}")
        return [r.line() for r in self.runs] + [job]
