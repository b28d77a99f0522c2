"""`validate`: check a dataset folder's shards the way a trainer will read them. SpecForge loads
them with `load_dataset("json")`, which infers one Arrow schema: every row needs the same keys
and value types (in "meta" too), and "reasoning_content" on every assistant turn or on none."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.config.dataset import DEFAULT_CONFIG_DIR, find_dataset_config
from gen_pipeline.config.mix import recorded_sampling
from gen_pipeline.display import count, display_path
from gen_pipeline.errors import ConfigError
from gen_pipeline.quality.accounting import add_meta, format_gate
from gen_pipeline.store.layout import dataset_parts, part_name, shard_files
from gen_pipeline.store.manifest import read_manifest
from gen_pipeline.store.ranks import owner_rank, parse_rank_folder

KINDS = {
    "unparseable": "line is not a JSON object",
    "schema": "keys or value types differ from the first row",
    "meta_schema": "meta keys or value types differ from the first row",
    "reasoning_mixed": "reasoning_content on some assistant turns but not others",
    "duplicate_id": "id already seen",
    "roles": "roles do not alternate (optional system, then user/assistant, ending with assistant)",
    "empty_content": "a turn with empty content",
    "think_marker": "<think> or </think> left in an assistant turn's content",
    "truncated": "finish_reason is \"length\" and the dataset drops truncated samples",
    "wrong_rank": "a rank's folder holds a sample whose id hashes to another rank",
    "mixed_config": "rows made with another model or sampling than the first row",
    "leak": "a turn written with a reasoning leak (meta.per_turn[].leak) although the dataset drops them "
            "(generation.truncated = \"drop\")",
    "mix_sampling": "meta.sampling is not what the declared sampling mix gives its meta.sampling_variant",
}
THINK_MARKERS = ("<think>", "</think>")
# an invalid last line is a torn write by the store's trust rule (store/layout.py): not a sample, and cut
TORN = ("; it is the last line, a write cut short (a crash, or a run writing now): the next generate run cuts "
        "it off, and export skips it")
EXAMPLES_PER_KIND = 20  # keep memory bounded when every row of 88,000 has the same problem


@dataclass
class Problem:
    kind: str
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


@dataclass
class ValidationReport:
    """Counts per problem kind (all of them) and the first examples of each with file:line."""

    folder: str
    rows: int = 0
    files: int = 0
    truncated: int = 0
    truncated_policy: str = "keep"
    ranks: int = 0  # rank folders read (0: a dataset written by one run)
    counts: Counter[str] = field(default_factory=Counter)
    examples: list[Problem] = field(default_factory=list)
    gate: dict[str, int] = field(default_factory=dict)  # the quality gate's counts of the rows (meta.per_turn)

    @property
    def ok(self) -> bool:
        return not self.counts

    def add(self, kind: str, file: str, line: int, message: str) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= EXAMPLES_PER_KIND:
            self.examples.append(Problem(kind, file, line, message))

    def to_dict(self) -> dict[str, Any]:
        return {"folder": self.folder, "ok": self.ok, "rows": self.rows, "files": self.files, "ranks": self.ranks,
                "truncated": self.truncated, "truncated_policy": self.truncated_policy, "gate": self.gate,
                "problems": dict(self.counts), "examples": [asdict(p) for p in self.examples]}

    def format(self) -> str:
        """For humans: a summary line, then each problem kind with its first examples."""
        verdict = "OK" if self.ok else f"{sum(self.counts.values())} problems"
        ranks = f" of {self.ranks} ranks" if self.ranks else ""
        out = [f"{self.folder}: {count(self.rows)} rows in {count(self.files)} shards{ranks}: {verdict} "
               f"({self.truncated:,} truncated, policy {self.truncated_policy})"]
        if gate := format_gate(self.gate):
            out.append(f"  {gate} (written rows only; errors.jsonl holds the failed samples)")
        for kind, n in self.counts.most_common():
            out.append(f"  {kind}: {n:,} ({KINDS[kind]})")
            out += [f"    {p}" for p in self.examples if p.kind == kind][:5]
        return "\n".join(out)


def _tname(v: Any) -> str:
    return {str: "a string", int: "an integer", float: "a float", bool: "a boolean", list: "a list",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


def _shape_diff(first: dict[str, Any], row: dict[str, Any], prefix: str, deep: bool) -> str:
    """Why `row` does not have `first`'s keys and value types ("" when it does); `deep` recurses
    into objects (meta.sampling); lists are the caller's business."""
    a, b = set(first), set(row)
    if a != b:
        return ", ".join([f"missing {prefix}{k}" for k in sorted(a - b)]
                         + [f"extra {prefix}{k}" for k in sorted(b - a)])
    for k in sorted(a):
        if type(row[k]) is not type(first[k]):
            return f"{prefix}{k} is {_tname(row[k])} here, {_tname(first[k])} in the first row"
        if deep and isinstance(row[k], dict) and (diff := _shape_diff(first[k], row[k], f"{prefix}{k}.", deep)):
            return diff
    return ""


