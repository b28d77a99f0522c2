"""Dataset and server configs: frozen dataclasses read from TOML, validated with messages
that name the file and the key.

A dataset config, `datasets_cfg/B2.toml`:

    name = "B2"                      # defaults to the file's stem
    target_samples = 18000

    [source]
    hf_id = "org/name"               # Hugging Face hub dataset ...
    split = "train"
    # files = ["data/demo.jsonl"]    # ... or local files (jsonl/json/parquet), relative to the TOML
    schema = "sharegpt"              # "sharegpt" (from/value) | "messages" (role/content) | "prompt"
    field = "conversations"          # the column holding the conversation or the prompt text
    id_field = "id"                  # optional: a stable source id column; else a content hash
    system_prompt = ""               # optional: prepended when a row has none
    max_prompt_chars = 400000        # optional: longer rows are rejected (reason prompt_too_long)
    shuffle_seed = 0                 # optional: shuffle the source once, deterministically

    [sampling]
    max_new_tokens = 4096
    temperature = 0.7
    top_p = 0.95

    [generation]
    reasoning = "keep"               # "keep" reasoning_content | "disable" thinking | "none"
    truncated = "keep"               # finish_reason == "length": "keep" or "drop"
    empty_turn = "retry"             # empty assistant content: "retry" (then a failure) or "fail"
    request_timeout_s = 3600
    max_attempts = 6

    [output]
    shard_max_samples = 2000
    fsync_every = 64
"""

from __future__ import annotations

import difflib
import hashlib
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson

from .errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG_DIR = REPO_ROOT / "datasets_cfg"
DEFAULT_OUTPUT_DIR = REPO_ROOT / "outputs"
SCHEMAS = ("sharegpt", "messages", "prompt")
REASONING_MODES = ("keep", "disable", "none")
TRUNCATED_POLICIES = ("keep", "drop")
EMPTY_TURN_POLICIES = ("retry", "fail")  # an empty assistant turn (validate rejects it): retry or fail


@dataclass(frozen=True)
class SourceConfig:
    hf_id: str = ""
    hf_subset: str = ""
    split: str = "train"
    files: tuple[str, ...] = ()
    schema: str = "sharegpt"
    field: str = "conversations"
    id_field: str = ""
    system_prompt: str = ""
    shuffle_seed: int | None = None
    streaming: bool = False
    max_prompt_chars: int = 400_000  # longer prompts are rejected before any request (~100K tokens)


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int = 2048
    temperature: float = 0.7
    top_p: float = 0.95


@dataclass(frozen=True)
class GenerationConfig:
    reasoning: str = "none"
    truncated: str = "keep"
    empty_turn: str = "retry"  # EMPTY_TURN_POLICIES; retries count against max_attempts
    request_timeout_s: float = 3600.0
    connect_timeout_s: float = 10.0
    max_attempts: int = 6
    retry_initial_wait_s: float = 1.0
    retry_max_wait_s: float = 60.0
    window: int = 0  # 0 = adaptive (the controller); N = fixed concurrency


@dataclass(frozen=True)
class OutputConfig:
    shard_max_samples: int = 2000
    fsync_every: int = 64


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    target_samples: int
    source: SourceConfig
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    path: Path | None = None  # the TOML it came from

    def resolve(self, rel: str) -> Path:
        """A path from the config, relative to the config file's folder."""
        p = Path(rel)
        if p.is_absolute() or self.path is None:
            return p
        return (self.path.parent / p).resolve()

    def fingerprint(self, model: str) -> dict[str, Any]:
        """What must not change between runs writing one dataset (checked on resume)."""
        return {
            "model": model,
            "source": _source_identity(self.source),
            "sampling": asdict(self.sampling),
            "reasoning": self.generation.reasoning,
            "truncated": self.generation.truncated,
        }


def _source_identity(src: SourceConfig) -> dict[str, Any]:
    d = asdict(src)
    d.pop("streaming")
    d.pop("max_prompt_chars")
    d["files"] = list(src.files)
    return d


def fingerprint_digest(fp: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(fp, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


# ---------------------------------------------------------------- loading + validation

_SECTIONS: dict[str, type] = {
    "source": SourceConfig,
    "sampling": SamplingConfig,
    "generation": GenerationConfig,
    "output": OutputConfig,
}


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; raises ConfigError naming the file and the line."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file.") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e}). Fix the syntax and run again.") from None


def _type_name(v: Any) -> str:
    return {str: "a string", bool: "a boolean", int: "an integer", float: "a number",
            list: "a list", dict: "a table"}.get(type(v), type(v).__name__)


