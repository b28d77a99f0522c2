"""`export`: from a dataset folder's shards to the one file (or folder) a trainer loads.

    outputs/B2/shard-*.jsonl ─► committed samples ─► filters ─► --mix ─► split by id hash
        ─► [--expand-turns] ─► seeded order ─► specforge / speculators JSONL, or hf (atomic)

Reads only what a resume would trust, takes no lock, writes nothing in outputs/, so it is safe
while a run writes. Formats: export_formats.py; filters, mix and split: export_select.py.
"""

from __future__ import annotations

import difflib
import errno
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gen_pipeline.config.dataset import DEFAULT_CONFIG_DIR, find_dataset_config
from gen_pipeline.display import display_path
from gen_pipeline.errors import ConfigError, DiskError, StoreError
from gen_pipeline.export.formats import (
    FORMATS,
    HF_LAYOUTS,
    LINE_WRITERS,
    expand_turns,
    sweep_stale_tmp,
    write_hf,
    write_jsonl,
)
from gen_pipeline.export.select import (
    DatasetCounts,
    Filters,
    Mix,
    ValSplit,
    drop_reason_text,
    mix_counts,
    seeded_key,
    take,
    validation_ids,
)
from gen_pipeline.store.layout import dataset_parts, has_shards, shard_files
from gen_pipeline.store.shards import iter_lines


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


@dataclass
class ExportSummary:
    """What was written: per-dataset counts, rows per split, the files and their size."""

    options: ExportOptions
    counts: list[DatasetCounts]
    rows: dict[str, int] = field(default_factory=dict)  # split name → rows written
    paths: dict[str, Path] = field(default_factory=dict)  # split name → file (jsonl formats)
    bytes_written: int = 0
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def format(self) -> str:
        o = self.options
        what = o.format + (f", {o.hf_layout}" if o.format == "hf" else "")
        total = sum(self.rows.values())
        out = [f"exported {total:,} rows ({what}) to {display_path(o.out)} in {self.elapsed_s:.1f} s"]
        for c in self.counts:
            dropped = ", ".join(f"{n:,} {drop_reason_text(r, o.filters)}" for r, n in sorted(c.dropped.items()))
            line = f"  {c.dataset}: {c.committed:,} committed samples, {sum(c.dropped.values()):,} dropped"
            line += f" ({dropped})" if dropped else ""
            line += f", {c.taken:,} exported"
            line += f" (of {c.eligible:,} eligible, --mix)" if c.taken < c.eligible else ""
            out.append(line)
        if o.expand_turns:
            out.append(f"  --expand-turns: {sum(c.taken for c in self.counts):,} samples → {total:,} rows, "
                       "one per assistant turn")
        where = {k: f" → {display_path(p)}" for k, p in self.paths.items()} if len(self.paths) > 1 else {}
        out.append("  split: " + ", ".join(f"{k} {n:,}{where.get(k, '')}" for k, n in self.rows.items()))
        return "\n".join(out + [f"  note: {n}" for n in self.notes])


def iter_committed_samples(folder: Path) -> Iterator[dict[str, Any]]:
    """The committed samples of a dataset folder (every part), first of each id, by the store's trust
    rule (layout.py, that of resume): every whole line of every shard; a torn or invalid last line is
    a write in progress and is skipped; an invalid line before it is damage: StoreError."""
    seen: set[str] = set()
    for part in dataset_parts(folder):
        for shard in shard_files(part):
            data = shard.path.read_bytes()  # one snapshot; a live writer only appends after it
            for number, row, _why, _end in iter_lines(data):
                if row is None:
                    raise StoreError(f"{display_path(shard.path)} line {number} is not a sample, and it is not the "
                                     "last line, so this is not a torn write: the file is damaged. Run `gen-pipeline "
                                     "validate` on the dataset, fix or delete that line, then export again.")
                if row["id"] not in seen:
                    seen.add(row["id"])
                    yield row


# ---------------------------------------------------------------- the export


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
    counts, samples = [], {}
    for name in _datasets(opts):
        c, rows = _read_dataset(opts, name)
        counts.append(c)
        samples[name] = rows
    chosen = _select(opts, counts, samples)
    val_ids = validation_ids((r["id"] for r in chosen), opts.val)
    splits = {"train": [r for r in chosen if r["id"] not in val_ids]}
    if opts.val.enabled:
        splits["validation"] = [r for r in chosen if r["id"] in val_ids]
    if opts.expand_turns:
        splits = {k: [t for r in rows for t in expand_turns(r)] for k, rows in splits.items()}
    for rows in splits.values():
        rows.sort(key=lambda r: seeded_key(opts.seed, r["id"]))
    summary = ExportSummary(opts, counts, rows={k: len(v) for k, v in splits.items()})
    try:
        summary.bytes_written = _write(opts, splits, targets)
    except OSError as e:
        raise write_error(opts.out, e) from None
    summary.paths = targets if opts.format != "hf" else {}
    summary.notes = _remove_stale_validation(opts)
    summary.elapsed_s = time.monotonic() - started
    return summary


