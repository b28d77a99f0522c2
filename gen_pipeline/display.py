"""Values as users see them in messages: paths and durations."""

from __future__ import annotations

from pathlib import Path


def display_path(path: Path) -> str:
    """`path` relative to the working directory when it is below it (what users typed)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def format_duration(seconds: float | None) -> str:
    """Seconds as a user reads them: 5s, 1m05s, 27h01m ("?" when unknown)."""
    if seconds is None:
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")
