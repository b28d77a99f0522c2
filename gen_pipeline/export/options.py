"""What `export` is asked (ExportOptions) and what it wrote (ExportSummary), as run/options.py is for `generate`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gen_pipeline.config.server import ServerProfile
from gen_pipeline.display import display_path
from gen_pipeline.export import select
from gen_pipeline.export.select import DatasetCounts, Filters, Mix, ValSplit
from gen_pipeline.export.tokens import SPECFORGE_MAX_LENGTH


@dataclass(frozen=True)
class ExportOptions:
    """What `gen-pipeline export` was asked; `datasets` are folder names under `output_root`."""

    datasets: tuple[str, ...]
    format: str
    out: Path
    output_root: Path
    hf_layout: str = "disk"
    mix: Mix | None = None
    seed: int = 0
    val: ValSplit = ValSplit()
    filters: Filters = Filters()
    expand_turns: bool = False
    keep_meta: bool = False
    status: bool = True
    force: bool = False
    harmony: bool = False  # specforge: gpt-oss (Harmony) roles
    tokenizer: str | None = None  # the target's tokenizer + chat template (tokens format, reasoning check)
    profile: ServerProfile | None = None  # --server NAME: the card's server, and the tokenizer by default
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    require_trained_reasoning: bool = False
    check_samples: int = 32
    max_length: int = SPECFORGE_MAX_LENGTH  # the trainer's length limit the tokens rows are checked against
    command: str | None = None  # the command line, for the card


@dataclass
class ExportSummary:
    """What was written: per-dataset counts, rows per split, the files."""

    options: ExportOptions
    counts: list[DatasetCounts]
    rows: dict[str, int] = field(default_factory=dict)  # split name → rows written
    paths: dict[str, Path] = field(default_factory=dict)  # split name → file (jsonl formats)
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    card: Path | None = None

    def format(self) -> str:
        o = self.options
        what = o.format + (f", {o.hf_layout}" if o.format == "hf" else "")
        total, taken = sum(self.rows.values()), sum(c.taken for c in self.counts)
        out = [f"exported {total:,} rows ({what}) to {display_path(o.out)} in {self.elapsed_s:.1f} s"]
        for c in self.counts:
            dropped = select.dropped_text(c.dropped, o.filters)
            out.append(f"  {c.dataset}: {c.committed:,} committed samples, {sum(c.dropped.values()):,} dropped"
                       + (f" ({dropped})" if dropped else "") + f", {c.taken:,} exported"
                       + (f" (of {c.eligible:,} eligible, --mix)" if c.taken < c.eligible else ""))
        if o.expand_turns or o.format == "tokens":  # one row per assistant turn (the two never go together)
            how = "--expand-turns" if o.expand_turns else "tokens"
            out.append(f"  {how}: {taken:,} samples → {total:,} rows, one per assistant turn")
        where = {k: f" → {display_path(p)}" for k, p in self.paths.items()} if len(self.paths) > 1 else {}
        out.append("  split: " + ", ".join(f"{k} {n:,}{where.get(k, '')}" for k, n in self.rows.items()))
        if self.card is not None:
            out.append(f"  card: {display_path(self.card)}")
        return "\n".join(out + [f"  note: {n}" for n in self.notes] + [f"  warning: {w}" for w in self.warnings])
