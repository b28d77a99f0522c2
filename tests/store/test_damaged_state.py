"""Damaged state: a sidecar that lies, duplicate lines on disk, a `.lock` that is a folder, rows of two
models in one dataset, a disk full while a start-up repairs, a bit flip inside a sealed shard's id. Real files."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import orjson
import pytest
from store_helpers import make, sample, shard_ids, write

import gen_pipeline.store.shards as shards_mod
from gen_pipeline.cli import main
from gen_pipeline.display import display_path
from gen_pipeline.errors import DiskError, StoreError
from gen_pipeline.reports.status import read_status
from gen_pipeline.reports.validate import validate_dataset


def _same_count_other_ids(folder: Path) -> None:
    """What a bit flip leaves: the same count and length, other ids."""
    lines = (folder / "shard-00000.ids").read_bytes().splitlines()
    (folder / "shard-00000.ids").write_bytes(b"\n".join(lines[:-4] + [b'"B2-9%d"' % k for k in range(4)]) + b"\n")


@pytest.mark.parametrize("damage", [_same_count_other_ids, lambda d: (d / "shard-00000.ids").write_bytes(
    (d / "shard-00001.ids").read_bytes()), lambda d: (d / "shard-00000.ids").unlink()],
    ids=["other-ids", "another-shards", "missing"])
def test_a_sidecar_that_does_not_match_its_shard_is_rebuilt_before_it_is_trusted(tmp_path: Path, damage) -> None:
    write(tmp_path, range(10))  # shard 0 and 1 sealed (4 each), shard 2 open (2)
    folder = tmp_path / "B2"
    good = (folder / "shard-00000.ids").read_bytes()
    damage(folder)
    with make(tmp_path) as s:
        state = s.open()
        assert state.notes == ["re-scanned shard-00000.jsonl: its id sidecar is missing or does not match"]
        assert sorted(state.done_ids) == sorted(f"B2-{i}" for i in range(10))
        assert s.write_samples([sample(i) for i in range(12)]) == 2  # only the two new ones
    assert shard_ids(folder) == [f"B2-{i}" for i in range(12)]
    assert (folder / "shard-00000.ids").read_bytes() == good  # rebuilt from the shard


# ---------------------------------------------------------------- duplicates on disk


@pytest.mark.parametrize("where", ["sealed", "open", "within"])
def test_duplicate_lines_on_disk_are_removed_in_a_committed_rewrite(tmp_path: Path, where: str) -> None:
    write(tmp_path, range(10))
    folder = tmp_path / "B2"
    target = folder / ("shard-00001.jsonl" if where == "sealed" else "shard-00002.jsonl")
    if where == "within":  # the open shard's first line written twice, a line after it: the first line is kept
        lines = target.read_bytes().splitlines(keepends=True)
        target.write_bytes(lines[0] + lines[0] + lines[1])
    else:
        first = (folder / "shard-00000.jsonl").read_bytes().splitlines(keepends=True)
        with open(target, "ab") as f:  # two lines written twice (a resume that trusted a bad sidecar)
            f.write(first[1] + first[2])
    dups = 1 if where == "within" else 2
    assert read_status(tmp_path, "B2", 10).done == 10 + dups
    assert validate_dataset(folder).counts["duplicate_id"] == dups
    with make(tmp_path, target=11) as s:
        state = s.open()
        assert state.done == 10
        assert state.notes[-1] == (
            f"removed {dups} duplicate line{'s' if dups > 1 else ''} from {target.name} (ids already written in "
            f"{'shard-00002.jsonl' if where == 'within' else 'shard-00000.jsonl'}; kept the first line of each)")
        assert s.write_samples([sample(10)]) == 1  # appended to the rewritten file, not the replaced one
    assert shard_ids(folder) == [f"B2-{i}" for i in range(11)]
    assert validate_dataset(folder).ok
    assert read_status(tmp_path, "B2", 11).done == 11
    manifest = orjson.loads((folder / "manifest.json").read_bytes())
    records = {e["name"]: e for e in manifest["sealed"]}
    if where == "sealed":
        assert [records["shard-00001.jsonl"][k] for k in ("bytes", "samples")] == [target.stat().st_size, 4]
    else:
        assert manifest["open"]["committed_bytes"] == target.stat().st_size
    assert not list(folder.glob("*.tmp*"))
    with make(tmp_path, target=11) as s:  # the next open finds nothing to repair
        assert s.open().notes == []


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

    monkeypatch.setattr(shards_mod, "write_sidecar", full)
    with pytest.raises(DiskError) as e:
        make(tmp_path).open()
    assert str(e.value) == (f"Writing {display_path(folder / 'shard-00001.jsonl')} failed: No space left on device. "
                            "9 samples are committed and safe; free space and run the same command to resume.")
    assert not (folder / ".lock").exists()


# ---------------------------------------------------------------- a bit flip inside an id


def flipped(tmp_path: Path) -> Path:
    """10 samples (shards 0 and 1 sealed, 2 open), then one bit of shard 0's third id flipped: B2-2 → B2-3."""
    write(tmp_path, range(10), target=10)
    shard = tmp_path / "B2" / "shard-00000.jsonl"
    data = shard.read_bytes()
    at = data.index(b'{"id":"B2-2",') + len(b'{"id":"B2-')
    shard.write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:])  # "2" (0x32) → "3" (0x33)
    return shard


def test_a_bit_flip_inside_an_id_of_a_sealed_shard_is_refused_at_start(tmp_path: Path) -> None:
    shard = flipped(tmp_path)
    store = make(tmp_path, target=10)
    with pytest.raises(StoreError) as e:
        store.open()
    assert str(e.value) == (
        f'{display_path(shard)} line 3 has id "B2-3", but the shard\'s id sidecar shard-00000.ids recorded id '
        '"B2-2" when the shard was sealed: the file changed on disk since (a bit flip or an edit), so that line '
        "may hold another sample than its id says. Delete that line (its sample will be generated again) or "
        "restore the file, then run again; `gen-pipeline validate` lists what else is damaged.")
    assert not store.claimed and not (tmp_path / "B2" / ".lock").exists()
    lines = shard.read_bytes().splitlines(keepends=True)
    shard.write_bytes(b"".join(lines[:2] + lines[3:]))  # what the message says to do
    with make(tmp_path, target=10) as s:
        state = s.open()
        assert (state.done, s.remaining) == (9, 1)
        assert "B2-2" not in state.done_ids


def test_export_counts_a_line_whose_id_it_already_exported_as_dropped(tmp_path: Path, capsys) -> None:
    flipped(tmp_path)
    out = tmp_path / "export.jsonl"
    code = main(["export", "--dataset", "B2", "--output-dir", str(tmp_path), "--out", str(out),
                 "--format", "specforge"])
    text = capsys.readouterr()
    assert code == 0, text
    assert len(out.read_bytes().splitlines()) == 9
    assert "  B2: 10 committed samples, 1 dropped (1 with an id already exported: a damaged line, see "\
        "`gen-pipeline validate`)" in text.out + text.err, text
