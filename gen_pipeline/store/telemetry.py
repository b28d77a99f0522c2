"""Telemetry: one JSON line per load poll of a run in outputs/<DATASET>/telemetry.jsonl.

Off the hot path: `Telemetry.poll` builds a small dict and puts it on a bounded queue; a daemon
thread appends batches and flushes (no fsync: a row lost to a power cut costs nothing, a row
lost to kill -9 is already in the page cache). Never fails a run: a full queue drops the row
(counted), a disk error is reported once and turns telemetry off for the rest of the run.

Bounded for a multi-day run: telemetry.jsonl keeps full resolution up to `max_bytes` (8 MiB,
~17K rows ≈ 5 h at one poll a second); then its rows are decimated 10:1 into telemetry.1.jsonl
(run boundaries and restarts are always kept), and when that archive passes `max_bytes` it is
decimated 2:1 in place. On disk: at most 2 × max_bytes + one batch (~16 MiB); older history
gets coarser, never lost as a whole. Readers skip a torn or unparseable line (kill -9 mid-write).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.store.layout import read_jsonl_rows

TELEMETRY_NAME = "telemetry.jsonl"
ARCHIVE_NAME = "telemetry.1.jsonl"
MAX_BYTES = 8 << 20  # ~17K rows of ~500 bytes: ~5 h at one poll a second
ROTATE_KEEP_EVERY = 10  # telemetry.jsonl → archive: keep 1 row in 10
ARCHIVE_KEEP_EVERY = 2  # archive over max_bytes: keep 1 row in 2
_QUEUE_ROWS = 1024  # ~17 min of polls at 1 s: a stuck disk drops rows instead of growing memory
_STOP = object()


def build_row(*, run: int | None, t_run_s: float, figures: Any, snap: Any, stats: Any, handle: Any,
              fixed_window: bool, retractions_run: int | None) -> dict[str, Any]:
    """One poll's record from the pipeline's live figures, the load snapshot (None when the poll
    failed), the controller's statistics() and the server handle. Pure."""
    cap = getattr(handle, "capacity", None)
    info = getattr(handle, "info", None) or {}
    return {
        "t": round(time.time(), 3), "t_run_s": round(t_run_s, 3), "run": run,
        "window": figures.window, "in_flight": figures.in_flight,
        "running": snap.running if snap else None, "queued": snap.queued if snap else None,
        "kv_used_tokens": snap.used_tokens if snap else None,
        "kv_usage": None if snap is None or snap.token_usage is None else round(snap.token_usage, 4),
        "kv_capacity_tokens": cap.max_total_num_tokens if cap else None,
        "max_running_requests": cap.max_running_requests if cap else None,
        "kv_dtype": info.get("kv_cache_dtype"), "mem_fraction_static": info.get("mem_fraction_static"),
        "gen_tok_s": None if snap is None or snap.gen_throughput is None else round(snap.gen_throughput, 1),
        "client_tok_s": round(figures.tokens_per_s, 1), "samples_per_s": round(figures.samples_per_s, 4),
        "retractions_total": snap.retractions_total if snap else None, "retractions": retractions_run,
        "done": figures.done, "target": figures.target, "failures": figures.failures,
        "mode": "fixed" if fixed_window else (stats.mode if stats else None),
        "reason": "--window" if fixed_window else (stats.reason if stats else None),
        "tokens_per_request": round(stats.tokens_per_request, 1) if stats else None,
        "held_tokens_per_request": round(stats.held_tokens_per_request, 1) if stats else None,
        "restarts": getattr(handle, "restarts", 0),
    }


