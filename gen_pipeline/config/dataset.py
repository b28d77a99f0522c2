"""Dataset configs: frozen dataclasses read from a dataset TOML (every key: the dataclasses below and
docs/datasets.md), validated with messages that name the file and the key. `datasets_cfg/B2.toml`:

    name = "B2"                      # optional: the file's stem, which it must equal
    target_samples = 18000
    [source]
    hf_id = "org/name"               # or files = ["data/demo.jsonl"] (jsonl/json/parquet, relative to the TOML)
    schema = "sharegpt"              # "sharegpt" (from/value) | "messages" (role/content) | "prompt"
    field = "conversations"          # the column holding the conversation or the prompt text
    [sampling]                       # + optional SGLang keys, [sampling.extra_body], [[sampling.mix]]
    max_new_tokens = 4096
    [generation]
    reasoning = "keep"               # "keep" reasoning_content | "disable" thinking | "none"
    on_loop = "retry"                # a looping turn: "retry" | "drop" | "keep" (cut where the loop began) | "off"
    [output]
    token_ids = true                 # record the server's token ids per assistant turn (for the `tokens` export)
"""

from __future__ import annotations

import difflib
import hashlib
import tomllib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import orjson

from gen_pipeline.config.mix import MIX_KEYS, SamplingMix, build_mix
from gen_pipeline.config.sampling import SamplingConfig as SamplingConfig  # a dataset's [sampling], importable here
from gen_pipeline.config.sampling import check_sampling
from gen_pipeline.config.schema import build_section, unknown_key
from gen_pipeline.display import display_path
from gen_pipeline.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG_DIR = REPO_ROOT / "datasets_cfg"
DEFAULT_OUTPUT_DIR = REPO_ROOT / "outputs"
Schema = Literal["sharegpt", "messages", "prompt"]
Reasoning = Literal["keep", "disable", "none"]
Truncated = Literal["keep", "drop"]
EmptyTurn = Literal["retry", "fail"]  # an empty assistant turn (validate rejects it): retry or fail
OnLoop = Literal["retry", "drop", "keep", "off"]  # a turn caught looping (gen_pipeline/quality)


@dataclass(frozen=True)
class SourceConfig:
    hf_id: str = ""
    hf_subset: str = ""
    split: str = "train"
    files: tuple[str, ...] = ()
    schema: Schema = "sharegpt"
    field: str = "conversations"
    id_field: str = ""
    system_prompt: str = ""
    shuffle_seed: int | None = None
    streaming: bool = False
    max_prompt_chars: int = 400_000  # longer prompts are rejected before any request (~100K tokens)
    strict: bool = False  # a .jsonl line that is not JSON: False = a bad_json reject, True = refuse the file


@dataclass(frozen=True)
class GenerationConfig:
    reasoning: Reasoning = "none"
    truncated: Truncated = "keep"
    empty_turn: EmptyTurn = "retry"  # retries count against max_attempts
    on_loop: OnLoop = "retry"  # retries count against max_attempts
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
    # record each assistant turn's server token ids; such turns are sent whole: SGLang 0.5.17 refuses
    # return_token_ids on a stream (serving_chat.py:914-924, HTTP 400)
    token_ids: bool = False


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    target_samples: int
    source: SourceConfig
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    path: Path | None = None  # the TOML it came from
    mix: SamplingMix | None = None  # [[sampling.mix]]: per-sample variants of `sampling` (config/mix.py)

    @property
    def variants(self) -> list[tuple[float, SamplingConfig]]:
        """(share, sampling) of each variant of the mix; [(1.0, sampling)] without one."""
        if self.mix is None:
            return [(1.0, self.sampling)]
        return [(v.share, v.sampling) for v in self.mix.variants]

    def resolve(self, rel: str) -> Path:
        """A path from the config, relative to the config file's folder."""
        p = Path(rel)
        if p.is_absolute() or self.path is None:
            return p
        return (self.path.parent / p).resolve()

    def fingerprint(self, model: str) -> dict[str, Any]:
        """What must not change between runs writing one dataset (checked on resume)."""
        fp: dict[str, Any] = {
            "model": model,
            "source": _source_identity(self.source),
            "sampling": self.sampling.as_dict(),
            "reasoning": self.generation.reasoning,
            "truncated": self.generation.truncated,
        }
        # Present only when not the default, so a dataset written before they existed resumes: what
        # a looping turn becomes, and whether rows carry the server's token ids (all or none).
        if self.generation.on_loop != "retry":
            fp["on_loop"] = self.generation.on_loop
        if self.output.token_ids:
            fp["token_ids"] = True
        if self.mix is not None:  # absent without one: a config without a mix keeps its fingerprint
            fp["sampling_mix"] = self.mix.fingerprint()
        return fp


