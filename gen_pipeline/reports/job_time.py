"""How long the job takes, for `plan`: tokens to decode / the rate a KV-bound server decodes them. A decode step
of b running takes base + per_request·b + per_kv_token·kv_in_use (attention reads every KV token), with the
reference node's coefficients (docs/measurements.md); another model or GPU: a measured rate (`decode_tok_s`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from gen_pipeline.config.dataset import NOT_IN_ALL, find_dataset_configs
from gen_pipeline.display import display_path, format_duration
from gen_pipeline.errors import ConfigError
from gen_pipeline.reports.status import read_status
from gen_pipeline.server.plan import Plan, kv_bytes_factor, option_in_use

MEASURED_MIN = 20  # samples of a dataset before its own lengths replace the assumed ones
STARTUP_S = 600.0  # loading ~600 GB of weights + CUDA graphs (SGLang PR #27139; docs/measurements.md, "job")

# Mean prompt and output tokens per sample the reference job is planned with: the benchmarks' length
# profiles (bench/jobs.py LENGTH_PROFILES, lognormal means), B2 from the seed (4K+ tokens per sample).
REFERENCE_LENGTHS: dict[str, tuple[float, float]] = {
    "B1": (300, 610),  # ShareGPT chat
    "B2": (790, 3630),  # long math reasoning
    "B6": (360, 750),  # UltraChat multi-turn
    "B7": (100, 600),  # Magpie instructions
}


@dataclass(frozen=True)
class StepModel:
    """Seconds of one decode step of `running` requests holding `kv_tokens` (bf16 cost per KV token)."""

    base_s: float
    per_request_s: float
    per_kv_token_s: float
    prefill_per_token_s: float

    def decode_tok_s(self, running: float, kv_tokens: float, kv_bytes_factor: float) -> float:
        step = self.base_s + self.per_request_s * running + self.per_kv_token_s * kv_bytes_factor * kv_tokens
        return running / step


# sglang_sim/profiles.py PROFILES["seed"] (tests/test_plan_job.py keeps the two equal)
REFERENCE_NODE = StepModel(base_s=0.025, per_request_s=3.0e-4, per_kv_token_s=1.7e-7, prefill_per_token_s=7.0e-5)


@dataclass(frozen=True)
class Lengths:
    prompt: float  # mean prompt tokens per sample
    output: float  # mean completion tokens per sample
    source: str  # "measured on N samples" | "assumed"


@dataclass(frozen=True)
class DatasetTime:
    name: str
    to_do: int
    lengths: Lengths | None  # None: unknown, left out of the total
    running: float = 0.0
    tok_s: float = 0.0
    output_tokens: float = 0.0
    seconds: float = 0.0


@dataclass(frozen=True)
class JobTime:
    datasets: tuple[DatasetTime, ...]
    kv_tokens: int
    kv_dtype: str
    rate_note: str
    startup_s: float = STARTUP_S
    cuda_graph_max_bs: int = 0  # the node's CUDA-graph ceiling (0: unknown)
    cuda_graph_note: str = ""

    @property
    def known(self) -> tuple[DatasetTime, ...]:
        return tuple(d for d in self.datasets if d.lengths is not None)

    @property
    def total_s(self) -> float:
        return sum(d.seconds for d in self.known) + (self.startup_s if any(d.to_do for d in self.known) else 0.0)


def dataset_lengths(config_dir: Path, output_dir: Path,
                    skipped: list[str] | None = None) -> list[tuple[str, int, Lengths | None]]:
    """(name, samples to do, lengths) of every job dataset of config_dir; raises ConfigError for a bad TOML
    (with `skipped`, a file that is no TOML text is left out there: find_dataset_configs)."""
    out = []
    for cfg in find_dataset_configs(["all"], config_dir, skipped):
        st = read_status(output_dir, cfg.name, cfg.target_samples)
        if st.done >= MEASURED_MIN:
            lengths: Lengths | None = Lengths(st.prompt_tokens / st.done, st.completion_tokens / st.done,
                                              f"measured on {st.done:,} samples")
        elif cfg.name in REFERENCE_LENGTHS:  # outputs stop at the TOML's max_new_tokens
            prompt, output = REFERENCE_LENGTHS[cfg.name]
            lengths = Lengths(prompt, min(output, cfg.sampling.max_new_tokens), "assumed")
        else:
            lengths = None
        out.append((cfg.name, st.remaining, lengths))
    return out


def job_time(datasets: list[tuple[str, int, Lengths | None]], *, kv_tokens: int, kv_dtype: str,
             kv_bytes_factor: float, decode_tok_s: float | None = None, step: StepModel = REFERENCE_NODE) -> JobTime:
    """Each dataset's decode time at the server's KV-bound rate (or at `decode_tok_s`, a measured rate)."""
    rows = []
    for name, to_do, lengths in datasets:
        if lengths is None:
            rows.append(DatasetTime(name, to_do, None))
            continue
        held = max(1.0, lengths.prompt + lengths.output / 2)  # KV a request holds on average over its life
        running = max(1.0, kv_tokens / held)
        rate = decode_tok_s or step.decode_tok_s(running, running * held, kv_bytes_factor)
        output = to_do * lengths.output
        prefill_s = 0.0 if decode_tok_s else to_do * lengths.prompt * step.prefill_per_token_s
        rows.append(DatasetTime(name, to_do, lengths, running, rate, output, output / rate + prefill_s))
    note = (f"at a measured {decode_tok_s:,.0f} tok/s (--decode-tok-s)" if decode_tok_s else
            "at the reference node's decode rate (Kimi-K2.5 on 8 x RTX PRO 6000, fitted to its measured B2 runs; "
            "for another model or GPU pass --decode-tok-s with a measured rate: make status shows a run's tok/s)")
    return JobTime(tuple(rows), kv_tokens, kv_dtype, note)


def format_job_time(j: JobTime, config_dir: Path) -> str:
    """The job's table and its wall time, with the assumptions it rests on."""
    to_do = sum(d.to_do for d in j.datasets)
    lines = [f"the job ({', '.join(d.name for d in j.datasets)} of {config_dir}/: {to_do:,} samples to do) with "
             f"{j.kv_tokens:,} KV tokens ({j.kv_dtype}), {j.rate_note}:",
             f"{'dataset':<8} {'to do':>8} {'tokens/sample':>18} {'lengths from':<24} {'running':>8} {'tok/s':>7} "
             f"{'output tokens':>14} {'time':>8}"]
    for d in j.datasets:
        if d.lengths is None:
            lines.append(f"{d.name:<8} {d.to_do:>8,} {'?':>18} {'unknown: run LIMIT=100 first':<24}")
            continue
        lengths = f"{d.lengths.prompt:,.0f} + {d.lengths.output:,.0f}"
        lines.append(f"{d.name:<8} {d.to_do:>8,} {lengths:>18} {d.lengths.source:<24} {d.running:>8,.0f} "
                     f"{d.tok_s:>7,.0f} {d.output_tokens / 1e6:>13,.1f}M {format_duration(d.seconds):>8}")
    known = j.known
    lines.append(f"{'total':<8} {sum(d.to_do for d in known):>8,} {'':>18} {'':<24} {'':>8} {'':>7} "
                 f"{sum(d.output_tokens for d in known) / 1e6:>13,.1f}M {format_duration(j.total_s):>8}"
                 + (f"  (with {format_duration(j.startup_s)} of start-up)" if j.total_s else ""))
    if len(known) < len(j.datasets):
        lines.append("  the datasets marked ? are not in the total: no samples to measure and no assumed lengths")
    lines += [
        "assumptions: tokens/sample = prompt + output, measured once a dataset has "
        f"{MEASURED_MIN} samples; running = KV tokens / (prompt + output/2), the KV a request holds on average;",
        "  the adaptive controller keeps the server at that (docs/measurements.md, job: within 1 % of the ideal); "
        "prefill at the reference node's cost; one server start for the whole job;",
        "  the rate was fitted on B2-like long requests (100-150 running): short-output datasets at hundreds running "
        "are an extrapolation, and SGLang's max_running_requests or CUDA-graph batch sizes may cap them lower.",
    ]
    c = j.cuda_graph_max_bs  # a warning when a dataset's predicted running exceeds the node's CUDA-graph ceiling
    if over := [d for d in known if c and d.running > c]:
        lines.append(
            f"WARNING: {', '.join(d.name for d in over)} would run {' / '.join(f'{d.running:,.0f}' for d in over)} "
            f"requests at once, above SGLang's CUDA-graph ceiling of {c} on this node ({j.cuda_graph_note}): a "
            f"decode batch above it runs without a CUDA graph, ~2x the step time. The adaptive controller holds the "
            f"batch at {c} (it reads cuda_graph_max_bs from the server), so these datasets run at most {c} at once "
            "and their times above are optimistic; to use the KV for more, raise it in the server profile: "
            f'extra_args = ["--cuda-graph-max-bs", "{2 * c}"] (more GPU memory for graphs, a longer start-up).')
    return "\n".join(lines)


def plan_job_time(p: Plan, config_dir: Path, output_dir: Path, *, decode_tok_s: float | None = None,
                  skipped: list[str] | None = None) -> str:
    """`plan`'s job section: the job of config_dir's dataset TOMLs at the KV tokens of p's KV dtype in use;
    "" when config_dir holds no dataset TOML. ConfigError for a bad TOML or a rate that is not positive."""
    if decode_tok_s is not None and not decode_tok_s > 0:
        raise ConfigError(f"--decode-tok-s {decode_tok_s:g} must be above 0 (a measured tokens/s; make status "
                          "shows a run's).")
    if not any(f.stem not in NOT_IN_ALL for f in config_dir.glob("*.toml")):
        return ""
    o = option_in_use(p)
    j = job_time(dataset_lengths(config_dir, output_dir, skipped), kv_tokens=o.kv_tokens, kv_dtype=o.kv_dtype,
                 kv_bytes_factor=kv_bytes_factor(p, o), decode_tok_s=decode_tok_s)
    j = replace(j, cuda_graph_max_bs=p.cuda_graph_max_bs, cuda_graph_note=p.cuda_graph_note)
    return format_job_time(j, Path(display_path(config_dir)))
