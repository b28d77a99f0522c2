"""Server profiles: one `[profile.NAME]` table of `datasets_cfg/server.toml` → a frozen ServerProfile.

    [profile.tuned]
    model_path = "moonshotai/Kimi-K2.5"   # keys are SGLang's flag names with "_"; extra_args go verbatim
    [profile.sim]
    inherits = "tuned"                    # another profile's keys (env merged key by key), then these

server.toml may also hold `[controller]` (controller/config.py) and `[run]` (config/run.py; the flag wins).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gen_pipeline.config.dataset import DEFAULT_CONFIG_DIR, read_toml
from gen_pipeline.config.run import run_table
from gen_pipeline.config.schema import build_section, unknown_key
from gen_pipeline.controller.config import ControllerConfig
from gen_pipeline.display import display_path
from gen_pipeline.errors import ConfigError

DEFAULT_SERVER_CONFIG = DEFAULT_CONFIG_DIR / "server.toml"
SGLANG_COMMAND = ("{python}", "-m", "sglang.launch_server")


@dataclass(frozen=True)
class ServerProfile:
    """How to start and supervise one SGLang server (keys = SGLang flags with "_")."""

    name: str
    model_path: str
    served_model_name: str = ""
    tp_size: int = 1
    dp_size: int = 1
    mem_fraction_static: float | None = None
    kv_cache_dtype: str = "auto"
    enable_hierarchical_cache: bool = False
    hicache_size_gb: int = 0  # host RAM per rank for evicted prefixes; adds no decode slots
    num_continuous_decode_steps: int = 1
    # tokens per streamed chunk (None: SGLang's, 1): every turn is streamed, and at one token a chunk the
    # client's CPU limits a fast server (docs/measurements.md, "stream interval")
    stream_interval: int | None = None
    enable_metrics: bool = True
    reasoning_parser: str = ""
    # SGLang's --tool-call-parser (TOOL_CALL_PARSERS): the tool-call text → message.tool_calls (tool-use datasets)
    tool_call_parser: str = ""
    trust_remote_code: bool = False
    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port at start (kept across restarts)
    max_running_requests: int | None = None
    context_length: int | None = None
    command: tuple[str, ...] = SGLANG_COMMAND
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # merged over os.environ (NCCL_* etc.)
    startup_timeout_s: float = 1800.0
    health_interval_s: float = 5.0
    unhealthy_after: int = 3  # consecutive failed health checks before a restart
    max_restarts: int = 3
    restart_backoff_s: float = 10.0  # first wait; doubles per attempt
    stop_grace_s: float = 30.0  # SIGTERM → SIGKILL
    backend: str = "sglang"  # meta.backend of the samples this server writes ("sim" for the simulator)
    source: str = ""  # the TOML it came from, for messages

    @property
    def where(self) -> str:
        """"datasets_cfg/server.toml [profile.tuned]", for messages that say what to edit."""
        return f"{self.source or 'server.toml'} [profile.{self.name}]"

    @property
    def request_model(self) -> str:
        """The model name requests carry (SGLang answers to served_model_name, else model_path)."""
        return self.served_model_name or self.model_path

    @property
    def tokenizer_path(self) -> str:
        """The tokenizer SGLang loads: its --tokenizer-path when extra_args pass one, else model_path."""
        for i, a in enumerate(self.extra_args):
            if a == "--tokenizer-path" and i + 1 < len(self.extra_args):
                return self.extra_args[i + 1]
            if a.startswith("--tokenizer-path="):
                return a.split("=", 1)[1]
        return self.model_path


def load_server_profile(name: str = "tuned", path: Path = DEFAULT_SERVER_CONFIG, *,
                        overrides: dict[str, Any] | None = None) -> ServerProfile:
    """Read profile `name` from `path`, then apply `overrides` (e.g. from the CLI); raises ConfigError
    naming the file and key (unknown key, bad type, unknown profile)."""
    return read_server_toml(path).profile(name, overrides=overrides)


@dataclass(frozen=True)
class ServerToml:
    """server.toml read once (a run reads its profile, [controller] and [run] from this one parse); each
    part is validated when asked for, so a mistake in one profile does not stop a command using another.
    A missing file has no profiles, and the defaults of [controller] and [run] (attach mode needs none)."""

    path: Path
    raw: dict[str, Any]
    exists: bool = True

    def profile(self, name: str = "tuned", *, overrides: dict[str, Any] | None = None) -> ServerProfile:
        """Profile `name`, then `overrides` applied; raises ConfigError naming the file and key."""
        if not self.exists:
            read_toml(self.path)  # its "no such file" message
        file = display_path(self.path)
        profiles = self.raw.get("profile", {})
        if not isinstance(profiles, dict) or not profiles:
            raise ConfigError(f"{file}: no [profile.NAME] tables. Add one, e.g. [profile.tuned] with model_path.")
        table, origin = _resolve_table(name, profiles, file)

        def where_of(key: str) -> str:  # a message about a key names the profile that writes it
            return f"{file}: profile.{origin.get(key, name)}."

        profile = _build(name, table, where_of, file)
        if overrides:
            over = f"override of profile.{name}: "
            profile = _build(name, {**table, **overrides}, lambda k: over if k in overrides else where_of(k), file)
        return profile

    def controller(self) -> ControllerConfig:
        """The `[controller]` table (every key optional; no table = the defaults)."""
        where = f"{display_path(self.path)}: controller."
        cfg = build_section(ControllerConfig, self.raw.get("controller", {}), where)
        bad = _controller_problem(cfg)
        if bad:
            raise ConfigError(f"{where}{bad}")
        return cfg

    def run(self) -> dict[str, Any]:
        """The `[run]` table: {option: value} of the generate options it sets (config/run.py)."""
        return run_table(self.raw.get("run", {}), f"{display_path(self.path)}: run.")


def read_server_toml(path: Path = DEFAULT_SERVER_CONFIG) -> ServerToml:
    """Parse server.toml once; raises ConfigError for bad TOML or an unknown top-level key."""
    if not Path(path).exists():
        return ServerToml(Path(path), {}, exists=False)
    raw = read_toml(path)
    for key in raw:
        if key not in _TOP_LEVEL:
            raise unknown_key(f"{display_path(path)}: ", key, _TOP_LEVEL, top_level=True)
    return ServerToml(Path(path), raw)


_TOP_LEVEL = ["controller", "profile", "run"]


def load_controller_config(path: Path = DEFAULT_SERVER_CONFIG) -> ControllerConfig:
    """The `[controller]` table of server.toml (every key optional; no table or no file = the defaults)."""
    return read_server_toml(path).controller()


def _controller_problem(c: ControllerConfig) -> str:
    """What is out of range in a controller config ("" when nothing)."""
    if not 0 < c.target_usage <= 1:
        return f"target_usage = {c.target_usage} must be above 0 and at most 1 (a share of the KV pool)."
    if not 1 <= c.min_window <= c.max_window:
        return (f"min_window = {c.min_window}, max_window = {c.max_window}: need 1 <= min_window <= max_window.")
    if not 0 < c.gain_min <= c.gain_max:
        return f"gain_min = {c.gain_min}, gain_max = {c.gain_max}: need 0 < gain_min <= gain_max."
    for f in fields(c):
        v = getattr(c, f.name)
        if isinstance(v, (int, float)) and (not math.isfinite(v) or v < 0):
            return f"{f.name} = {v} must be a non-negative number."
    return ""


def _resolve_table(name: str, profiles: dict[str, Any], file: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The profile's table with `inherits` chains flattened (child keys win), and for each key the profile
    that writes it ("env.NAME" for an env entry)."""
    chain: list[str] = []
    table: dict[str, Any] = {}
    origin: dict[str, str] = {}
    current: str | None = name
    while current is not None:
        if current not in profiles:
            known = ", ".join(sorted(profiles))
            what = f"Profile {current!r}" if not chain else f"profile.{chain[-1]}.inherits = {current!r}:"
            raise ConfigError(f"{file}: {what} not found. Known profiles: {known}.")
        if current in chain:
            raise ConfigError(f"{file}: profile.{name}: inherits forms a cycle ({' -> '.join(chain + [current])}).")
        chain.append(current)
        own = profiles[current]
        if not isinstance(own, dict):
            raise ConfigError(f"{file}: profile.{current} must be a table ([profile.{current}]).")
        parent_env = table.get("env", {})
        table = {**own, **table}
        for key in own:
            origin.setdefault(key, current)
        if isinstance(own.get("env"), dict):
            for key in own["env"]:
                origin.setdefault(f"env.{key}", current)
            if isinstance(parent_env, dict):
                table["env"] = {**own["env"], **parent_env}  # env tables merge key by key
        inherits = own.get("inherits")
        if inherits is not None and not isinstance(inherits, str):
            raise ConfigError(f"{file}: profile.{current}.inherits = {inherits!r} must be a profile name (a string).")
        current = inherits
    table.pop("inherits", None)
    return table, origin


