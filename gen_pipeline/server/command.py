"""Profile → the `python -m sglang.launch_server …` argv and environment (pure). Flag spellings as in SGLang's
srt/server_args.py (`--tp-size`, not the old `--tp`; `--hicache-size` is GB of host memory per rank)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping

from gen_pipeline.config.server import SGLANG_COMMAND, ServerProfile
from gen_pipeline.errors import ServerError

# set by the Makefile: the `make venv ... EXTRAS=...,gpu` that adds SGLang to the venv make runs
MAKE_SGLANG_VAR = "GEN_PIPELINE_MAKE_SGLANG"

# Profile key → SGLang flag ("--" + the key, dashed; hicache_size_gb: --hicache-size). Booleans become bare
# flags when true; None / "" / 0 (hicache) are left out. tests/contract checks them against SGLang's parser.
FLAGS: dict[str, str] = {key: "--" + key.removesuffix("_gb").replace("_", "-") for key in (
    "model_path", "served_model_name", "tp_size", "dp_size", "mem_fraction_static", "kv_cache_dtype",
    "enable_hierarchical_cache", "hicache_size_gb", "num_continuous_decode_steps", "stream_interval", "enable_metrics",
    "reasoning_parser", "tool_call_parser", "trust_remote_code", "max_running_requests", "context_length", "host")}


def build_command(profile: ServerProfile, *, port: int, python: str = sys.executable) -> list[str]:
    """The server's argv: the command template ("{python}" replaced), every set key's flag, extra_args."""
    argv = [part.replace("{python}", python) for part in profile.command]
    for key, flag in FLAGS.items():
        value = getattr(profile, key)
        if value is None or value is False or value == "" or (key == "hicache_size_gb" and value == 0):
            continue
        argv.append(flag)
        if value is not True:
            argv.append(repr(value) if isinstance(value, float) else str(value))  # 0.9 → "0.9", never "0.90000001"
    return [*argv, "--port", str(port), *profile.extra_args]


def check_launchable(profile: ServerProfile, python: str = sys.executable,
                     environ: Mapping[str, str] | None = None) -> None:
    """Raise ServerError when the profile launches SGLang and sglang is not installed in this Python (it
    would die at import, after the start-up wait), naming the command that installs it here (make's, when
    make started us)."""
    if tuple(profile.command[:3]) != SGLANG_COMMAND or importlib.util.find_spec("sglang") is not None:
        return
    via_make = (os.environ if environ is None else environ).get(MAKE_SGLANG_VAR, "")
    if via_make:
        how = (f"Install it into the venv make runs: {via_make} (offline: add PIP_ARGS=\"--no-index "
               "--find-links DIR\", DIR holding the wheels; docs/install.md, \"On the GPU node\").")
    else:
        how = (f"Install it into this Python: {python} -m pip install -e '.[gpu]' (from the checkout), or "
               "make venv EXTRAS=gpu and run through make.")
    raise ServerError(
        f"{profile.where} launches SGLang ({python} -m sglang.launch_server), but sglang is not installed "
        f"in this Python. {how} Without a GPU, try the pipeline on the simulator: --server sim (make demo).")


def build_env(profile: ServerProfile, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ (or `base`) with the profile's env table on top; PYTHONUNBUFFERED so logs arrive live."""
    return {"PYTHONUNBUFFERED": "1", **(os.environ if base is None else base), **profile.env}


def flag_origin(profile: ServerProfile, flag: str) -> str | None:
    """Which profile key produced `flag` ("--kv-cache-dtype" → "kv_cache_dtype"), "extra_args", or None."""
    bare = flag.split("=", 1)[0]
    if bare in profile.extra_args or flag in profile.extra_args:
        return "extra_args"
    return next((key for key, known in FLAGS.items() if known == bare), "port" if bare == "--port" else None)
