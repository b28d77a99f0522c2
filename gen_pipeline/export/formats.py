"""The layouts `export` writes, read from each trainer's source (docs/export.md): specforge {"id", "conversations",
"status"} (any other column goes to its chat template as a keyword), speculators {"id", "conversations"}, hf
(hf_features()), tokens (tokens.py). Tool-use rows carry `tools` as JSON text (SpecForge 0.2.0 data/preprocessing.py
and speculators 0.9.0 preprocessing.py pass it to apply_chat_template(tools=...)) and keep tool_calls / tool_call_id.
Writers are atomic: a hidden temporary beside the target, then a rename."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.errors import ConfigError
from gen_pipeline.export.tokens import row_tools, strip_token_ids
from gen_pipeline.store.lock import pid_alive

FORMATS = ("specforge", "speculators", "hf", "tokens")
HF_LAYOUTS = ("disk", "parquet")
TMP_MARK = ".export-tmp-"


def expand_turns(row: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per assistant turn: the history up to it with the reasoning of earlier assistant
    turns removed, the turn itself whole (as SpecForge's expand_reasoning_conversations.py does;
    chat templates of reasoning models render only the last turn's reasoning). Ids "<id>#turn<k>"."""
    out, history, k = [], [], 0
    for message in row["conversations"]:
        if message.get("role") != "assistant":
            history.append(message)
            continue
        out.append({**row, "id": f"{row['id']}#turn{k}", "source_id": row["id"], "turn_index": k,
                    "conversations": [*history, message]})
        history.append({key: v for key, v in message.items() if key != "reasoning_content"})
        k += 1
    return out


def _meta(row: dict[str, Any]) -> dict[str, Any]:
    """`meta` for --keep-meta: the sample's meta plus its dataset (and source turn when expanded)."""
    meta = dict(row["meta"]) if isinstance(row.get("meta"), dict) else {}
    meta["dataset"] = row.get("dataset")
    if "source_id" in row:
        meta["source_id"], meta["assistant_turn_index"] = row["source_id"], row["turn_index"]
    return meta


