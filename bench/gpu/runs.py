"""One `gen-pipeline generate` run of the GPU check as a subprocess, timed from the moment it has a
server (the "attached to" / "SGLang ready" line) to its exit, and the figures read back from disk."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bench.gpu.setup import DATASET

_READY = re.compile(r"^(attached to |SGLang ready after )")
_READY_S = re.compile(r"SGLang ready after (\d+) s")
_RETRACTED = re.compile(r"retracted (\d+)")
_WINDOW = re.compile(r"in flight (\d+)/(\d+)")
_KV = re.compile(r"KV (\d+)%")


@dataclass
class CliRun:
    name: str
    argv: list[str]
    rc: int | None = None
    wall_s: float = 0.0
    dispatch_s: float = 0.0  # server in hand -> exit
    ready_mono: float | None = None  # time.monotonic() when it had its server (traces are timed from it)
    killed: bool = False
    cpu_s: float = 0.0  # the CLI's user + sys CPU (children reaped during the run: the CLI alone)
    lines: list[tuple[float, str]] = field(default_factory=list)  # (seconds since start, line)

    def text(self) -> str:
        return "\n".join(f"[{t:7.1f}] {line}" for t, line in self.lines)

    def controller_figures(self) -> dict:
        """What the progress log lines showed: windows, KV usage, the retraction count the controller saw."""
        windows = [int(m.group(2)) for _, ln in self.lines if (m := _WINDOW.search(ln))]
        retracted = [int(m.group(1)) for _, ln in self.lines if (m := _RETRACTED.search(ln))]
        kv = [int(m.group(1)) for _, ln in self.lines if (m := _KV.search(ln))]
        ready = [int(m.group(1)) for _, ln in self.lines if (m := _READY_S.search(ln))]
        return {"log_lines": len(windows), "windows": windows, "kv_usage_pct": kv,
                "retracted_max": max(retracted, default=0), "retracted_seen": bool(retracted),
                "ready_s_reported": ready[0] if ready else None}


def cli_argv(cfg_dir: Path, out_dir: Path, *args: str, dataset: str = DATASET) -> list[str]:
    return [os.environ.get("BENCH_PYTHON", sys.executable), "-m", "gen_pipeline", "generate",
            "--dataset", str(cfg_dir / f"{dataset}.toml"), "--config-dir", str(cfg_dir),
            "--output-dir", str(out_dir), "--progress", "log", *args]


def run_cli(name: str, argv: list[str], log_dir: Path, *, kill_after_s: float | None = None,
            timeout_s: float = 900.0, ready: re.Pattern[str] = _READY) -> CliRun:
    """Run the CLI (or another client: `ready` is the line that says it has its server and starts); with
    kill_after_s, SIGKILL it that many seconds after it has a server."""
    run = CliRun(name, argv)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    ready_at: list[float] = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)

    def reader() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            now = time.monotonic()
            line = raw.decode(errors="replace").rstrip()
            if not ready_at and ready.search(line):
                ready_at.append(now)
            run.lines.append((now - started, line))

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    while proc.poll() is None:
        now = time.monotonic()
        if kill_after_s is not None and ready_at and now - ready_at[0] >= kill_after_s:
            os.kill(proc.pid, signal.SIGKILL)
            run.killed = True
            break
        if now - started > timeout_s:
            os.killpg(proc.pid, signal.SIGKILL)
            run.killed = True
            break
        time.sleep(0.05)
    run.rc = proc.wait()
    ended = time.monotonic()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    run.cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    t.join(timeout=5)
    assert proc.stdout is not None
    proc.stdout.close()
    run.wall_s = ended - started
    run.dispatch_s = ended - (ready_at[0] if ready_at else started)
    run.ready_mono = ready_at[0] if ready_at else None
    (log_dir / f"cli-{name}.log").write_text(" ".join(argv) + "\n" + run.text() + "\n")
    return run


def read_outputs(folder: Path, expected_ids: set[str] | None = None) -> dict:
    """Rows, duplicates, missing ids, tokens, empty turns and finish reasons from the shards on disk."""
    ids: Counter[str] = Counter()
    completion = prompt = empty = 0
    reasons: Counter[str] = Counter()
    torn = 0
    for shard in sorted(folder.glob("shard-*.jsonl")):
        for line in shard.read_bytes().splitlines():
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                torn += 1
                continue
            ids[row["id"]] += 1
            meta = row.get("meta", {})
            completion += int(meta.get("completion_tokens", 0))
            prompt += int(meta.get("prompt_tokens", 0))
            reasons[str(meta.get("finish_reason"))] += 1
            turns = [t for t in row.get("conversations", []) if t.get("role") == "assistant"]
            empty += any(not (t.get("content") or "").strip() for t in turns)
    errors = folder / "errors.jsonl"
    out = {"rows": sum(ids.values()), "unique": len(ids), "duplicates": sum(ids.values()) - len(ids),
           "unparseable": torn, "completion_tokens": completion, "prompt_tokens": prompt,
           "empty_assistant_turns": empty, "finish_reasons": dict(reasons),
           "errors_logged": len(errors.read_bytes().splitlines()) if errors.exists() else 0}
    if expected_ids is not None:
        done = {i.split("-", 1)[1] if "-" in i else i for i in ids}
        out["missing"] = len(expected_ids - done)
    return out


def sample_rows(folder: Path) -> Iterator[dict]:
    """The rows of the shards on disk that parse and have a meta."""
    for shard in sorted(folder.glob("shard-*.jsonl")):
        for line in shard.read_bytes().splitlines():
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(row, dict) and "meta" in row:
                yield row


def lengths(folder: Path) -> list[list[int]]:
    """[prompt_tokens, completion_tokens] per sample, for replaying the job in the simulator."""
    return [[int(r["meta"]["prompt_tokens"]), int(r["meta"]["completion_tokens"])] for r in sample_rows(folder)]


def validate(cfg_dir: Path, out_dir: Path) -> dict:
    """`gen-pipeline validate` exit code and its last lines."""
    argv = [os.environ.get("BENCH_PYTHON", sys.executable), "-m", "gen_pipeline", "validate", "--dataset",
            DATASET, "--config-dir", str(cfg_dir), "--output-dir", str(out_dir)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    return {"rc": p.returncode, "tail": (p.stdout + p.stderr).strip().splitlines()[-6:]}
