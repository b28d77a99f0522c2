"""Values as users see them in messages: paths and durations; lines written to a console whose reader
may have gone."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import TextIO


def display_path(path: Path) -> str:
    """`path` relative to the working directory when it is below it (what users typed)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def count(n: int) -> str:
    """A count as every line a user reads shows it: 1,538 (one formatter, so no line says 1538)."""
    return f"{n:,}"


def format_duration(seconds: float | None) -> str:
    """Seconds as a user reads them: 5s, 1m05s, 27h01m ("?" when unknown)."""
    if seconds is None:
        return "?"
    h, rem = divmod(int(seconds), 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def write_line(line: str, stream: TextIO) -> bool:
    """`line` and a newline to `stream`, flushed; False (its descriptor pointed at /dev/null) when its reader has
    gone (tee killed by Ctrl-C, a terminal closed): a summary not shown changes no exit code and raises nothing."""
    try:
        stream.write(line + "\n")
        stream.flush()
        return True
    except OSError as e:
        if not reader_gone(e):
            raise
        to_devnull(stream)
        return False


def reader_gone(error: BaseException | None) -> bool:
    """`error` says the console's reader has gone: a pipe without reader (EPIPE), or a terminal hung up
    (EIO: the ssh session dropped, the window closed: SIGHUP's case)."""
    return isinstance(error, OSError) and error.errno in (errno.EPIPE, errno.EIO)


def to_devnull(stream: TextIO) -> None:
    """Point `stream`'s descriptor at /dev/null: its later writes (and the interpreter's last flush)
    succeed silently instead of raising BrokenPipeError again."""
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)
