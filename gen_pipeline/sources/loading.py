"""Dataset loading: Hugging Face hub or local files (through `datasets`) → validated Prompts (schemas:
docs/datasets.md). Validation follows SpecForge's; a failing row is a `Reject` with a reason, not fatal.
Ids are stable across runs: "<DATASET>-<source id>" from `source.id_field`, else a content hash."""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.config.dataset import DatasetConfig, SourceConfig
from gen_pipeline.display import display_path
from gen_pipeline.errors import ConfigError, DiskError, StoreError
from gen_pipeline.records import Message, Prompt, Reject
from gen_pipeline.sources import hub
from gen_pipeline.sources.files import CLEAN_DIR, BadLine, file_problem, no_rows_problem, scan_jsonl

_SHAREGPT_ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bard": "assistant", "model": "assistant",
    "system": "system", "tool": "tool", "observation": "tool", "function_call": "assistant",
}
_MESSAGE_ROLES = {"user", "assistant", "system", "tool"}
TOOLS_COLUMN = "tools"  # the row's column with the conversation's tool schemas
_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


@dataclass
class SourceStats:
    """Counts of what the source produced in this run (rejects by reason)."""

    rows: int = 0
    prompts: int = 0
    skipped_done: int = 0
    rejects: dict[str, int] = field(default_factory=dict)

    def reject(self, reason: str) -> None:
        self.rejects[reason] = self.rejects.get(reason, 0) + 1


class InvalidRow(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def parse_row(row: dict[str, Any], schema: str, cfg_field: str) -> list[Message]:
    """Map one source row to role/content messages; raises InvalidRow with a reason."""
    if cfg_field not in row:
        raise InvalidRow("missing_field", f"no column {cfg_field!r} (columns: {', '.join(sorted(row))})")
    value = row[cfg_field]
    if value is None:  # `datasets` fills a column missing from some rows with None
        raise InvalidRow("missing_field", f"{cfg_field!r} is missing in this row")
    if schema == "prompt":
        return [{"role": "user", "content": _content(value, 0)}]
    if not isinstance(value, list) or not value:
        raise InvalidRow("bad_type", f"{cfg_field!r} must be a non-empty list of turns, got {type(value).__name__}")
    messages: list[Message] = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict):
            raise InvalidRow("bad_type", f"turn {i} must be an object, got {type(turn).__name__}")
        role_key, content_key = _turn_keys(turn, schema, i)
        raw_role = turn[role_key]
        role = _SHAREGPT_ROLES.get(raw_role) if schema == "sharegpt" else (
            raw_role if raw_role in _MESSAGE_ROLES else None)
        if role is None:
            raise InvalidRow("unknown_role", f"turn {i} has role {raw_role!r}")
        if raw_role == "function_call" and content_key == "value":  # LLaMA-Factory: the call as JSON text
            messages.append({"role": "assistant", "content": "", "tool_calls": _tool_calls(turn[content_key], i)})
        elif role == "tool":
            messages.append(_tool_result(turn, content_key, i, messages))
        elif role == "assistant" and turn.get("tool_calls"):
            content = turn[content_key]
            if content is not None and not isinstance(content, str):
                raise InvalidRow("bad_type", f"turn {i} content must be a string, got {type(content).__name__}")
            messages.append({"role": "assistant", "content": content or "",
                             "tool_calls": _tool_calls(turn["tool_calls"], i)})
        else:
            messages.append({"role": role, "content": _content(turn[content_key], i)})
    return messages


def _tool_calls(value: Any, i: int) -> list[dict[str, Any]]:
    """A turn's tool calls in OpenAI's shape, arguments as JSON text; raises InvalidRow (bad_tool_call)."""
    if isinstance(value, str):
        value = _json(value, "bad_tool_call", f"turn {i}: the tool call is not JSON")
    calls = value if isinstance(value, list) else [value]
    out = []
    for k, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidRow("bad_tool_call", f"turn {i}: tool call {k} has no function name")
        args = fn.get("arguments", {}) if isinstance(fn, dict) else {}
        if isinstance(args, dict):  # `datasets` read an object column: keys of other rows' objects came as null
            args = drop_nulls(args)
        elif isinstance(args, str):
            what = f"turn {i}: the arguments of tool call {k} ({name}) are not JSON"
            args = _json(args, "bad_tool_call", what) if args.strip() else {}
        cid = call.get("id") if isinstance(call, dict) and "function" in call else None
        out.append({"id": cid if isinstance(cid, str) and cid else f"call_{i}_{k}", "type": "function",
                    "function": {"name": name, "arguments": orjson.dumps(args).decode()}})
    return out


