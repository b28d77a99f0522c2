"""Issue 23, damaged state: a sidecar that lies, duplicate lines on disk, a `.lock` that is a folder, a
lost manifest (the config-drift guard must survive it), rows of two models in one dataset. Real files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from gen_pipeline.display import display_path
from gen_pipeline.errors import ConfigDriftError, StoreError
from gen_pipeline.records import Sample
from gen_pipeline.reports.status import read_status
from gen_pipeline.reports.validate import validate_dataset
from gen_pipeline.store.dataset_store import DatasetStore

FP = {"model": "m", "source": {"files": ["a.jsonl"]}, "sampling": {"max_new_tokens": 64, "temperature": 0.7,
                                                                     "top_p": 0.95},
      "reasoning": "keep", "truncated": "keep"}


def sample(i: int, model: str = "m", temperature: float = 0.7) -> Sample:
    return Sample(f"B2-{i}", "B2", [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}],
                  {"model": model, "finish_reason": "stop", "prompt_tokens": 10, "completion_tokens": 20,
                   "sampling": {"max_new_tokens": 64, "temperature": temperature, "top_p": 0.95}})


def make(root: Path, **kw) -> DatasetStore:
    args = {"fingerprint": FP, "target": 100, "shard_max_samples": 4, "fsync_every": 3} | kw
    return DatasetStore(root, "B2", **args)


def write(root: Path, ids: range, **kw) -> None:
    with make(root, **kw) as s:
        s.open()
        s.write_samples([sample(i) for i in ids])


def disk_ids(folder: Path) -> list[str]:
    return [orjson.loads(line)["id"] for p in sorted(folder.glob("shard-*.jsonl"))
            for line in p.read_bytes().splitlines()]


# ---------------------------------------------------------------- the id sidecar


def test_a_sidecar_with_the_right_count_and_wrong_ids_is_rebuilt_before_it_is_trusted(tmp_path: Path) -> None:
    write(tmp_path, range(10))  # shard 0 and 1 sealed (4 each), shard 2 open (2)
    folder = tmp_path / "B2"
    sidecar = folder / "shard-00000.ids"
    good = sidecar.read_bytes()
    lines = good.splitlines()
    # same count, same length, other ids: what a bit flip or a copied sidecar leaves
    sidecar.write_bytes(b"\n".join(lines[:-4] + [b'"B2-90"', b'"B2-91"', b'"B2-92"', b'"B2-93"']) + b"\n")
    with make(tmp_path) as s:
        state = s.open()
        assert state.notes == ["re-scanned shard-00000.jsonl: its id sidecar is missing or does not match"]
        assert sorted(state.done_ids) == sorted(f"B2-{i}" for i in range(10))
        assert s.write_samples([sample(i) for i in range(12)]) == 2  # only the two new ones
    assert Counter(disk_ids(folder)).most_common(1)[0][1] == 1
    assert disk_ids(folder) == [f"B2-{i}" for i in range(12)]
    assert sidecar.read_bytes() == good  # rebuilt from the shard


def test_a_sidecar_of_another_shard_is_not_trusted(tmp_path: Path) -> None:
    write(tmp_path, range(9))
    folder = tmp_path / "B2"
    (folder / "shard-00000.ids").write_bytes((folder / "shard-00001.ids").read_bytes())
    with make(tmp_path) as s:
        state = s.open()
        assert state.notes == ["re-scanned shard-00000.jsonl: its id sidecar is missing or does not match"]
        assert sorted(state.done_ids) == sorted(f"B2-{i}" for i in range(9))


# ---------------------------------------------------------------- duplicates on disk


@pytest.mark.parametrize("where", ["sealed", "open"])
def test_duplicate_lines_on_disk_are_removed_in_a_committed_rewrite(tmp_path: Path, where: str) -> None:
    write(tmp_path, range(10))
    folder = tmp_path / "B2"
    target = folder / ("shard-00001.jsonl" if where == "sealed" else "shard-00002.jsonl")
    first = (folder / "shard-00000.jsonl").read_bytes().splitlines(keepends=True)
    with open(target, "ab") as f:  # two lines written twice (a resume that trusted a bad sidecar)
        f.write(first[1] + first[2])
    assert read_status(tmp_path, "B2", 10).done == 12
    assert validate_dataset(folder).counts["duplicate_id"] == 2
    with make(tmp_path, target=10) as s:
        state = s.open()
        assert state.done == 10
        assert state.notes[-1] == (f"removed 2 duplicate lines from {target.name} (ids already written in "
                                   "shard-00000.jsonl; kept the first line of each)")
    assert disk_ids(folder) == [f"B2-{i}" for i in range(10)]
    assert validate_dataset(folder).ok
    assert read_status(tmp_path, "B2", 10).done == 10
    manifest = orjson.loads((folder / "manifest.json").read_bytes())
    records = {e["name"]: e for e in manifest["sealed"]}
    if where == "sealed":
        assert records["shard-00001.jsonl"]["bytes"] == target.stat().st_size
        assert records["shard-00001.jsonl"]["samples"] == 4
    else:
        assert manifest["open"]["committed_bytes"] == target.stat().st_size
    assert not list(folder.glob("*.tmp*"))
    with make(tmp_path, target=10) as s:  # the next open finds nothing to repair
        assert s.open().notes == []


def test_a_duplicate_within_one_shard_keeps_the_first_line(tmp_path: Path) -> None:
    write(tmp_path, range(3))
    folder = tmp_path / "B2"
    shard = folder / "shard-00000.jsonl"
    lines = shard.read_bytes().splitlines(keepends=True)
    shard.write_bytes(lines[0] + lines[1] + lines[0] + lines[2])
    with make(tmp_path) as s:
        state = s.open()
        assert state.notes[-1] == ("removed 1 duplicate line from shard-00000.jsonl (ids already written in "
                                   "shard-00000.jsonl; kept the first line of each)")
        assert s.write_samples([sample(3)]) == 1
    assert disk_ids(folder) == ["B2-0", "B2-1", "B2-2", "B2-3"]


# ---------------------------------------------------------------- the lock file


def test_a_lock_that_is_a_folder_is_a_message_for_generate_and_a_state_for_status(tmp_path: Path) -> None:
    write(tmp_path, range(2))
    folder = tmp_path / "B2"
    (folder / ".lock").mkdir()
    with pytest.raises(StoreError) as e:
        make(tmp_path).open()
    where = display_path(folder)
    assert str(e.value) == (f"{where}/.lock is a directory, not a lock file (gen_pipeline never makes one). "
                            f"Remove it (rmdir {where}/.lock) and run again.")
    assert e.value.exit_code == 4
    st = read_status(tmp_path, "B2", 10)
    assert (st.done, st.state) == (2, "lock unreadable (.lock is a directory)")


# ---------------------------------------------------------------- a lost manifest keeps the drift guard


def test_a_lost_manifest_keeps_the_config_drift_guard(tmp_path: Path) -> None:
    write(tmp_path, range(6))
    folder = tmp_path / "B2"
    (folder / "manifest.json").unlink()
    with pytest.raises(ConfigDriftError) as e:
        make(tmp_path, fingerprint={**FP, "model": "other"}).open()
    where = display_path(folder)
    assert str(e.value) == (
        f"{where} was written with a different config (1 setting differs):\n"
        f"  model: 'm' in {where}, 'other' now\n"
        "Resuming would mix samples made two ways in one dataset. Restore the old setting to resume, "
        "or write to a new output folder or dataset name.")
    assert disk_ids(folder) == [f"B2-{i}" for i in range(6)]
    with make(tmp_path) as s:  # the same config resumes
        assert s.open().done == 6


def test_lost_manifest_and_fingerprint_file_the_rows_still_refuse_another_model(tmp_path: Path) -> None:
    write(tmp_path, range(6))
    folder = tmp_path / "B2"
    for name in ("manifest.json", "fingerprint.json"):
        (folder / name).unlink(missing_ok=True)
    other = {**FP, "model": "other", "sampling": {**FP["sampling"], "temperature": 1.0}}
    with pytest.raises(ConfigDriftError) as e:
        make(tmp_path, fingerprint=other).open()
    where = display_path(folder)
    assert str(e.value) == (
        f"{where} was written with a different config (2 settings differ):\n"
        f"  model: 'm' in {where}, 'other' now\n"
        f"  sampling.temperature: 0.7 in {where}, 1.0 now\n"
        "Resuming would mix samples made two ways in one dataset. Restore the old settings to resume, "
        "or write to a new output folder or dataset name.\n"
        f"(Its manifest.json and fingerprint.json are gone: the settings were read from the rows, "
        "shard-00000.jsonl line 1.)")
    with make(tmp_path) as s:
        assert s.open().done == 6


def test_validate_finds_rows_of_two_models_or_two_samplings(tmp_path: Path) -> None:
    folder = tmp_path / "B2"
    folder.mkdir()
    rows = [sample(0), sample(1), sample(2, model="other"), sample(3, temperature=1.0)]
    (folder / "shard-00000.jsonl").write_bytes(b"".join(r.to_json() for r in rows))
    report = validate_dataset(folder)
    assert dict(report.counts) == {"mixed_config": 2}
    assert [str(p) for p in report.examples] == [
        "shard-00000.jsonl:3: meta.model is 'other' here, 'm' in the first row",
        "shard-00000.jsonl:4: meta.sampling.temperature is 1.0 here, 0.7 in the first row"]
    assert "  mixed_config: 2 (rows made with another model or sampling than the first row)" in report.format()


# ---------------------------------------------------------------- disk full while a start-up repairs


def test_a_disk_full_start_up_counts_every_committed_sample(tmp_path: Path, monkeypatch) -> None:
    """A first run died of a full disk between sealing shard 1 and committing the manifest; the next
    start-up must rewrite shard 1's sidecar and the disk is still full: its message counts all the
    samples on disk, not those loaded before the failed write."""
    import errno
    import os

    import gen_pipeline.store.dataset_store as store_mod
    from gen_pipeline.errors import DiskError

    s = make(tmp_path, fsync_every=100)
    s.open()
    s.write_samples([sample(i) for i in range(6)])
    s.commit()
    folder = tmp_path / "B2"
    old = (folder / "manifest.json").read_bytes()  # shard 0 sealed, shard 1 open
    s.write_samples([sample(i) for i in range(6, 9)])  # seals shard 1, opens shard 2 (one sample)
    s.close()
    (folder / "manifest.json").write_bytes(old)  # the commit after sealing shard 1 never landed
    (folder / "shard-00001.ids").unlink()
    (folder / "fingerprint.json").unlink(missing_ok=True)

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store_mod, "write_sidecar", full)
    with pytest.raises(DiskError) as e:
        make(tmp_path).open()
    assert str(e.value) == (f"Writing {display_path(folder / 'shard-00001.jsonl')} failed: No space left on device. "
                            "9 samples are committed and safe; free space and run the same command to resume.")
    assert not (folder / ".lock").exists()
