"""The config-drift guard when the manifest is lost: fingerprint.json ({"fingerprint", "digest"}) is a
second copy of the manifest's fingerprint; with both gone, the rows' meta.model and meta.sampling still
say which config made them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.config.dataset import fingerprint_digest
from gen_pipeline.config.mix import recorded_sampling
from gen_pipeline.errors import ConfigDriftError
from gen_pipeline.store.manifest import check_drift
from gen_pipeline.store.shards import write_atomic

FINGERPRINT_NAME = "fingerprint.json"


def read_fingerprint(folder: Path) -> dict[str, Any] | None:
    """The fingerprint fingerprint.json records, or None when it is absent or damaged."""
    try:
        data = orjson.loads((folder / FINGERPRINT_NAME).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    fp = data.get("fingerprint") if isinstance(data, dict) else None
    return fp if isinstance(fp, dict) and data.get("digest") == fingerprint_digest(fp) else None


def write_fingerprint(folder: Path, fp: dict[str, Any]) -> None:
    """Record `fp` in fingerprint.json (atomically) unless it holds it already; raises OSError."""
    if read_fingerprint(folder) != orjson.loads(orjson.dumps(fp)):
        body = {"fingerprint": fp, "digest": fingerprint_digest(fp)}
        write_atomic(folder / FINGERPRINT_NAME, orjson.dumps(body, option=orjson.OPT_INDENT_2))


def check_rows(folder: Path, configs: list[tuple[str, bytes, int]], fp: dict[str, Any]) -> None:
    """With no recorded fingerprint left: raise ConfigDriftError when a row's meta.model or meta.sampling
    is not what `fp` asks for (under a sampling mix: for the row's meta.sampling_variant). `configs`:
    (shard name, {"model", "sampling"[, "sampling_variant"]} as JSON, its first line)."""
    for shard, key, line in configs:
        row = orjson.loads(key)
        variant = row.get("sampling_variant", 0)
        sampling = recorded_sampling(fp, variant) if isinstance(variant, int) else None
        asked = {"model": fp.get("model")}
        if sampling is not None and row.get("sampling") is not None:
            asked["sampling"] = sampling
        else:  # a row without sampling, or a variant `fp` does not have (its line below says so)
            row.pop("sampling", None)
        if ("sampling_variant" in row or "sampling_mix" in fp) and sampling is not None:
            asked["sampling_variant"] = variant
        try:
            check_drift(folder, row, asked)
        except ConfigDriftError as e:
            raise ConfigDriftError(
                f"{e}\n(Its manifest.json and {FINGERPRINT_NAME} are gone: the settings were read from the rows, "
                f"{shard} line {line}.)") from None
