"""Helpers for end-to-end tests: a dataset on disk, the CLI as a real subprocess, the output read back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
SAMPLE_KEYS = {"id", "dataset", "conversations", "meta"}
META_KEYS = {"model", "backend", "finish_reason", "prompt_tokens", "completion_tokens", "turns", "sampling",
             "kv_cache_dtype", "generated_at"}


def make_rows(n: int, *, invalid: int = 0) -> list[dict]:
    rows = []
    for i in range(n):
        msgs = [{"role": "system", "content": "be helpful"}] if i % 3 == 0 else []
        msgs.append({"role": "user", "content": f"Question number {i}: tell me about topic {i % 17}."})
        if i % 4 == 0:
            msgs += [{"role": "assistant", "content": "old"}, {"role": "user", "content": f"Follow-up {i}?"}]
        rows.append({"id": f"r{i}", "messages": msgs})
    for k in range(invalid):
        rows.insert(3 + 5 * k, {"id": f"bad{k}", "messages": [{"role": "user", "content": ""}]})
    return rows


def write_dataset(folder: Path, *, name: str = "T", rows: list[dict] | None = None, target: int = 60,
                  max_new_tokens: int = 96, extra: str = "", shard_max_samples: int = 25, fsync_every: int = 8) -> Path:
    """A dataset TOML + its jsonl in `folder`; returns the TOML path."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in (rows if rows is not None else make_rows(80))))
    toml = folder / f"{name}.toml"
    toml.write_text(f"""name = "{name}"
target_samples = {target}
[source]
files = ["{data.name}"]
schema = "messages"
field = "messages"
id_field = "id"
[sampling]
max_new_tokens = {max_new_tokens}
temperature = 0.7
top_p = 0.95
[generation]
reasoning = "keep"
truncated = "keep"
request_timeout_s = 20
max_attempts = 8
retry_initial_wait_s = 0.05
retry_max_wait_s = 0.5
{extra}
[output]
shard_max_samples = {shard_max_samples}
fsync_every = {fsync_every}
""")
    return toml


def cli_cmd(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "gen_pipeline", *map(str, args)]


def run_cli(*args: str | Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_cmd(*args), capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


def start_cli(*args: str | Path, log: Path) -> subprocess.Popen[bytes]:
    """The CLI in its own session (so a test can kill it and whatever it started)."""
    f = open(log, "ab")
    return subprocess.Popen(cli_cmd(*args), stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def read_samples(out: Path, name: str = "T") -> list[dict]:
    """Every line of every shard, parsed (an unparseable line fails the test)."""
    lines = []
    for shard in sorted((out / name).glob("shard-*.jsonl")):
        for i, line in enumerate(shard.read_bytes().splitlines()):
            try:
                lines.append(orjson.loads(line))
            except orjson.JSONDecodeError as e:
                raise AssertionError(f"{shard.name}:{i + 1} does not parse: {line[:80]!r}") from e
    return lines


def assert_exact(out: Path, target: int, name: str = "T") -> list[dict]:
    """Exactly `target` samples, no duplicate ids, every field present with the right type."""
    samples = read_samples(out, name)
    dup = [k for k, v in Counter(s["id"] for s in samples).items() if v > 1]
    assert dup == [], f"duplicate ids: {dup[:5]}"
    assert len(samples) == target
    for s in samples:
        assert set(s) == SAMPLE_KEYS and set(s["meta"]) == META_KEYS, s
        roles = [m["role"] for m in s["conversations"] if m["role"] != "system"]
        assert roles[0] == "user" and roles[-1] == "assistant"
        assert all(a != b for a, b in zip(roles, roles[1:]))
        assert all(m["content"] for m in s["conversations"])
        assert isinstance(s["meta"]["prompt_tokens"], int) and s["meta"]["completion_tokens"] > 0
    return samples


def wait_for(pred, timeout_s: float = 30.0, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval_s)
