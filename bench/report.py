"""Shared writer for bench results: every benchmark owns one section of
`bench/results.json` (machine-readable) and one section of `docs/measurements.md` (the docs site's
measurements page, which the user pages link to by section: `measurements.md#<name>`)."""

from __future__ import annotations

import datetime
import os
import platform
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_JSON = BENCH_DIR / "results.json"
RESULTS_MD = BENCH_DIR.parent / "docs" / "measurements.md"
_HEADER = ("# Measurements\n\nEvery figure the documentation quotes is here, each section written by the benchmark "
           "that measured it (`python -m bench NAME`, or `make bench` for all), with its date, machine and command. "
           "Sections marked \"written by hand\" are notes beside them.\n")


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp makes it 0600; these are files to read and commit
    os.replace(tmp, path)


def _command() -> str:
    """The command that runs the benchmark calling write_section: `python -m bench NAME` where it has a name."""
    from bench.__main__ import BENCHES

    module = sys._getframe(2).f_globals.get("__name__", "")
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name if spec else ""
    names = {m: n for n, m in BENCHES.items()}
    return f"python -m bench {names[module]}" if module in names else f"python -m {module or 'bench'}"


def stamp(command: str) -> str:
    """The line under a section's heading: when, where and how it was measured."""
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return (f"*Measured {datetime.datetime.now(datetime.UTC):%Y-%m-%d} on a {os.cpu_count()}-CPU "
            f"{platform.machine()} {platform.system()} machine{load}, by `{command}`.*")


def write_section(name: str, data: dict[str, Any], markdown: str, *, stamped: bool = True) -> None:
    """Replace section `name` in results.json and docs/measurements.md (other sections are kept). The section
    gets a line under its heading saying when, where and by what command it was measured (`stamped`; a
    section rendered from a committed run, as bench/gpu/report.py's, names its run's own date and machine)."""
    if stamped:
        heading, _, rest = markdown.strip().partition("\n")
        markdown = f"{heading}\n\n{stamp(_command())}\n{rest}"
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
