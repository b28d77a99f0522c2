"""A dataset folder's metadata on disk: the manifest (written atomically) and the config-drift
check (the run lock is lock.py). Sync, no async library: the store calls it from a thread.

    outputs/B2/manifest.json   {"fingerprint", "sealed": [...], "open": {...}, "runs": [...], "progress"}
"""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.display import display_path
from gen_pipeline.errors import ConfigDriftError

MANIFEST_NAME = "manifest.json"
_TMP_PREFIX = MANIFEST_NAME + ".tmp-"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new file in `folder` durable; raises OSError."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- manifest


def read_manifest(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(manifest, None), (None, None) when absent, or (None, why) when it cannot be read."""
    path = folder / MANIFEST_NAME
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None, None
    except (OSError, orjson.JSONDecodeError) as e:
        return None, f"{display_path(path)} could not be read ({e}); rebuilt it from the shards"
    if not isinstance(data, dict):
        return None, f"{display_path(path)} is not a JSON object; rebuilt it from the shards"
    return data, None


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """Replace manifest.json atomically: tmp file in the folder, fsync, rename, fsync the folder.

    A crash at any point leaves either the old or the new manifest. Raises OSError.
    """
    tmp = folder / f"{_TMP_PREFIX}{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / MANIFEST_NAME)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(folder)


def remove_stale_tmp(folder: Path) -> int:
    """Delete manifest tmp files left by a crash between write and rename; returns how many."""
    n = 0
    for p in folder.glob(_TMP_PREFIX + "*"):
        with contextlib.suppress(OSError):
            p.unlink()
            n += 1
    return n


# ---------------------------------------------------------------- config drift


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


_MISSING = object()


def fingerprint_diff(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """[(dotted key, old value, new value)] for every setting that differs; absent = `_MISSING`."""
    a, b = _flatten(old), _flatten(new)
    # JSON round trip makes tuples lists: compare the stored form with the stored form.
    b = {k: orjson.loads(orjson.dumps(v)) for k, v in b.items()}
    keys = sorted(set(a) | set(b))
    return [(k, a.get(k, _MISSING), b.get(k, _MISSING)) for k in keys if a.get(k, _MISSING) != b.get(k, _MISSING)]


def _show(v: Any) -> str:
    return "(not set)" if v is _MISSING else repr(v)


def check_drift(folder: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise ConfigDriftError naming each differing key when `new` is not the stored fingerprint."""
    diffs = fingerprint_diff(old, new)
    if not diffs:
        return
    where = display_path(folder)
    lines = [f"  {k}: {_show(o)} in {where}, {_show(n)} now" for k, o, n in diffs]
    raise ConfigDriftError(
        f"{where} was written with a different config ({len(diffs)} setting"
        f"{'s' if len(diffs) > 1 else ''} differ{'' if len(diffs) > 1 else 's'}):\n" + "\n".join(lines) + "\n"
        "Resuming would mix samples made two ways in one dataset. Restore the old setting"
        f"{'s' if len(diffs) > 1 else ''} to resume, or write to a new output folder or dataset name.")
