"""Recognise fatal SGLang log lines and turn them into advice a user can act on (pure). The patterns mirror
SGLang's (srt/mem_cache/memory_pool.py, model_runner.py), torch's out-of-memory, NCCL's and argparse's lines."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gen_pipeline.config.server import ServerProfile
from gen_pipeline.server.command import flag_origin

# Order matters: the first kind whose pattern matches a line wins.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("not_enough_memory", re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static")),
    ("oom", re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory")),
    ("nccl", re.compile(r"NCCL error|nccl(?:System|Internal|UnhandledCuda|Remote|InvalidUsage)Error"
                        r"|Watchdog caught collective operation timeout")),
    ("bad_flag", re.compile(r"error: (?:unrecognized arguments: .*|argument -.*)$")),
)
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)$")
_ARGUMENT = re.compile(r"error: argument (\S+?)(?:/\S+)?:")
COMMAND_ECHO = "$ "  # process.py writes the command as the log's first line, prefixed with this
REFERENCE_HEADROOM = "the reference job keeps ~3.5 GB free per GPU"


# Lines worth a word to the user once, not fatal: (kind, pattern, what it means for the job).
_WARNINGS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    # SGLang 0.5.17 with --kv-cache-dtype fp8_e4m3 and a checkpoint without KV scales
    # (srt/layers/quantization/kv_cache.py): scales of 1.0 can cost accuracy.
    ("fp8_kv_scales", re.compile(r"Using FP8 KV cache but no scaling factors provided"),
     "fp8 KV cache without scaling factors (SGLang uses 1.0): the outputs may be less accurate; "
     "compare against kv_cache_dtype = \"auto\" on a sample before a long run"),
)


def find_warnings(lines: list[str]) -> list[tuple[str, str]]:
    """(kind, advice) for each known warning in `lines`, in order, each kind once."""
    found: dict[str, str] = {}
    for line in (ln for ln in lines if not ln.startswith(COMMAND_ECHO)):
        for kind, pattern, said in _WARNINGS:
            if kind not in found and pattern.search(line):
                found[kind] = said
    return list(found.items())


@dataclass(frozen=True)
class FatalLine:
    kind: str  # "not_enough_memory" | "oom" | "nccl" | "bad_flag"
    line: str


def find_fatal(lines: list[str]) -> FatalLine | None:
    """The first line that means SGLang will not come up, or None."""
    for line in (ln for ln in lines if not ln.startswith(COMMAND_ECHO)):  # our echo's arguments may hold anything
        for kind, pattern in _PATTERNS:
            if pattern.search(line):
                return FatalLine(kind, line.strip())
    return None


def advice(fatal: FatalLine | None, profile: ServerProfile) -> str:
    """What to change, naming the profile key and file when we know it."""
    where, mem = profile.where, profile.mem_fraction_static
    if fatal is None:
        return "Fix the cause shown above, then run the same command again."
    if fatal.kind == "oom":
        now = f", now {mem}" if mem is not None else ""
        return (f"Lower mem_fraction_static in {where}{now} ({REFERENCE_HEADROOM}), "
                "or lower max_running_requests / context_length.")
    if fatal.kind == "not_enough_memory":
        now = f" (now {mem})" if mem is not None else ""
        return (f"The weights leave no room for the KV cache: raise mem_fraction_static in {where}{now}, "
                f"use more GPUs (tp_size = {profile.tp_size}), or a smaller / quantized model.")
    if fatal.kind == "nccl":
        return (f"Check the NCCL settings in the env table of {where}, that all tp_size = {profile.tp_size} "
                "GPUs are visible (CUDA_VISIBLE_DEVICES) and idle, and rerun with NCCL_DEBUG=INFO for details.")
    return _bad_flag_advice(fatal.line, profile, where)


def _bad_flag_advice(line: str, profile: ServerProfile, where: str) -> str:
    flags: list[str] = []
    if m := _UNRECOGNIZED.search(line):
        flags = [t for t in m.group(1).split() if t.startswith("-")]
    elif m := _ARGUMENT.search(line):
        flags = [m.group(1)]
    origins = [f"{flag} comes from {key}" if (key := flag_origin(profile, flag)) else f"{flag} is not from the profile"
               for flag in flags]
    said = "; ".join(origins) if origins else "see the argparse message above"
    return (f"The installed SGLang rejected a flag ({said}) in {where}. "
            "Fix or remove that key (or upgrade SGLang), then run again.")
