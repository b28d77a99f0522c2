"""Shared writer for bench results: every benchmark owns one section of
`bench/results.json` (machine-readable) and one section of `docs/measurements.md` (the docs site's
measurements page, which the user pages link to by section: `measurements.md#<name>`)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import orjson

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_JSON = BENCH_DIR / "results.json"
RESULTS_MD = BENCH_DIR.parent / "docs" / "measurements.md"
_HEADER = ("# Measurements\n\nEvery figure the documentation quotes is here, each section written by the benchmark "
           "that measured it (`python -m bench NAME`, or `make bench` for all), with its machine and command. "
           "Sections marked \"written by hand\" are notes beside them.\n")


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp makes it 0600; these are files to read and commit
    os.replace(tmp, path)


def write_section(name: str, data: dict[str, Any], markdown: str) -> None:
    """Replace section `name` in results.json and docs/measurements.md (other sections are kept)."""
    results = orjson.loads(RESULTS_JSON.read_bytes()) if RESULTS_JSON.exists() else {}
    results[name] = data
    _atomic_write(RESULTS_JSON, orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    text = RESULTS_MD.read_text() if RESULTS_MD.exists() else _HEADER
    begin, end = f"<!-- section:{name} -->", f"<!-- /section:{name} -->"
    block = f"{begin}\n<a id=\"{name}\"></a>\n\n{markdown.strip()}\n{end}"  # the anchor the docs link to
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    _atomic_write(RESULTS_MD, text.encode())


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
