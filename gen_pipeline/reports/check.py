"""`gen-pipeline check`: read the source as a run would, before any server starts, so that `generate` refuses to
launch (unless --proceed-anyway) on what would fail the run. A larger or hub source is judged from its first
SAMPLE_ROWS rows (after the configured shuffle) and the row count `datasets` reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from gen_pipeline.config.dataset import DatasetConfig
from gen_pipeline.config.mix import declared_lines
from gen_pipeline.config.server import ServerProfile
from gen_pipeline.display import display_path
from gen_pipeline.errors import ConfigError, GenPipelineError, SourceShortError
from gen_pipeline.records import Prompt, Reject
from gen_pipeline.reports.lengths import Lengths, context_length, measure
from gen_pipeline.reports.status import read_status
from gen_pipeline.sources.loading import LoadedSource, SourceStats, add_bad_lines, iter_prompts, load_source
from gen_pipeline.store.layout import final_failure_ids

WHOLE_SOURCE_ROWS = 50_000  # a local source up to this many rows is read whole
SAMPLE_ROWS = 2_000  # otherwise: its first rows
SHOWN_PROMPTS = 3
PREVIEW_CHARS = 160


@dataclass
class CheckReport:
    """What check found in one dataset's source; `problems` are what `generate` refuses to launch for."""

    dataset: str
    toml: str
    source: str  # "local files data/demo.jsonl" | "hub org/name (split train)"
    columns: list[str]
    total_rows: int | None  # rows the source has (None: a streaming source)
    whole: bool  # every row was read
    stats: SourceStats
    rejects: list[Reject]
    prompts: list[Prompt]
    lengths: Lengths
    max_new_tokens: int
    context: tuple[int | None, str]  # (tokens, where it was read) or (None, how to make it known)
    done: int
    target: int
    final_failed: int
    problems: list[GenPipelineError] = field(default_factory=list)
    mix: list[str] = field(default_factory=list)  # the declared sampling mix, one line per variant

    @property
    def valid(self) -> int:
        return self.stats.prompts

    @property
    def rejected(self) -> int:
        return sum(self.stats.rejects.values())

    @property
    def remaining(self) -> int:
        return max(0, self.target - self.done)

    def available(self) -> int | None:
        """New samples the source can still give: counted (whole), estimated (sample + row count) or None."""
        if self.whole:
            valid = self.valid
        elif self.total_rows is not None and self.stats.rows:
            valid = round(self.total_rows * self.valid / self.stats.rows)
        else:
            return None
        return max(0, valid - self.done - self.final_failed)


def run_check(cfg: DatasetConfig, *, output_root: Path, profile: ServerProfile | None,
              limit: int | None = None, sample_rows: int = SAMPLE_ROWS) -> CheckReport:
    """Load the source and check it against what the dataset still needs; ConfigError for an unloadable source."""
    loaded = load_source(cfg)
    done, final_failed = dataset_done(output_root, cfg)
    return check_source(cfg, loaded, done=done, final_failed=final_failed, profile=profile, limit=limit,
                        sample_rows=sample_rows)


def dataset_done(output_root: Path, cfg: DatasetConfig) -> tuple[int, int]:
    """(samples done, ids failed for good) of a dataset, all ranks as one, read once while other ranks write."""
    status = read_status(output_root, cfg.name, cfg.target_samples)
    final_failed = len(final_failure_ids(output_root / cfg.name)) if status.done or status.runs else 0
    return status.done, final_failed


def check_source(cfg: DatasetConfig, loaded: LoadedSource, *, done: int, final_failed: int,
                 profile: ServerProfile | None, limit: int | None = None,
                 sample_rows: int = SAMPLE_ROWS) -> CheckReport:
    """Parse a loaded source as a run would, measure prompts, compare with the target (at most `limit` needed).
    Raises ConfigError for a missing column; `problems` lists what `generate` refuses to launch for."""
    where = display_path(cfg.path) if cfg.path else cfg.name
    total = len(loaded.rows) if hasattr(loaded.rows, "__len__") else None
    columns = _columns(loaded.rows)
    for key, name, what in (("field", cfg.source.field, "the conversations or prompts"),
                            ("id_field", cfg.source.id_field, "ids")):
        if columns and name and name not in columns:  # no columns: an empty source, which _problems says
            raise ConfigError(f"{where}: source.{key} = {name!r}: the source has no such column. Its columns: "
                              f"{', '.join(columns)}. Set source.{key} to the column holding {what}.")
    whole = bool(cfg.source.files) and total is not None and total <= WHOLE_SOURCE_ROWS
    stats = SourceStats()
    rejects: list[Reject] = []
    add_bad_lines(cfg, loaded, stats, rejects)
    rows = loaded.rows if whole else islice(loaded.rows, sample_rows)
    prompts = list(iter_prompts(cfg, frozenset(), stats, rejects, rows=rows))
    max_new = max(s.max_new_tokens for _, s in cfg.variants)  # a sampling mix: its largest must fit too
    src, subset = cfg.source, f" ({cfg.source.hf_subset})" if cfg.source.hf_subset else ""
    described = f"local files {', '.join(src.files)}" if src.files else f"hub {src.hf_id}{subset}, split {src.split}"
    report = CheckReport(
        cfg.name, where, described, columns, total, whole, stats, rejects, prompts[:SHOWN_PROMPTS],
        measure(prompts[:sample_rows], profile), max_new, context_length(profile),
        done, cfg.target_samples, final_failed)
    if cfg.mix is not None:
        report.mix = [f"sampling mix ({len(cfg.mix.variants)} variants, mix_seed {cfg.mix.seed}; a sample's "
                      "variant is drawn from the seed and its source row):", *declared_lines(cfg.mix)]
    report.problems = _problems(report, cfg, where, report.remaining if limit is None else min(report.remaining, limit))
    return report


