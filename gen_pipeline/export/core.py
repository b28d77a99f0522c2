"""`export`: committed samples → filters → --mix → split by id hash → [--expand-turns | tokens rows] → reasoning
check → seeded order → the file (or hf folder) and its card. Reads only what a resume would trust, takes no lock:
safe while a run writes. Validation rows go to <out stem>.val.ndjson, which no *.json / *.jsonl glob matches."""

from __future__ import annotations

import difflib
import errno
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gen_pipeline.config.dataset import DEFAULT_CONFIG_DIR, find_dataset_config
from gen_pipeline.display import display_path
from gen_pipeline.errors import ConfigError, DiskError, StoreError
from gen_pipeline.export import formats, select
from gen_pipeline.export.card import write_card
from gen_pipeline.export.options import ExportOptions, ExportSummary
from gen_pipeline.export.render import Renderer, load_renderer, tokenizer_source
from gen_pipeline.export.template_check import REASONING_ADVICE, TemplateCheck, reasoning_verdict
from gen_pipeline.export.tokens import NO_TOKENIZER, TokenRowBuilder, compact_ids, has_server_ids, length_fit
from gen_pipeline.store.layout import has_shards, iter_committed_samples

VAL_SUFFIX = ".val.ndjson"


def export_names(datasets: Sequence[str], config_dir: Path = DEFAULT_CONFIG_DIR) -> tuple[str, ...]:
    """`--dataset` values (repeated or comma-separated) → folder names; a TOML path gives its `name`."""
    names = [n.strip() for arg in datasets for n in arg.split(",") if n.strip()]
    return tuple(find_dataset_config(n, config_dir).name if n.endswith(".toml") else n for n in names)


def run_export(opts: ExportOptions) -> ExportSummary:
    """Read, select, split and write; raises ConfigError (bad flag, unknown or empty dataset,
    impossible mix) or StoreError (output exists without --force, damaged shard)."""
    started = time.monotonic()
    _check_options(opts)
    targets = _targets(opts)
    for t in targets.values():
        _check_target(t, opts.force)
    read = [_read_dataset(opts, n) for n in dict.fromkeys(opts.mix.datasets if opts.mix else opts.datasets)]
    counts, chosen = [c for c, _ in read], _select(opts, read)
    renderer, why = _renderer(opts)
    notes, warnings = check_reasoning(opts, chosen, renderer, why)  # before writing: the flag refuses
    val_ids = select.validation_ids((r["id"] for r in chosen), opts.val)
    splits = {"train": [r for r in chosen if r["id"] not in val_ids]}
    if opts.val.enabled:
        splits["validation"] = [r for r in chosen if r["id"] in val_ids]
    if opts.expand_turns:
        splits = {k: [t for r in rows for t in formats.expand_turns(r)] for k, rows in splits.items()}
    if opts.format == "tokens":
        builder = TokenRowBuilder(renderer, why=why)
        built = {k: builder.rows(rows) for k, rows in splits.items()}
        # went exact at a spot check: the splits built before it again
        splits = {k: builder.rows(rows) for k, rows in splits.items()} if builder.mismatch else built
        notes += builder.notes()
        fits, fit = length_fit((r for rows in splits.values() for r in rows), opts.max_length)
        (notes if fits else warnings).append(fit)
    for rows in splits.values():
        rows.sort(key=lambda r: select.seeded_key(opts.seed, r["id"]))
    summary = ExportSummary(opts, counts, rows={k: len(v) for k, v in splits.items()}, warnings=warnings)
    try:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        _write(opts, splits, targets)
    except OSError as e:
        raise write_error(opts.out, e) from None
    summary.paths = targets if opts.format != "hf" else {}
    summary.notes = _remove_stale_validation(opts) + notes
    summary.elapsed_s = time.monotonic() - started
    summary.card = write_card(opts, summary, chosen)
    return summary


def _renderer(opts: ExportOptions) -> tuple[Renderer | None, str]:
    """(the target's tokenizer, or None and why): --tokenizer must load; the --server profile's model is tried
    and may be absent here (a hub id on a machine without it)."""
    source, flag, trust = tokenizer_source(opts.tokenizer, opts.profile)
    if source is None:
        return None, NO_TOKENIZER
    try:
        return load_renderer(source, kwargs=opts.template_kwargs, trust_remote_code=trust, flag=flag), ""
    except ConfigError as e:
        if opts.tokenizer:
            raise
        why = str(e).rstrip(".")  # names the profile's tokenizer path unless it is the missing extra
        return None, why if source in why else f"{flag} {source} cannot be loaded: {why}"


