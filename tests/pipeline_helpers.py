"""Helpers for end-to-end tests: a dataset on disk, the CLI as a real subprocess, the output read back."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
# what gen_pipeline reads from a launcher (the rank: store/ranks.py; the lock's SLURM job: store/manifest.py),
# unset for the suite, which may itself run in a SLURM job or under torchrun
LAUNCHER_VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT",
                 "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_JOB_ID", "SLURM_RESTART_COUNT", "RANK",
                 "WORLD_SIZE")
# Offline tokenizers with the chat templates of three kinds of target (chatml, qwen3, kimi), as
# `python -m bench.chat_templates tests/data/tokenizers` writes them: the data, not the bench's code
TOKENIZERS = REPO / "tests" / "data" / "tokenizers"
SAMPLE_KEYS = {"id", "dataset", "conversations", "meta"}
META_KEYS = {"model", "backend", "finish_reason", "prompt_tokens", "completion_tokens", "turns", "sampling",
             "kv_cache_dtype", "generated_at", "per_turn", "chat_template_kwargs"}
TURN_META_KEYS = {"finish_reason", "prompt_tokens", "completion_tokens", "reasoning_tokens", "attempts", "loops",
                  "empty", "leak", "tokens_not_decoded", "discarded_tokens"}
MIX_META_KEYS = META_KEYS | {"sampling_variant"}  # under a sampling mix (config/mix.py)


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


def sim_profile(tmp_path: Path, name: str, extra_args: list[str], **keys: object) -> Path:
    """tmp_path/cfg: the repository's server.toml plus a profile `name` (inherits "sim") with `extra_args`
    and `keys` (TOML values as written)."""
    cfg = tmp_path / "cfg"
    cfg.mkdir(exist_ok=True)
    shutil.copy(REPO / "datasets_cfg" / "server.toml", cfg / "server.toml")
    lines = [f"\n[profile.{name}]", 'inherits = "sim"', f"extra_args = {orjson.dumps(extra_args).decode()}",
             *(f"{k} = {v}" for k, v in keys.items())]
    with open(cfg / "server.toml", "a") as f:
        f.write("\n".join(lines) + "\n")
    return cfg


def chat_tokenizers(root: Path) -> dict[str, Path]:
    """Copies of the committed offline tokenizers under `root` (a test may change its copy): {kind: folder}."""
    return {p.name: Path(shutil.copytree(p, root / p.name)) for p in sorted(TOKENIZERS.iterdir())}


def tokenizer_specials() -> list[str]:
    """The special tokens of the committed tokenizers, in id order."""
    return [t["content"] for t in orjson.loads((TOKENIZERS / "qwen3" / "tokenizer.json").read_bytes())["added_tokens"]]


def chat_template(kind: str) -> str:
    return (TOKENIZERS / kind / "chat_template.jinja").read_text()


def cli_cmd(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "gen_pipeline", *map(str, args)]


def run_cli_process(*args: str | Path, timeout_s: float = 280) -> subprocess.CompletedProcess[str]:
    """The CLI as a subprocess, to its end (`timeout_s` is a bound for a hung run, under the test's own):
    for tests whose subject is the process (its exit status, its environment, its descriptors)."""
    return subprocess.run(cli_cmd(*args), capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


# Python's own warning filters (what `python -m gen_pipeline` runs under), not the suite's "error"
_PYTHON_WARNINGS = [("default", None, DeprecationWarning, "__main__", 0),
                    ("ignore", None, DeprecationWarning, None, 0),
                    ("ignore", None, PendingDeprecationWarning, None, 0),
                    ("ignore", None, ImportWarning, None, 0),
                    ("ignore", None, ResourceWarning, None, 0)]
_CLI_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE)


@contextlib.contextmanager
def _cli_globals() -> Iterator[None]:
    """What a CLI run changes in its process (logging, signal dispositions, os.environ, cwd, warning filters),
    put back after; and the exit past stuck threads (os._exit) that only a real process may take."""
    import logging
    import warnings

    from gen_pipeline.cli import commands

    loggers = [logging.getLogger(), logging.getLogger("gen_pipeline")]
    saved_logs = [(lg, list(lg.handlers), lg.level) for lg in loggers]
    saved_signals = {s: signal.getsignal(s) for s in _CLI_SIGNALS}
    saved_env, exit_past = dict(os.environ), commands.exit_past_threads
    commands.exit_past_threads = lambda code, join_s=0.5: None  # type: ignore[assignment]
    try:
        with contextlib.chdir(REPO), warnings.catch_warnings():
            warnings.filters[:] = list(_PYTHON_WARNINGS)  # type: ignore[index]
            yield
    finally:
        commands.exit_past_threads = exit_past
        os.environ.clear()
        os.environ.update(saved_env)
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
        for lg, handlers, level in saved_logs:
            lg.handlers[:] = handlers
            lg.setLevel(level)


def run_cli(*args: str | Path, timeout_s: float = 280) -> subprocess.CompletedProcess[str]:
    """The CLI in this process, to its end, with `python -m gen_pipeline`'s exit code, stdout and stderr (a
    traceback and 1 for an uncaught exception); a process inside an async test (anyio.run cannot start)."""
    import asyncio
    import io
    import traceback

    from gen_pipeline.cli import main

    with contextlib.suppress(RuntimeError):
        asyncio.get_running_loop()
        return run_cli_process(*args, timeout_s=timeout_s)

    out, err = io.StringIO(), io.StringIO()
    with _cli_globals(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse: usage errors (2) and --help (0)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
        except Exception:  # what the interpreter prints for an uncaught exception
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess(cli_cmd(*args), code, out.getvalue(), err.getvalue())


def start_cli(*args: str | Path, log: Path) -> subprocess.Popen[bytes]:
    """The CLI in its own session (so a test can kill it and whatever it started)."""
    with open(log, "ab") as f:  # the child keeps its own descriptor
        return subprocess.Popen(cli_cmd(*args), stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)


def finish_cli(proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120) -> str:
    """Wait for a start_cli process (SIGKILL its group if it outlives `timeout_s`); its log, asserting
    exit 0 and no traceback."""
    try:
        rc = proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert rc == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    return text


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    proc.wait(timeout=30)


def freeze(proc: subprocess.Popen[bytes]) -> None:
    """SIGSTOP the process's group: what the test saw (still running, N lines) holds until thaw()."""
    os.killpg(proc.pid, signal.SIGSTOP)


