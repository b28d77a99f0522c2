"""The manifest (written atomically, typed by `Manifest`, checked field by field when read) and the config-drift
check. Sync: the store calls it from a thread."""

from __future__ import annotations

import contextlib
import functools
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NotRequired, Required, cast

import orjson
from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

from gen_pipeline.display import display_path
from gen_pipeline.errors import ConfigDriftError
from gen_pipeline.records import RunSnapshot

MANIFEST_NAME = "manifest.json"
_TMP_PREFIX = MANIFEST_NAME + ".tmp-"
TMP_SUFFIX = ".tmp"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class ShardFigures(TypedDict):
    """What the records of sealed and open shards both hold."""

    prompt_tokens: int
    completion_tokens: int
    truncated: int
    gate: NotRequired[dict[str, int]]  # the quality gate's counts (quality/accounting.py), when any
    variants: NotRequired[dict[str, int]]  # samples per meta.sampling_variant ("0": n, ...); older shards lack it


class ShardRecord(ShardFigures):
    """A sealed shard as the manifest lists it (layout.py trusts it while the file keeps its size)."""

    name: str
    samples: int
    bytes: int


class OpenShardRecord(ShardFigures):
    """The shard being written: its committed length (flushed lines past it are kept on resume too)."""

    name: str
    committed_bytes: int
    committed_samples: int


class RunRecord(TypedDict, total=False):
    """One run of the dataset (its part): who, when, what it wrote, why it stopped."""

    run: Required[int]
    pid: int
    host: str
    started_at: str
    ended_at: str | None  # None while it runs (or when it died)
    updated_at: str
    done_at_start: int
    samples_written: int
    duplicates_skipped: int
    over_target_skipped: int
    failures: int
    rejects: int
    repaired_bytes: int
    notes: list[str]
    stopped_by: str  # RunSummary.stopped_by
    generating_at: str  # its dataset's first request (a job's later dataset waits for the earlier ones)
    tp_size: int  # the server's, as it reported (or the launched profile's)
    dp_size: int
    servers: int  # how many servers it ran on (the URLs, or a router's workers)
    gpus: int  # GPUs held: tp × dp × servers or --gpus-per-server × servers; absent = unknown
    gpus_how: str  # "tp 8 × dp 1 × 1 server", "--gpus-per-server 8 × 2 servers" or "unknown"


class ProgressRecord(TypedDict, total=False):
    """The live figures of the last commit (status shows a running run's rate); all optional: older runs wrote fewer."""

    samples_per_s: float
    tokens_per_s: float
    in_flight: int
    window: int
    failures: int
    written_this_run: int
    elapsed_s: float
    updated_at: float | str  # time.time() (an ISO time is read too)
    spec_accept_length: float  # the server-wide sglang:spec_accept_length of the last poll (a draft runs)


class Manifest(TypedDict, total=False):
    """outputs/<DATASET>/manifest.json (a rank's part: rank-<R>-of-<W>/manifest.json). Read back, it is
    checked against these types (read_manifest), which accept every manifest this tool has written."""

    created_at: str
    dataset: str
    target: int  # a rank's share for a rank's part
    fingerprint: dict[str, Any]  # DatasetConfig.fingerprint(model): what the drift check compares
    fingerprint_digest: str
    sealed: list[ShardRecord]
    open: OpenShardRecord
    runs: list[RunRecord]
    updated_at: str
    rank: int  # a rank's part only
    world_size: int
    progress: ProgressRecord


@functools.cache
def _manifest_type() -> TypeAdapter[Manifest]:
    return TypeAdapter(Manifest)  # built on first read (~0.1 s): status of no folder need not pay it


def progress_record(s: RunSnapshot) -> ProgressRecord:
    """The manifest's progress record of a run's snapshot."""
    return {"samples_per_s": round(s.samples_per_s, 4), "tokens_per_s": round(s.tokens_per_s, 1),
            "in_flight": s.in_flight, "window": s.window, "failures": s.failures,
            "written_this_run": s.completions, "elapsed_s": round(s.elapsed_s, 1), "updated_at": s.time_s,
            **({"spec_accept_length": round(s.spec_accept_length, 3)} if s.spec_accept_length else {})}