class Telemetry:
    """A run's telemetry writer; call `poll` from the load poller, `close` at the end of the run."""

    def __init__(self, folder: Path, *, run: int | None, started_s: float,
                 on_event: Callable[[str], Any] = print, max_bytes: int = MAX_BYTES) -> None:
        self.path = Path(folder) / TELEMETRY_NAME
        self.run = None if run is None else max(run, last_run(Path(folder)) + 1)
        self.started_s, self.on_event, self.max_bytes = started_s, on_event, max_bytes
        self.enabled = True
        self.dropped = 0
        self._queue: queue.Queue[Any] = queue.Queue(_QUEUE_ROWS)
        self._thread: threading.Thread | None = None
        self._last_counter: int | None = None
        self._retractions: int | None = None

    def poll(self, figures: Any, snap: Any, stats: Any, handle: Any, *, fixed_window: bool = False) -> None:
        """Record one load poll (never raises, never blocks); the run's retraction count is kept even
        when the file is off (the progress line shows it)."""
        with contextlib.suppress(Exception):
            self._count_retractions(snap)
        if not self.enabled:
            return
        try:
            row = build_row(run=self.run, t_run_s=time.monotonic() - self.started_s, figures=figures, snap=snap,
                            stats=stats, handle=handle, fixed_window=fixed_window,
                            retractions_run=self._retractions)
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="telemetry", daemon=True)
                self._thread.start()
            self._queue.put_nowait(row)
        except queue.Full:
            self.dropped += 1
        except Exception as e:  # a telemetry bug must not end a run
            self._disable(f"telemetry off: could not record a poll ({type(e).__name__}: {e})")

    @property
    def retractions(self) -> int | None:
        """Requests the server retracted during this run (None until a poll carried the counter)."""
        return self._retractions

    def _count_retractions(self, snap: Any) -> None:
        """Retractions of this run: the server's counter restarts at 0 with the server."""
        value = getattr(snap, "retractions_total", None)
        if value is None:
            return
        prev, self._last_counter = self._last_counter, value
        if prev is None:
            self._retractions = self._retractions or 0  # the first reading is this run's baseline
        elif value < prev:
            self._retractions = (self._retractions or 0) + value  # a restarted server counts from 0
        else:
            self._retractions = (self._retractions or 0) + value - prev

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush what is queued (waits at most timeout_s) and stop the thread."""
        if self._thread is None:
            return
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            return
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
            while len(rows) < 256:
                try:
                    rows.append(self._queue.get_nowait())
                except queue.Empty:
                    break
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
    kept = decimate(read_file(path), ROTATE_KEEP_EVERY)
    with open(archive, "ab") as f:
        f.write(b"".join(orjson.dumps(r) + b"\n" for r in kept))
        size = f.tell()
    os.truncate(path, 0)
    if size > max_bytes:
        rows = decimate(read_file(archive), ARCHIVE_KEEP_EVERY)
        tmp = archive.with_name(archive.name + ".tmp")
        tmp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        os.replace(tmp, archive)


def decimate(rows: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """Every `every`-th row, plus each row where the run or the restart count changes (and the last)."""
    out: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        prev = rows[i - 1] if i else None
        boundary = prev is None or (row.get("run"), row.get("restarts")) != (prev.get("run"), prev.get("restarts"))
        if boundary or i % every == 0 or i == len(rows) - 1:
            out.append(row)
    return out


def read_file(path: Path) -> list[dict[str, Any]]:
    """The telemetry rows of one file (object lines with a time "t"); torn or unparseable lines are
    skipped (layout.read_jsonl_rows); [] when absent."""
    return [row for row in read_jsonl_rows(path) if isinstance(row.get("t"), (int, float))]


def last_run(folder: Path) -> int:
    """The highest run id in the last rows of the telemetry (0 when none): a run killed before its
    manifest was committed left no number there, but its rows are here."""
    for name in (TELEMETRY_NAME, ARCHIVE_NAME):
        try:
            with open(folder / name, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
                tail = f.read()
        except OSError:
            continue
        runs = []
        for line in tail.split(b"\n")[1:] if len(tail) == 65536 else tail.split(b"\n"):
            try:
                run = orjson.loads(line).get("run")
            except (orjson.JSONDecodeError, AttributeError):
                continue
            if isinstance(run, int):
                runs.append(run)
        if runs:
            return max(runs)
    return 0


def read_telemetry(folder: Path) -> list[dict[str, Any]]:
    """Every telemetry row of a dataset folder (archive first), oldest first."""
    folder = Path(folder)
    rows = read_file(folder / ARCHIVE_NAME) + read_file(folder / TELEMETRY_NAME)
    return sorted(rows, key=lambda r: r["t"])


def runs_of(rows: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rows split into consecutive runs (a new run id starts a new list)."""
    out: list[list[dict[str, Any]]] = []
    for row in rows:
        if not out or out[-1][-1].get("run") != row.get("run"):
            out.append([])
        out[-1].append(row)
    return out
