"""`status`: figures of each dataset folder, read from outputs/ only, without the lock, so it
works while a run writes and after one died. Sealed shards' figures come from the manifest;
only the open shard (and any shard the manifest does not match) is parsed, torn tail skipped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from .manifest import read_lock, read_manifest
from .progress import format_duration
from .shards import list_shards, read_sidecar, scan_bytes, sidecar_path

ERRORS_NAME = "errors.jsonl"
REJECTS_NAME = "rejects.jsonl"


def _jsonl_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON object lines of a file (a torn or unparseable line is skipped); [] when absent."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    rows = []
    for line in data.split(b"\n"):
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def final_failure_ids(folder: Path) -> set[str]:
    """Ids recorded in errors.jsonl with `retryable: false` (done or not)."""
    return {r["id"] for r in _jsonl_rows(folder / ERRORS_NAME)
            if r.get("retryable") is False and isinstance(r.get("id"), str)}


@dataclass
class DatasetStatus:
    """One dataset's figures; `state` is "running (pid N)", "stopped", "finished", "not started"
    or "died (pid N gone)". Rates in samples/s and tokens/s, `eta_s` in seconds."""

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
    updated_at: str | None = None
    corrupt_lines: int = 0

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
        return self.remaining / self.samples_per_s if self.samples_per_s else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "truncated_share": round(self.truncated_share, 4),
                "remaining": self.remaining, "eta_s": self.eta_s}


@dataclass
class StatusReport:
    """All datasets plus the total over `total_of` (the datasets that make up the job)."""

    datasets: list[DatasetStatus]
    total_done: int
    total_target: int

    def to_dict(self) -> dict[str, Any]:
        return {"datasets": {d.dataset: d.to_dict() for d in self.datasets},
                "total": {"done": self.total_done, "target": self.total_target}}


def read_status(root: Path, dataset: str, target: int | None) -> DatasetStatus:
    """Figures of `root/dataset` (target None = the one the last run recorded). Never raises for
    a damaged folder: unreadable parts are skipped and counted in `corrupt_lines`."""
    folder = Path(root) / dataset
    manifest = read_manifest(folder)[0] if folder.is_dir() else None
    manifest = manifest or {}
    st = DatasetStatus(dataset, target if target is not None else manifest.get("target"))
    if not folder.is_dir():
        return st
    open_ids = _add_shards(st, folder, manifest)
    _add_errors(st, folder, manifest, open_ids)
    _add_rejects(st, folder)
    _add_run(st, folder, manifest)
    return st


def _add_shards(st: DatasetStatus, folder: Path, manifest: dict[str, Any]) -> list[str]:
    """Shard figures into `st`; returns the ids parsed (the shards the manifest does not cover)."""
    sealed = {e.get("name"): e for e in manifest.get("sealed", []) if isinstance(e, dict)}
    parsed: list[str] = []
    for path in list_shards(folder).values():
        st.shards += 1
        entry = sealed.get(path.name)
        try:
            size = path.stat().st_size
            if entry is not None and entry.get("bytes") == size:
                for k in ("prompt_tokens", "completion_tokens", "truncated"):
                    setattr(st, k, getattr(st, k) + int(entry.get(k, 0)))
                st.done += int(entry.get("samples", 0))
                continue
            scan = scan_bytes(path.read_bytes())
        except (OSError, ValueError, TypeError):
            continue  # vanished or rewritten while we read: a live run owns it
        st.done += scan.samples
        st.prompt_tokens += scan.prompt_tokens
        st.completion_tokens += scan.completion_tokens
        st.truncated += scan.truncated
        st.corrupt_lines += len(scan.corrupt)
        parsed += scan.ids
    return parsed


def _done_ids(folder: Path, manifest: dict[str, Any], parsed: list[str]) -> set[str]:
    ids = set(parsed)
    for e in manifest.get("sealed", []):
        if isinstance(e, dict) and isinstance(e.get("name"), str):
            ids.update(read_sidecar(sidecar_path(folder / e["name"])) or [])
    return ids


def _add_errors(st: DatasetStatus, folder: Path, manifest: dict[str, Any], parsed: list[str]) -> None:
    rows = _jsonl_rows(folder / ERRORS_NAME)
    if not rows:
        return
    runs = manifest.get("runs") or [{}]
    last = runs[-1].get("run", max((r.get("run", 0) for r in rows), default=0))
    st.errors_last_run = sum(1 for r in rows if r.get("run") == last)
    done = _done_ids(folder, manifest, parsed)
    st.errors_unresolved = len({r.get("id") for r in rows} - done - {None})


def _add_rejects(st: DatasetStatus, folder: Path) -> None:
    # Every run re-reads the source and rejects the same rows again: count each row once.
    latest = {r.get("row"): r.get("reason", "?") for r in _jsonl_rows(folder / REJECTS_NAME)}
    st.rejects = len(latest)
    st.rejects_by_reason = dict(Counter(latest.values()).most_common())


def _add_run(st: DatasetStatus, folder: Path, manifest: dict[str, Any]) -> None:
    runs = manifest.get("runs") or []
    st.runs = len(runs)
    lock = read_lock(folder)
    if lock is not None and lock.pid is not None:
        where = "" if lock.local else f" on {lock.host}"
        st.state = f"running (pid {lock.pid}{where})" if lock.alive else f"died (pid {lock.pid} gone)"
    elif lock is not None:
        st.state = "running (pid unknown)" if lock.alive else "died (pid unknown)"
    elif st.target is not None and st.done >= st.target:
        st.state = "finished"
    elif runs or st.done:
        st.state = "stopped"
    progress = manifest.get("progress") or {}
    st.samples_per_s = _num(progress.get("samples_per_s"))
    st.tokens_per_s = _num(progress.get("tokens_per_s"))
    st.updated_at = progress.get("updated_at") or manifest.get("updated_at")
    if st.samples_per_s is None and runs:
        st.samples_per_s = _run_rate(runs[-1])


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _run_rate(run: dict[str, Any]) -> float | None:
    """samples/s of a run from its manifest record, when the pipeline passed no progress."""
    try:
        t0 = datetime.fromisoformat(run["started_at"])
        t1 = datetime.fromisoformat(run.get("ended_at") or run["updated_at"])
    except (KeyError, TypeError, ValueError):
        return None
    elapsed_s = (t1 - t0).total_seconds()
    return run.get("samples_written", 0) / elapsed_s if elapsed_s > 0 else None


def status_all(root: Path, targets: dict[str, int], *, total_of: list[str] | None = None) -> StatusReport:
    """Status of every dataset in `targets` plus any other folder of `root` with shards; the
    total sums `total_of` (default: every dataset in `targets`)."""
    names = list(targets)
    if Path(root).is_dir():
        names += sorted(p.name for p in Path(root).iterdir()
                        if p.is_dir() and p.name not in targets and any(p.glob("shard-*.jsonl")))
    datasets = [read_status(root, n, targets.get(n)) for n in names]
    counted = set(targets if total_of is None else total_of)
    return StatusReport(datasets, sum(d.done for d in datasets if d.dataset in counted),
                        sum(targets.get(n, 0) for n in counted))


# ---------------------------------------------------------------- human output


def _si(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.1f}"


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    return "done" if s == 0 else format_duration(s)


def _row(d: DatasetStatus) -> list[str]:
    errors = f"{d.errors_last_run}/{d.errors_unresolved}" if d.errors_last_run or d.errors_unresolved else "0"
    return [d.dataset, f"{d.done:,}/{d.target:,}" if d.target is not None else f"{d.done:,}/?",
            f"{100 * d.done / d.target:.1f}%" if d.target else "-", str(d.shards), _si(d.prompt_tokens),
            _si(d.completion_tokens), f"{100 * d.truncated_share:.1f}%", errors, str(d.rejects), d.state,
            _si(d.samples_per_s), _si(d.tokens_per_s), _duration(d.eta_s)]


def format_status(report: StatusReport) -> str:
    """A compact table: one row per dataset plus the total."""
    head = ["dataset", "done/target", "%", "shards", "prompt tok", "compl tok", "trunc", "errors",
            "rejects", "state", "samples/s", "tok/s", "ETA"]
    rows = [_row(d) for d in report.datasets]
    if report.total_target:  # no total row when none of the datasets it sums is shown
        pct = f"{100 * report.total_done / report.total_target:.1f}%"
        rows.append(["total", f"{report.total_done:,}/{report.total_target:,}", pct] + [""] * (len(head) - 3))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if report.total_target:
        lines.insert(-1, lines[1])
    notes = [f"{d.dataset}: {d.corrupt_lines} unreadable lines in the shards; run validate"
             for d in report.datasets if d.corrupt_lines]
    return "\n".join(lines + (["", "errors = failures in the last run / ids still without a sample"]
                              if any(d.errors_last_run or d.errors_unresolved for d in report.datasets) else [])
                     + notes)