def read_manifest(folder: Path) -> tuple[Manifest | None, str | None]:
    """(manifest, None); (None, None) when absent; (None, why naming file and field) when unreadable or mistyped."""
    path = folder / MANIFEST_NAME
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None, None
    except (OSError, orjson.JSONDecodeError) as e:
        return None, f"{display_path(path)} could not be read ({e}); rebuilt it from the shards"
    if not isinstance(data, dict):
        return None, f"{display_path(path)} is not a JSON object; rebuilt it from the shards"
    try:
        _manifest_type().validate_python(data, strict=True)
    except ValidationError as e:
        return None, f"{display_path(path)}: {_field_problem(e)}; rebuilt it from the shards"
    return cast(Manifest, data), None  # validated above; the data itself is kept (unknown keys survive a rewrite)


def _field_problem(e: ValidationError) -> str:
    """The first error as `runs[0].pid = '12' is not an integer`."""
    err = e.errors(include_url=False)[0]
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in err["loc"]).lstrip(".")
    if err["type"] == "missing":
        return f"{where} is missing"
    wanted = {"int_type": "an integer", "float_type": "a number", "string_type": "a string", "list_type": "a list",
              "dict_type": "an object", "typed_dict_type": "an object", "bool_type": "true or false"}
    want = wanted.get(err["type"], err["msg"].removeprefix("Input should be ").rstrip("."))
    return f"{where} = {orjson.dumps(err['input'])[:60].decode()} is not {want}"


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Replace manifest.json atomically (write_atomic; a failed write removes its tmp file); raises OSError."""
    tmp = folder / f"{_TMP_PREFIX}{os.getpid()}"
    try:
        write_atomic(folder / MANIFEST_NAME, orjson.dumps(manifest, option=orjson.OPT_INDENT_2), tmp)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_atomic(path: Path, data: bytes, tmp: Path | None = None) -> None:
    """Replace `path` with `data`: a tmp file beside it (`<name>.tmp` unless given), fsync, rename, fsync the folder;
    raises OSError. A crash leaves the old file or the new one (and maybe the tmp, which `remove_tmp_files` clears)."""
    tmp = tmp or path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)  # the rename is durable once its folder is fsynced
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_tmp(folder: Path) -> int:
    """Delete manifest tmp files left by a crash between write and rename; returns how many."""
    return remove_matching(folder, _TMP_PREFIX + "*")


def remove_matching(folder: Path, *patterns: str) -> int:
    """Delete the files of `folder` matching any glob pattern (those that can be); returns how many."""
    n = 0
    for p in [p for pattern in patterns for p in folder.glob(pattern)]:
        with contextlib.suppress(OSError):
            p.unlink()
            n += 1
    return n


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


_MISSING = object()


def _show(v: Any) -> str:
    return "(not set)" if v is _MISSING else repr(v)


def check_drift(folder: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise ConfigDriftError naming each differing key when `new` is not the stored fingerprint."""
    # JSON round trip makes tuples lists: compare the stored form with the stored form.
    a, b = _flatten(old), {k: orjson.loads(orjson.dumps(v)) for k, v in _flatten(new).items()}
    diffs = [(k, a.get(k, _MISSING), b.get(k, _MISSING)) for k in sorted(set(a) | set(b))
             if a.get(k, _MISSING) != b.get(k, _MISSING)]
    if not diffs:
        return
    where = display_path(folder)
    lines = [f"  {k}: {_show(o)} in {where}, {_show(n)} now" for k, o, n in diffs]
    raise ConfigDriftError(
        f"{where} was written with a different config ({len(diffs)} setting"
        f"{'s' if len(diffs) > 1 else ''} differ{'' if len(diffs) > 1 else 's'}):\n" + "\n".join(lines) + "\n"
        "Resuming would mix samples made two ways in one dataset. Restore the old setting"
        f"{'s' if len(diffs) > 1 else ''} to resume, or write to a new output folder or dataset name.")