def _value_diff(first: Any, here: Any, name: str) -> str:
    """"name is X here, Y in the first row" for the first differing value ("" when equal), into objects."""
    if isinstance(first, dict) and isinstance(here, dict):
        for k in sorted(set(first) | set(here)):
            if diff := _value_diff(first.get(k), here.get(k), f"{name}.{k}"):
                return diff
        return ""
    return "" if first == here else f"{name} is {here!r} here, {first!r} in the first row"


class _Checker:
    def __init__(self, report: ValidationReport, fingerprint: dict[str, Any] | None = None):
        self.r = report
        # the manifest's fingerprint when it declares a sampling mix: each row is checked against its variant
        self.mix_fp = fingerprint if fingerprint and isinstance(fingerprint.get("sampling_mix"), dict) else None
        self.first: dict[str, Any] | None = None
        self.first_sampling: dict[Any, Any] = {}  # meta.sampling_variant: the first such row's meta.sampling
        self.reasoning: bool | None = None  # do assistant turns carry reasoning_content?
        self.seen: dict[str, str] = {}

    def row(self, file: str, line: int, row: dict[str, Any]) -> None:
        self.r.rows += 1
        if self.first is None:
            self.first = row
        if diff := _shape_diff(self.first, row, "", deep=False):
            self.r.add("schema", file, line, diff)
        meta, first_meta = row.get("meta"), self.first.get("meta")
        if isinstance(meta, dict) and isinstance(first_meta, dict):
            if diff := _shape_diff(first_meta, meta, "meta.", deep=True):
                self.r.add("meta_schema", file, line, diff)
            else:  # a row of another shape is reported as that
                self._config(file, line, meta, first_meta)
            leaks_before = self.r.gate.get("leaks", 0)
            add_meta(self.r.gate, meta)
            if self.r.gate.get("leaks", 0) > leaks_before and self.r.truncated_policy == "drop":
                self.r.add("leak", file, line, 'meta.per_turn flags a reasoning leak but generation.truncated = "drop"')
            if meta.get("finish_reason") == "length":
                self.r.truncated += 1
                if self.r.truncated_policy == "drop":
                    self.r.add("truncated", file, line, 'finish_reason is "length" but generation.truncated = "drop"')
        here, rid = f"{file}:{line}", row.get("id")
        if isinstance(rid, str) and (at := self.seen.setdefault(rid, here)) != here:  # not a str: the schema check's
            self.r.add("duplicate_id", file, line, f"id {rid!r} already at {at}")
        if isinstance(row.get("conversations"), list):
            self._turns(file, line, row["conversations"])

    def _config(self, file: str, line: int, meta: dict[str, Any], first: dict[str, Any]) -> None:
        """One dataset is one model and one sampling (one per variant of a sampling mix): a row made another
        way is a problem (a resume with another config that no drift check caught)."""
        variant = meta.get("sampling_variant")
        same_variant = self.first_sampling.setdefault(variant, meta.get("sampling"))
        diff = (_value_diff(first.get("model"), meta.get("model"), "meta.model")
                or _value_diff(same_variant, meta.get("sampling"), "meta.sampling"))
        if diff:
            which = "" if variant in (None, 0) or diff.startswith("meta.model") else f" (sampling_variant {variant})"
            self.r.add("mixed_config", file, line, diff.replace("in the first row", f"in the first row{which}"))
        if self.mix_fp is not None:
            self._mix(file, line, variant, meta.get("sampling"))

    def _mix(self, file: str, line: int, variant: Any, sampling: Any) -> None:
        declared = len(self.mix_fp.get("sampling_mix") or {}) - 1 if self.mix_fp else 0  # its keys: the seed too
        expected = (recorded_sampling(self.mix_fp, variant)
                    if self.mix_fp and isinstance(variant, int) and not isinstance(variant, bool) else None)
        if expected is None:
            self.r.add("mix_sampling", file, line, f"meta.sampling_variant is {variant!r}: the declared mix has "
                       f"variants 0 to {declared - 1}")
        elif diff := _value_diff(expected, sampling, "meta.sampling"):
            self.r.add("mix_sampling", file, line, diff.replace(
                "in the first row", f"in the declared mix for sampling_variant {variant}"))

    def _turns(self, file: str, line: int, turns: list[Any]) -> None:
        roles = [t.get("role") if isinstance(t, dict) else None for t in turns]
        if not _roles_ok(roles, turns):
            self.r.add("roles", file, line, f"roles are {roles}")
        for i, t in enumerate(turns):
            if not isinstance(t, dict) or not isinstance(t.get("content"), str):
                self.r.add("schema", file, line, f"conversations[{i}].content is not a string")
                continue
            if not t["content"].strip() and not t.get("tool_calls") and t.get("role") != "tool":
                self.r.add("empty_content", file, line, f"conversations[{i}] ({t.get('role')}) has empty content")
            if t.get("role") != "assistant":
                continue
            if marker := next((m for m in THINK_MARKERS if m in t["content"]), None):
                self.r.add("think_marker", file, line, f"conversations[{i}].content contains {marker!r}")
            has = "reasoning_content" in t
            if self.reasoning is None:
                self.reasoning = has
            elif has != self.reasoning:
                self.r.add("reasoning_mixed", file, line, f"conversations[{i}] {'has' if has else 'lacks'} "
                           f"reasoning_content, unlike the first assistant turn of the dataset")


