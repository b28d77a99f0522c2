"""Local source files checked before `datasets` reads them (it would say `StopIteration`). A .jsonl line that
is not a JSON object becomes a `bad_json` reject; `datasets` gets a cleaned copy (it refuses a whole file)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson

CLEAN_DIR = Path(tempfile.gettempdir()) / "gen_pipeline-clean"
HEAD_BYTES = 65_536  # what the binary and encoding checks read of a file
_DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
# Magic numbers of what people hand over instead of a JSON Lines file, and what to do with each.
_MAGIC = ((b"\x1f\x8b", "gzip-compressed: decompress it (gunzip) and list the .jsonl it holds"),
          (b"PAR1", "a Parquet file: give it a .parquet name"),
          (b"PK\x03\x04", "a zip archive: unpack it and list the files it holds"),
          (b"\xfd7zXZ", "xz-compressed: decompress it (unxz) and list the .jsonl it holds"),
          (b"(\xb5/\xfd", "zstd-compressed: decompress it (unzstd) and list the .jsonl it holds"))


@dataclass(frozen=True)
class BadLine:
    file: str  # the file's name as the config lists it
    line: int  # 1-based
    error: str


@dataclass(frozen=True)
class ScannedFile:
    path: Path  # what `datasets` reads: the original, or its cleaned copy
    good_lines: int
    bad: tuple[BadLine, ...]


def scan_jsonl(path: Path, shown_as: str) -> ScannedFile:
    """Check every line of a .jsonl file; on bad lines write (once) and return a cleaned copy."""
    bad: list[BadLine] = []
    good = 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                value = orjson.loads(line.rstrip(b"\r\n"))  # so an error's column is within this line
            except orjson.JSONDecodeError as e:
                bad.append(BadLine(shown_as, number, f"not valid JSON ({e.msg}, column {e.colno})"))
                continue
            if isinstance(value, dict):
                good += 1
            else:
                bad.append(BadLine(shown_as, number, f"a JSON {type(value).__name__}, not an object"))
    if not bad:
        return ScannedFile(path, good, ())
    return ScannedFile(_clean_copy(path, {b.line for b in bad}), good, tuple(bad))


def _clean_copy(path: Path, bad_lines: set[int]) -> Path:
    """Named by the original's path, size and mtime, so `datasets` caches it."""
    st = path.stat()
    key = hashlib.sha1(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    dest = CLEAN_DIR / key / path.name
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    with open(path, "rb") as src, open(tmp, "wb") as out:
        for number, line in enumerate(src, start=1):
            if number not in bad_lines and line.strip():
                out.write(line if line.endswith(b"\n") else line + b"\n")
    os.replace(tmp, dest)  # atomic: a concurrent check/run never reads half a copy
    return dest


def file_problem(path: Path, name: str) -> str | None:
    """Why `path` (listed as `name` in source.files) cannot be read as a source at all, or None.
    Reads at most HEAD_BYTES; raises OSError when the file cannot be read."""
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix in _DATA_SUFFIXES)[:3]
        hint = (f"list the files in it instead, e.g. files = [{', '.join(repr(f'{name}/{f}') for f in inside)}]"
                if inside else "list the .jsonl/.json/.parquet files it should hold instead")
        return f"{name} is a directory, not a file: {hint}."
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    if not head:
        return (f"{name} is empty (0 bytes): there are no rows to generate from. Point source.files at the "
                "dataset's file.")
    if path.suffix == ".parquet":
        return None if head.startswith(b"PAR1") else f"{name} is not a Parquet file (it does not start with PAR1)."
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return f"{name} is not text but {what}."
    nul = head.find(b"\0")
    if nul >= 0:
        return (f"{name} is not text: it holds binary data (a NUL byte at byte {nul + 1}). A {path.suffix} source is "
                "UTF-8 JSON; is it the right file?")
    if path.suffix == ".json":
        return _not_utf8(head, name)  # one JSON document: datasets reads all of it or nothing
    return None


def no_rows_problem(path: Path, name: str, scanned: ScannedFile) -> str | None:
    """Why a scanned .jsonl gives no row at all (every line blank or bad), or None when it gives some."""
    if scanned.good_lines:
        return None
    if not scanned.bad:
        return f"{name} holds no rows (only blank lines). Point source.files at the dataset's file."
    with open(path, "rb") as f:
        encoding = _not_utf8(f.read(HEAD_BYTES), name)
    if encoding:
        return encoding
    first = scanned.bad[0]
    n = len(scanned.bad)
    which = "its one non-blank line is" if n == 1 else f"all its {n:,} non-blank lines are"
    return (f"{name} has no line that is a JSON object: {which} bad (line {first.line} is {first.error}). A JSON "
            "Lines file holds one JSON object per line; is it the right file?")


def _not_utf8(head: bytes, name: str) -> str | None:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.reason == "unexpected end of data" and e.start >= len(head) - 3 and len(head) == HEAD_BYTES:
            return None  # a character cut by the HEAD_BYTES boundary
        line = head.count(b"\n", 0, e.start) + 1
        column = e.start - (head.rfind(b"\n", 0, e.start) + 1) + 1
        return (f"{name} is not UTF-8 text (byte 0x{head[e.start]:02x} at line {line}, column {column}): JSON must "
                f"be UTF-8. Convert it, e.g. iconv -f latin1 -t utf-8 {name} > utf8-{Path(name).name}, and list "
                "the copy in source.files.")
    return None
