"""What a tune run has measured (outputs/<D>/tune/state.json, written atomically after every trial), so a second
run of the same plan (`key`) does not redo it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.probe.core import RefSide
from gen_pipeline.probe.metrics import Position
from gen_pipeline.records import Prompt
from gen_pipeline.store.shards import write_atomic

STATE_NAME = "state.json"


def load_state(folder: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The state of folder when it belongs to the plan `key`, else None (absent, damaged or another plan's)."""
    try:
        state = orjson.loads((folder / STATE_NAME).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return state if isinstance(state, dict) and state.get("key") == orjson.loads(orjson.dumps(key)) else None


def save_state(folder: Path, state: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / STATE_NAME, orjson.dumps(state, option=orjson.OPT_INDENT_2))


def dump_sides(sides: list[RefSide]) -> list[dict[str, Any]]:
    def pos(ps: list[Position]) -> list[Any]:
        return [[p.token, p.logprob, [list(t) for t in p.top]] for p in ps]
    return [{"id": s.prompt.id, "ids": s.ids, "free": pos(s.free), "forced": pos(s.forced)} for s in sides]


def load_sides(rows: list[dict[str, Any]], prompts: list[Prompt]) -> list[RefSide]:
    """dump_sides' rows back, each with its prompt of `prompts` (the probe's, loaded again by id)."""
    by_id = {p.id: p for p in prompts}

    def pos(rows: list[Any]) -> list[Position]:
        return [Position(t, lp, tuple((float(a), int(b)) for a, b in top)) for t, lp, top in rows]
    return [RefSide(by_id[r["id"]], r["ids"], pos(r["free"]), pos(r["forced"])) for r in rows if r["id"] in by_id]