def _roles_ok(roles: list[Any], turns: list[Any] | None = None) -> bool:
    """Optional system, then user/assistant alternating, ending with an assistant; a tool-use sample
    (tool turns): the order sources/loading.py accepts (a call's results, then an assistant), ending with
    an assistant (whose calls may be unanswered: a sample that ended at a divergence)."""
    if "tool" in roles and turns is not None and all(isinstance(t, dict) for t in turns):
        from gen_pipeline.sources.loading import InvalidRow, check_roles

        try:
            check_roles(turns)
        except InvalidRow:
            return False
        return bool(roles[-1] == "assistant")
    body = roles[1:] if roles[:1] == ["system"] else roles
    return (len(body) >= 2 and len(body) % 2 == 0
            and all(r == ("user" if i % 2 == 0 else "assistant") for i, r in enumerate(body)))


def validate_named(name: str, output_root: Path, config_dir: Path = DEFAULT_CONFIG_DIR) -> ValidationReport:
    """`validate --dataset NAME`: the folder of a dataset name (a TOML's `name` when NAME is a config),
    validated; ConfigError when it has no folder or no sample yet."""
    is_config = name.endswith(".toml") or (config_dir / f"{name}.toml").exists()
    folder = output_root / (find_dataset_config(name, config_dir).name if is_config else name)  # the TOML's `name`
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such output folder. Generate it first (make generate DATASET={name}).")
    report = validate_dataset(folder)
    if report.rows == 0 and report.ok:
        raise ConfigError(f"{folder}: nothing to validate: no samples yet ({report.files} shard"
                          f"{'' if report.files == 1 else 's'}, all empty). "
                          f"Generate it first (make generate DATASET={name}).")
    return report


def validate_dataset(folder: Path) -> ValidationReport:
    """Check every shard line of `folder` (all ranks' parts as one dataset: duplicates across ranks
    count); problems carry file:line. Never raises for bad data."""
    parts = dataset_parts(folder)
    manifest = read_manifest(parts[0] if parts else folder)[0] or {}
    policy = (manifest.get("fingerprint") or {}).get("truncated", "keep")
    report = ValidationReport(display_path(folder), truncated_policy=policy if policy in ("keep", "drop") else "keep")
    checker = _Checker(report, manifest.get("fingerprint"))
    report.ranks = sum(1 for part in parts if parse_rank_folder(part.name))
    for part, shard in ((p, s) for p in parts for s in shard_files(p)):
        path, name, owner = shard.path, part_name(folder, shard.path), parse_rank_folder(part.name)
        report.files += 1
        data = path.read_bytes()
        last = data.count(b"\n") + (not data.endswith(b"\n"))  # the last line's number
        for n, line in enumerate(data.split(b"\n"), start=1):
            if not line and n > data.count(b"\n"):
                break  # the empty string after the final newline
            try:
                row = orjson.loads(line)
                bad = "" if isinstance(row, dict) else f"a JSON {type(row).__name__}, not an object"
            except orjson.JSONDecodeError:
                bad = "not valid JSON"
            if bad:
                report.add("unparseable", name, n, bad + (TORN if n == last else ""))
                continue
            checker.row(name, n, row)
            if owner is not None and isinstance(row.get("id"), str) and owner_rank(row["id"], owner[1]) != owner[0]:
                report.add("wrong_rank", name, n, f"id {row['id']!r} belongs to rank "
                           f"{owner_rank(row['id'], owner[1])} of {owner[1]}, not rank {owner[0]}")
    return report
