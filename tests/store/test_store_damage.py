"""A bit flip inside an id of a sealed shard keeps the shard's size, so its record and sidecar were trusted:
the start rescan compares each line's id with the sidecar's and refuses; export drops an id it already wrote."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_helpers import make, write

from gen_pipeline.cli import main
from gen_pipeline.display import display_path
from gen_pipeline.errors import StoreError


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
