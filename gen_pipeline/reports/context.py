"""What a dataset's runs were, for the report page, read from its folder only; nothing here raises for a
damaged folder: what cannot be read is left out."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from gen_pipeline.store.fingerprint import read_fingerprint
from gen_pipeline.store.manifest import Manifest, read_manifest

RUN_LOG_NAME = "run.log"
_LOG_LINE = re.compile(r"^\S+ [A-Z]+ (.*)$")
_STARTING = re.compile(r"^starting SGLang \((?P<profile>[^)]*)\) on (?P<url>\S+?),")
_READY = re.compile(r"^SGLang ready after \S+ s: (?P<summary>.*)$")
_ATTACHED = re.compile(r"^attached to (?P<url>.+?): (?P<summary>.*)$")


def run_context(folder: Path, rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(label, value) lines describing the runs of `folder`; `rows` are its telemetry rows."""
    manifest = read_manifest(folder)[0] or {}
    fp = manifest.get("fingerprint")
    fp = fp if isinstance(fp, dict) else (read_fingerprint(folder) or {})
    sampling, source = fp.get("sampling"), fp.get("source")
    extra = [f"{k} {fp[k]}" for k in ("reasoning", "truncated") if fp.get(k)]
    sampled = "; ".join([", ".join(f"{k} {v}" for k, v in sampling.items()), *extra]) if isinstance(sampling, dict) \
        else ""
    out = [("Runs", _runs(manifest)), ("Model", str(fp.get("model") or "")), ("Server", _server(folder)),
           ("KV capacity", _kv(rows)), ("Sampling", sampled),
           ("Source", _source(source) if isinstance(source, dict) else "")]
    return [(label, value) for label, value in out if value]


def _when(iso: Any) -> str:
    try:
        return datetime.fromisoformat(str(iso)).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return "?"


def _runs(manifest: Manifest) -> str:
    runs = manifest.get("runs", [])  # read_manifest checked every field
    if not runs:
        return "none recorded (no manifest.json)"
    first, last = runs[0], runs[-1]
    end = last.get("ended_at") or last.get("updated_at")
    ended = f"last ended {_when(end)}" if last.get("ended_at") else f"last updated {_when(end)}"
    stopped = f", {STOPPED.get(str(how), f'stopped by {how}')}" if (how := last.get("stopped_by")) else ""
    return f"{len(runs)}, first started {_when(first.get('started_at'))}, {ended}{stopped}"


# a run record's stopped_by (RunSummary.stopped_by) in words
STOPPED = {"target": "target reached", "limit": "stopped at --limit", "source_exhausted": "the source ran out",
           "nothing_to_do": "nothing to do (the target was already reached)", "SIGINT": "interrupted (SIGINT)",
           "SIGTERM": "stopped (SIGTERM)"}


def _server(folder: Path) -> str:
    """The last server the runs used, as run.log says: profile and URL, or the attached URL; its summary."""
    try:
        text = (folder / RUN_LOG_NAME).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    where = summary = ""
    for line in text.splitlines():
        msg = m.group(1) if (m := _LOG_LINE.match(line)) else ""
        if s := _STARTING.match(msg):
            where, summary = f"profile {s['profile']} (launched, {s['url']})", ""
        elif r := _READY.match(msg):
            summary = r["summary"]
        elif a := _ATTACHED.match(msg):
            where, summary = f"attached to {a['url']}", a["summary"]
    return "; ".join(x for x in (where, summary) if x)


def _kv(rows: list[dict[str, Any]]) -> str:
    last = next((r for r in reversed(rows) if r.get("kv_capacity_tokens")), None)
    if last is None:
        return ""
    parts = [f"{last['kv_capacity_tokens']:,} tokens", f"KV dtype {last['kv_dtype']}" if last.get("kv_dtype") else "",
             "" if last.get("mem_fraction_static") is None else f"mem_fraction_static {last['mem_fraction_static']}",
             f"max running requests {last['max_running_requests']:,}" if last.get("max_running_requests") else ""]
    return ", ".join(p for p in parts if p)


def _source(source: dict[str, Any]) -> str:
    if source.get("files"):
        return "files " + ", ".join(map(str, source["files"]))
    split = f", split {source['split']}" if source.get("split") else ""
    return f"hub {source.get('hf_id', '?')}{split}"