def _source_identity(src: SourceConfig) -> dict[str, Any]:
    # strict: how bad lines are handled, not which rows: outputs stay resumable either way
    d = {k: v for k, v in asdict(src).items() if k not in ("streaming", "max_prompt_chars", "strict")}
    return {**d, "files": list(src.files)}


def fingerprint_digest(fp: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(fp, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


# ---------------------------------------------------------------- loading + validation

_SECTIONS: dict[str, type] = {
    "source": SourceConfig,
    "sampling": SamplingConfig,
    "generation": GenerationConfig,
    "output": OutputConfig,
}


class UnreadableConfig(ConfigError):
    """A `.toml` that is no TOML text at all: a folder, not UTF-8, unreadable. `--dataset all` (and the
    listings of status and plan) skip such a file with a warning rather than take the other datasets down."""


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; raises ConfigError naming the file and the line (UnreadableConfig when it is
    no text file at all)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file.") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e}). Fix the syntax and run again.") from None
    except IsADirectoryError:
        raise UnreadableConfig(f"{path} is a folder, not a TOML file. Rename it (only config files may end in "
                               ".toml) or move it out of the config folder.") from None
    except UnicodeDecodeError as e:  # tomllib decodes the bytes as UTF-8 (TOML is UTF-8 by its spec)
        raise UnreadableConfig(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); a TOML "
                               "file must be UTF-8. Save it as UTF-8, or move it out of the config folder if it is "
                               "no config.") from None
    except OSError as e:
        raise UnreadableConfig(f"{path}: cannot be read ({e.strerror or e}). Fix its permissions, or move it out "
                               "of the config folder if it is no config.") from None


def load_dataset_config(path: Path) -> DatasetConfig:
    """Read and validate one dataset TOML; raises ConfigError naming file and key."""
    raw = read_toml(path)
    name_in = display_path(path)
    top_known = ["name", "target_samples", *_SECTIONS]
    for key in raw:
        if key not in top_known:
            raise unknown_key(f"{name_in}: ", key, top_known, top_level=True)
    if "source" not in raw:
        raise ConfigError(f"{name_in}: missing [source] table (hf_id or files, schema, field).")
    if "target_samples" not in raw:
        raise ConfigError(f"{name_in}: missing target_samples (how many samples this dataset should end with).")
    target = build_section(_Target, {"target_samples": raw["target_samples"]}, f"{name_in}: ").target_samples
    if target <= 0:
        raise ConfigError(f"{name_in}: target_samples = {target} must be positive.")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name or "/" in name:
        raise ConfigError(f"{name_in}: name = {name!r} must be a non-empty string without '/'.")
    if name != path.stem:  # one name per dataset: the file's, its folder's, its ids' and every --dataset's
        raise ConfigError(f"{name_in}: name = {name!r} differs from the file's name ({path.name}). The name picks the "
                          f"output folder (outputs/{name}/) and the ids ({name}-...), and every command finds a "
                          f"dataset by its file name, so the two must agree: rename the file to {name}.toml, or set "
                          f"name = {path.stem!r} (or remove name: it defaults to the file's name).")
    tables = {k: raw.get(k, {}) for k in _SECTIONS}
    sampling_table = tables["sampling"]
    if isinstance(sampling_table, dict):  # SamplingConfig's keys and the mix's (build_mix below)
        known = [f.name for f in fields(SamplingConfig)] + list(MIX_KEYS)
        for key in sampling_table:
            if key not in known:
                raise unknown_key(f"{name_in}: sampling.", key, known)
        tables["sampling"] = {k: v for k, v in sampling_table.items() if k not in MIX_KEYS}
    sections: dict[str, Any] = {k: build_section(cls, tables[k], f"{name_in}: {k}.") for k, cls in _SECTIONS.items()}
    src: SourceConfig = sections["source"]
    if bool(src.hf_id) == bool(src.files):
        raise ConfigError(f"{name_in}: [source] needs exactly one of hf_id (a Hugging Face dataset) "
                          f"or files (local jsonl/json/parquet paths).")
    gen: GenerationConfig = sections["generation"]

    def check(s: SamplingConfig, where: str) -> None:
        check_sampling(s, where)
        _check_reasoning(s, gen, where)

    check(sections["sampling"], f"{name_in}: sampling.")
    mix = build_mix(sampling_table, sections["sampling"], f"{name_in}: sampling.", check)
    if gen.window < 0:
        raise ConfigError(f"{name_in}: generation.window = {gen.window} must be 0 (the adaptive controller) "
                          "or a fixed number of requests in flight.")
    if gen.max_attempts < 1:
        raise ConfigError(f"{name_in}: generation.max_attempts = {gen.max_attempts} must be at least 1.")
    out: OutputConfig = sections["output"]
    if out.shard_max_samples < 1 or out.fsync_every < 1:
        raise ConfigError(f"{name_in}: output.shard_max_samples and output.fsync_every must be at least 1.")
    if out.token_ids and gen.on_loop == "keep":
        raise ConfigError(f"{name_in}: generation.on_loop = \"keep\" cuts a looping turn's text where the loop began, "
                          "which the server's token ids (output.token_ids = true) cannot follow: the ids would hold "
                          "the loop the text does not. Set on_loop = \"retry\" or \"drop\", or token_ids = false.")
    return DatasetConfig(name=name, target_samples=target, path=path.resolve(), mix=mix, **sections)


