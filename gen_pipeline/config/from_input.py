"""`generate --input prompts.jsonl --output-dir out`: the schema inferred from the rows, and the TOML
used written to `out/prompts.toml`, so the same command (or `--dataset out/prompts.toml`) resumes; a later
command whose settings differ from it is refused."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.config.dataset import DatasetConfig, SamplingConfig, load_dataset_config, read_toml
from gen_pipeline.display import display_path
from gen_pipeline.errors import ConfigError
from gen_pipeline.sources.loading import InvalidRow, check_roles, content_id, parse_row
from gen_pipeline.store.layout import read_jsonl_rows

# Columns tried, in order: conversations first (a list of turns), then a prompt's text.
TURN_COLUMNS = ("messages", "conversations", "conversation", "turns", "chat", "dialog")
TEXT_COLUMNS = ("prompt", "question", "instruction", "query", "input", "text")
INFER_ROWS = 100  # rows read to pick schema and field (every row is read once more to count the valid ones)


@dataclass(frozen=True)
class Inferred:
    """What the rows of an input file look like: schema, field, id column ("" = content hashes)."""

    schema: str
    field: str
    id_field: str
    valid: int  # rows that parse under it, each id once
    rows: int


def _schema_of(rows: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(schema, field) under which most of `rows` parse, or None."""
    columns = [c for c in (*TURN_COLUMNS, *TEXT_COLUMNS) if any(c in r for r in rows)]
    best: tuple[int, str, str] | None = None
    for column in columns:
        for schema in (("messages", "sharegpt") if column in TURN_COLUMNS else ("prompt",)):
            n = sum(1 for r in rows if _valid(r, schema, column))
            if n and (best is None or n > best[0]):
                best = (n, schema, column)
    return None if best is None else (best[1], best[2])


def _valid(row: dict[str, Any], schema: str, column: str) -> list[Any] | None:
    try:
        messages = parse_row(row, schema, column)
        check_roles(messages)
    except InvalidRow:
        return None
    return messages


def infer_input(path: Path) -> Inferred:
    """Schema, field and id column of a .jsonl prompt file, and how many of its rows are valid; raises
    ConfigError naming the file and what was seen."""
    where = display_path(path)
    if path.suffix != ".jsonl":
        raise ConfigError(f"--input {where}: only a .jsonl file (one JSON object a line) is read without a dataset "
                          "TOML. For .json/.parquet or a hub dataset, write one (datasets_cfg/B2.toml shows how).")
    if not path.is_file():
        raise ConfigError(f"--input {where}: no such file.")
    try:
        rows = read_jsonl_rows(path)  # the JSON object lines; the run rejects the others
    except OSError as e:
        raise ConfigError(f"--input {where}: cannot be read ({e.strerror or e}).") from None
    found = _schema_of(rows[:INFER_ROWS])
    if found is None:
        seen = sorted({k for r in rows[:INFER_ROWS] for k in r})
        raise ConfigError(f"--input {where}: no column holds a conversation ({', '.join(TURN_COLUMNS)}: a list of "
                          f"role/content or from/value turns) or a prompt ({', '.join(TEXT_COLUMNS)}: a string); "
                          f"its rows have {', '.join(seen) or 'no columns'}. Rename the column, or write a dataset "
                          "TOML naming it (source.field).")
    schema, column = found
    parsed = [(r, m) for r in rows if (m := _valid(r, schema, column)) is not None]
    raw_ids = [r.get("id") for r, _ in parsed]
    has_ids = bool(parsed) and all(isinstance(i, (str, int)) and not isinstance(i, bool) and i != "" for i in raw_ids)
    id_field = "id" if has_ids and len({str(i) for i in raw_ids}) == len(raw_ids) else ""
    ids = {str(i) for i in raw_ids} if id_field else {content_id(m) for _, m in parsed}
    return Inferred(schema, column, id_field, len(ids), len(rows))


def input_name(path: Path) -> str:
    """The dataset name of an input file: its stem, with characters other than letters, digits, - and _ as _."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", path.stem) or "input"


def input_toml(path: Path, inferred: Inferred, sampling: SamplingConfig, command: str) -> str:
    """The dataset TOML of an input file: the inferred [source], the sampling flags' [sampling]."""
    def q(v: object) -> str:
        return orjson.dumps(v).decode()

    ids = (f"id_field = {q(inferred.id_field)}\n" if inferred.id_field
           else "# no id_field: the rows have no unique \"id\" column, so ids are content hashes\n")
    return (f"# Written by: {command}\n"
            f"# Inferred from {path.name}: schema {q(inferred.schema)}, field {q(inferred.field)}; "
            f"{inferred.valid:,} of its {inferred.rows:,} rows are valid.\n"
            f"# Resume with the same command, or: gen-pipeline generate --dataset THIS_FILE\n"
            f"name = {q(input_name(path))}\n"
            f"target_samples = {inferred.valid}\n\n"
            f"[source]\nfiles = [{q(str(path.resolve()))}]\nschema = {q(inferred.schema)}\n"
            f"field = {q(inferred.field)}\n{ids}\n"
            f"[sampling]\nmax_new_tokens = {sampling.max_new_tokens}\ntemperature = {sampling.temperature!r}\n"
            f"top_p = {sampling.top_p!r}\n")


def input_dataset(path: Path, output_root: Path, *, command: str = "gen-pipeline generate --input",
                  **given: Any) -> tuple[DatasetConfig, str]:
    """(the dataset config of `--input path`, a line saying where its TOML is): inferred and written to
    output_root/<name>.toml, or read back from there when an earlier run wrote the same settings; `given`:
    sampling_flags(). Raises ConfigError when the file cannot be used or the TOML there says otherwise."""
    sampling = SamplingConfig(**{k: v for k, v in given.items() if v is not None})  # else SamplingConfig's defaults
    text = input_toml(path, infer_input(path), sampling, command)
    toml = output_root / f"{input_name(path)}.toml"
    if toml.exists():
        old, new = read_toml(toml), tomllib.loads(text)
        if old != new:
            differs = ", ".join(_differences(old, new))
            raise ConfigError(f"{display_path(toml)} was written by an earlier run with other settings ({differs}); "
                              f"its samples were made with it. Resume it as it is with --dataset {display_path(toml)} "
                              "(or the same flags as then), or pass another --output-dir to start anew.")
        return load_dataset_config(toml), f"resuming {display_path(toml)} (the dataset TOML of --input {path.name})"
    output_root.mkdir(parents=True, exist_ok=True)
    tmp = toml.with_name(toml.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(toml)
    try:
        cfg = load_dataset_config(toml)
    except ConfigError:
        toml.unlink()  # a flag's value refused (its message names the key): no TOML of a run that never was
        raise
    inferred = f"schema {cfg.source.schema!r}, field {cfg.source.field!r}"
    return cfg, (f"wrote {display_path(toml)} ({inferred}, target {cfg.target_samples:,}): the same command, or "
                 f"--dataset {display_path(toml)}, resumes")


def sampling_flags(*, max_new_tokens: int | None, temperature: float | None, top_p: float | None,
                   input_given: bool) -> dict[str, Any]:
    """The sampling flags given, for input_dataset; ConfigError when given without --input (a dataset
    TOML's [sampling] decides then)."""
    given = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p}
    named = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
    if named and not input_given:
        raise ConfigError(f"{', '.join(named)} {'goes' if len(named) == 1 else 'go'} with --input only: with "
                          "--dataset, the TOML's [sampling] table sets them. Edit it there.")
    return given


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} {a!r} there, {b!r} now")
    return out
