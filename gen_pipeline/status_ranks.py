"""`status` of a dataset written by ranks: each rank's part read like a one-run folder, then
summed into one DatasetStatus, with the ranks that are stale (unfinished and nobody writing them).

A rank is stale when it is short of its share, not "source exhausted" (another run would not
help), and either no live run holds its lock (died, stopped, never started) or its manifest has
not been committed for STALE_AFTER_S (a run commits every few seconds while it lives: one that
does not is hung, or on a host this one cannot check). A run that has written nothing yet may be
loading the model (no commits until its server answers): it gets STARTING_GRACE_S first.
Rerunning a stale rank resumes it alone.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from .layout import REJECTS_NAME, rank_parts, read_jsonl_rows
from .manifest import read_manifest
from .progress import format_duration
from .ranks import rank_folder_name, rank_share
from .status import DatasetStatus, _si, read_part_status

STALE_AFTER_S = 120.0  # runs commit their manifest every ~5 s (RunOptions.commit_interval_s)
STARTING_GRACE_S = 1800.0 + STALE_AFTER_S  # the tuned profile's startup_timeout_s, then the usual
_SUMMED = ("done", "shards", "prompt_tokens", "completion_tokens", "truncated", "errors_last_run",
           "errors_unresolved", "corrupt_lines", "runs")


def _rank_status(part: Path | None, dataset: str, rank: int, world: int, target: int | None) -> DatasetStatus:
    share = rank_share(target, rank, world) if target is not None else None
    if part is None:
        st = DatasetStatus(f"{dataset}/{rank_folder_name(rank, world)}", share)
    else:
        st = read_part_status(part, f"{dataset}/{part.name}", share)
    st.world_size = world
    running = st.state.startswith("running")
    unfinished = st.target is None or st.done < st.target
    heartbeat_old = st.heartbeat_age_s is not None and st.heartbeat_age_s > _stale_after_s(part)
    if unfinished and st.state != "source exhausted" and (not running or heartbeat_old):
        st.stale_ranks = [rank]
    return st


def _stale_after_s(part: Path | None) -> float:
    """How long a live-looking run may go without a commit: longer while its last run has written nothing."""
    runs = ((read_manifest(part)[0] or {}).get("runs") or [{}]) if part is not None else [{}]
    last = runs[-1] if isinstance(runs[-1], dict) else {}
    starting = last.get("ended_at") is None and not last.get("samples_written")
    return STARTING_GRACE_S if starting else STALE_AFTER_S


def read_ranked_status(folder: Path, dataset: str, target: int | None) -> DatasetStatus:
    """All ranks of `folder` as one dataset; ranks missing from a world size seen are "not started"."""
    parts = rank_parts(folder)
    worlds = sorted({w for _, w in parts})
    ranks = [_rank_status(parts.get((r, w)), dataset, r, w, target) for w in worlds for r in range(w)]
    if target is None:  # no config: the shares the ranks recorded
        target = sum(r.target or 0 for r in ranks) if all(r.target is not None for r in ranks) else None
    st = DatasetStatus(dataset, target, world_size=max(worlds), ranks=ranks)
    for name in _SUMMED:
        setattr(st, name, sum(getattr(r, name) for r in ranks))
    st.stale_ranks = [n for r in ranks for n in r.stale_ranks]
    _add_rejects(st, list(parts.values()))
    live = [r for r in ranks if r.state.startswith("running") and not r.stale_ranks]
    # while ranks run, the dataset's rate is theirs; after, the sum of each rank's last rate
    rated = [r.samples_per_s for r in (live or ranks) if r.samples_per_s is not None]
    st.samples_per_s = sum(rated) if rated else None
    tok = [r.tokens_per_s for r in (live or ranks) if r.tokens_per_s is not None]
    st.tokens_per_s = sum(tok) if tok else None
    st.heartbeat_age_s = min((r.heartbeat_age_s for r in ranks if r.heartbeat_age_s is not None), default=None)
    st.state = _state(ranks, len(live))
    return st


def _add_rejects(st: DatasetStatus, parts: list[Path]) -> None:
    # every rank reads the whole source and records the same invalid rows: count each row once
    latest = {r.get("row"): r.get("reason", "?") for p in parts for r in read_jsonl_rows(p / REJECTS_NAME)}
    st.rejects = len(latest)
    st.rejects_by_reason = dict(Counter(latest.values()).most_common())


def _state(ranks: list[DatasetStatus], live: int) -> str:
    stale = sum(1 for r in ranks if r.stale_ranks)
    tail = f", {stale} stale" if stale else ""
    if all(r.state == "finished" for r in ranks):
        return "finished"
    if live:
        return f"running ({live} of {len(ranks)} ranks){tail}"
    if all(r.state in ("finished", "source exhausted") for r in ranks):
        return "source exhausted"
    return f"stopped{tail}" if any(r.runs or r.done for r in ranks) else f"not started{tail}"


def _ago(age_s: float | None) -> str:
    return "-" if age_s is None else f"{format_duration(max(age_s, 0.0))} ago"


def format_ranks(datasets: list[DatasetStatus]) -> list[str]:
    """Per ranked dataset: a line, then one row per rank (what to rerun is marked "stale: run it")."""
    out: list[str] = []
    for d in datasets:
        stale = f"; stale: rank {', '.join(map(str, d.stale_ranks))}" if d.stale_ranks else ""
        out += ["", f"{d.dataset}: {len(d.ranks)} ranks{stale}"]
        head = ["rank", "done/share", "%", "state", "last commit", "samples/s", ""]
        rows = [[r.dataset.split("/", 1)[1], f"{r.done:,}/{r.target:,}" if r.target is not None else f"{r.done:,}/?",
                 f"{100 * r.done / r.target:.1f}%" if r.target else "-", r.state, _ago(r.heartbeat_age_s),
                 _si(r.samples_per_s), "stale: run it" if r.stale_ranks else ""] for r in d.ranks]
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in [head, *rows]]
    return out