def _build(name: str, table: dict[str, Any], where_of: Callable[[str], str], file: str) -> ServerProfile:
    """Validate one flattened table; the fields build_section cannot type-check are checked here. A message
    about a key starts with `where_of(key)` (the profile that writes it)."""
    table = dict(table)
    for reserved in ("name", "source"):
        if reserved in table:
            raise ConfigError(f"{where_of(reserved)}{reserved}: unknown key (the profile's name is its table name). "
                              "Remove it.")
    if "model_path" not in table:
        raise ConfigError(f"{where_of('model_path')}model_path: missing. Set the model to serve (a hub id or a "
                          "local folder).")
    if "mem_fraction_static" in table:
        value = table["mem_fraction_static"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            raise ConfigError(f"{where_of('mem_fraction_static')}mem_fraction_static = {value!r} must be a number "
                              "between 0 and 1 (the share of GPU memory for weights + KV cache, e.g. 0.90).")
        table["mem_fraction_static"] = float(value)
    env = table.get("env", {})
    if not isinstance(env, dict):
        raise ConfigError(f"{where_of('env')}env must be a table of NAME = \"value\" strings ([...env]).")
    for key, v in env.items():
        if not isinstance(v, str):
            raise ConfigError(f"{where_of(f'env.{key}')}env.{key} = {v!r} must be a string (environment values "
                              "are text). Put it in quotes.")
    table["name"] = name
    table["source"] = file
    profile: ServerProfile = build_section(ServerProfile, table, where_of(""), key_where=where_of)
    _check_ranges(profile, where_of)
    return profile


# SGLang 0.5.17's --tool-call-parser names (python/sglang/srt/function_call/function_call_parser.py,
# FunctionCallParser.ToolCallParserEnum)
TOOL_CALL_PARSERS = ("apertus2509", "cohere_command4", "deepseekv3", "deepseekv31", "deepseekv32", "deepseekv4",
                     "gemma4", "gigachat3", "glm", "glm45", "glm47", "gpt-oss", "hermes", "hunyuan", "inkling",
                     "interns1", "kimi_k2", "kimi_k3", "lfm2", "llama3", "mimo", "minicpm5", "minimax-m2",
                     "minimax-m3", "mistral", "pythonic", "poolside_v1", "qwen", "qwen25", "qwen3_coder", "step3",
                     "step3p5", "trinity")


# (accepts the value, what it must be) per key, checked in this order
_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    **dict.fromkeys(("tp_size", "dp_size", "num_continuous_decode_steps", "unhealthy_after"),
                    (lambda v: v >= 1, "be at least 1")),
    **dict.fromkeys(("startup_timeout_s", "health_interval_s", "restart_backoff_s", "stop_grace_s"),
                    (lambda v: math.isfinite(v) and v >= 0, "be a non-negative number of seconds")),
    "stream_interval": (lambda v: v is None or v >= 1,
                        "be at least 1 (tokens per streamed chunk; leave it out for SGLang's default, 1)"),
    **dict.fromkeys(("max_restarts", "hicache_size_gb"), (lambda v: v >= 0, "not be negative")),
    "port": (lambda v: 0 <= v <= 65535, "be 0 (pick a free one) or a TCP port up to 65535"),
}


