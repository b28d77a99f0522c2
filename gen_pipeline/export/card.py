"""The dataset card `export` writes: README.md, YAML front matter (what the HF hub reads) and markdown (docs/export.md
lists what it holds). Inside the folder for `hf`; beside the JSONL file otherwise, as <out stem>.README.md when that
folder holds another README.md."""

from __future__ import annotations

import bisect
import contextlib
import json
import os
from collections import Counter
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gen_pipeline.config.mix import produced_shares
from gen_pipeline.quality.accounting import SAVED_FORMULA, decoded_tokens, format_spec, gpu_s_per_token, saved_gpu_s
from gen_pipeline.reports.status import DatasetStatus, gpu_lines, read_status, run_wall_s, status_all
from gen_pipeline.store.layout import dataset_parts
from gen_pipeline.store.manifest import read_manifest

if TYPE_CHECKING:
    from gen_pipeline.export.options import ExportOptions, ExportSummary

MARK = "gen_pipeline_export"
GATE_COLUMNS = {"loops caught": "loops", "loops kept (cut)": "loops_kept", "empty answers retried": "empty",
                "leaks flagged": "leaks", "tokens not decoded": "tokens_not_decoded"}  # column → DatasetStatus.gate key


def card_path(opts: ExportOptions) -> Path:
    if opts.format == "hf":
        return opts.out / "README.md"
    readme = opts.out.parent / "README.md"
    if not readme.exists() or _ours(readme, opts.out.name):
        return readme
    return opts.out.with_name(opts.out.stem + ".README.md")


def _ours(path: Path, name: str) -> bool:
    with contextlib.suppress(OSError):
        return f"{MARK}: {json.dumps(name)}" in path.read_text(errors="replace")[:2000]
    return False


def write_card(opts: ExportOptions, summary: ExportSummary, chosen: list[dict[str, Any]]) -> Path:
    path = card_path(opts)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(render_card(opts, summary, chosen))
    os.replace(tmp, path)
    return path


def _version() -> str:
    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version("gen-pipeline")
    return "unknown"


def _wall_h(root: Path, dataset: str) -> float | None:
    """Hours the dataset's runs took (every rank's part), from the manifests' run records."""
    walls = [w for part in dataset_parts(root / dataset) for run in (read_manifest(part)[0] or {}).get("runs") or []
             if (w := run_wall_s(run)) is not None]
    return sum(walls) / 3600 if walls else None


