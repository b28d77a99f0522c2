"""The shard file format: names, parsing lines (pure), and the id sidecars of sealed shards (shard-00003.ids: a header
{"shard", "bytes", "samples", "ids_sha256"}, then one JSON id a line). A sidecar is trusted only when it fits its shard
(`read_sidecar`), else the shard is parsed and it is written anew: a wrong one never makes a resume write twice.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.quality.accounting import add_meta, int_or_zero
from gen_pipeline.store.manifest import TMP_SUFFIX, ShardFigures, ShardRecord, remove_matching
from gen_pipeline.store.manifest import write_atomic as write_atomic  # re-exported: the tool's one atomic write

SHARD_RE = re.compile(r"^shard-(\d{5,})\.jsonl$")


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.jsonl"


def sidecar_path(shard: Path) -> Path:
    return shard.with_suffix(".ids")


def list_shards(folder: Path) -> dict[int, Path]:
    """{index: path} of the shard files in `folder`."""
    return dict(sorted((int(m.group(1)), p) for p in folder.glob("shard-*.jsonl") if (m := SHARD_RE.match(p.name))))


@dataclass
class ShardScan:
    """What one shard's bytes hold. `good_bytes` ends after the last valid line."""

    ids: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    truncated: int = 0
    gate: dict[str, int] = field(default_factory=dict)  # the quality gate's counts (quality/accounting.py)
    good_bytes: int = 0
    cut_bytes: int = 0
    corrupt: list[tuple[int, str]] = field(default_factory=list)  # (1-based line, why), not the last line
    # {(meta.model, meta.sampling, meta.sampling_variant) as sorted JSON: its first line}, for fingerprint.check_rows
    configs: dict[bytes, int] = field(default_factory=dict)
    variants: dict[str, int] = field(default_factory=dict)  # samples per meta.sampling_variant (the sampling mix)

    @property
    def samples(self) -> int:
        return len(self.ids)

    def entry(self, name: str) -> ShardRecord:
        """The manifest's record of this shard."""
        return {"name": name, "samples": self.samples, "bytes": self.good_bytes, **self.figures()}

    def figures(self) -> ShardFigures:
        """The token and quality figures a shard's manifest record holds (sealed or open)."""
        out: ShardFigures = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                             "truncated": self.truncated}
        if self.variants:
            out["variants"] = dict(self.variants)
        if self.gate:
            out["gate"] = dict(self.gate)
        return out

    def add(self, row: dict[str, Any]) -> None:
        self.ids.append(row["id"])
        meta = row["meta"] if isinstance(row.get("meta"), dict) else {}
        self.prompt_tokens += int_or_zero(meta.get("prompt_tokens"))
        self.completion_tokens += int_or_zero(meta.get("completion_tokens"))
        self.truncated += meta.get("finish_reason") == "length"
        add_meta(self.gate, meta)
        variant = meta.get("sampling_variant")
        if isinstance(variant, int) and not isinstance(variant, bool):
            self.variants[str(variant)] = self.variants.get(str(variant), 0) + 1


def parse_line(line: bytes) -> tuple[dict[str, Any] | None, str]:
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None, "not valid JSON"
    if not isinstance(row, dict) or not isinstance(row.get("id"), str):
        return None, "not a sample (no string \"id\")"
    return row, ""


def iter_lines(data: bytes) -> Iterator[tuple[int, dict[str, Any] | None, str, int]]:
    """(1-based line, row or None, why ("" for a sample), byte offset after the line) of every line of a shard but a
    torn write: the bytes after the last newline and an invalid last line (layout.py's trust rule)."""
    lines = data[:data.rfind(b"\n") + 1].split(b"\n")[:-1]
    last, pos = len(lines) - 1, 0
    for i, line in enumerate(lines):
        row, why = parse_line(line)
        if row is None and i == last:
            return
        pos += len(line) + 1
        yield i + 1, row, why, pos


def scan_bytes(data: bytes) -> ShardScan:
    """Parse a shard, cutting a torn write (as iter_lines); earlier invalid lines go to `corrupt` (caller decides)."""
    scan = ShardScan()
    pos = 0
    for line_no, row, why, pos in iter_lines(data):  # noqa: B007 - the last line's end is read after the loop
        if row is None:
            scan.corrupt.append((line_no, why))
        else:
            scan.add(row)
            meta = row.get("meta")
            if isinstance(meta, dict) and "model" in meta:
                config = {"model": meta["model"], "sampling": meta.get("sampling"),
                          **({"sampling_variant": meta["sampling_variant"]} if "sampling_variant" in meta else {})}
                scan.configs.setdefault(orjson.dumps(config, option=orjson.OPT_SORT_KEYS), line_no)
    scan.good_bytes, scan.cut_bytes = pos, len(data) - pos
    return scan


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:16]


def read_sidecar(path: Path, shard: Path, size: int) -> list[str] | None:
    """The ids of the sealed shard `shard` (`size` bytes now) from its sidecar `path`, or None when the
    sidecar is missing, damaged, or made from another shard or another state of this one."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    head, _, body = data.partition(b"\n")
    try:
        header = orjson.loads(head)
        ids = orjson.loads(b"[" + body.rstrip(b"\n").replace(b"\n", b",") + b"]") if body else []
    except orjson.JSONDecodeError:
        return None
    if not (isinstance(header, dict) and header.get("shard") == shard.name and header.get("bytes") == size
            and header.get("samples") == len(ids) and header.get("ids_sha256") == _digest(body)
            and all(isinstance(i, str) for i in ids)):
        return None
    if not ids:
        return ids
    prefix = b'{"id":' + orjson.dumps(ids[0]) + b","  # the shard's first line, as Sample.to_json writes it
    try:
        with open(shard, "rb") as f:
            return ids if f.read(len(prefix)) == prefix else None
    except OSError:
        return None


def first_changed_line(data: bytes, ids: Sequence[str]) -> int | None:
    """The first line (1-based) of a sealed shard's `data` not starting with the id its sidecar recorded (or one line
    too many or too few), else None. Bytes only, no parsing: the store runs it on every sealed shard at start."""
    pos = 0
    for number, rid in enumerate(ids, 1):  # no split: a sealed shard is ~40 MB, its ids a few bytes a line
        end = data.find(b"\n", pos)
        if end < 0 or not data.startswith(b'{"id":' + orjson.dumps(rid) + b",", pos, end):
            return number
        pos = end + 1
    return None if pos == len(data) else len(ids) + 1


def write_sidecar(shard: Path, ids: Sequence[str], size: int) -> None:
    """Write the sidecar of `shard` (`size` bytes, holding `ids`) atomically (tmp + fsync + rename); raises OSError."""
    body = b"".join(orjson.dumps(i) + b"\n" for i in ids)
    header = orjson.dumps({"shard": shard.name, "bytes": size, "samples": len(ids), "ids_sha256": _digest(body)})
    write_atomic(sidecar_path(shard), header + b"\n" + body)


def remove_tmp_files(folder: Path) -> int:
    """Delete the tmp files of shard, sidecar and fingerprint rewrites a crash left; returns how many."""
    return remove_matching(folder, *(pattern + TMP_SUFFIX for pattern in ("shard-*.jsonl", "shard-*.ids", "*.json")))
