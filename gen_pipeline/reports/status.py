"""`status`: each dataset folder's figures, read from outputs/ without the lock (it works while a run writes and
after one died); which lines count is layout.py's trust rule."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gen_pipeline.config.dataset import EXAMPLES, find_dataset_config
from gen_pipeline.config.mix import declared_mix, produced_shares
from gen_pipeline.display import format_duration
from gen_pipeline.errors import ConfigError
from gen_pipeline.quality import accounting
from gen_pipeline.quality.accounting import format_gate, format_spec, merged
from gen_pipeline.reports import gpu_hours
from gen_pipeline.reports.gpu_hours import GpuUsage, Projection, format_usage, timestamp
from gen_pipeline.store import layout
from gen_pipeline.store.lock import read_lock
from gen_pipeline.store.manifest import Manifest, RunRecord, read_manifest
from gen_pipeline.store.ranks import rank_folder_name, rank_share


@dataclass
class DatasetStatus:
    """One dataset's figures; `state` is "running (pid N)", "stopped", "finished", "source exhausted",
    "not started" or "died (pid N gone)". Rates in samples/s and tokens/s, `eta_s` in seconds."""

    dataset: str
    target: int | None
    done: int = 0
    shards: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    truncated: int = 0
    errors_last_run: int = 0
    errors_unresolved: int = 0
    rejects: int = 0
    rejects_by_reason: dict[str, int] = field(default_factory=dict)
    state: str = "not started"
    runs: int = 0
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    updated_at: float | str | None = None  # the last commit: time.time() of its figures, or ISO time
    corrupt_lines: int = 0
    world_size: int = 1  # >1: written by ranks; `ranks` holds one status per rank (below)
    ranks: list[DatasetStatus] = field(default_factory=list)
    stale_ranks: list[int] = field(default_factory=list)
    heartbeat_age_s: float | None = None  # seconds since the manifest was last committed
    gpu: GpuUsage = field(default_factory=GpuUsage)  # measured GPU-hours (reports/gpu_hours.py)
    lanes: dict[str, list[RunRecord]] = field(default_factory=dict, repr=False)  # runs by rank: the job's union
    gate: dict[str, int] = field(default_factory=dict)  # the quality gate's counts (quality/accounting.py)
    run_wall_s: float = 0.0  # every run's wall time (every rank's: server-seconds)
    spec_server: float | None = None  # the last run's server-wide draft acceptance (manifest progress)

    @property
    def server_s_saved(self) -> float | None:
        """Server-seconds saved by early loop aborts (quality/accounting.py's estimate; × GPUs for GPU-seconds)."""
        decoded = accounting.decoded_tokens(self.gate, self.completion_tokens)
        return accounting.saved_gpu_s(self.gate, accounting.gpu_s_per_token(self.run_wall_s, 1, decoded))
    # a sampling mix (config/mix.py): the declared [share, what it changes] per variant, and the samples
    # committed per meta.sampling_variant ("0": n); both empty without one
    mix: list[tuple[float, str]] = field(default_factory=list)
    variants: dict[str, int] = field(default_factory=dict)

    @property
    def truncated_share(self) -> float:
        return self.truncated / self.done if self.done else 0.0

    @property
    def remaining(self) -> int:
        return max(0, (self.target or 0) - self.done)

    @property
    def eta_s(self) -> float | None:
        if self.remaining == 0:
            return 0.0
        if self.state == "source exhausted" or self.stale_ranks:
            return None  # no rate finishes it: the source has no more rows, or a rank has no live run
        if self.ranks:  # the dataset ends when its slowest rank does
            etas = [r.eta_s for r in self.ranks]
            known = [e for e in etas if e is not None]
            return max(known) if len(known) == len(etas) else None
        return self.remaining / self.samples_per_s if self.samples_per_s else None

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("gpu", "lanes")}
        return {**d, "truncated_share": round(self.truncated_share, 4),
                "server_s_saved": None if (saved := self.server_s_saved) is None else round(saved, 1),
                "spec_acceptance": accounting.spec_figure(self.gate, self.spec_server),
                "remaining": self.remaining, "eta_s": self.eta_s, "ranks": [r.to_dict() for r in self.ranks],
                "gpu": self.gpu.to_dict()}


