"""`report`: one self-contained HTML page per dataset from its telemetry (PNG plots inlined as
base64) with the `status` table and the diagnosis. matplotlib (Agg) is the optional `report` extra.

The time axis is run time with the gaps between runs removed (a resume days later does not squash
the plots); dashed lines mark where each run starts, red lines where the server restarted.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import html
import io
import os
from pathlib import Path
from typing import Any

from gen_pipeline.display import display_path
from gen_pipeline.errors import ConfigError, StoreError
from gen_pipeline.store.telemetry import runs_of

PANELS = ("throughput", "kv", "load", "retractions")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("report needs matplotlib: pip install 'gen-pipeline[report]' "
                          "(make report installs it).") from None
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


def plot_png(rows: list[dict[str, Any]], title: str, *, dpi: int = 80) -> bytes:
    """The four panels as one PNG."""
    plt = _pyplot()
    xs, starts, restarts = timeline(rows)
    fig, axes = plt.subplots(4, 1, figsize=(10, 9), sharex=True)
    ax = axes[0]
    ax.plot(xs, _series(rows, "gen_tok_s"), label="server generation tok/s", lw=1.2)
    ax.set_ylabel("server tok/s")
    # its own axis: completed tokens over the client's last minute (and a simulator's clock runs faster)
    twin = ax.twinx()
    twin.plot(xs, _series(rows, "client_tok_s"), color="tab:orange", lw=1.0, alpha=0.7,
              label="completed tok/s (client clock, right axis)")
    twin.set_ylabel("client tok/s")
    twin.legend(loc="upper right", fontsize=7)
    ax = axes[1]
    ax.plot(xs, _series(rows, "kv_usage"), color="tab:purple", lw=1.2, label="KV usage")
    ax.axhline(0.9, color="grey", lw=0.8, ls=":")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("KV used / capacity")
    ax = axes[2]
    for key, label in (("window", "window"), ("in_flight", "in flight"), ("running", "running"), ("queued", "queued")):
        ax.plot(xs, _series(rows, key), label=label, lw=1.2)
    ax.set_ylabel("requests")
    ax = axes[3]
    ax.plot(xs, _series(rows, "retractions"), color="tab:red", lw=1.2, label="retractions this run")
    ax.set_ylabel("retractions")
    ax.set_xlabel("run time, minutes (gaps between runs removed)")
    for ax in axes:
        for x, _ in starts:
            ax.axvline(x, color="black", ls="--", lw=0.8)
        for x in restarts:
            ax.axvline(x, color="red", lw=1.0)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=7, ncol=4)
    for x, run in starts:
        axes[0].annotate(f"run {run}", (x, 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                         xytext=(2, -10), textcoords="offset points")
    for x in restarts:
        axes[1].annotate("restart", (x, 0.05), color="red", fontsize=7, xytext=(2, 0), textcoords="offset points")
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def render_html(dataset: str, rows: list[dict[str, Any]], status_text: str, diagnosis_text: str) -> str:
    """The page: plots, the status table, the diagnosis (all inline; no network needed to view it)."""
    runs = runs_of(rows)
    if rows:
        png = base64.b64encode(plot_png(rows, f"{dataset}: {len(rows)} polls over {len(runs)} run(s)")).decode()
        plots = f'<img alt="{html.escape(dataset)} telemetry" src="data:image/png;base64,{png}">'
    else:
        plots = "<p>No telemetry yet: generate writes telemetry.jsonl on every load poll.</p>"
    restarts = sum(max((r.get("restarts") or 0) for r in run) for run in runs)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(dataset)} report</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}} pre{{background:#f4f4f4;padding:1em;
overflow-x:auto}} img{{max-width:100%}}</style></head>
<body><h1>{html.escape(dataset)}</h1>
<p>{len(runs)} run(s), {restarts} server restart(s), {len(rows)} load polls.</p>
<h2>Status</h2><pre>{html.escape(status_text)}</pre>
<h2>Diagnosis</h2><pre>{html.escape(diagnosis_text)}</pre>
<h2>Over time</h2>{plots}
</body></html>
"""


def write_report(path: Path, page: str) -> Path:
    """Write the page atomically (a tmp file beside it, then a rename); raises StoreError (exit 4) when the
    folder cannot be written."""
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
