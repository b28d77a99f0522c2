"""`report`: one self-contained HTML page per dataset (PNG plots inlined: it opens offline; matplotlib is the
`report` extra). The time axis leaves out the gaps between runs, so a resume days later does not squash the plots."""

from __future__ import annotations

import base64
import contextlib
import errno
import html
import io
import os
from pathlib import Path
from typing import Any

from gen_pipeline.config.mix import produced_shares
from gen_pipeline.display import display_path
from gen_pipeline.errors import ConfigError, StoreError
from gen_pipeline.quality.accounting import SAVED_FORMULA, format_gate
from gen_pipeline.reports.context import run_context
from gen_pipeline.reports.diagnose import THRESHOLDS
from gen_pipeline.reports.status import STATUS_HEAD, StatusReport, gpu_lines, status_all, status_rows
from gen_pipeline.store.layout import dataset_folder
from gen_pipeline.store.manifest import read_manifest
from gen_pipeline.store.telemetry import runs_of


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("report needs matplotlib, which is not installed in this Python. On the GPU node: "
                          "make venv EXTRAS=gpu (the one install that every make target runs with); into "
                          "another Python: pip install -e '.[report]' from the checkout.") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def timeline(rows: list[dict[str, Any]]) -> tuple[list[float], list[tuple[float, Any]], list[float]]:
    """(x minutes for each row, [(x, run id) where each run starts], [x of each restart])."""
    xs: list[float] = []
    starts: list[tuple[float, Any]] = []
    restarts: list[float] = []
    offset = 0.0
    for run in runs_of(rows):
        t0 = run[0]["t_run_s"]
        starts.append((offset / 60, run[0].get("run")))
        prev_restarts = run[0].get("restarts") or 0
        for r in run:
            x = (offset + r["t_run_s"] - t0) / 60
            xs.append(x)
            if (r.get("restarts") or 0) > prev_restarts:
                restarts.append(x)
            prev_restarts = r.get("restarts") or 0
        offset += run[-1]["t_run_s"] - t0 + 1.0  # a second apart so boundaries stay visible
    return xs, starts, restarts


def _series(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float("nan") if r.get(key) is None else float(r[key]) for r in rows]


def _legend_outside(ax: Any, extra: Any = None) -> None:
    """One legend to the right of the panel (never over its lines), with `extra` axes' entries (a twin)."""
    handles, labels = ax.get_legend_handles_labels()
    more = extra.get_legend_handles_labels() if extra is not None else ([], [])
    handles, labels = handles + more[0], labels + more[1]
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.09 if extra is not None else 1.01, 1.0),
                  borderaxespad=0.0, fontsize=8, frameon=False)


def plot_figure(rows: list[dict[str, Any]], title: str) -> Any:
    """The four panels as a matplotlib Figure: legends right of the panels, thresholds labelled."""
    plt = _pyplot()
    xs, starts, restarts = timeline(rows)
    span_min = max(xs, default=0.0)
    unit, per = ("seconds", 1 / 60) if span_min < 2 else ("hours", 60.0) if span_min > 180 else ("minutes", 1.0)
    xs, starts, restarts = [x / per for x in xs], [(x / per, r) for x, r in starts], [x / per for x in restarts]
    fig, axes = plt.subplots(4, 1, figsize=(11, 9.5), sharex=True, layout="constrained")
    ax = axes[0]
    ax.plot(xs, _series(rows, "gen_tok_s"), label="server generation tok/s (left axis)", lw=1.2)
    ax.set_ylabel("server tok/s")
    # its own axis: completed tokens over the client's last minute (and a simulator's clock runs faster)
    twin = ax.twinx()
    twin.plot(xs, _series(rows, "client_tok_s"), color="tab:orange", lw=1.0, alpha=0.7,
              label="completed tok/s, client clock (right axis)")
    twin.set_ylabel("client tok/s")
    _legend_outside(ax, twin)
    ax = axes[1]
    ax.plot(xs, _series(rows, "kv_usage"), color="tab:purple", lw=1.2, label="KV usage")
    kv_full = THRESHOLDS["kv_full"]
    ax.axhline(kv_full, color="grey", lw=0.8, ls=":", label=f"kv_full {kv_full:.2f} (diagnose: the pool fills)")
    ax.annotate(f"kv_full {kv_full:.2f}", (1.0, kv_full), xycoords=("axes fraction", "data"), xytext=(-3, 3),
                textcoords="offset points", ha="right", fontsize=8, color="dimgrey",
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8})
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("KV used / capacity")
    ax = axes[2]
    for key, label in (("window", "window"), ("in_flight", "in flight"), ("running", "running"), ("queued", "queued")):
        ax.plot(xs, _series(rows, key), label=label, lw=1.2)
    ax.set_ylabel("requests")
    ax = axes[3]
    retractions = _series(rows, "retractions")
    ax.plot(xs, retractions, color="tab:red", lw=1.2, label="retractions this run")
    ax.set_ylim(0, max([1.0] + [v * 1.1 for v in retractions if v == v]))  # a count: never below 0 (v == v: not NaN)
    ax.set_ylabel("retractions")
    ax.set_xlabel(f"run time, {unit} (gaps between runs removed)")
    for ax in axes:
        for x, _ in starts:
            ax.axvline(x, color="black", ls="--", lw=0.8)
        for x in restarts:
            ax.axvline(x, color="red", lw=1.0)
        ax.grid(alpha=0.3)
        if ax is not axes[0]:
            _legend_outside(ax)
    for x, run in starts:
        axes[0].annotate(f"run {run}", (x, 1.0), xycoords=("data", "axes fraction"), fontsize=8,
                         xytext=(2, -10), textcoords="offset points")
    for x in restarts:
        axes[1].annotate("restart", (x, 0.05), color="red", fontsize=8, xytext=(2, 0), textcoords="offset points")
    fig.suptitle(title)
    return fig


