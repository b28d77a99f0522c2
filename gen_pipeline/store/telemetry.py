"""Telemetry: one JSON line per load poll of a run in outputs/<DATASET>/telemetry.jsonl (docs/status.md), appended
by a daemon thread from a bounded queue without fsync (a lost row costs nothing); it never fails a run. Past
`max_bytes` rows are decimated 10:1 into telemetry.1.jsonl, itself decimated 2:1 in place. Readers skip a torn line.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypedDict

import orjson

from gen_pipeline.records import RunSnapshot
from gen_pipeline.store.layout import jsonl_rows, read_jsonl_rows
from gen_pipeline.store.manifest import write_atomic

TELEMETRY_NAME = "telemetry.jsonl"
ARCHIVE_NAME = "telemetry.1.jsonl"
MAX_BYTES = 8 << 20  # ~17K rows of ~500 bytes: ~5 h at one poll a second
ROTATE_KEEP_EVERY = 10  # telemetry.jsonl → archive: keep 1 row in 10
ARCHIVE_KEEP_EVERY = 2  # archive over max_bytes: keep 1 row in 2
_QUEUE_ROWS = 1024  # ~17 min of polls at 1 s: a stuck disk drops rows instead of growing memory
_STOP = object()


class TelemetryRow(TypedDict):
    """One line of telemetry.jsonl: one load poll of a run (a RunSnapshot, flattened for the page)."""

    t: float  # wall clock, time.time()
    t_run_s: float
    run: int | None
    window: int
    in_flight: int
    running: int | None
    queued: int | None
    kv_used_tokens: int | None
    kv_usage: float | None
    kv_capacity_tokens: int | None
    max_running_requests: int | None
    cuda_graph_max_bs: int | None  # the server's CUDA-graph ceiling (largest decode batch with a graph)
    kv_dtype: str | None
    mem_fraction_static: float | None
    gen_tok_s: float | None
    client_tok_s: float
    samples_per_s: float
    retractions_total: int | None
    retractions: int | None  # this run's
    done: int
    target: int
    failures: int
    mode: str | None  # "fixed" under --window, else the controller's
    reason: str | None
    tokens_per_request: float | None
    held_tokens_per_request: float | None
    restarts: int
    client_cpu: float | None  # cores the CLI process used over the last ~10 s (1.0: one core busy)
    front_end_cpu: float | None  # ... a launched SGLang's busiest front-end process (run/stats.py); attached: None


def build_row(s: RunSnapshot, *, run: int | None) -> TelemetryRow:
    """One poll's row from the run's snapshot. Pure."""
    return {
        "t": round(s.time_s, 3), "t_run_s": round(s.elapsed_s, 3), "run": run,
        "window": s.window, "in_flight": s.in_flight, "running": s.running, "queued": s.queued,
        "kv_used_tokens": s.kv_used_tokens, "kv_usage": _round(s.kv_usage, 4),
        "kv_capacity_tokens": s.kv_capacity_tokens, "max_running_requests": s.max_running_requests,
        "cuda_graph_max_bs": s.cuda_graph_max_bs, "kv_dtype": s.kv_dtype, "mem_fraction_static": s.mem_fraction_static,
        "gen_tok_s": _round(s.gen_tokens_per_s, 1),
        "client_tok_s": round(s.tokens_per_s, 1), "samples_per_s": round(s.samples_per_s, 4),
        "retractions_total": s.retractions_total, "retractions": s.retractions_run,
        "done": s.done, "target": s.target, "failures": s.failures,
        "mode": "fixed" if s.fixed_window else s.controller_mode,
        "reason": "--window" if s.fixed_window else s.controller_reason,
        "tokens_per_request": _round(s.tokens_per_request, 1),
        "held_tokens_per_request": _round(s.held_tokens_per_request, 1),
        "restarts": s.restarts, "client_cpu": _round(s.client_cpu, 3),
        "front_end_cpu": _round(s.front_end_cpu, 3),
    }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


class Telemetry:
    """A run's telemetry writer; call `poll` from the load poller, `close` at the end of the run."""

    def __init__(self, folder: Path, *, run: int | None, on_event: Callable[[str], Any] = print,
                 max_bytes: int = MAX_BYTES) -> None:
        self.path = Path(folder) / TELEMETRY_NAME
        self.run = None if run is None else max(run, last_run(Path(folder)) + 1)
        self.on_event, self.max_bytes, self.enabled, self.dropped = on_event, max_bytes, True, 0
        self._queue: queue.Queue[Any] = queue.Queue(_QUEUE_ROWS)
        self._thread: threading.Thread | None = None

    def poll(self, snapshot: RunSnapshot) -> None:
        """Record one load poll (never raises, never blocks)."""
        if not self.enabled:
            return
        try:
            row = build_row(snapshot, run=self.run)
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="telemetry", daemon=True)
                self._thread.start()
            self._queue.put_nowait(row)
        except queue.Full:
            self.dropped += 1
        except Exception as e:  # a telemetry bug must not end a run
            self._disable(f"telemetry off: could not record a poll ({type(e).__name__}: {e})")

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush what is queued (waits at most timeout_s) and stop the thread."""
        if self._thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put(_STOP, timeout=timeout_s)
                self._thread.join(timeout_s)

    def _disable(self, message: str) -> None:
        if self.enabled:
            self.enabled = False
            with contextlib.suppress(Exception):
                self.on_event(message)

    def _drain(self) -> None:
        fresh = True
        while True:
            rows = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while len(rows) < 256:
                    rows.append(self._queue.get_nowait())
            stop = any(r is _STOP for r in rows)
            rows = [r for r in rows if r is not _STOP]
            if rows and self.enabled:
                try:
                    append_rows(self.path, rows, mend_tail=fresh, max_bytes=self.max_bytes)
                    fresh = False
                except OSError as e:
                    self._disable(f"telemetry off for this run: cannot write {self.path} ({e.strerror or e}); "
                                  "the run goes on.")
            if stop:
                return


def append_rows(path: Path, rows: list[dict[str, Any]], *, mend_tail: bool = False,
                max_bytes: int = MAX_BYTES) -> None:
    """Append rows (one line each); `mend_tail` first ends a torn last line left by a killed run,
    so it cannot swallow the first new row. Rotates when the file passes max_bytes."""
    blob = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    with open(path, "ab") as f:
        if mend_tail and f.tell() > 0:
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    blob = b"\n" + blob
        f.write(blob)
        size = f.tell()
    if size > max_bytes:
        rotate(path, max_bytes)


def rotate(path: Path, max_bytes: int = MAX_BYTES) -> None:
    """telemetry.jsonl → 1 row in 10 appended to the archive; the archive over max_bytes → 1 in 2."""
    archive = path.with_name(ARCHIVE_NAME)
    with open(archive, "ab") as f:
        f.write(b"".join(orjson.dumps(r) + b"\n" for r in decimate(read_file(path), ROTATE_KEEP_EVERY)))
        size = f.tell()
    os.truncate(path, 0)
    if size > max_bytes:
        rows = decimate(read_file(archive), ARCHIVE_KEEP_EVERY)
        write_atomic(archive, b"".join(orjson.dumps(r) + b"\n" for r in rows))


def decimate(rows: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """Every `every`-th row, plus each row where the run or the restart count changes (and the last)."""
    return [row for i, row in enumerate(rows) if i % every == 0 or i == len(rows) - 1
            or (row.get("run"), row.get("restarts")) != (rows[i - 1].get("run"), rows[i - 1].get("restarts"))]


def read_file(path: Path) -> list[dict[str, Any]]:
    """The telemetry rows (object lines with a time "t") of one file, torn lines skipped; [] when absent."""
    return [row for row in read_jsonl_rows(path) if isinstance(row.get("t"), (int, float))]


def last_run(folder: Path) -> int:
    """The highest run id in the telemetry's last rows (0: none): a run killed before its manifest commit has rows."""
    for name in (TELEMETRY_NAME, ARCHIVE_NAME):
        try:
            with open(folder / name, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
                tail = f.read()
        except OSError:
            continue
        rows = jsonl_rows(tail.partition(b"\n")[2] if len(tail) == 65536 else tail)  # skip a cut first line
        if runs := [run for r in rows if isinstance(run := r.get("run"), int)]:
            return max(runs)
    return 0


def read_telemetry(folder: Path) -> list[dict[str, Any]]:
    """Every telemetry row of a dataset folder (archive first), oldest first."""
    return sorted(read_file(Path(folder, ARCHIVE_NAME)) + read_file(Path(folder, TELEMETRY_NAME)), key=lambda r: r["t"])


def runs_of(rows: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rows split into consecutive runs (a new run id starts a new list)."""
    out: list[list[dict[str, Any]]] = []
    for row in rows:
        if not out or out[-1][-1].get("run") != row.get("run"):
            out.append([])
        out[-1].append(row)
    return out
