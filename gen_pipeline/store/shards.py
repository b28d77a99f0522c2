"""The shard file format: names, parsing a shard's lines (pure), and the id sidecars of sealed
shards. Read through layout.py (the trust rules); the store repairs with it.

    shard-00003.jsonl   one Sample JSON object a line, "\\n"-terminated; a torn write leaves a partial last line
    shard-00003.ids     the ids of a sealed shard, one JSON string a line, so resume need not parse the shard
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.store.manifest import ShardRecord

SHARD_RE = re.compile(r"^shard-(\d{5,})\.jsonl$")


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.jsonl"


def sidecar_path(shard: Path) -> Path:
    return shard.with_suffix(".ids")


def list_shards(folder: Path) -> dict[int, Path]:
    """{index: path} of the shard files in `folder`."""
    out = {}
    for p in folder.glob("shard-*.jsonl"):
        m = SHARD_RE.match(p.name)
        if m:
            out[int(m.group(1))] = p
    return dict(sorted(out.items()))


@dataclass
class ShardScan:
    """What one shard's bytes hold. `good_bytes` ends after the last valid line."""

    ids: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    truncated: int = 0
    good_bytes: int = 0
    cut_bytes: int = 0
    corrupt: list[tuple[int, str]] = field(default_factory=list)  # (1-based line, why), not the last line

    @property
    def samples(self) -> int:
        return len(self.ids)

    def entry(self, name: str) -> ShardRecord:
        """The manifest's record of this shard."""
        return {"name": name, "samples": self.samples, "bytes": self.good_bytes, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "truncated": self.truncated}

    def add(self, row: dict[str, Any]) -> None:
        self.ids.append(row["id"])
        meta = row.get("meta")
        if not isinstance(meta, dict):
            meta = {}
        self.prompt_tokens += _int(meta.get("prompt_tokens"))
        self.completion_tokens += _int(meta.get("completion_tokens"))
        self.truncated += meta.get("finish_reason") == "length"


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _parse_line(line: bytes) -> tuple[dict[str, Any] | None, str]:
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None, "not valid JSON"
    if not isinstance(row, dict) or not isinstance(row.get("id"), str):
        return None, "not a sample (no string \"id\")"
    return row, ""


def iter_lines(data: bytes) -> Iterator[tuple[int, dict[str, Any] | None, str, int]]:
    """(1-based line, row or None, why, byte offset after the line) of every line of a shard except a
    torn write: the bytes after the last newline and an invalid last line (layout.py's trust rule).
    `why` is "" for a sample."""
    lines = data[:data.rfind(b"\n") + 1].split(b"\n")[:-1]
    last, pos = len(lines) - 1, 0
    for i, line in enumerate(lines):
        row, why = _parse_line(line)
        if row is None and i == last:
            return
        pos += len(line) + 1
        yield i + 1, row, why, pos


def scan_bytes(data: bytes) -> ShardScan:
    """Parse a shard: bytes after the last newline are a torn write and are cut, so is an invalid
    last line; invalid lines before it are listed in `corrupt` (the caller decides)."""
    scan = ShardScan()
    pos = 0
    for line_no, row, why, pos in iter_lines(data):  # noqa: B007 - the last line's end is read after the loop
        if row is None:
            scan.corrupt.append((line_no, why))
        else:
            scan.add(row)
    scan.good_bytes, scan.cut_bytes = pos, len(data) - pos
    return scan


def read_sidecar(path: Path) -> list[str] | None:
    """The ids of a sealed shard, or None when the sidecar is missing or damaged."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if not data:
        return []
    try:  # one JSON string a line → one JSON array: a single parse for 2,000 ids
        ids = orjson.loads(b"[" + data.rstrip(b"\n").replace(b"\n", b",") + b"]")
    except orjson.JSONDecodeError:
        return None
    return ids if all(isinstance(i, str) for i in ids) else None


def write_sidecar(path: Path, ids: Sequence[str]) -> None:
    """Write the sidecar atomically (tmp + fsync + rename); raises OSError."""
    tmp = path.with_suffix(".ids.tmp")
    with open(tmp, "wb") as f:
        f.write(b"".join(orjson.dumps(i) + b"\n" for i in ids))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