@dataclass
class StatusReport:
    """All datasets plus the total over `total_of` (the datasets that make up the job)."""

    datasets: list[DatasetStatus]
    total_done: int
    total_target: int
    total_of: list[str] = field(default_factory=list)  # the datasets the total sums

    def _job(self) -> list[DatasetStatus]:
        counted = set(self.total_of) if self.total_target else {d.dataset for d in self.datasets}
        return [d for d in self.datasets if d.dataset in counted]

    @property
    def gpu(self) -> GpuUsage:
        """The job's GPU-hours: per rank, the union of its datasets' runs (reports/gpu_hours.py)."""
        return gpu_hours.job_usage(_lanes(self._job()))

    @property
    def projection(self) -> Projection:
        job = self._job()
        return gpu_hours.project([(d.remaining if d.target is not None else 0, d.samples_per_s, d.eta_s) for d in job],
                                 gpu_hours.job_rate([d.gpu for d in job]),
                                 live=any(d.state.startswith("running") for d in job),
                                 blocked=[d.dataset for d in job if d.state == "source exhausted" and d.remaining])

    def to_dict(self) -> dict[str, Any]:
        return {"datasets": {d.dataset: d.to_dict() for d in self.datasets},
                "total": {"done": self.total_done, "target": self.total_target},
                "job": {"gpu": self.gpu.to_dict(), "projection": self.projection.to_dict()}}


def read_status(root: Path, dataset: str, target: int | None) -> DatasetStatus:
    """Figures of `root/dataset` (target None: the last run's), all ranks as one; unreadable parts are counted in
    `corrupt_lines`, never raised."""
    folder = layout.dataset_folder(root, dataset)
    return (read_ranked_status if layout.rank_parts(folder) else read_part_status)(folder, dataset, target)


def read_part_status(folder: Path, dataset: str, target: int | None) -> DatasetStatus:
    """Figures of one folder written by one run at a time (a one-run dataset, or one rank's part)."""
    manifest = (read_manifest(folder)[0] if folder.is_dir() else None) or {}
    st = DatasetStatus(dataset, target if target is not None else manifest.get("target"))
    if not folder.is_dir():
        return st
    errors = layout.read_jsonl_rows(folder / layout.ERRORS_NAME)
    done_ids = _add_shards(st, folder, ids=bool(errors))  # ids only to tell which failures have a sample since
    for r in errors:  # every failure record: the loops its turns had (a later run's retry adds its own)
        accounting.add_failure(st.gate, r)
    if errors:
        last = runs[-1]["run"] if (runs := manifest.get("runs")) else max(r.get("run", 0) for r in errors)
        st.errors_last_run = sum(1 for r in errors if r.get("run") == last)
        st.errors_unresolved = len({r.get("id") for r in errors} - done_ids - {None})
    st.mix = declared_mix(manifest.get("fingerprint") or {})
    _add_rejects(st, [folder])
    _add_run(st, folder, manifest)
    return st


def _add_shards(st: DatasetStatus, folder: Path, *, ids: bool) -> set[str]:
    """Shard figures into `st` under layout's trust rule; returns the committed ids when asked."""
    done: set[str] = set()
    for shard in layout.committed_shards(folder, ids=ids):
        scan = shard.scan
        st.shards += 1
        st.done += shard.samples
        st.prompt_tokens += scan.prompt_tokens
        st.completion_tokens += scan.completion_tokens
        st.truncated += scan.truncated
        st.gate = merged([st.gate, scan.gate])
        st.corrupt_lines += len(scan.corrupt)
        st.variants = merged([st.variants, scan.variants])
        done.update(scan.ids)
    return done


def _add_run(st: DatasetStatus, folder: Path, manifest: Manifest) -> None:
    runs = manifest.get("runs", [])
    st.runs = len(runs)
    st.run_wall_s = sum(run_wall_s(r) or 0.0 for r in runs)
    lock = read_lock(folder)
    if lock is not None and lock.problem:
        st.state = f"lock unreadable ({lock.problem})"
    elif lock is not None and lock.pid is not None:
        where = "" if lock.local else f" on {lock.host}"
        st.state = f"running (pid {lock.pid}{where})" if lock.alive else f"died (pid {lock.pid} gone)"
    elif lock is not None:
        st.state = "running (pid unknown)" if lock.alive else "died (pid unknown)"
    elif st.target is not None and st.done >= st.target:
        st.state = "finished"
    elif runs and runs[-1].get("stopped_by") == "source_exhausted":
        st.state = "source exhausted"  # more runs will not help: the source has no more valid rows
    elif runs or st.done:
        st.state = "stopped"
    progress = manifest.get("progress", {})
    st.samples_per_s, st.tokens_per_s = progress.get("samples_per_s"), progress.get("tokens_per_s")
    st.spec_server = progress.get("spec_accept_length")
    st.updated_at = progress.get("updated_at") or manifest.get("updated_at")
    committed = timestamp(manifest.get("updated_at"))  # the last commit: how long ago the run was heard from
    st.heartbeat_age_s = None if committed is None else max(0.0, time.time() - committed)
    st.gpu = gpu_hours.dataset_usage(runs)
    st.lanes = {folder.name if manifest.get("world_size") else "": list(runs)}
    if st.samples_per_s is None and runs:  # no progress passed: the last run's record
        st.samples_per_s = runs[-1].get("samples_written", 0) / wall if (wall := run_wall_s(runs[-1])) else None