def _json(text: str, reason: str, what: str) -> Any:
    """`text` parsed as JSON; raises InvalidRow(reason) quoting its start."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        raise InvalidRow(reason, f"{what}: {text[:80]!r}") from None


def _tool_result(turn: dict[str, Any], content_key: str, i: int, before: list[Message]) -> Message:
    """A tool turn: its content (a string, may be empty) and the id of the call it answers."""
    content = turn[content_key]
    if not isinstance(content, str):
        content = orjson.dumps(content).decode() if isinstance(content, dict | list) else None
        if content is None:
            raise InvalidRow("bad_type", f"turn {i} (tool) content must be a string")
    cid = turn.get("tool_call_id")
    if not isinstance(cid, str) or not cid:  # the next call of the assistant turn before without a result
        for answered, m in enumerate(reversed(before)):
            if m["role"] != "tool":
                calls = m.get("tool_calls") or []
                cid = calls[answered]["id"] if answered < len(calls) else f"call_{i}"
                break
    return {"role": "tool", "content": content, "tool_call_id": cid or f"call_{i}"}


def parse_tools(row: dict[str, Any]) -> str:
    """The row's `tools` column as JSON text ("" when none); raises InvalidRow (bad_tools)."""
    value = row.get(TOOLS_COLUMN)
    if value is None or value == "" or value == []:
        return ""
    if isinstance(value, str):
        value = _json(value, "bad_tools", f"column {TOOLS_COLUMN!r} is not JSON")
    elif isinstance(value, list):  # `datasets` made one Arrow struct of all rows' schemas: their keys came as null
        value = drop_nulls(value)
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise InvalidRow("bad_tools", f"column {TOOLS_COLUMN!r} must be a list of tool schemas (objects)")
    return orjson.dumps(value).decode() if value else ""


def drop_nulls(value: Any) -> Any:
    """`value` without the null-valued keys of its objects, at every depth: `datasets` loads a JSON column of
    objects as one Arrow struct, every row's keys, the missing ones null (JSON text comes back as written)."""
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def _turn_keys(turn: dict[str, Any], schema: str, i: int) -> tuple[str, str]:
    """The turn's role and content keys: from/value or role/content under sharegpt, role/content otherwise."""
    if schema == "sharegpt" and "from" in turn and "value" in turn:
        return "from", "value"
    if "role" in turn and "content" in turn:
        return "role", "content"
    needs = "'from' and 'value' (or 'role' and 'content')" if schema == "sharegpt" else "'role' and 'content'"
    hint = "; set source.schema = \"sharegpt\" for from/value turns" if schema != "sharegpt" and "from" in turn else ""
    has = ", ".join(map(repr, sorted(turn))) or "no keys"
    raise InvalidRow("missing_field", f"turn {i} needs {needs}; it has {has}{hint}")