def check_reasoning(opts: ExportOptions, chosen: list[dict[str, Any]], renderer: Renderer | None,
                    why: str = "") -> tuple[list[str], list[str]]:
    """(notes, warnings) on how much of the samples' reasoning this format's trainer puts under its loss mask;
    ConfigError with --require-trained-reasoning when not all of it."""
    kept = any(m.get("reasoning_content") for r in chosen for m in r["conversations"] if m.get("role") == "assistant")
    if not kept or opts.format == "hf" or opts.harmony:
        return [], []
    if opts.format == "tokens":  # a turn with the server's ids is its row as the model produced it: nothing to check
        chosen = [r for r in chosen if not all(has_server_ids(m) for m in r["conversations"]
                                               if m.get("role") == "assistant")]
        if not chosen:
            return ["tokens: every turn's row is the server's token ids, its reasoning and answer whole under the "
                    "loss mask"], []
    if renderer is None:
        note = f"the samples keep reasoning; whether the trainer's chat template trains it was not checked ({why})"
        if opts.require_trained_reasoning:
            raise ConfigError(f"--require-trained-reasoning: {note}.")
        return [note], []
    mode = {"specforge": "specforge-expanded" if opts.expand_turns else "specforge"}.get(opts.format, opts.format)
    sample = select.covering(chosen, opts.check_samples, opts.seed)
    share = TemplateCheck(renderer).run_mode(sample, mode).reasoning_share or 0.0
    trained, what = reasoning_verdict(share, len(sample), mode, renderer.source)
    if trained:
        return [what], []
    if opts.require_trained_reasoning:
        raise ConfigError(f"--require-trained-reasoning: only {what}"
                          + ("" if what.endswith(REASONING_ADVICE) else f". {REASONING_ADVICE}"))
    return [], [what]


def _check_options(opts: ExportOptions) -> None:
    fmt, mixed = opts.format, opts.mix.datasets if opts.mix else []
    rules = [
        (fmt not in formats.FORMATS, f"--format {fmt!r} is not one of {', '.join(formats.FORMATS)}."),
        (opts.hf_layout not in formats.HF_LAYOUTS,
         f"--hf-layout {opts.hf_layout!r} is not one of {', '.join(formats.HF_LAYOUTS)}."),
        (fmt != "hf" and opts.out.suffix != ".jsonl", f"--out {opts.out}: the {fmt} format writes one JSONL file; "
         "give a path ending in .jsonl (e.g. --out exports/B2.jsonl)."),
        (fmt == "tokens" and opts.expand_turns, "--expand-turns does not apply to --format tokens: it already "
         "writes one row per assistant turn. Drop --expand-turns."),
        (opts.harmony and fmt != "specforge", "--harmony applies to --format specforge only (SpecForge's gpt-oss "
         f"parser), not to {fmt}."),
        (opts.harmony and opts.status, "--harmony needs --no-status: SpecForge's Harmony parser takes no extra "
         "column (its parse() has no **kwargs, specforge/data/parse.py:387-394)."),
        (fmt == "speculators" and opts.expand_turns, "--expand-turns does not apply to --format speculators: its "
         "prepare_data.py already makes one training row per assistant turn. Drop --expand-turns."),
        (not opts.status and fmt != "specforge",
         f"--no-status applies to --format specforge only (the {fmt} format has no status)."),
        (not opts.datasets and opts.mix is None, "export needs --dataset NAME (repeatable) or --mix NAME=SHARE,...."),
        (bool(mixed and opts.datasets and set(opts.datasets) != set(mixed)), f"--dataset {', '.join(opts.datasets)} "
         f"and --mix {', '.join(mixed)} name different datasets; --mix alone is enough."),
    ]
    for bad, message in rules:
        if bad:
            raise ConfigError(message)


def _targets(opts: ExportOptions) -> dict[str, Path]:
    """split name → path: the JSONL formats put validation beside train as <stem>.val.ndjson."""
    if opts.format == "hf":
        return {"all": opts.out}
    return {"train": opts.out} | ({"validation": validation_path(opts.out)} if opts.val.enabled else {})


def validation_path(out: Path) -> Path:
    return out.with_name(out.stem + VAL_SUFFIX)