def run_wall_s(run: Mapping[str, Any]) -> float | None:
    """Seconds a run record spans (started_at to ended_at, else its last update); None without them."""
    t0 = timestamp(run.get("started_at"))
    t1 = timestamp(run.get("ended_at") or run.get("updated_at"))
    return None if t0 is None or t1 is None else max(0.0, t1 - t0)


def config_targets(config_dir: Path, output_dir: Path, only: Sequence[str] = ()) -> tuple[dict[str, int | None],
                                                                                        list[str]]:
    """({dataset name: target}, warnings) from the configs of `only` (default: every TOML of config_dir but
    the bundled examples without output). A dataset with outputs but no config gets None; a config that does
    not load is a warning unless it was named (then its ConfigError is raised)."""
    targets: dict[str, int | None] = {}
    warnings: list[str] = []
    for n in list(only) or [str(p) for p in sorted(config_dir.glob("*.toml")) if p.stem != "server"
                            and (p.stem not in EXAMPLES or (output_dir / p.stem).is_dir())]:
        if not n.endswith(".toml") and not (config_dir / f"{n}.toml").exists() and (output_dir / n).is_dir():
            targets[n] = None
            continue
        try:
            cfg = find_dataset_config(n, config_dir)
        except ConfigError as e:
            if only:
                raise
            warnings.append(str(e))
            targets.setdefault(Path(n).stem, None)
            continue
        targets[cfg.name] = cfg.target_samples
    return targets, warnings


def check_output_root(root: Path) -> None:
    """ConfigError for an --output-dir that is no folder (a typo would read "not started" everywhere, exit 0)."""
    if not Path(root).exists():
        raise ConfigError(f"--output-dir {root}: no such folder, so no dataset has output there. Pass the folder "
                          "generate wrote to (default: outputs), or run generate first: it makes the folder.")
    if not Path(root).is_dir():
        raise ConfigError(f"--output-dir {root} is a file, not a folder. Pass the folder generate wrote to "
                          "(default: outputs).")


def status_all(root: Path, targets: dict[str, int | None], *, total_of: list[str] | None = None,
               others: bool = True) -> StatusReport:
    """Status of every dataset in `targets` plus (`others`) any other folder of `root` with shards; the
    total sums `total_of` (default: every dataset in `targets`)."""
    names = list(targets)
    if others and Path(root).is_dir():
        names += sorted(p.name for p in Path(root).iterdir()
                        if p.is_dir() and p.name not in targets and layout.has_shards(p))
    datasets = [read_status(root, n, targets.get(n)) for n in names]
    counted = set(targets if total_of is None else total_of)
    return StatusReport(datasets, sum(d.done for d in datasets if d.dataset in counted),
                        sum(d.target or 0 for d in datasets if d.dataset in counted),
                        [n for n in names if n in counted])


# ---------------------------------------------------------------- human output


def _si(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.1f}"


def _progress(done: int, target: int | None) -> list[str]:
    """The "done/target" and "%" cells."""
    return [f"{done:,}/{target:,}" if target is not None else f"{done:,}/?",
            f"{100 * done / target:.1f}%" if target else "-"]