def plot_png(rows: list[dict[str, Any]], title: str, *, dpi: int = 100) -> bytes:
    """The four panels as one PNG."""
    fig = plot_figure(rows, title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    _pyplot().close(fig)
    return buf.getvalue()


_CSS = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
pre{background:#f4f4f4;padding:1em;white-space:pre-wrap;overflow-wrap:anywhere}
table{border-collapse:collapse;margin:0.5em 0}
table.context th{text-align:left;vertical-align:top;padding:0.2em 1em 0.2em 0;white-space:nowrap}
table.context td{padding:0.2em 0;overflow-wrap:anywhere}
table.status{width:100%;font-size:0.9em}
table.status th,table.status td{border-bottom:1px solid #ddd;padding:0.3em 0.4em;text-align:right}
table.status th:first-child,table.status td:first-child{text-align:left}
img{max-width:100%;height:auto}"""


def _status_html(status: StatusReport | str) -> str:
    if isinstance(status, str):  # a preformatted table (from a caller that built it)
        return f"<pre>{html.escape(status)}</pre>"
    cells = [[f"<th>{html.escape(h)}</th>" for h in STATUS_HEAD]]
    cells += [[f"<td>{html.escape(c)}</td>" for c in row] for row in status_rows(status)]
    table = '<table class="status">' + "".join(f"<tr>{''.join(r)}</tr>" for r in cells) + "</table>"
    gate = [f"<p>{html.escape(d.dataset)}: {html.escape(line)} (saved: an estimate, "
            f"{html.escape(SAVED_FORMULA)})</p>"
            for d in status.datasets if (line := format_gate(d.gate, d.server_s_saved, unit="server"))]
    mixes = [f"<p>{html.escape(d.dataset)}: sampling mix, samples committed per variant:</p><pre>"
             + html.escape("\n".join(produced_shares(d.mix, d.variants))) + "</pre>" for d in status.datasets if d.mix]
    if any(d.gpu.recorded for d in status.datasets):
        mixes.append('<pre class="gpu">' + html.escape("\n".join(gpu_lines(status))) + "</pre>")
    return table + "".join(gate) + "".join(mixes)


def render_html(dataset: str, rows: list[dict[str, Any]], status: StatusReport | str, diagnosis_text: str,
                context: list[tuple[str, str]] | None = None, run_total: int | None = None) -> str:
    """The page: what the runs were, the status of this dataset, the diagnosis, the plots (all inline; no
    network needed to view it). `run_total`: the manifest's runs (default: those with telemetry)."""
    runs = runs_of(rows)
    if rows:
        title = f"{dataset}: {_count(len(rows), 'poll')} over {_count(len(runs), 'run')} with telemetry"
        png = base64.b64encode(plot_png(rows, title)).decode()
        plots = f'<img alt="{html.escape(dataset)} telemetry" src="data:image/png;base64,{png}">'
    else:
        plots = "<p>No telemetry yet: generate writes telemetry.jsonl on every load poll.</p>"
    restarts = sum(max((r.get("restarts") or 0) for r in run) for run in runs)
    facts = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in context or [])
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(dataset)} report</title>
<style>{_CSS}</style></head>
<body><h1>{html.escape(dataset)}</h1>
<p>{_count(len(runs) if run_total is None else run_total, "run")}, {_count(restarts, "server restart")}, \
{_count(len(rows), "load poll")}.</p>
{f'<table class="context">{facts}</table>' if facts else ""}
<h2>Status</h2>{_status_html(status)}
<h2>Diagnosis</h2><pre>{html.escape(diagnosis_text)}</pre>
<h2>Over time</h2>{plots}
</body></html>
"""


def build_report(output_root: Path, dataset: str, rows: list[dict[str, Any]], diagnosis_text: str,
                 target: int | None) -> str:
    """The report page of `output_root/dataset`: its run context and its own status (no other dataset)."""
    folder = dataset_folder(output_root, dataset)
    status = status_all(output_root, {dataset: target}, total_of=[], others=False)
    runs = len((read_manifest(folder)[0] or {}).get("runs", []))  # every run, also one that had nothing to do
    return render_html(dataset, rows, status, diagnosis_text, run_context(folder, rows), runs)


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def write_report(path: Path, page: str) -> Path:
    """Write the page atomically (a tmp file, then a rename); StoreError (exit 4) when the folder cannot be written."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        hint = ("free space there or pass --out on another disk" if e.errno in (errno.ENOSPC, errno.EDQUOT)
                else "pass --out with a path in a folder you can write")
        raise StoreError(f"Cannot write the report {display_path(path)}: {e.strerror or e}. Nothing was written; "
                         f"{hint} (e.g. --out /tmp/{path.name}).") from None
    return path
