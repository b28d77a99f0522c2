"""A manifest.json with a field of the wrong type, through the entry points status and generate use: status
shows the samples on disk (the shards are the truth); generate finishes exactly (a note naming manifest.json
and the field) or stops with exit 4 naming them. A traceback is a failure."""

from __future__ import annotations

import functools
import operator
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from gen_pipeline.config.dataset import find_dataset_config
from gen_pipeline.errors import GenPipelineError
from gen_pipeline.reports.status import format_status, read_status, status_all
from gen_pipeline.run import run_generate
from gen_pipeline.run.options import RunOptions

from pipeline_helpers import assert_exact, write_dataset

TARGET, FIRST = 12, 7


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    *parents, key = [int(p) if p.isdigit() else p for p in path.split(".")]
    return lambda m: functools.reduce(operator.getitem, parents, m).__setitem__(key, value)


VARIANTS: list[tuple[str, str, Callable[[dict[str, Any]], None]]] = [  # (id, the field named, the damage)
    ("sealed-a-string", "sealed", _set("sealed", "shard-00000.jsonl")),
    ("sealed-a-number", "sealed", _set("sealed", 7)),
    ("sealed-samples-a-string", "samples", _set("sealed.0.samples", "5")),
    ("sealed-bytes-null", "bytes", _set("sealed.0.bytes", None)),
    ("open-a-list", "open", _set("open", ["shard-00001.jsonl"])),
    ("open-committed-bytes-a-string", "committed_bytes", _set("open.committed_bytes", "99")),
    ("runs-an-object", "runs", _set("runs", {"run": 1})),
    ("runs-entry-a-string", "runs", _set("runs", ["run 1"])),
    ("fingerprint-a-string", "fingerprint", _set("fingerprint", "sim-model")),
    ("progress-a-list", "progress", _set("progress", [1.5, 2])),
    ("target-a-string", "target", _set("target", "12")),
]
PARAMS = [pytest.param(field, damage, id=name) for name, field, damage in VARIANTS]


@pytest.fixture(scope="module")
def written(tmp_path_factory, sim_url: str) -> tuple[Path, Path]:
    """A dataset run once to FIRST of TARGET samples (two sealed shards and an open one): (toml, out)."""
    import anyio

    work = tmp_path_factory.mktemp("written")
    toml = write_dataset(work / "ds", target=TARGET, max_new_tokens=32, shard_max_samples=3, fsync_every=2)
    opts = RunOptions(output_root=work / "out", server_urls=(sim_url,), window=4, limit=FIRST)
    assert anyio.run(run_generate, find_dataset_config(str(toml)), opts).done == FIRST
    return toml, work / "out"


def _damaged(tmp_path: Path, written: tuple[Path, Path], damage: Callable[[dict[str, Any]], None]) -> Path:
    out = tmp_path / "out"
    shutil.copytree(written[1], out)
    path = out / "T" / "manifest.json"
    m = orjson.loads(path.read_bytes())
    damage(m)
    path.write_bytes(orjson.dumps(m))
    return out


@pytest.mark.parametrize(("field", "damage"), PARAMS)
def test_status_of_a_damaged_manifest_shows_the_shards(tmp_path: Path, written, field: str, damage) -> None:
    out = _damaged(tmp_path, written, damage)
    st = read_status(out, "T", TARGET)
    assert (st.dataset, st.done, st.target) == ("T", FIRST, TARGET)
    assert format_status(status_all(out, {"T": TARGET})).splitlines()[2].startswith(f"T        {FIRST}/{TARGET}")
    st = read_status(out, "T", None)  # no config: the target comes from the manifest, or is unknown
    assert st.target in (TARGET, None)


@pytest.mark.parametrize(("field", "damage"), PARAMS)
async def test_generate_over_a_damaged_manifest_finishes_exactly_or_refuses_naming_the_field(
        tmp_path: Path, written, sim_url: str, events, field: str, damage) -> None:
    out = _damaged(tmp_path, written, damage)
    try:
        result = await run_generate(find_dataset_config(str(written[0])),
                                    RunOptions(output_root=out, server_urls=(sim_url,), window=4))
    except GenPipelineError as e:  # refused: the message names the file and the field, exit 4
        assert "manifest.json" in str(e) and field in str(e), str(e)
        assert e.exit_code == 4
    else:  # finished: a note (an event) names the file and the field
        assert result.done == TARGET
        assert_exact(out, TARGET)
        assert any("manifest.json" in m and field in m for m in events), events