def _table(head: list[str], rows: list[list[str]], *, rule: bool = False) -> list[str]:
    """Columns padded to their widest cell, two spaces apart; `rule`: dashes under the head."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in [head, *rows]]
    return lines[:1] + ["  ".join("-" * w for w in widths)] * rule + lines[1:]


def _row(d: DatasetStatus, in_total: bool) -> list[str]:
    errors = f"{d.errors_last_run}/{d.errors_unresolved}" if d.errors_last_run or d.errors_unresolved else "0"
    return [d.dataset, *_progress(d.done, d.target), str(d.shards), _si(d.prompt_tokens),
            _si(d.completion_tokens), f"{100 * d.truncated_share:.1f}%", errors, str(d.rejects),
            d.state if in_total else f"{d.state} (not in total)",
            _si(d.samples_per_s), _si(d.tokens_per_s),
            "-" if (eta := d.eta_s) is None else "done" if eta == 0 else format_duration(eta)]


STATUS_HEAD = ["dataset", "done/target", "%", "shards", "prompt tok", "compl tok", "trunc", "errors",
               "rejects", "state", "samples/s", "tok/s", "ETA"]


def status_rows(report: StatusReport) -> list[list[str]]:
    """The table's cells under STATUS_HEAD: one row per dataset, then the total (when it sums a dataset shown)."""
    counted = set(report.total_of) if report.total_target else {d.dataset for d in report.datasets}
    rows = [_row(d, d.dataset in counted) for d in report.datasets]
    if report.total_target:  # no total row when none of the datasets it sums is shown
        rows.append(["total", *_progress(report.total_done, report.total_target)] + [""] * (len(STATUS_HEAD) - 3))
    return rows


def format_status(report: StatusReport) -> str:
    """A compact table: one row per dataset plus the total."""
    lines = _table(STATUS_HEAD, status_rows(report), rule=True)
    if report.total_target:
        lines.insert(-1, lines[1])
    notes = [f"{d.dataset}: {d.corrupt_lines} unreadable lines in the shards; run validate"
             for d in report.datasets if d.corrupt_lines]
    notes += [f"{d.dataset}: {line}" for d in report.datasets
              if (line := format_gate(d.gate, d.server_s_saved, unit="server"))]
    notes += [f"{d.dataset}: {line}" for d in report.datasets if (line := format_spec(d.gate, d.spec_server))]
    for d in report.datasets:
        if d.mix:
            notes += ["", f"{d.dataset}: sampling mix, samples committed per variant:"]
            notes += [f"  {line}" for line in produced_shares(d.mix, d.variants)]
    notes += format_ranks([d for d in report.datasets if d.ranks])
    if any(d.gpu.recorded for d in report.datasets):  # runs that recorded their server (older ones did not)
        notes += ["", *gpu_lines(report)]
    return "\n".join(lines + (["", "errors = failures in the last run / ids still without a sample"]
                              if any(d.errors_last_run or d.errors_unresolved for d in report.datasets) else [])
                     + notes)


def gpu_lines(report: StatusReport) -> list[str]:
    """GPU-hours per dataset that ran, the job's, and the projected completion (status, report page, card)."""
    ran = [d for d in report.datasets if d.gpu.recorded]
    lines = ["GPU-hours (tp × dp × servers × wall time):"] + [format_usage(f"  {d.dataset}", d.gpu) for d in ran]
    if len(ran) > 1 or not ran:
        lines.append(format_usage("  job", report.gpu))
    return [*lines, "  " + report.projection.line()]


# ---------------------------------------------------------------- datasets written by ranks
# Each rank's part is read like a one-run folder, then summed. A rank is stale (rerun it: it resumes
# alone) when it is short of its share, not exhausted, and no live run holds its lock or its manifest
# has not been committed for STALE_AFTER_S (a live run commits every few seconds); STARTING_GRACE_S
# first while a run has written nothing (its server may be loading the model).

STALE_AFTER_S = 120.0  # runs commit their manifest every ~5 s (RunOptions.commit_interval_s)
STARTING_GRACE_S = 1800.0 + STALE_AFTER_S  # the tuned profile's startup_timeout_s, then the usual
_SUMMED = ("done", "shards", "prompt_tokens", "completion_tokens", "truncated", "errors_last_run",
           "errors_unresolved", "corrupt_lines", "runs", "run_wall_s")


def _rank_status(part: Path | None, dataset: str, rank: int, world: int, target: int | None) -> DatasetStatus:
    share = rank_share(target, rank, world) if target is not None else None
    st = (DatasetStatus(f"{dataset}/{rank_folder_name(rank, world)}", share) if part is None
          else read_part_status(part, f"{dataset}/{part.name}", share))
    st.world_size = world
    unfinished = st.target is None or st.done < st.target
    # how long a live-looking run may go without a commit: longer while its last run has written nothing
    runs = (read_manifest(part)[0] or {}).get("runs", []) if part is not None else []
    starting = not runs or (runs[-1].get("ended_at") is None and not runs[-1].get("samples_written"))
    heartbeat_old = st.heartbeat_age_s is not None and st.heartbeat_age_s > (
        STARTING_GRACE_S if starting else STALE_AFTER_S)
    if unfinished and st.state != "source exhausted" and (not st.state.startswith("running") or heartbeat_old):
        st.stale_ranks = [rank]
    return st


