"""The user docs as the tests read them: the README (the front door) and the docs site's pages, without the
measurements page (written by the benchmarks, not a manual)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "measurements.md")]


def user_docs() -> str:
    """Every page's text, one after another."""
    return "\n".join(p.read_text() for p in PAGES)
