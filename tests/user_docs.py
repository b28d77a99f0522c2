"""The user docs as tests read them: the README and docs/*.md but the benchmarks' measurements page."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "measurements.md")]


def user_docs() -> str:
    """Every page's text, one after another."""
    return "\n".join(p.read_text() for p in PAGES)