def harmony_messages(conversations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant turns as SpecForge's HarmonyParser roles: analysis (reasoning) then final (answer), each on
    its channel and masked (specforge/data/parse.py:358-384 refuses "assistant" with `Unknown role`)."""
    out = []
    for m in conversations:
        if m.get("role") != "assistant":
            out.append({"role": m["role"], "content": m["content"]})
            continue
        if m.get("reasoning_content"):
            out.append({"role": "assistant_analysis", "content": m["reasoning_content"]})
        out.append({"role": "assistant_final", "content": m["content"]})
    return out


def specforge_line(row: dict[str, Any], *, keep_meta: bool, status: bool, harmony: bool = False) -> bytes:
    convs = strip_token_ids(row["conversations"])
    if harmony and (row_tools(row) or any(m.get("tool_calls") or m.get("role") == "tool" for m in convs)):
        raise ConfigError(f"sample {row['id']} is a tool-use conversation, and --harmony writes only the analysis "
                          "and final channels of each assistant turn: its tool calls would be lost. Export it "
                          "without --harmony (or --format tokens), or leave its dataset out of this export.")
    out: dict[str, Any] = {"id": row["id"], "conversations": harmony_messages(convs) if harmony else convs}
    if tools := row_tools(row):
        out["tools"] = tools
    if status:
        out["status"] = "success"
    if keep_meta:
        out["meta"] = _meta(row)
    return orjson.dumps(out, option=orjson.OPT_APPEND_NEWLINE)


def tokens_line(row: dict[str, Any], *, keep_meta: bool, status: bool = False, harmony: bool = False) -> bytes:
    """A tokens row (tokens.py); the ids as JSON arrays, which SpecForge and datasets read as-is."""
    out: dict[str, Any] = {"id": row["id"], "input_ids": row["input_ids"], "loss_mask": row["loss_mask"],
                           "ids_from": row["ids_from"]}
    if keep_meta:
        out["meta"] = _meta(row)
    return orjson.dumps(out, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY)


LINE_WRITERS: dict[str, Callable[..., bytes]] = {  # speculators: specforge's row without status
    "specforge": specforge_line, "tokens": tokens_line,
    "speculators": lambda row, *, keep_meta, **_: specforge_line(row, keep_meta=keep_meta, status=False)}

HF_META = {"model": "string", "backend": "string", "finish_reason": "string", "prompt_tokens": "int64",
           "completion_tokens": "int64", "turns": "int64", "sampling": "string", "sampling_variant": "int64",
           "kv_cache_dtype": "string", "generated_at": "string", "chat_template_kwargs": "string",
           "tool_divergence": "int64"}


# meta.per_turn: each assistant turn's quality flags and counts (records.TurnMeta), null where a row has none
HF_TURN_META = {"finish_reason": "string", "prompt_tokens": "int64", "completion_tokens": "int64",
                "reasoning_tokens": "int64", "attempts": "int64", "loops": "int64", "empty": "int64", "leak": "string",
                "tokens_not_decoded": "int64", "discarded_tokens": "int64",
                # a draft's acceptance (SGLang's meta_info; only on a server with a speculative algorithm)
                "spec_accept_length": "float64", "spec_verify_ct": "int64"}


def hf_features() -> Any:
    """The fixed schema of the hf format (meta.sampling is JSON text: its keys differ by dataset)."""
    from datasets import Features, Value

    turn = {"role": Value("string"), "content": Value("string"), "reasoning_content": Value("string"),
            "tool_calls": Value("string"), "tool_call_id": Value("string")}
    meta: dict[str, Any] = {k: Value(t) for k, t in HF_META.items()}
    meta["per_turn"] = [{k: Value(t) for k, t in HF_TURN_META.items()}]
    return Features({"id": Value("string"), "source_id": Value("string"), "dataset": Value("string"),
                     "tools": Value("string"), "conversations": [turn], "meta": meta})


def _hf_value(value: Any, kind: str) -> Any:
    if kind == "int64":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind == "float64":
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def hf_row(row: dict[str, Any]) -> dict[str, Any]:
    meta = row["meta"] if isinstance(row.get("meta"), dict) else {}
    return {"id": row["id"], "source_id": row.get("source_id", row["id"]), "dataset": row.get("dataset"),
            "tools": row_tools(row) or None,
            "conversations": [{"role": m.get("role"), "content": m.get("content"),
                               "reasoning_content": m.get("reasoning_content"),
                               "tool_calls": _hf_value(m.get("tool_calls"), "string"),
                               "tool_call_id": m.get("tool_call_id")} for m in row["conversations"]],
            "meta": {**{k: _hf_value(meta.get(k), t) for k, t in HF_META.items()},
                     "per_turn": [{k: _hf_value(t.get(k), kind) for k, kind in HF_TURN_META.items()}
                                  for t in meta.get("per_turn") or [] if isinstance(t, dict)]}}


def tmp_path(target: Path) -> Path:
    return target.parent / f".{target.name}{TMP_MARK}{os.getpid()}"


def sweep_stale_tmp(target: Path) -> None:
    """Remove temporaries a killed export left beside `target` (their pid is gone)."""
    for p in target.parent.glob(f".{target.name}{TMP_MARK}*"):
        pid = p.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            _remove(p)


def _remove(p: Path) -> None:
    """Best effort: a temporary that cannot be removed (a read-only folder) must not hide why the export failed."""
    with contextlib.suppress(OSError):
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def write_jsonl(target: Path, lines: Sequence[bytes]) -> None:
    """Write `lines` to `target` atomically (tmp + fsync + rename)."""
    tmp = tmp_path(target)
    try:
        with open(tmp, "wb") as f:
            for start in range(0, len(lines), 4096):  # one write per batch, not per row
                f.write(b"".join(lines[start:start + 4096]))
            f.flush()
            os.fsync(f.fileno())
        _install(tmp, target)
    finally:
        _remove(tmp)


def write_hf(target: Path, splits: dict[str, list[dict[str, Any]]], layout: str) -> None:
    """A DatasetDict folder (layout "disk") or <split>.parquet files ("parquet") at `target`,
    built in a temporary folder and renamed into place."""
    import pyarrow as pa
    from datasets import Dataset, DatasetDict, DatasetInfo

    tmp = tmp_path(target)
    try:
        tmp.mkdir()
        features = hf_features()
        built = DatasetDict()
        for name, rows in splits.items():
            # pyarrow builds the table faster than Dataset.from_list (docs/measurements.md, "export")
            table = pa.Table.from_pylist([hf_row(r) for r in rows], schema=features.arrow_schema)
            # a fingerprint from the ids: without one, datasets hashes the whole table to make it
            ids_digest = hashlib.blake2b(b"\n".join(r["id"].encode() for r in rows), digest_size=8).hexdigest()
            built[name] = Dataset(table, info=DatasetInfo(features=features), fingerprint=f"export-{name}-{ids_digest}")
        if layout == "disk":
            built.save_to_disk(str(tmp))
        else:
            for name, ds in built.items():
                ds.to_parquet(str(tmp / f"{name}.parquet"))
        _install(tmp, target)
    finally:
        _remove(tmp)


def _install(tmp: Path, target: Path) -> None:
    """Rename `tmp` to `target`. A file replaces a file in one step; an existing folder (--force)
    is moved aside first and removed after, so `target` is never half written."""
    if not target.exists() or (tmp.is_file() and target.is_file()):
        os.replace(tmp, target)
        return
    old = target.parent / f".{target.name}{TMP_MARK}old-{os.getpid()}"
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except OSError:
        os.rename(old, target)
        raise
    _remove(old)