def thaw(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGCONT)


@contextlib.contextmanager
def frozen(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """freeze() inside the block, thaw() after it."""
    freeze(proc)
    try:
        yield
    finally:
        thaw(proc)


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
        assert set(s) == SAMPLE_KEYS and set(s["meta"]) in (META_KEYS, MIX_META_KEYS), s
        roles = [m["role"] for m in s["conversations"] if m["role"] != "system"]
        assert roles[0] == "user" and roles[-1] == "assistant"
        assert all(a != b for a, b in itertools.pairwise(roles))
        assert all(m["content"] for m in s["conversations"])
        assert isinstance(s["meta"]["prompt_tokens"], int) and s["meta"]["completion_tokens"] > 0
        per_turn = s["meta"]["per_turn"]
        assert len(per_turn) == s["meta"]["turns"] and all(set(t) == TURN_META_KEYS for t in per_turn), per_turn
        assert sum(t["completion_tokens"] for t in per_turn) == s["meta"]["completion_tokens"]
    return samples


def wait_for(pred, timeout_s: float = 30.0, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval_s)


# ---------------------------------------------------------------- fault injection (tests/e2e, bench/faults_soak.py)

SIM_FAST = ["--sim-profile", "fast", "--time-scale", "10", "--sim-startup-s", "0", "--sim-output-mean", "160",
            "--sim-output-spread", "0.6"]
KILL_AIMS = ("time", "write", "rotation", "manifest")


def count_output(out: Path, name: str = "T") -> tuple[int, int, int]:
    """(lines, unique ids, unparseable lines) over every shard; never raises on a bad line."""
    ids: list[str] = []
    bad = 0
    for shard in sorted((out / name).glob("shard-*.jsonl")):
        for line in shard.read_bytes().splitlines():
            try:
                ids.append(orjson.loads(line)["id"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                bad += 1
    return len(ids), len(set(ids)), bad


def _shard_lines(folder: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in folder.glob("shard-*.jsonl"))


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return 0


def wait_for_aim(proc: subprocess.Popen[bytes], folder: Path, aim: str, rng, timeout_s: float = 30.0) -> bool:
    """Until the moment `aim` names (polling every ~2 ms); False if the process ended first. time: a random
    delay; write: k more shard lines; rotation: a new shard; manifest: the manifest replaced k more times."""
    if aim == "time":
        deadline = time.monotonic() + rng.uniform(0.3, 3.0)
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        return proc.poll() is None
    start_lines, start_shards = _shard_lines(folder), len(list(folder.glob("shard-*.jsonl")))
    start_mtime, changes, k = _mtime_ns(folder / "manifest.json"), 0, rng.randint(1, 12)
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        if aim == "write" and _shard_lines(folder) >= start_lines + k:
            return True
        if aim == "rotation" and len(list(folder.glob("shard-*.jsonl"))) > start_shards:
            return True
        if aim == "manifest":
            m = _mtime_ns(folder / "manifest.json")
            if m != start_mtime:
                start_mtime, changes = m, changes + 1
                if changes >= min(k, 3):
                    return True
        time.sleep(0.002)
    return proc.poll() is None


def kill_resume_trial(work: Path, url: str, seed: int, *, kills: int = 2, target: int = 60,
                      sig: int = signal.SIGKILL) -> dict:
    """SIGKILL the CLI (attached to `url`) `kills` times at seeded moments, then resume to the end; what
    happened: aims, kills that landed, final rc, lines/unique/unparseable."""
    rng = random.Random(seed)
    toml = write_dataset(work / "ds", target=target, max_new_tokens=64, shard_max_samples=rng.choice([4, 7, 11]),
                         fsync_every=rng.choice([1, 3, 8]))
    out, log = work / "out", work / "cli.log"
    args = ("generate", "--dataset", toml, "--server-url", url, "--output-dir", out, "--progress", "log")
    aims, landed = [], 0
    for _ in range(kills):
        aim = rng.choice(KILL_AIMS)
        proc = start_cli(*args, log=log)
        (out / "T").mkdir(parents=True, exist_ok=True)
        if wait_for_aim(proc, out / "T", aim, rng):
            landed += 1
        aims.append(aim)
        kill_group(proc, sig)
    final = run_cli(*args)
    lines, unique, bad = count_output(out)
    return {"aims": aims, "landed": landed, "rc": final.returncode, "stderr": final.stderr,
            "stdout": final.stdout, "lines": lines, "unique": unique, "unparseable": bad,
            "lost": max(0, target - unique), "duplicated": lines - bad - unique, "out": out}


# ---------------------------------------------------------------- servers that go away (tests/server)

def sigkill_sim(sim) -> None:
    """SIGKILL a simulator's group and reap it (sglang_sim.testing.SimProcess)."""
    os.killpg(sim.process.pid, signal.SIGKILL)
    assert sim.process.wait(timeout=10) == -signal.SIGKILL  # it died, by that signal


def restart_sim_on_same_port(sim, args: list[str]):
    """A new simulator on the port of `sim` (dead), appending to its log; returns once /health answers."""
    from sglang_sim.testing import SimProcess, sim_command, wait_healthy

    with open(sim.log_path, "ab") as log:
        proc = subprocess.Popen(sim_command(args, sim.port), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    back = SimProcess(proc, sim.port, sim.log_path)
    wait_healthy(back, 30)
    return back


def wait_lines(folder: Path, n: int, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """Until the shards in `folder` hold `n` lines; fails if `proc` ends first."""
    wait_until(lambda: _shard_lines(folder) >= n, proc, timeout_s)


def wait_until(ready, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """Until `ready()`; fails if `proc` ends first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, f"not seen within {timeout_s} s (rc {proc.poll()})"
        time.sleep(0.05)


def three_samples(out: Path) -> Path:
    """A store under `out` with dataset T holding 3 committed one-turn samples (for export and report tests)."""
    from gen_pipeline.records import Sample
    from gen_pipeline.store.dataset_store import DatasetStore

    with DatasetStore(out, "T", fingerprint={"model": "m"}, target=3) as s:
        s.open()
        turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        s.write_samples([Sample(f"T-{i}", "T", turns, {"model": "m", "finish_reason": "stop", "prompt_tokens": 1,
                                                       "completion_tokens": 1, "sampling": {}}) for i in range(3)])
    return out