def _columns(rows: Any) -> list[str]:
    if names := getattr(rows, "column_names", None):
        return list(names)
    first = next(iter(rows), None)  # a streaming source may not know its columns before a row is read
    return sorted(first) if isinstance(first, dict) else []


def _problems(r: CheckReport, cfg: DatasetConfig, where: str, needed: int) -> list[GenPipelineError]:
    out: list[GenPipelineError] = []
    read = r.stats.rows
    scope = "rows" if r.whole else "sampled rows"
    if read and r.rejected * 2 > read:
        src, first = cfg.source, r.rejects[0]
        out.append(ConfigError(
            f"{where}: {r.rejected:,} of {read:,} {scope} are rejected ({_reasons(r.stats)}); the first, row "
            f"{first.source_index}: {first.detail}. Check source.schema = {src.schema!r} and source.field = "
            f"{src.field!r} (gen-pipeline check --dataset {cfg.name} shows the parsed rows)."))
    if (overflow := _overflow_problem(r, cfg, where)) is not None:
        out.append(overflow)
    available = r.available()
    if needed > 0 and available is not None and available < needed:
        had = f"{r.done:,} done" + (f", {r.final_failed:,} failed for good" if r.final_failed else "")
        basis = (f"{r.valid:,} valid rows, {had}" if r.whole else f"about: an estimate from {r.valid:,} valid of "
                 f"the first {read:,} rows, scaled to {r.total_rows:,} rows; {had}")
        out.append(SourceShortError(
            f"{where}: the source can give {available:,} more samples ({basis}), "
            f"but {needed:,} are needed to reach target_samples = {r.target:,}. Add rows to the source or "
            f"lower target_samples to {r.done + available:,}; or pass --proceed-anyway to generate what there is."))
    return out


def _overflow_problem(r: CheckReport, cfg: DatasetConfig, where: str) -> ConfigError | None:
    """Most measured prompts cannot fit the context with max_new_tokens: every such request would be
    refused (HTTP 400), so a run would fail nearly all of them. None when most fit or the context is unknown."""
    ctx, ctx_where = r.context
    n = len(r.lengths.values)
    if ctx is None or not n:
        return None
    over = r.lengths.overflowing(r.max_new_tokens, ctx)
    if over * 2 <= n:
        return None
    approx, median = "" if r.lengths.unit == "tokens" else "~", r.lengths.median_tokens()
    room = ctx - median
    fix = (f"lower sampling.max_new_tokens (at most {room:,} lets the median prompt fit), raise context_length"
           if room > 0 else "raise context_length")
    return ConfigError(
        f"{where}: {over:,} of {n:,} measured prompts do not fit the context: prompt + max_new_tokens "
        f"({r.max_new_tokens:,}) may be at most the context length, {ctx:,} tokens ({ctx_where}); the median prompt "
        f"is {approx}{median:,} tokens. SGLang refuses such requests (HTTP 400), so a run would fail them. To fix: "
        f"{fix}, or reject long rows with source.max_prompt_chars.")


def _reasons(stats: SourceStats) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(stats.rejects.items(), key=lambda kv: (-kv[1], kv[0])))


def format_report(r: CheckReport) -> str:
    """The report as text for a terminal."""
    read = r.stats.rows
    if r.whole:
        scope = f"all {read:,} rows read (a local source of up to {WHOLE_SOURCE_ROWS:,} rows is read whole)"
    else:
        of = f"{r.total_rows:,}" if r.total_rows is not None else "an unknown number of (streamed)"
        scope = f"the first {read:,} of {of} rows read (a sample: hub sources and local ones over " \
                f"{WHOLE_SOURCE_ROWS:,} rows)"
    lines = [f"check {r.dataset} ({r.toml}): {r.source}", f"  {scope}",
             f"  columns: {', '.join(r.columns) or 'none'}",
             f"  valid: {r.valid:,}; rejected: {r.rejected:,}" + (f" ({_reasons(r.stats)})" if r.rejected else "")]
    firsts: dict[str, Reject] = {}
    for rej in r.rejects:
        firsts.setdefault(rej.reason, rej)
    lines += [f"    {rej.reason}, e.g. row {rej.source_index}: {rej.detail}" for rej in firsts.values()]
    lines.append(f"  parsed prompts ({len(r.prompts)} shown, cut at {PREVIEW_CHARS} characters):")
    lines += [f"    {p.id}: {_preview(p)}" for p in r.prompts]
    lines += r.lengths.format(r.max_new_tokens, r.context)
    lines += [f"  {r.mix[0]}", *(f"    {x}" for x in r.mix[1:])] if r.mix else []
    available = r.available()
    can = ("unknown (a streaming source has no row count)" if available is None
           else f"{available:,}" + ("" if r.whole else " (estimated from the sample)"))
    lines.append(f"  target: {r.done:,}/{r.target:,} done, {r.remaining:,} to go; the source can give {can} more")
    lines.append("  OK" if not r.problems else f"  {len(r.problems)} problem(s); generate refuses to launch "
                                                 "(--proceed-anyway overrides):")
    lines += [f"    - {p}" for p in r.problems]
    return "\n".join(lines)


def _preview(p: Prompt) -> str:
    text = " | ".join(f"[{m['role']}] {m['content']}" for m in p.messages if m["role"] != "assistant")
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