def _check_ranges(p: ServerProfile, where_of: Callable[[str], str]) -> None:
    for key, (accepts, words) in _RANGES.items():
        if not accepts(getattr(p, key)):
            raise ConfigError(f"{where_of(key)}{key} = {getattr(p, key)} must {words}.")
    if not p.command:
        raise ConfigError(f"{where_of('command')}command must not be empty (default: {list(SGLANG_COMMAND)}).")
    if p.tool_call_parser and p.tool_call_parser not in TOOL_CALL_PARSERS:
        raise ConfigError(f"{where_of('tool_call_parser')}tool_call_parser = {p.tool_call_parser!r} is not one of "
                          f"SGLang 0.5.17's parsers: {', '.join(TOOL_CALL_PARSERS)}. Pick the target model's (kimi_k2 "
                          "for Kimi-K2.5, qwen25 for Qwen2.5/Qwen3, qwen3_coder for Qwen3-Coder) or leave it out.")


def normalise_server_url(url: str, flag: str = "--server-url") -> str:
    """A running server's base URL as every request and poll uses it (no trailing "/"; an OpenAI-style
    ".../v1" is accepted: the client adds /v1/... itself). Raises ConfigError naming `flag`."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{flag} {url!r} must start with http:// or https:// (e.g. http://gpu-node:30000).")
    return url[: -len("/v1")] if url.endswith("/v1") else url