def _dataset_rows(opts: ExportOptions, summary: ExportSummary,
                  chosen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for c in summary.counts:
        mine = [r for r in chosen if r.get("dataset", c.dataset) == c.dataset]
        metas = [r["meta"] if isinstance(r.get("meta"), dict) else {} for r in mine]
        st = read_status(opts.output_root, c.dataset, None)
        store_count(st)
        attempted = st.done + st.errors_unresolved
        measured = st.gpu.known
        gpus: int | str | None = f"{st.gpu.gpus} ({st.gpu.how})" if measured else (
            opts.profile.tp_size * opts.profile.dp_size if opts.profile else None)
        wall_h = st.gpu.wall_s / 3600 if measured else _wall_h(opts.output_root, c.dataset)
        per_1k = st.gpu.per_1k if measured else (
            wall_h * gpus / st.done * 1000 if wall_h is not None and isinstance(gpus, int) and st.done else None)
        counted = st.gpu.gpus if measured else (gpus if isinstance(gpus, int) else None)
        saved = saved_gpu_s(st.gate, gpu_s_per_token(None if wall_h is None else wall_h * 3600, counted,
                                                     decoded_tokens(st.gate, st.completion_tokens)))
        rows.append({  # keyed by the card's column names, the cells as printed
            "dataset": c.dataset, "committed samples": f"{c.committed:,}", "exported": f"{c.taken:,}",
            "dropped": ", ".join(f"{n:,} {k}" for k, n in sorted(c.dropped.items())) or "0",
            "model": _most(m.get("model") for m in metas), "backend": _most(m.get("backend") for m in metas),
            "KV cache dtype": _most(m.get("kv_cache_dtype") for m in metas),
            "sampling": f"`{_most(json.dumps(m['sampling'], sort_keys=True) for m in metas if m.get('sampling'))}`",
            "truncated": _pct(sum(m.get("finish_reason") == "length" for m in metas), len(metas)),
            "failed requests": _pct(st.errors_unresolved, attempted),
            "rejected source rows": f"{st.rejects:,}",
            "prompt tokens": f"{sum(int(m.get('prompt_tokens') or 0) for m in metas):,}",
            "completion tokens": f"{sum(int(m.get('completion_tokens') or 0) for m in metas):,}",
            "mix": produced_shares(st.mix, dict(Counter(str(m["sampling_variant"]) for m in metas
                                                        if isinstance(m.get("sampling_variant"), int)))),
            "run wall time": "unknown" if wall_h is None else f"{wall_h:.3f} h", "GPUs": gpus or "unknown",
            "GPU-hours per 1,000 samples": _gpu_h(per_1k), "spec": format_spec(st.gate, st.spec_server),
            **{column: f"{st.gate.get(k, 0):,}" for column, k in GATE_COLUMNS.items()},
            "GPU-hours saved (estimate)": _gpu_h(None if saved is None else saved / 3600),
        })
    return rows


def store_count(st: DatasetStatus) -> int:
    """Count `st.gpu` over the store's samples (every run's GPUs known): a run killed after writing samples its
    manifest had not recorded (samples_written) undercounts them. In place; returns the samples added."""
    u = st.gpu
    if not u.known or u.unknown_runs or st.done <= u.samples:
        return 0
    added, u.samples = st.done - u.samples, st.done
    return added


def _most(values: Any) -> str:
    c = Counter(str(v) for v in values if v not in (None, ""))
    if not c:
        return "unknown"
    (top, n), total = c.most_common(1)[0], sum(c.values())
    return top if n == total else f"{top} ({n:,} of {total:,} samples)"


def render_card(opts: ExportOptions, summary: ExportSummary, chosen: list[dict[str, Any]]) -> str:
    rows = _dataset_rows(opts, summary, chosen)
    total = sum(summary.rows.values())
    size = ("n<1K", "1K<n<10K", "10K<n<100K", "100K<n<1M")[bisect.bisect_right((1_000, 10_000, 100_000), total)]
    files = {k: p.name for k, p in summary.paths.items()}
    front = ["---", f"{MARK}: {json.dumps(opts.out.name)}", f"pretty_name: {json.dumps(opts.out.stem)}",
             "task_categories:", "- text-generation", "tags:", "- speculative-decoding", "- eagle3", "- synthetic",
             f"size_categories:\n- {size}"]
    if opts.format == "hf" and opts.hf_layout == "parquet":
        front += ["configs:", "- config_name: default", "  data_files:"]
        front += [f"  - split: {k}\n    path: {k}.parquet" for k in summary.rows]
    front.append("---")
    p = opts.profile
    server = (f"`{p.name}` profile (tp {p.tp_size} × dp {p.dp_size} = {p.tp_size * p.dp_size} GPUs)" if p
              else "unknown (export with --server NAME to record it)")
    body = [f"# {opts.out.stem}", "",
            f"Training data for an EAGLE-3 draft model: every assistant turn regenerated by the target model. "
            f"Written by gen-pipeline {_version()} on {datetime.now(UTC).isoformat(timespec='seconds')}.", "",
            "## Files", ""]
    body += [f"- `{name}`: {k}, {summary.rows.get(k, 0):,} rows" for k, name in files.items()]
    if not files:
        body += [f"- `{opts.out.name}/`: {', '.join(f'{k} {n:,} rows' for k, n in summary.rows.items())}"]
    body += ["", f"Format `{opts.format}`" + (" with `--expand-turns`" if opts.expand_turns else "") + ". Server: "
             + server + ".", "", "## Target and sampling", "",
             *_table(rows, "dataset", "model", "backend", "KV cache dtype", "sampling")]
    for r in rows:
        if r["mix"]:
            body += ["", f"Sampling mix of {r['dataset']} (each sample's variant drawn from the mix seed and its "
                     "source row; its sampling is in meta.sampling, its variant in meta.sampling_variant), exported "
                     "samples per variant:", ""]
            body += [f"- {line}" for line in r["mix"]]
    body += ["", "## Counts", "", *_table(rows, "dataset", "committed samples", "dropped", "exported", "truncated",
                                          "failed requests", "rejected source rows"),
             "", "## Tokens and cost", "", *_table(rows, "dataset", "prompt tokens", "completion tokens",
                                                   "run wall time", "GPUs", "GPU-hours per 1,000 samples"),
             "", "Token totals are over the exported samples (their meta). GPU-hours = GPUs × wall time ÷ "
             "committed samples × 1,000: measured where the runs recorded their server (tp × dp × servers, "
             "wall time from each dataset's first request), else every run's wall time, start-up included, "
             "× the --server profile's tp × dp.", ""]
    status = status_all(opts.output_root, {r["dataset"]: None for r in rows}, others=False)
    status.gpu.samples += sum(store_count(d) for d in status.datasets)
    if any(d.gpu.recorded for d in status.datasets):
        body += ["```", *(line.removeprefix("  ") for line in gpu_lines(status)), "```", ""]
    body += ["## Quality gate", "", *_table(rows, "dataset", *GATE_COLUMNS, "GPU-hours saved (estimate)")]
    spec = [f"- {r['dataset']}: {r['spec']}" for r in rows if r["spec"]]  # the server ran a draft
    body += ["", "Loops are stopped on the stream as they begin (the server aborts the request); failed samples' "
             f"loops included. GPU-hours saved = {SAVED_FORMULA}.", "",
             *(["## Draft acceptance", "", *spec, ""] if spec else []),
             "## Export", "", "```", opts.command or f"gen-pipeline export --format {opts.format} --out {opts.out}",
             "```", ""]
    return "\n".join(front + body)


def _table(rows: list[dict[str, Any]], *columns: str) -> list[str]:
    """A markdown table of `columns` (keys of each row): header, rule, a line per row."""
    return [f"| {' | '.join(columns)} |", "|" + "---|" * len(columns),
            *(f"| {' | '.join(str(r[c]) for c in columns)} |" for r in rows)]


def _pct(part: int, whole: int) -> str:
    return f"{100 * (part / whole if whole else 0.0):.1f}%"


def _gpu_h(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.2f}"

