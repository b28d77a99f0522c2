"""Local JSON Lines sources: find the lines that are not JSON objects before `datasets` reads them.

`datasets`' json loader refuses a whole file for one bad line (and names a 0-based row). A run
instead skips such lines: a file with bad lines is handed to `datasets` as a cleaned copy (kept
under the temp folder, named by the original's path, size and mtime so `datasets` caches it), and
each bad line becomes a `bad_json` reject with its file name and 1-based line number. Files
without bad lines are handed over untouched.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson

CLEAN_DIR = Path(tempfile.gettempdir()) / "gen_pipeline-clean"


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


def _line_error(line: bytes) -> str | None:
    """Why one non-blank line is not a JSON object, or None when it is one."""
    try:
        value = orjson.loads(line.rstrip(b"\r\n"))  # so an error's column is within this line
    except orjson.JSONDecodeError as e:
        return f"not valid JSON ({e.msg}, column {e.colno})"
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__}, not an object"
    return None


def scan_jsonl(path: Path, shown_as: str) -> ScannedFile:
    """Check every line of a .jsonl file; on bad lines write (once) and return a cleaned copy."""
    bad: list[BadLine] = []
    good = 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            error = _line_error(line)
            if error is None:
                good += 1
            else:
                bad.append(BadLine(shown_as, number, error))
    if not bad:
        return ScannedFile(path, good, ())
    return ScannedFile(_clean_copy(path, {b.line for b in bad}), good, tuple(bad))


def _clean_copy(path: Path, bad_lines: set[int]) -> Path:
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
