"""Paths as users see them in messages."""

from __future__ import annotations

from pathlib import Path


def display_path(path: Path) -> str:
    """`path` relative to the working directory when it is below it (what users typed)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