def read_ranked_status(folder: Path, dataset: str, target: int | None) -> DatasetStatus:
    """All ranks of `folder` as one dataset; ranks missing from a world size seen are "not started"."""
    parts = layout.rank_parts(folder)
    worlds = sorted({w for _, w in parts})
    ranks = [_rank_status(parts.get((r, w)), dataset, r, w, target) for w in worlds for r in range(w)]
    if target is None:  # no config: the shares the ranks recorded
        target = sum(r.target or 0 for r in ranks) if all(r.target is not None for r in ranks) else None
    st = DatasetStatus(dataset, target, world_size=max(worlds), ranks=ranks)
    for name in _SUMMED:
        setattr(st, name, sum(getattr(r, name) for r in ranks))
    st.gate = merged(r.gate for r in ranks)
    served = [r.spec_server for r in ranks if r.spec_server is not None]  # each rank's own server's gauge
    st.spec_server = sum(served) / len(served) if served else None
    st.stale_ranks = [n for r in ranks for n in r.stale_ranks]
    st.gpu = gpu_hours.add([r.gpu for r in ranks])
    st.lanes = _lanes(ranks)
    st.mix = next((r.mix for r in ranks if r.mix), [])
    st.variants = merged(r.variants for r in ranks)
    _add_rejects(st, list(parts.values()))
    live = [r for r in ranks if r.state.startswith("running") and not r.stale_ranks]
    for rate in ("samples_per_s", "tokens_per_s"):  # while ranks run, theirs; after, each rank's last rate
        rated = [getattr(r, rate) for r in (live or ranks) if getattr(r, rate) is not None]
        setattr(st, rate, sum(rated) if rated else None)
    st.heartbeat_age_s = min((r.heartbeat_age_s for r in ranks if r.heartbeat_age_s is not None), default=None)
    st.state = _state(ranks, len(live))
    return st


def _lanes(statuses: list[DatasetStatus]) -> dict[str, list[RunRecord]]:
    """The runs of `statuses` by lane (rank), in one list per lane."""
    lanes: dict[str, list[RunRecord]] = {}
    for d in statuses:
        for lane, runs in d.lanes.items():
            lanes.setdefault(lane, []).extend(runs)
    return lanes


def _add_rejects(st: DatasetStatus, parts: list[Path]) -> None:
    # every run (and every rank) re-reads the source and rejects the same rows again: count each once
    rows = [r for p in parts for r in layout.read_jsonl_rows(p / layout.REJECTS_NAME)]
    latest = {r.get("row"): r.get("reason", "?") for r in rows}
    st.rejects = len(latest)
    st.rejects_by_reason = dict(Counter(latest.values()).most_common())


def _state(ranks: list[DatasetStatus], live: int) -> str:
    tail = f", {stale} stale" if (stale := sum(1 for r in ranks if r.stale_ranks)) else ""
    if all(r.state == "finished" for r in ranks):
        return "finished"
    if live:
        return f"running ({live} of {len(ranks)} ranks){tail}"
    if all(r.state in ("finished", "source exhausted") for r in ranks):
        return "source exhausted"
    return f"stopped{tail}" if any(r.runs or r.done for r in ranks) else f"not started{tail}"


def format_ranks(datasets: list[DatasetStatus]) -> list[str]:
    """Per ranked dataset: a line, then one row per rank (what to rerun is marked "stale: run it")."""
    out: list[str] = []
    for d in datasets:
        stale = f"; stale: rank {', '.join(map(str, d.stale_ranks))}" if d.stale_ranks else ""
        out += ["", f"{d.dataset}: {len(d.ranks)} ranks{stale}"]
        head = ["rank", "done/share", "%", "state", "last commit", "samples/s", ""]
        rows = [[r.dataset.split("/", 1)[1], *_progress(r.done, r.target), r.state,
                 "-" if (age := r.heartbeat_age_s) is None else f"{format_duration(max(age, 0.0))} ago",
                 _si(r.samples_per_s), "stale: run it" if r.stale_ranks else ""] for r in d.ranks]
        out += ["  " + line for line in _table(head, rows)]
    return out
