"""`tune`'s plan, decided before anything is launched (pure): the candidates (the shipped profile + one
lever each), what `plan` predicts for each, and the budget (a share of the job's predicted time)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Annotated, Any

from gen_pipeline.config.dataset import DatasetConfig
from gen_pipeline.config.schema import check_flags, flag
from gen_pipeline.config.server import ServerProfile
from gen_pipeline.display import format_duration
from gen_pipeline.errors import ConfigError
from gen_pipeline.reports.job_time import STARTUP_S, Lengths, dataset_lengths, job_time
from gen_pipeline.server.plan import (
    BUNDLED_CONFIG,
    REFERENCE_GPU_MEM_GIB,
    REFERENCE_OVERHEAD_GIB,
    Plan,
    kv_bytes_factor,
    option_in_use,
    plan_from_args,
    profile_cuda_graph_max_bs,
    profile_inputs,
)

FP8 = ("fp8_e4m3", "fp8_e5m2")
SIM_STARTUP_S = 5.0  # a simulator's start-up (its --sim-startup-s is a second or less)
ASSUMED_PROMPT_TOKENS = 300  # a dataset with no measured or reference lengths: prompt tokens assumed


@dataclass(frozen=True)
class Lever:
    """One single-GPU SGLang lever: its `--levers` name, SGLang's flag, the server.toml key ("" = extra_args)
    and `pick`: the value tried, from the profile's current one (None: SGLang's default) and the shipped plan.
    `inert`: why SGLang ignores the flag ("" = it acts); such a lever is named in the plan, never tried."""

    name: str
    flag: str
    key: str
    pick: Callable[[Any, Plan], Any]
    aliases: tuple[str, ...] = ()  # other spellings of the flag, replaced with it
    pool_only: bool = False  # it only sizes the KV pool: a candidate with the shipped pool cannot change the speed
    inert: str = ""


# The levers tune tries, one candidate each (SGLang 0.5.17 server_args.py spellings). Values: one step
# in the direction that pays when the server is KV- or step-bound, as the seed's diagnosis went.
LEVERS: tuple[Lever, ...] = (
    Lever("kv_cache_dtype", "--kv-cache-dtype", "kv_cache_dtype",
          lambda cur, p: "bf16" if cur in FP8 else "fp8_e4m3"),
    Lever("mem_fraction_static", "--mem-fraction-static", "mem_fraction_static",
          lambda cur, p: round((cur or p.mem_fraction_static) + 0.02, 2), pool_only=True),
    # 0.5.17: --cuda-graph-max-bs is the deprecated alias of --cuda-graph-max-bs-decode (one dest)
    Lever("cuda_graph_max_bs", "--cuda-graph-max-bs", "", lambda cur, p: 2 * int(cur or p.cuda_graph_max_bs),
          ("--cuda-graph-max-bs-decode",)),
    Lever("schedule_conservativeness", "--schedule-conservativeness", "", lambda cur, p: (cur or 1.0) / 2),
    # 0.5.17 parses it (server_args.py) and no other module reads the field, so a trial measures only the noise
    # (the H100 tune run, docs/measurements.md#gpu_h100_tune); tests/contract/test_launch_flags.py fails when
    # the pinned SGLang starts reading it
    Lever("num_continuous_decode_steps", "--num-continuous-decode-steps", "num_continuous_decode_steps",
          lambda cur, p: 2 * (cur or 1), inert="SGLang 0.5.17 parses --num-continuous-decode-steps but its "
                                             "scheduler never reads it"),
    # unset: 8192, what the seed's server ran (SGLang picks 2048..16384 by GPU memory, server_args.py)
    Lever("chunked_prefill_size", "--chunked-prefill-size", "", lambda cur, p: 2 * int(cur or 8192)),
    Lever("stream_interval", "--stream-interval", "stream_interval", lambda cur, p: 2 * (cur or 1)),
    # the HTTP front end / tokenizer manager in several processes: one is a whole core at --stream-interval 1
    # with a small model (diagnose's front_end_bound); 4 from SGLang's default of 1
    Lever("tokenizer_worker_num", "--tokenizer-worker-num", "",
          lambda cur, p: 4 if (cur or 1) <= 1 else 2 * int(cur)),
)
# Levers that need several GPUs or a trained draft: named in the plan, never tried on one GPU.
NOT_ON_ONE_GPU = {
    "dcp_size": "--dcp-size (decode context parallelism: splits the MLA cache over TP ranks)",
    "tp_size": "--tp-size (tensor parallelism)",
    "speculative_algorithm": "--speculative-algorithm EAGLE3 (needs a trained draft model)",
}


@dataclass(frozen=True)
class TuneOptions:
    """What `tune` was asked; ranges checked when constructed (ConfigError naming the flag)."""

    output_root: Path
    config_dir: Path
    budget_share: Annotated[float, flag("--budget-share", gt=0, le=1, help=(
        "share of the job's predicted time the tune run may take (default: 0.05)"))] = 0.05
    budget_s: Annotated[float | None, flag("--budget-s", gt=0, unit="seconds", help=(
        "the tune run's budget in seconds instead of --budget-share of the job's predicted time"))] = None
    prompts: Annotated[int | None, flag("--prompts", ge=1, help=(
        "prompts per trial, the job's next ones, the same for every candidate (default: the trial's share of the "
        "budget, from the decode slots plan predicts to twice that)"))] = None
    startup_s: Annotated[float | None, flag("--startup-s", ge=0, unit="seconds", help=(
        "seconds one server start takes, counted per trial in the budget (default: 600 for SGLang, the "
        "reference job's ~600 GB of weights; 5 for the simulator): a small model starts in a minute"))] = None
    rounds: Annotated[int, flag("--rounds", ge=1, help=(
        "most rounds (every candidate once each, rotated), as the budget allows (default: 3)"))] = 3
    probe_prompts: Annotated[int, flag("--probe-prompts", ge=1, help=(
        "prompts whose greedy answers each candidate must match as probe-kv measures (default: 8)"))] = 8
    probe_max_new_tokens: Annotated[int, flag("--probe-max-new-tokens", ge=1, help=(
        "output cap of those greedy answers (default: 64)"))] = 64
    levers: tuple[str, ...] = tuple(lv.name for lv in LEVERS)
    model_config: Path = BUNDLED_CONFIG
    gpu_mem_gb: float = REFERENCE_GPU_MEM_GIB
    weights_gb: float | None = None

    def __post_init__(self) -> None:
        check_flags(self)
        known = [lv.name for lv in LEVERS]  # refused: a --levers name tune does not know or cannot try on one GPU
        for name in self.levers:
            if name in NOT_ON_ONE_GPU:
                raise ConfigError(f"--levers {name}: {NOT_ON_ONE_GPU[name]} needs several GPUs or a draft; tune "
                                  f"tries single-GPU levers only: {', '.join(known)}.")
            if name not in known:
                raise ConfigError(f"--levers {name}: no such lever; choose from {', '.join(known)} (comma-separated).")
        if not self.levers:
            raise ConfigError(f"--levers is empty; choose from {', '.join(known)} (comma-separated).")


@dataclass(frozen=True)
class Candidate:
    name: str  # "<profile>+<lever>=<value>", or the shipped profile's name
    profile: ServerProfile
    change: dict[str, Any]  # the server.toml keys that differ from the shipped profile
    kv_tokens: int = 0
    slots: int = 0


@dataclass(frozen=True)
class TunePlan:
    shipped: Candidate
    candidates: tuple[Candidate, ...]
    skipped: tuple[tuple[str, str], ...]  # (candidate, why plan says it cannot start)
    prompts: int
    rounds: int
    budget_s: float
    budget_note: str
    trial_s: float  # predicted seconds of one trial (start-up + the prompts)

    @property
    def trials(self) -> int:
        return 1 + len(self.candidates)

    def lines(self) -> list[str]:
        """The plan of the tune run, stated before anything starts."""
        total_s = self.rounds * self.trials * self.trial_s
        out = [f"tune budget: {format_duration(self.budget_s)} ({self.budget_note}); {self.rounds} round(s) x "
               f"{self.trials} trials (the shipped {self.shipped.name} + {len(self.candidates)} candidates) of "
               f"the job's next {self.prompts:,} prompts (the same for each), predicted {format_duration(total_s)}"]
        out += [f"  {c.name}: plan {c.kv_tokens:,} KV tokens, {c.slots:,} decode slots"
                for c in (self.shipped, *self.candidates)]
        out += [f"  skipped {name}: {why}" for name, why in self.skipped]
        out.append("  not tried on one GPU: " + "; ".join(NOT_ON_ONE_GPU.values()))
        return out


def flag_value(extra_args: tuple[str, ...], flag_name: str) -> str | None:
    """The value of `flag_name` (as "--x N" or "--x=N") in extra_args, else None."""
    for i, arg in enumerate(extra_args):
        name, eq, value = arg.partition("=")
        if name == flag_name:
            return value if eq else (extra_args[i + 1] if i + 1 < len(extra_args) else None)
    return None


def with_flag(extra_args: tuple[str, ...], flag_name: str, value: Any,
              aliases: tuple[str, ...] = ()) -> tuple[str, ...]:
    """extra_args with `flag_name` set to `value` (an earlier setting of it or its aliases removed)."""
    out: list[str] = []
    args = iter(extra_args)
    for arg in args:
        name, eq, _ = arg.partition("=")
        if name == flag_name or name in aliases:
            if not eq:
                next(args, None)  # its value
            continue
        out.append(arg)
    return (*out, flag_name, f"{value:g}" if isinstance(value, float) else str(value))


def candidate(shipped: ServerProfile, lever: Lever, p: Plan) -> Candidate:
    """The shipped profile with one lever moved (LEVERS' pick). A lever the profile sets in extra_args (which
    SGLang reads after the keys) is moved there, even when it has a server.toml key."""
    raw = next((v for f in (lever.flag, *lever.aliases) if (v := flag_value(shipped.extra_args, f))), None)
    if lever.key and raw is None:
        value = lever.pick(getattr(shipped, lever.key), p)
        change: dict[str, Any] = {lever.key: value}
        profile = replace(shipped, **change)
    else:
        value = lever.pick(_number(raw) if raw else None, p)
        change = {"extra_args": list(with_flag(shipped.extra_args, lever.flag, value, lever.aliases))}
        profile = replace(shipped, extra_args=tuple(change["extra_args"]))
    shown = f"{value:g}" if isinstance(value, float) else value
    name = f"{shipped.name}+{lever.name}={shown}"
    return Candidate(name, replace(profile, name=name), change)


def _number(raw: str) -> float | str:
    try:
        return float(raw)
    except ValueError:
        return raw  # --kv-cache-dtype fp8_e4m3


def plan_profile(profile: ServerProfile, opts: TuneOptions, tokens_per_sample: int) -> Plan:
    """`plan` of one profile with tune's model flags; ConfigError when it cannot start."""
    inputs, note = profile_inputs(profile)
    graphs = profile_cuda_graph_max_bs(profile.extra_args)
    p = plan_from_args(opts.model_config, gpu_mem_gb=opts.gpu_mem_gb, tokens_per_sample=tokens_per_sample,
                       weights_gb=opts.weights_gb, overhead_gb=REFERENCE_OVERHEAD_GIB, inputs_note=note, **inputs)
    return replace(p, cuda_graph_max_bs=graphs) if graphs else p