def _check_options(opts: ExportOptions) -> None:
    if opts.format not in FORMATS:
        raise ConfigError(f"--format {opts.format!r} is not one of {', '.join(FORMATS)}.")
    if opts.hf_layout not in HF_LAYOUTS:
        raise ConfigError(f"--hf-layout {opts.hf_layout!r} is not one of {', '.join(HF_LAYOUTS)}.")
    if opts.format != "hf" and opts.out.suffix != ".jsonl":
        raise ConfigError(f"--out {opts.out}: the {opts.format} format writes one JSONL file; give a path "
                          "ending in .jsonl (e.g. --out exports/B2.jsonl).")
    if opts.format == "speculators" and opts.expand_turns:
        raise ConfigError("--expand-turns does not apply to --format speculators: its prepare_data.py already "
                          "makes one training row per assistant turn. Drop --expand-turns.")
    if not opts.status and opts.format != "specforge":
        raise ConfigError(f"--no-status applies to --format specforge only (the {opts.format} format has no status).")
    if not opts.datasets and opts.mix is None:
        raise ConfigError("export needs --dataset NAME (repeatable) or --mix NAME=SHARE,....")
    if opts.mix is not None and opts.datasets and set(opts.datasets) != set(opts.mix.datasets):
        raise ConfigError(f"--dataset {', '.join(opts.datasets)} and --mix {', '.join(opts.mix.datasets)} name "
                          "different datasets; --mix alone is enough.")


def _datasets(opts: ExportOptions) -> list[str]:
    return list(dict.fromkeys(opts.mix.datasets if opts.mix is not None else opts.datasets))


def _targets(opts: ExportOptions) -> dict[str, Path]:
    """split name → path: the JSONL formats put validation beside train as <stem>.val.jsonl."""
    if opts.format == "hf":
        return {"all": opts.out}
    targets = {"train": opts.out}
    if opts.val.enabled:
        targets["validation"] = opts.out.with_name(opts.out.stem + ".val.jsonl")
    return targets


def _remove_stale_validation(opts: ExportOptions) -> list[str]:
    """--force without --val-share: a <stem>.val.jsonl from an earlier export would overlap the new
    train file, so it goes too."""
    stale = opts.out.with_name(opts.out.stem + ".val.jsonl")
    if opts.format == "hf" or opts.val.enabled or not opts.force or not stale.is_file():
        return []
    stale.unlink()
    return [f"removed {display_path(stale)} (an earlier export's validation rows, now in train)"]


def write_error(out: Path, e: OSError) -> StoreError:
    """An export that could not be written, as the store error it is (exit 4): nothing was exported."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskError(f"Writing {display_path(out)} failed: {e.strerror}. Nothing was exported (no partial file "
                         "is left); free space or choose an --out on another disk.")
    return StoreError(f"Cannot write --out {display_path(out)}: {e.strerror or e} (in {display_path(out.parent)}). "
                      "Choose an --out in a folder you can write, or make that folder writable.")


def _check_target(path: Path, force: bool) -> None:
    if not path.parent.is_dir():
        raise ConfigError(f"--out {path}: the folder {display_path(path.parent)} does not exist. Create it first.")
    if not os.access(path.parent, os.W_OK):  # before reading the datasets (EACCES, EROFS; root ignores modes)
        code = errno.EROFS if os.statvfs(path.parent).f_flag & os.ST_RDONLY else errno.EACCES
        raise write_error(path, OSError(code, os.strerror(code)))
    sweep_stale_tmp(path)
    if path.exists() and not force:
        raise StoreError(f"{display_path(path)} already exists. Pass --force to replace it (the new export is "
                         "written beside it and swapped in), or choose another --out.")


def _read_dataset(opts: ExportOptions, name: str) -> tuple[DatasetCounts, list[dict[str, Any]]]:
    folder = opts.output_root / name
    if not folder.is_dir():
        raise _missing(opts.output_root, name, folder)
    counts, rows = DatasetCounts(name), []
    for row in iter_committed_samples(folder):
        counts.committed += 1
        reason = opts.filters.reason(row)
        if reason:
            counts.dropped[reason] += 1
        else:
            rows.append(row)
    if not counts.committed:
        raise ConfigError(f"{name} has no committed samples yet (no whole line in the shards of "
                          f"{display_path(folder)}). Generate some first (make generate DATASET=" + name + ").")
    if not rows:
        why = ", ".join(f"{n:,} {drop_reason_text(r, opts.filters)}" for r, n in sorted(counts.dropped.items()))
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


def _select(opts: ExportOptions, counts: list[DatasetCounts],
            samples: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The samples the export takes: all eligible ones, or the --mix quota of each dataset."""
    wanted = mix_counts(opts.mix, {c.dataset: c.eligible for c in counts}) if opts.mix else {}
    chosen = []
    for c in counts:
        rows = take(samples[c.dataset], wanted.get(c.dataset, c.eligible), opts.seed)
        c.taken = len(rows)
        chosen += rows
    return chosen


def _write(opts: ExportOptions, splits: dict[str, list[dict[str, Any]]], targets: dict[str, Path]) -> int:
    if opts.format == "hf":
        return write_hf(opts.out, splits, opts.hf_layout)
    line = LINE_WRITERS[opts.format]
    # validation first: the train file is the one a trainer is pointed at, so it appears last
    return sum(write_jsonl(targets[k], [line(r, keep_meta=opts.keep_meta, status=opts.status) for r in splits[k]])
               for k in sorted(splits, key=lambda k: k == "train"))