def _content(value: Any, i: int) -> str:
    if not isinstance(value, str):
        raise InvalidRow("bad_type", f"turn {i} content must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidRow("empty_content", f"turn {i} has empty content")
    return value


def check_roles(messages: list[Message]) -> None:
    """Optional leading system, then user/assistant alternating from user; raises InvalidRow. With tool
    turns: an assistant with tool_calls is answered by one tool turn per call, then an assistant."""
    body = messages[1:] if messages and messages[0]["role"] == "system" else messages
    if not body:
        raise InvalidRow("no_user_turn", "no user turn")
    if any(m["role"] == "tool" or m.get("tool_calls") for m in body):
        _check_tool_roles(body, len(messages) - len(body))
        return
    for i, m in enumerate(body):
        expected = "user" if i % 2 == 0 else "assistant"
        if m["role"] != expected:
            raise InvalidRow("roles_not_alternating",
                             f"turn {i + len(messages) - len(body)} is {m['role']!r}, expected {expected!r}")


def _check_tool_roles(body: list[Message], offset: int) -> None:
    """The order of a conversation with tool turns (what SpecForge's parser and chat templates accept)."""
    expected: tuple[str, ...] = ("user",)
    pending = 0  # results still owed to the last assistant's calls
    for i, m in enumerate(body):
        role = m["role"]
        if role not in expected:
            raise InvalidRow("roles_not_alternating", f"turn {i + offset} is {role!r}, expected "
                                                      f"{' or '.join(map(repr, expected))}")
        if role == "assistant" and m.get("tool_calls"):
            pending = len(m["tool_calls"])
            expected = ("tool",)
        elif role == "assistant":
            expected = ("user",)
        elif role == "tool":
            pending -= 1
            expected = ("tool",) if pending > 0 else ("assistant",)
        else:
            expected = ("assistant",)
    if pending > 0 and body[-1]["role"] == "tool":
        raise InvalidRow("tool_results_missing", f"the last assistant turn made more tool calls than the "
                                                 f"{len(body)} turns answer")


def content_id(messages: list[Message], tools: str = "") -> str:
    """A stable hash of the conversation's system, user and tool turns (assistant turns get regenerated;
    with tools, the source's tool calls and the tools too: they shape the history sent)."""
    kept: list[Any] = [(m["role"], m["content"]) for m in messages if m["role"] != "assistant"]
    if tools or any(m.get("tool_calls") for m in messages):
        kept += [tools, [m.get("tool_calls") for m in messages if m["role"] == "assistant"]]
    return hashlib.sha1(orjson.dumps(kept)).hexdigest()[:16]


def to_prompt(row: dict[str, Any], index: int, cfg: DatasetConfig) -> Prompt:
    """One row → Prompt (validated, with its stable id); raises InvalidRow."""
    src = cfg.source
    messages = parse_row(row, src.schema, src.field)
    tools = parse_tools(row) if src.schema != "prompt" or TOOLS_COLUMN in row else ""
    if src.system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": src.system_prompt})
    check_roles(messages)
    chars = sum(len(m["content"]) for m in messages if m["role"] != "assistant") + len(tools)
    if chars > src.max_prompt_chars:
        raise InvalidRow("prompt_too_long", f"{chars} characters > source.max_prompt_chars = {src.max_prompt_chars}")
    if src.id_field:
        raw = row.get(src.id_field)
        if not isinstance(raw, (str, int)) or isinstance(raw, bool) or raw == "":
            raise InvalidRow("missing_id", f"column {src.id_field!r} is missing or not a string/integer")
        sid = str(raw)
    else:
        sid = content_id(messages, tools)
    return Prompt(id=f"{cfg.name}-{sid}", messages=tuple(messages), source_index=index, tools=tools)


def _datasets() -> Any:
    """The `datasets` module, imported lazily: it takes ~1 s and status/validate don't need it. Its
    progress bars and log level are the application's to set (the CLI quiets them: cli/logs.py)."""
    import datasets

    return datasets


@dataclass
class LoadedSource:
    """The rows as `datasets` gives them, plus the local lines it was not shown (not JSON objects)."""

    rows: Any
    bad_lines: tuple[BadLine, ...] = ()
    good_lines: int = 0  # rows of the scanned .jsonl files (the bad lines' reject rows are numbered after them)


def load_source(cfg: DatasetConfig) -> LoadedSource:
    """Load the source as a run reads it; raises ConfigError (missing file, hub offline, bad format)."""
    src = cfg.source
    where = display_path(cfg.path) if cfg.path else cfg.name
    offline = None if src.files else hub.offline_reason()
    if offline:
        hub.go_offline()  # a copy in the local cache still loads
    datasets = _datasets()
    loaded = LoadedSource(None)
    try:
        if src.files:
            loaded = _local_files(cfg, where)
            fmt = "parquet" if loaded.rows[0].suffix == ".parquet" else "json"
            ds = datasets.load_dataset(fmt, data_files=[str(p) for p in loaded.rows], split="train",
                                       streaming=src.streaming)
        else:
            ds = datasets.load_dataset(src.hf_id, src.hf_subset or None, split=src.split, streaming=src.streaming)
    except ConfigError:
        raise
    except Exception as e:  # datasets wraps Arrow/JSON/network errors in many types
        what = source_label(src)
        disk = _disk_error(e, where, what, datasets.config.HF_DATASETS_CACHE)
        if disk is not None:
            raise disk from None
        if offline:
            raise ConfigError(f"{where}: the Hugging Face hub is not reachable ({offline}) and {what} is not in the "
                              f"local cache. Download the dataset's files where the hub is reachable (hf download "
                              f"--repo-type dataset {src.hf_id} --local-dir DIR), copy them here, and in {where} set "
                              "source.files to the local .jsonl/.json/.parquet files (and remove hf_id).") from None
        cause = e.__cause__ or e.__context__ or e
        hint = ("Check that every line is one JSON object (JSON Lines) or the file is valid JSON/Parquet."
                if src.files else "Check the dataset id and split, and that the hub is reachable "
                "(or download it and point source.files at the local copy).")
        raise ConfigError(f"{where}: could not load source {what}: {type(cause).__name__}: {cause}. {hint}") from None
    if src.shuffle_seed is not None:
        ds = ds.shuffle(seed=src.shuffle_seed)
    rows = len(ds) if hasattr(ds, "__len__") else loaded.good_lines  # streaming datasets have no len()
    return LoadedSource(ds, loaded.bad_lines, rows)


def source_label(src: SourceConfig) -> str:
    """The source as messages name it: its files, or its hub id and split."""
    return ", ".join(src.files) if src.files else f"{src.hf_id} (split {src.split})"


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_TOO_LARGE = (errno.EFBIG,)
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def _no_room(e: OSError) -> bool:
    """The datasets library's own check before it writes its cache (builder.py, download_and_prepare):
    OSError("Not enough disk space. Needed: ...") with no errno, raised when the cache's disk is full."""
    return e.errno is None and str(e).startswith("Not enough disk space")


def _disk_error(exc: BaseException, where: str, what: str, cache: Any) -> StoreError | None:
    """A full or unwritable disk under the load (the datasets cache, where `datasets` converts a source
    to Arrow before a run reads it; or the folder of cleaned copies) as the store error it is (exit 4),
    or None when it is not one."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:  # the OSError is often a cause or context of what datasets raises
        seen.add(id(e))
        if isinstance(e, OSError) and (e.errno in _DISK_FULL + _TOO_LARGE + _NOT_WRITABLE or _no_room(e)):
            break
        e = e.__cause__ or e.__context__
    if not isinstance(e, OSError):
        return None
    written = Path(e.filename) if isinstance(e.filename, str) else Path(cache)
    if written.resolve().is_relative_to(CLEAN_DIR.resolve()):
        role, fix = (f"{display_path(CLEAN_DIR)} keeps cleaned copies of sources with bad lines",
                     "set TMPDIR to a folder on a disk with room")
    else:
        role, fix = (f"the datasets cache {display_path(Path(cache))}, where the source is converted to Arrow "
                     "before a run reads it", "set HF_DATASETS_CACHE to a folder on a disk with room")
    place = display_path(written if written.is_dir() else written.parent)
    if e.errno in _TOO_LARGE:
        return DiskError(f"{where}: could not load source {what}: a file in {place} grew past the largest size allowed "
                         f"({e.strerror}: the filesystem's limit or the shell's ulimit -f; {role}). Raise the limit, "
                         f"or {fix.replace('with room', 'without that limit')}, then run again.")
    if e.errno in _DISK_FULL or _no_room(e):
        return DiskError(f"{where}: could not load source {what}: the disk of {place} is full "
                         f"({e.strerror or 'datasets: ' + str(e).split('.')[0]}; {role}). "
                         f"Free space there, or {fix}, then run again.")
    return StoreError(f"{where}: could not load source {what}: cannot write in {place} ({e.strerror}; {role}). "
                      f"Make it writable, or {fix.replace(' on a disk with room', ' this user can write')}, then "
                      "run again.")


def _local_files(cfg: DatasetConfig, where: str) -> LoadedSource:
    """The paths `datasets` should read (cleaned copies for .jsonl files with bad lines) and those lines."""
    src = cfg.source
    paths = [cfg.resolve(f) for f in src.files]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise ConfigError(f"{where}: source.files: {', '.join(missing)} not found.")
    fmts = {_FORMATS.get(p.suffix) for p in paths}
    if None in fmts or len(fmts) != 1:
        raise ConfigError(f"{where}: source.files must all be .jsonl/.json or all .parquet "
                          f"(got {', '.join(p.name for p in paths)}).")
    read: list[Any] = []
    bad: list[BadLine] = []
    good = 0
    for name, path in zip(src.files, paths, strict=True):
        try:
            problem = file_problem(path, name)
            scanned = scan_jsonl(path, name) if problem is None and path.suffix == ".jsonl" else None
            problem = problem or (no_rows_problem(path, name, scanned) if scanned else None)
        except OSError as e:
            if e.filename is not None and Path(e.filename).resolve() != path.resolve():
                raise _disk_error(e, where, name, CLEAN_DIR) or e from None  # writing a cleaned copy
            raise ConfigError(f"{where}: source.files: cannot read {name}: {e.strerror or e}. Fix its permissions "
                              "or point source.files at a file this user can read.") from None
        if problem:
            raise ConfigError(f"{where}: source.files: {problem}")
        if scanned is None:
            read.append(path)
            continue
        if scanned.bad and src.strict:
            b = scanned.bad[0]
            raise ConfigError(f"{where}: {b.file} line {b.line} is {b.error}; source.strict = true refuses "
                              f"the file. Fix or delete that line, or remove strict to skip such lines "
                              f"into rejects.jsonl.")
        read.append(scanned.path)
        bad += scanned.bad
        good += scanned.good_lines
    return LoadedSource(read, tuple(bad), good)


def add_bad_lines(cfg: DatasetConfig, loaded: LoadedSource, stats: SourceStats, rejects: list[Reject]) -> None:
    """The lines `datasets` was not shown, as bad_json rejects numbered after the good rows (stable
    across runs, never a good row's number: the store writes each row's reject once)."""
    for k, bad in enumerate(loaded.bad_lines):
        stats.rows += 1
        stats.reject("bad_json")
        rejects.append(Reject(cfg.name, loaded.good_lines + k, "bad_json", f"{bad.file} line {bad.line} is {bad.error}",
                              file=bad.file, line=bad.line))


def iter_prompts(cfg: DatasetConfig, skip_ids: set[str] | frozenset[str], stats: SourceStats,
                 rejects: list[Reject], rows: Any = None,
                 owns: Callable[[str], bool] | None = None, loaded: LoadedSource | None = None) -> Iterator[Prompt]:
    """Valid prompts not in `skip_ids` (given `owns`, only the ids it owns), in source order, each id once, from
    `rows`, else `loaded`, else the source loaded here. Invalid rows go to `rejects` (the caller writes them)
    and `stats` on every rank (status counts each row once)."""
    seen: set[str] = set()
    if rows is None:
        loaded = loaded or load_source(cfg)
        add_bad_lines(cfg, loaded, stats, rejects)
        rows = loaded.rows
    for index, row in enumerate(rows):
        stats.rows += 1
        try:
            prompt = to_prompt(row, index, cfg)
            if prompt.id in seen:
                raise InvalidRow("duplicate", f"id {prompt.id} appeared earlier in the source")
        except InvalidRow as e:
            stats.reject(e.reason)
            rejects.append(Reject(cfg.name, index, e.reason, e.detail))
            continue
        seen.add(prompt.id)
        if owns is not None and not owns(prompt.id):  # another rank sends it
            continue
        if prompt.id in skip_ids:
            stats.skipped_done += 1
            continue
        stats.prompts += 1
        yield prompt


def estimate_prompt_tokens(prompts: list[Prompt]) -> float:
    """Mean prompt length in tokens, from characters (~4 chars/token, errs low for code/CJK-free text)."""
    if not prompts:
        return 0.0
    return sum(p.prompt_chars for p in prompts) / len(prompts) / 4.0