def _planned(c: Candidate, lever: Lever, ships: Candidate, opts: TuneOptions,
             per_sample: int) -> tuple[Candidate, str]:
    """`c` with the KV tokens and decode slots plan predicts, and why a trial of it is skipped ("": tried)."""
    if lever.inert:
        return c, f"{lever.inert}: a trial would measure nothing"
    try:
        p = plan_profile(c.profile, opts, per_sample)
    except ConfigError as e:
        return c, f"plan refuses it: {e}"
    c = replace(c, kv_tokens=(q := option_in_use(p)).kv_tokens, slots=q.decode_slots)
    if c.slots < 1:
        return c, f"plan predicts {c.kv_tokens:,} KV tokens: no decode slot for {per_sample:,} tokens a sample"
    if lever.pool_only and c.kv_tokens == ships.kv_tokens:
        cap = " (--max-total-tokens caps it)" if p.max_total_tokens == c.kv_tokens else ""
        return c, (f"plan predicts the shipped pool, {c.kv_tokens:,} KV tokens{cap}, and {lever.flag} only sizes "
                   "the pool: a trial would measure nothing")
    return c, ""


def make_plan(cfg: DatasetConfig, shipped: ServerProfile, opts: TuneOptions) -> TunePlan:
    """The candidates, their plans and the budget; ConfigError when the shipped profile cannot start, the
    job's time is unknown without --budget-s, or one round does not fit the budget."""
    rows = dataset_lengths(opts.config_dir, opts.output_root)
    own = next((ln for name, _, ln in rows if name == cfg.name), None) or Lengths(
        ASSUMED_PROMPT_TOKENS, cfg.sampling.max_new_tokens, "assumed: max_new_tokens")
    per_sample = int(own.prompt + own.output)
    base = plan_profile(shipped, opts, per_sample)
    o = option_in_use(base)
    ships = Candidate(shipped.name, shipped, {}, o.kv_tokens, o.decode_slots)
    candidates, skipped = [], []
    for lever in (lv for lv in LEVERS if lv.name in opts.levers):
        c, why = _planned(candidate(shipped, lever, base), lever, ships, opts, per_sample)
        if why:
            skipped.append((c.name, why))
        else:
            candidates.append(c)
    fill = max(8, math.ceil(o.kv_tokens / max(1.0, own.prompt + own.output / 2)))  # the slots, all filled once
    predict = partial(job_time, kv_tokens=o.kv_tokens, kv_dtype=o.kv_dtype, kv_bytes_factor=kv_bytes_factor(base, o))
    per_prompt_s = predict([(cfg.name, 1, own)]).total_s - STARTUP_S
    startup_s = opts.startup_s if opts.startup_s is not None else SIM_STARTUP_S if shipped.backend == "sim" \
        else STARTUP_S
    if opts.budget_s is not None:
        budget_s, note = opts.budget_s, "--budget-s"
    elif job_s := predict(rows).total_s:
        budget_s, note = opts.budget_share * job_s, f"{100 * opts.budget_share:g} % of the job's predicted " \
                                                    f"{format_duration(job_s)}"
    else:
        raise ConfigError(f"tune: the job of {opts.config_dir} has no predicted time (no dataset with samples to do "
                          "and known lengths), so --budget-share has nothing to be a share of: pass --budget-s.")
    trials = 1 + len(candidates)
    least = opts.prompts or fill
    for rounds in range(opts.rounds, 0, -1):  # the most rounds whose trials hold at least `least` prompts
        room = budget_s / (trials * rounds) - startup_s
        prompts = opts.prompts or min(2 * fill, int(room // per_prompt_s))
        if prompts >= least and prompts * per_prompt_s <= room:
            return TunePlan(ships, tuple(candidates), tuple(skipped), prompts, rounds, budget_s, note,
                            startup_s + prompts * per_prompt_s)
    why = "" if opts.prompts else " (the decode slots plan predicts: fewer never fill the server)"
    raise ConfigError(
        f"tune: one round of {trials} trials ({shipped.name} + {len(candidates)} candidates) takes "
        f"{format_duration(trials * (startup_s + least * per_prompt_s))}: each a start-up of "
        f"{format_duration(startup_s)} and {least:,} prompts{why}, predicted {format_duration(least * per_prompt_s)}. "
        f"That is more than the budget of {format_duration(budget_s)} ({note}). Raise --budget-share or "
        "--budget-s, lower --prompts, or name fewer --levers.")