def _remove_stale_validation(opts: ExportOptions) -> list[str]:
    """--force: an earlier export's validation file that this one does not replace would overlap the new
    train file or sit where a *.jsonl glob finds it (an old .val.jsonl), so it goes."""
    if opts.format == "hf" or not opts.force:
        return []
    notes = []
    current, old = validation_path(opts.out), opts.out.with_name(opts.out.stem + ".val.jsonl")
    if not opts.val.enabled and current.is_file():
        current.unlink()
        notes.append(f"removed {display_path(current)} (an earlier export's validation rows, now in train)")
    if old.is_file():
        old.unlink()
        notes.append(f"removed {display_path(old)} (an earlier export's validation rows under the old name, "
                     "which a *.jsonl glob finds)")
    return notes


def write_error(out: Path, e: OSError) -> StoreError:
    """An export that could not be written, as the store error it is (exit 4): nothing was exported."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskError(f"Writing {display_path(out)} failed: {e.strerror}. Nothing was exported (no partial file "
                         "is left); free space or choose an --out on another disk.")
    return StoreError(f"Cannot write --out {display_path(out)}: {e.strerror or e} (in {display_path(out.parent)}). "
                      "Choose an --out in a folder you can write, or make that folder writable.")


def _check_target(path: Path, force: bool) -> None:
    folder = path.parent  # created when the export is written (`exports/` is not in a fresh clone)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"--out {path}: {display_path(folder)} is a file, not a folder. Choose another --out.")
    if not os.access(folder, os.W_OK):  # before reading the datasets (EACCES, EROFS; root ignores modes)
        code = errno.EROFS if os.statvfs(folder).f_flag & os.ST_RDONLY else errno.EACCES
        raise write_error(path, OSError(code, os.strerror(code)))
    formats.sweep_stale_tmp(path)
    if path.exists() and not force:
        raise StoreError(f"{display_path(path)} already exists. Pass --force to replace it (the new export is "
                         "written beside it and swapped in), or choose another --out.")


def _read_dataset(opts: ExportOptions, name: str) -> tuple[select.DatasetCounts, list[dict[str, Any]]]:
    folder = opts.output_root / name
    if not folder.is_dir():
        raise _missing(opts.output_root, name, folder)
    counts, rows = select.DatasetCounts(name), []
    duplicates: list[str] = []
    for row in iter_committed_samples(folder, duplicates):
        if opts.format == "tokens":
            compact_ids(row)
        counts.committed += 1
        reason = opts.filters.reason(row)
        if reason:
            counts.dropped[reason] += 1
        else:
            rows.append(row)
    if duplicates:  # lines of the shards, like the committed count status shows
        counts.committed += len(duplicates)
        counts.dropped["duplicate"] += len(duplicates)
    if not counts.committed:
        raise ConfigError(f"{name} has no committed samples yet (no whole line in the shards of "
                          f"{display_path(folder)}). Generate some first (make generate DATASET=" + name + ").")
    if not rows:
        why = select.dropped_text(counts.dropped, opts.filters)
        raise ConfigError(f"{name}: every one of its {counts.committed:,} samples was dropped ({why}). "
                          "Relax --drop-truncated / --min-completion-tokens.")
    return counts, rows


def _missing(root: Path, name: str, folder: Path) -> ConfigError:
    known = sorted(p.name for p in root.iterdir() if p.is_dir() and has_shards(p)) if root.is_dir() else []
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]}?" if close else ""
    return ConfigError(f"No dataset {name!r}: {display_path(folder)} does not exist. Datasets with samples "
                       f"in {display_path(root)}: {', '.join(known) or 'none'}.{hint} Generate it first "
                       f"(make generate DATASET={name}) or pass --output-dir.")


def _select(opts: ExportOptions, read: list[tuple[select.DatasetCounts, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """The samples the export takes: all eligible ones, or the --mix quota of each dataset."""
    wanted = select.mix_counts(opts.mix, {c.dataset: c.eligible for c, _ in read}) if opts.mix else {}
    chosen = []
    for c, rows in read:
        chosen += (taken := select.take(rows, wanted.get(c.dataset, c.eligible), opts.seed))
        c.taken = len(taken)
    return chosen


def _write(opts: ExportOptions, splits: dict[str, list[dict[str, Any]]], targets: dict[str, Path]) -> None:
    if opts.format == "hf":
        return formats.write_hf(opts.out, splits, opts.hf_layout)
    line = formats.LINE_WRITERS[opts.format]
    kw = {"keep_meta": opts.keep_meta, "status": opts.status, "harmony": opts.harmony}
    for k in sorted(splits, key=lambda k: k == "train"):  # the train file, the one a trainer is pointed at, last
        formats.write_jsonl(targets[k], [line(r, **kw) for r in splits[k]])