@dataclass(frozen=True)
class _Target:
    target_samples: int


def _check_reasoning(s: SamplingConfig, gen: GenerationConfig, where: str) -> None:
    """generation.reasoning = "disable" sends thinking = false: a sampling that asks for thinking contradicts it."""
    asks = [f"chat_template_kwargs.{k} = true" for k in ("thinking", "enable_thinking")
            if s.chat_template_kwargs.get(k) is True]
    asks += [f"reasoning_effort = {s.reasoning_effort!r}"] if s.reasoning_effort not in (None, "none") else []
    if gen.reasoning == "disable" and asks:
        raise ConfigError(f"{where}{asks[0]} contradicts generation.reasoning = \"disable\" (which sends thinking = "
                          "false). Remove one of them.")


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
        raise ConfigError(f"No dataset config {name!r}: {display_path(path)} does not exist. "
                          f"Configs in {display_path(config_dir)}: {', '.join(known) or 'none'}.{hint}")
    return load_dataset_config(path)


# the TOMLs of a config folder that `--dataset all` leaves out: the server profiles and the bundled examples
EXAMPLES = ("demo", "tools")
NOT_IN_ALL = ("server", *EXAMPLES)


def find_dataset_configs(names: Sequence[str], config_dir: Path = DEFAULT_CONFIG_DIR,
                         skipped: list[str] | None = None) -> list[DatasetConfig]:
    """`--dataset B1,B2` / repeated / `all` (every dataset TOML of config_dir but server, demo and tools) →
    the configs, in order, each once; ConfigError names the TOML. With `skipped`, a file of `all` that
    is no TOML text (UnreadableConfig) is left out and its message added there."""
    wanted = [n.strip() for arg in names for n in arg.split(",") if n.strip()]
    if not wanted:
        raise ConfigError("--dataset is empty: name a dataset (B2), several (B1,B2,B6,B7) or all.")
    expanded: list[str] = []
    for n in wanted:
        if n == "all":
            found = [str(p) for p in sorted(config_dir.glob("*.toml")) if p.stem not in NOT_IN_ALL]
            if not found:
                raise ConfigError(f"--dataset all: no dataset TOML in {config_dir}.")
            expanded += found
        else:
            expanded.append(n)
    cfgs: dict[str, DatasetConfig] = {}
    for n in expanded:
        try:
            cfg = find_dataset_config(n, config_dir)
        except UnreadableConfig as e:
            if skipped is None or n in wanted:  # one named on the command line is an error
                raise
            skipped.append(f"{e} (skipped)")
            continue
        if cfg.name in cfgs and cfgs[cfg.name].path != cfg.path:
            raise ConfigError(f"{cfg.path} and {cfgs[cfg.name].path} both name dataset {cfg.name!r}: one "
                              "output folder each; rename one.")
        cfgs.setdefault(cfg.name, cfg)
    if not cfgs:
        raise ConfigError(f"--dataset all: no dataset TOML in {config_dir} that can be read: {' '.join(skipped or [])}")
    return list(cfgs.values())