def _coerce(where: str, key: str, value: Any, default: Any, annotation: str) -> Any:
    """Check one TOML value against the dataclass field's type; ints are fine for floats."""
    loc = f"{where}{key}"
    if annotation in ("float",):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            hint = " Remove the quotes." if isinstance(value, str) else ""
            raise ConfigError(f"{loc} = {value!r} must be a number (got {_type_name(value)}).{hint}")
        return float(value)
    if annotation in ("int", "int | None"):
        if isinstance(value, bool) or not isinstance(value, int):
            hint = " Remove the quotes." if isinstance(value, str) else ""
            raise ConfigError(f"{loc} = {value!r} must be an integer (got {_type_name(value)}).{hint}")
        return value
    if annotation == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{loc} = {value!r} must be true or false (got {_type_name(value)}).")
        return value
    if annotation == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{loc} = {value!r} must be a string (got {_type_name(value)}). Put it in quotes.")
        return value
    if annotation.startswith("tuple"):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise ConfigError(f"{loc} = {value!r} must be a list of strings.")
        return tuple(value)
    return value


def build_section(cls: type, table: Any, where: str) -> Any:
    """Instantiate a config dataclass from a TOML table; unknown keys are errors.

    `where` prefixes messages, e.g. "datasets_cfg/B2.toml: sampling."
    """
    if not isinstance(table, dict):
        raise ConfigError(f"{where.rstrip('.')} must be a table ([section]), got {_type_name(table)}.")
    known = {f.name: f for f in fields(cls)}
    kwargs = {}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(
                f"{where}{key}: unknown key. Known keys here: {', '.join(sorted(known))}. "
                "Check the spelling or remove it.")
        f = known[key]
        kwargs[key] = _coerce(where, key, value, f.default, str(f.type))
    return cls(**kwargs)


def _check_choice(where: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{where} = {value!r} is not one of {', '.join(repr(c) for c in choices)}.")


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def load_dataset_config(path: Path) -> DatasetConfig:
    """Read and validate one dataset TOML; raises ConfigError naming file and key."""
    raw = read_toml(path)
    name_in = _rel(path)
    top_known = {"name", "target_samples", *_SECTIONS}
    for key in raw:
        if key not in top_known:
            raise ConfigError(f"{name_in}: {key}: unknown key. Known top-level keys: "
                              f"{', '.join(sorted(top_known))}. Check the spelling or remove it.")
    if "source" not in raw:
        raise ConfigError(f"{name_in}: missing [source] table (hf_id or files, schema, field).")
    if "target_samples" not in raw:
        raise ConfigError(f"{name_in}: missing target_samples (how many samples this dataset should end with).")
    target = _coerce(f"{name_in}: ", "target_samples", raw["target_samples"], 0, "int")
    if target <= 0:
        raise ConfigError(f"{name_in}: target_samples = {target} must be positive.")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name or "/" in name:
        raise ConfigError(f"{name_in}: name = {name!r} must be a non-empty string without '/'.")
    sections = {k: build_section(cls, raw.get(k, {}), f"{name_in}: {k}.") for k, cls in _SECTIONS.items()}
    src: SourceConfig = sections["source"]
    if bool(src.hf_id) == bool(src.files):
        raise ConfigError(f"{name_in}: [source] needs exactly one of hf_id (a Hugging Face dataset) "
                          f"or files (local jsonl/json/parquet paths).")
    _check_choice(f"{name_in}: source.schema", src.schema, SCHEMAS)
    gen: GenerationConfig = sections["generation"]
    _check_choice(f"{name_in}: generation.reasoning", gen.reasoning, REASONING_MODES)
    _check_choice(f"{name_in}: generation.truncated", gen.truncated, TRUNCATED_POLICIES)
    _check_choice(f"{name_in}: generation.empty_turn", gen.empty_turn, EMPTY_TURN_POLICIES)
    samp: SamplingConfig = sections["sampling"]
    if samp.max_new_tokens <= 0:
        raise ConfigError(f"{name_in}: sampling.max_new_tokens = {samp.max_new_tokens} must be positive.")
    if gen.max_attempts < 1:
        raise ConfigError(f"{name_in}: generation.max_attempts = {gen.max_attempts} must be at least 1.")
    out: OutputConfig = sections["output"]
    if out.shard_max_samples < 1 or out.fsync_every < 1:
        raise ConfigError(f"{name_in}: output.shard_max_samples and output.fsync_every must be at least 1.")
    return DatasetConfig(name=name, target_samples=target, path=path.resolve(), **sections)


def available_datasets(config_dir: Path = DEFAULT_CONFIG_DIR) -> list[str]:
    return sorted(p.stem for p in config_dir.glob("*.toml") if p.stem != "server")


def find_dataset_config(name: str, config_dir: Path = DEFAULT_CONFIG_DIR) -> DatasetConfig:
    """`--dataset B2` → datasets_cfg/B2.toml (or a path to a TOML)."""
    p = Path(name)
    if p.suffix == ".toml":
        if not p.exists():
            raise ConfigError(f"{name}: no such dataset config file.")
        return load_dataset_config(p)
    path = config_dir / f"{name}.toml"
    if not path.exists():
        known = available_datasets(config_dir)
        close = difflib.get_close_matches(name, known, n=1) or [k for k in known if k.lower() == name.lower()]
        hint = f" Did you mean {close[0]}?" if close else ""
        raise ConfigError(f"No dataset config {name!r}: {_rel(path)} does not exist. "
                          f"Configs in {_rel(config_dir)}: {', '.join(known) or 'none'}.{hint}")
    return load_dataset_config(path)
