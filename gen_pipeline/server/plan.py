"""`gen-pipeline plan`: predict KV tokens and decode slots from a model's config.json (pure).

KV bytes per token on one GPU as SGLang sizes its pools (srt/mem_cache/memory_pool.py, model_runner.py):
MHA/GQA 2 × layers × ceil(kv_heads / tp) × head_dim × bytes; MLA (kv_lora_rank + qk_rope_head_dim) × layers ×
bytes, on every rank. KV tokens = (gpu_mem × mem_fraction_static − weights / tp − overhead) / bytes per token
× dcp, d at most the copies TP makes of each KV head (scheduler.py admits against max_total_num_tokens × dcp_size).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

from gen_pipeline.config.dataset import DEFAULT_CONFIG_DIR
from gen_pipeline.config.schema import check_flags, flag
from gen_pipeline.config.server import ServerProfile
from gen_pipeline.errors import ConfigError

GIB = 1 << 30  # SGLang's "GB" in its memory logs is GiB
# The reference node and the overhead that fits its measured pools (module doc); cli/parser.py's defaults too.
REFERENCE_GPU = "RTX PRO 6000 Blackwell, 96 GB"
REFERENCE_GPU_MEM_GIB = 95.6
REFERENCE_OVERHEAD_GIB = 4.5
# The bundled config.json (plan's default --model-config) is Kimi-K2.5's: its INT4 checkpoint is 594 GB on
# disk = 553 GiB, the default --weights-gb with that config (another config needs the flag).
BUNDLED_CONFIG = DEFAULT_CONFIG_DIR / "models" / "kimi-k2.5-config.json"
BUNDLED_WEIGHTS_GIB = 553.0
KV_BYTES = {"auto": 2, "bf16": 2, "bfloat16": 2, "float16": 2, "fp16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8": 1}
# Drafts whose KV SGLang 0.5.17 pools with the target's: it sizes the pool as if the target had the draft's
# layers too (pool_configurator.py: cell size x (1 + draft layers / layers)); NEXTN is EAGLE's alias.
DRAFT_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")
WEIGHT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
COMPARED_KV = ("bf16", "fp8_e4m3")  # always shown side by side (lever 1); the profile's own is added
WEIGHTS_EXAMPLE = ("--weights-gb (the checkpoint's total size in GiB; Kimi-K2.5 INT4: 594 GB on disk = 553 GiB) "
                   "or --params-b with --weight-dtype (e.g. --params-b 70 --weight-dtype bf16 = 130.4 GiB)")


@dataclass(frozen=True)
class KvOption:
    kv_dtype: str
    bytes_per_token: int  # on one GPU
    kv_tokens: int  # the server's max_total_num_tokens
    decode_slots: int  # kv_tokens // tokens_per_sample
    tokens_per_0_01: int  # extra KV tokens per +0.01 of mem_fraction_static
    hicache_tokens: int  # host-RAM prefix tokens hicache_gb holds (no decode slots)


@dataclass(frozen=True)
class Plan:
    attention: str  # "MLA" | "MHA"
    layers: int
    gpu_mem_gb: float
    tp_size: int
    mem_fraction_static: float
    weights_gb_per_gpu: float
    overhead_gb: float
    kv_gb_per_gpu: float  # what is left for the KV pool on each GPU
    tokens_per_sample: int
    hicache_gb: float
    options: tuple[KvOption, ...]
    weights_note: str = ""  # how the weight size was obtained
    inputs_note: str = ""  # where tp / memory fraction / KV dtype / hicache came from
    kv_in_use: str = ""  # the profile's KV dtype (marked in the table)
    cuda_graph_max_bs: int = 0  # the largest decode batch SGLang replays a CUDA graph for (the profile's or default)
    cuda_graph_note: str = ""
    dcp_size: int = 1  # --dcp-size: KV tokens x dcp_size (module doc)
    dcp_max: int = 1  # the copies TP makes of each KV head: the largest dcp_size that splits tokens
    draft_note: str = ""  # a speculative draft's share of the pool and of the memory (profile_draft)
    max_total_tokens: int | None = None  # --max-total-tokens: SGLang's pool is the smaller of it and what fits


@dataclass(frozen=True)
class PlanNumbers:
    """plan's numbers, each named by the `plan` flag that sets it; ranges checked when constructed."""

    gpu_mem_gb: Annotated[float, flag("--gpu-mem-gb", gt=0)]
    tp_size: Annotated[int, flag("--tp-size", ge=1)]
    mem_fraction_static: Annotated[float, flag("--mem-fraction-static", gt=0, lt=1)]
    tokens_per_sample: Annotated[int, flag("--tokens-per-sample", ge=1)]
    weights_gb: Annotated[float, flag("--weights-gb", gt=0)]
    hicache_gb: Annotated[float, flag("--hicache-gb", ge=0)] = 0.0
    overhead_gb: Annotated[float, flag("--overhead-gb", ge=0)] = 0.0
    dcp_size: Annotated[int, flag("--dcp-size", ge=1)] = 1

    def __post_init__(self) -> None:
        check_flags(self)


def sglang_cuda_graph_max_bs(gpu_mem_gb: float, tp_size: int) -> int:
    """SGLang 0.5.17's default decode CUDA-graph ceiling (server_args.py _handle_gpu_memory_settings:
    `cuda_graph_config.decode.max_bs` by GPU memory in MiB and tp_size); a larger batch runs without a graph."""
    mib = gpu_mem_gb * 1024
    for below_gib, small, large in ((20, 8, 8), (35, 24, 80), (60, 32, 160), (160, 256, 512)):
        if mib < below_gib * 1024:
            return small if tp_size < 4 else large
    return 512  # B200, MI300


def profile_cuda_graph_max_bs(extra_args: tuple[str, ...]) -> int | None:
    """--cuda-graph-max-bs / --cuda-graph-max-bs-decode N (or =N) in a profile's extra_args, else None."""
    return _extra_int(extra_args, ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"))


def _extra_int(extra_args: tuple[str, ...], names: tuple[str, ...]) -> int | None:
    return int(value) if (value := _extra_str(extra_args, names)) is not None and value.isdigit() else None


def _extra_str(extra_args: tuple[str, ...], names: tuple[str, ...]) -> str | None:
    """The value of the first of `names` in a profile's extra_args (`--name V` or `--name=V`), else None."""
    for i, arg in enumerate(extra_args):
        name, _, value = arg.partition("=")
        if name in names:
            return value or (extra_args[i + 1] if i + 1 < len(extra_args) else "")
    return None


@dataclass(frozen=True)
class Draft:
    """A speculative draft the profile runs, as plan sizes it."""

    algorithm: str
    layers: int
    weights_gb: float  # the whole draft checkpoint in GiB; 0: not known here
    note: str


def profile_draft(extra_args: tuple[str, ...]) -> Draft | None:
    """The draft a profile's extra_args run (DRAFT_ALGORITHMS), its layers and weights from a local
    --speculative-draft-model-path, else 1 layer (EAGLE's) and weights not counted, said in the note; or None."""
    algorithm = (_extra_str(extra_args, ("--speculative-algorithm",)) or "").upper()
    if algorithm not in DRAFT_ALGORITHMS:
        return None
    path = _extra_str(extra_args, ("--speculative-draft-model-path", "--speculative-draft-model"))
    folder = Path(path) if path else None
    try:
        cfg = json.loads((folder / "config.json").read_text()) if folder is not None else None
    except (OSError, ValueError):
        cfg = None
    layers = cfg.get("text_config", cfg).get("num_hidden_layers") if isinstance(cfg, dict) else None
    if folder is None or not isinstance(layers, int) or layers < 1:
        where = f"{path} is not a local folder with a config.json here" if path else "no draft path given"
        return Draft(algorithm, 1, 0.0, f"draft ({algorithm}): 1 layer assumed and its weights not counted ({where})")
    weights = sum(f.stat().st_size for f in folder.iterdir() if f.suffix in (".safetensors", ".bin")) / GIB
    return Draft(algorithm, layers, weights, f"draft ({algorithm}): {layers} layer(s) and {weights:.1f} GiB of "
                                             f"weights from {folder}")


def kv_bytes_per_token(model_config: dict[str, Any], kv_dtype: str, tp_size: int) -> tuple[str, int, int]:
    """(attention kind, layers, KV bytes per token on one GPU); ConfigError if the config lacks a field."""
    kind, layers, per_token, _ = _kv_layout(model_config, kv_dtype, tp_size)
    return kind, layers, per_token


def _kv_layout(model_config: dict[str, Any], kv_dtype: str, tp_size: int) -> tuple[str, int, int, int]:
    """kv_bytes_per_token's figures and the copies TP makes of each KV head (module doc: DCP's limit)."""
    cfg = model_config.get("text_config", model_config)  # multimodal wrappers (Kimi-K2.5) nest it
    if kv_dtype not in KV_BYTES:
        raise ConfigError(f"kv_cache_dtype {kv_dtype!r} is not one of {', '.join(KV_BYTES)}.")
    elem = KV_BYTES[kv_dtype]
    layers = _field(cfg, "num_hidden_layers")
    if cfg.get("kv_lora_rank"):
        latent = _field(cfg, "kv_lora_rank") + _field(cfg, "qk_rope_head_dim")
        return "MLA", layers, latent * layers * elem, tp_size
    heads = _field(cfg, "num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or _field(cfg, "hidden_size") // heads
    per_gpu_heads = math.ceil(kv_heads / tp_size)  # fewer heads than GPUs: each GPU keeps one copy
    return "MHA", layers, 2 * layers * per_gpu_heads * head_dim * elem, max(1, tp_size // kv_heads)


def _field(cfg: dict[str, Any], key: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"config.json: {key} = {value!r} is missing or not a positive integer; "
                          "plan needs it to size the KV cache.")
    return value


def plan(model_config: dict[str, Any], *, gpu_mem_gb: float, tp_size: int, mem_fraction_static: float,
         tokens_per_sample: int, weights_gb: float | None = None, params_b: float | None = None,
         weight_dtype: str | None = None, kv_dtypes: tuple[str, ...] = COMPARED_KV,
         hicache_gb: float = 0.0, overhead_gb: float = 0.0, dcp_size: int = 1, draft: Draft | None = None,
         max_total_tokens: int | None = None) -> Plan:
    """Predicted KV tokens and decode slots per KV dtype. Memory in GiB; weights_gb is the whole model
    (or params_b billions × weight_dtype bytes); a draft adds its weights and its layers' KV; max_total_tokens
    caps the pool (SGLang's model_runner takes the smaller). Raises ConfigError on missing or impossible inputs."""
    if weights_gb is None:
        if params_b is None or weight_dtype not in WEIGHT_BYTES:
            raise ConfigError("plan needs weights_gb, or params_b with weight_dtype in "
                              f"{', '.join(WEIGHT_BYTES)} (the bytes per parameter).")
        weights_gb = params_b * 1e9 * WEIGHT_BYTES[weight_dtype] / GIB
        weights_note = (f"weights: {params_b:g}B parameters × {WEIGHT_BYTES[weight_dtype]:g} bytes ({weight_dtype}) "
                        f"= {weights_gb:.1f} GiB")
    else:
        weights_note = f"weights: {weights_gb:g} GiB (--weights-gb)"
    PlanNumbers(gpu_mem_gb, tp_size, mem_fraction_static, tokens_per_sample, weights_gb, hicache_gb, overhead_gb,
                dcp_size)
    weights_gb += draft.weights_gb if draft else 0.0  # the draft's weights sit beside the target's
    weights_per_gpu = weights_gb / tp_size
    kv_gb = gpu_mem_gb * mem_fraction_static - weights_per_gpu - overhead_gb
    if kv_gb <= 0:
        raise ConfigError(
            f"Nothing is left for the KV cache: {gpu_mem_gb:g} GiB/GPU × mem_fraction_static {mem_fraction_static:g} "
            f"= {gpu_mem_gb * mem_fraction_static:.1f} GiB, but the weights take {weights_per_gpu:.1f} GiB/GPU"
            f"{f' and overhead {overhead_gb:g} GiB' if overhead_gb else ''}. "
            + _what_fits(gpu_mem_gb, tp_size, mem_fraction_static, weights_gb, overhead_gb))
    options = []
    kind, layers, copies = "", 0, 1
    for dtype in kv_dtypes:
        kind, layers, per_token, copies = _kv_layout(model_config, dtype, tp_size)
        if draft is not None:
            per_token = int(per_token * (1 + draft.layers / layers))
        tokens = max(0, int(kv_gb * GIB // per_token)) * dcp_size
        tokens = min(tokens, max_total_tokens) if max_total_tokens else tokens
        options.append(KvOption(dtype, per_token, tokens, tokens // tokens_per_sample,
                                 int(gpu_mem_gb * 0.01 * GIB // per_token) * dcp_size,
                                 int(hicache_gb * GIB // per_token)))
    if dcp_size > 1 and (copies % dcp_size or tp_size % dcp_size):
        heads = "its latent KV is on every rank" if kind == "MLA" else f"each KV head is on {copies} rank(s)"
        raise ConfigError(f"--dcp-size {dcp_size}: at tp_size {tp_size} {heads}, and decode context parallelism "
                          f"splits tokens only over ranks holding the same heads: pass a divisor of {copies}"
                          + (" (or 1: this model's heads are already split without copies)." if copies == 1 else "."))
    draft_note = "" if draft is None else (
        f"{draft.note}: KV bytes per token x (1 + {draft.layers}/{layers}), as SGLang pools the draft's KV with the "
        f"target's" + (f"; weights +{draft.weights_gb / tp_size:.1f} GiB/GPU" if draft.weights_gb else ""))
    return Plan(kind, layers, gpu_mem_gb, tp_size, mem_fraction_static, weights_per_gpu, overhead_gb, kv_gb,
                tokens_per_sample, hicache_gb, tuple(options), weights_note,
                cuda_graph_max_bs=sglang_cuda_graph_max_bs(gpu_mem_gb, tp_size),
                cuda_graph_note=f"SGLang's default for {gpu_mem_gb:g} GiB GPUs at tp {tp_size}", dcp_size=dcp_size,
                dcp_max=copies, draft_note=draft_note, max_total_tokens=max_total_tokens)


# GPUs by memory as nvidia-smi reports it (MiB / 1024): the refusal names the smallest one that fits.
KNOWN_GPUS = ((79.6, "H100/A100 80 GB"), (REFERENCE_GPU_MEM_GIB, REFERENCE_GPU), (140.4, "H200 141 GB"))


def _what_fits(gpu_mem_gb: float, tp_size: int, fraction: float, weights_gb: float, overhead_gb: float) -> str:
    """What would leave room for a KV cache: the GPU memory needed at this tp_size and fraction (and the
    smallest known GPU with it), and the tp_size these GPUs need (a power of two: TP splits the heads)."""
    need_gb = (weights_gb / tp_size + overhead_gb) / fraction
    fits = next((f"{tp_size} x {name} ({mem:g} GiB/GPU)" for mem, name in KNOWN_GPUS if mem > need_gb), None)
    per_gpu = gpu_mem_gb * fraction - overhead_gb
    tp = 1 if per_gpu > 0 else 0
    while tp and weights_gb / tp >= per_gpu:
        tp *= 2
    nodes = f" ({tp // 8} nodes of 8 GPUs)" if tp > 8 else ""
    out = (f"At tp_size {tp_size} and this fraction each GPU needs more than {need_gb:.1f} GiB, so {tp_size} x "
           f"{gpu_mem_gb:g} GiB GPUs cannot hold the model with a KV cache. ")
    out += f"The smallest node that can: {fits}. " if fits else ""
    out += f"Or use tp_size {tp} on these GPUs{nodes}, " if tp else "Or use GPUs with more memory, "
    return out + "a larger mem_fraction_static or smaller (quantized) weights."


def profile_inputs(profile: ServerProfile, *, tp_size: int | None = None, mem_fraction_static: float | None = None,
                   kv_cache_dtype: str | None = None, hicache_gb: float | None = None,
                   dcp_size: int | None = None) -> tuple[dict[str, Any], str]:
    """The plan's tp_size, mem_fraction_static, kv_dtypes, hicache_gb and dcp_size: each flag (None = not
    given) over the profile's key (dcp_size: its extra_args); and a line saying where each value came from."""
    hicache = float(profile.hicache_size_gb) if profile.enable_hierarchical_cache else 0.0
    picked = {  # name: (flag value, profile value, fallback when the profile leaves it to SGLang)
        "tp_size": (tp_size, profile.tp_size, 1),
        "mem_fraction_static": (mem_fraction_static, profile.mem_fraction_static, 0.90),
        "kv_cache_dtype": (kv_cache_dtype, profile.kv_cache_dtype, "auto"),
        "hicache_gb": (hicache_gb, hicache, 0.0),
        "dcp_size": (dcp_size, _extra_int(profile.extra_args, ("--dcp-size", "--decode-context-parallel-size")), 1),
        "max_total_tokens": (None, _extra_int(profile.extra_args, ("--max-total-tokens",)), None),
    }
    values: dict[str, Any] = {}
    notes = []
    for name, (given, own, fallback) in picked.items():
        value, whence = (given, "flag") if given is not None else (own, "profile") if own is not None else (
            fallback, "default")
        values[name] = value
        if name not in ("dcp_size", "max_total_tokens") or whence != "default":  # no DCP, no cap: not worth a word
            notes.append(f"{name} {value:g} ({whence})" if isinstance(value, float) else f"{name} {value} ({whence})")
    kv = values.pop("kv_cache_dtype")
    values["kv_dtypes"] = COMPARED_KV + (() if kv in COMPARED_KV or kv == "auto" else (kv,))
    values["kv_in_use"] = "bf16" if kv == "auto" else kv
    values["draft"] = profile_draft(profile.extra_args)
    return values, f"inputs from {profile.where}, flags override: " + ", ".join(notes)


def format_plan(p: Plan) -> str:
    """The prediction and the three levers side by side, as text for a terminal."""
    lines = [
        f"{p.attention} attention, {p.layers} layers; tp={p.tp_size}"
        + (f", dcp={p.dcp_size} (KV tokens x {p.dcp_size})" if p.dcp_size > 1 else "")
        + f", {p.gpu_mem_gb:g} GiB/GPU × "
        f"mem_fraction_static {p.mem_fraction_static:g} − weights {p.weights_gb_per_gpu:.1f} GiB/GPU"
        + (f" − overhead {p.overhead_gb:g} GiB" if p.overhead_gb else "")
        + f" = {p.kv_gb_per_gpu:.1f} GiB/GPU for the KV cache",
        "",
        f"{'kv dtype':<10} {'bytes/token/GPU':>16} {'KV tokens':>12} {'decode slots':>13} {'+0.01 mem':>11}",
    ]
    lines[:0] = [n for n in (p.inputs_note, p.weights_note, p.draft_note) if n]
    for o in p.options:
        mark = "  <- the profile's kv_cache_dtype" if o.kv_dtype == p.kv_in_use else ""
        lines.append(f"{o.kv_dtype:<10} {o.bytes_per_token:>16,} {o.kv_tokens:>12,} {o.decode_slots:>13,} "
                     f"{'+' + format(o.tokens_per_0_01, ','):>11}{mark}")
    lines += ["", f"decode slots = KV tokens / {p.tokens_per_sample:,} tokens per sample (prompt + output)"]
    if p.max_total_tokens:
        lines.append(f"KV tokens capped at {p.max_total_tokens:,} by --max-total-tokens (SGLang takes the smaller of "
                     "it and what fits); the levers below move what fits, not the cap")
    lines.append("")
    lines += _levers(p)
    if p.kv_gb_per_gpu <= 0:
        lines.append("WARNING: the weights do not leave room for a KV cache at this memory fraction "
                     "(SGLang: 'Not enough memory. Please try to increase --mem-fraction-static').")
    return "\n".join(lines)


def _levers(p: Plan) -> list[str]:
    first, last = p.options[0], p.options[-1]
    out = ["levers:"]
    if first.bytes_per_token != last.bytes_per_token:
        ratio = last.kv_tokens / first.kv_tokens if first.kv_tokens else float("nan")
        out.append(f"  1. KV dtype: {last.kv_dtype} stores {first.bytes_per_token // last.bytes_per_token}x fewer "
                   f"bytes per token than {first.kv_dtype} → {ratio:.1f}x the tokens at equal memory.")
    out.append(f"  2. memory fraction: each +0.01 gives {p.gpu_mem_gb * 0.01:.2f} GiB/GPU → "
               + ", ".join(f"+{o.tokens_per_0_01:,} tokens ({o.kv_dtype})" for o in p.options)
               + "; leave headroom for activations and CUDA graphs (the reference job keeps ~3.5 GB/GPU free).")
    host = ", ".join(f"{o.hicache_tokens:,} tokens ({o.kv_dtype})" for o in p.options)
    out.append(f"  3. hierarchical cache ({p.hicache_gb:g} GB host RAM per rank: {host}): keeps evicted prefixes "
               "for later prefix hits; it adds no decode slots (running requests live in GPU KV).")
    if p.dcp_max > 1:  # DCP splits what TP copies
        o = option_in_use(p)
        per_rank = o.kv_tokens // p.dcp_size
        sizes = [d for d in (2, 4, 8, 16) if p.dcp_max % d == 0 and d != p.dcp_size]
        what = "the latent KV is" if p.attention == "MLA" else "each KV head is"
        out.append(f"  4. decode context parallelism (--dcp-size d): {what} copied on {p.dcp_max} ranks at tp "
                   f"{p.tp_size}; d keeps each token on one of d of them → d x the KV tokens: "
                   + ", ".join(f"d={d} {per_rank * d:,} ({o.kv_dtype})" for d in sizes)
                   + "; each decode step pays communication growing with d, so measure the speed"
                   + (" (MLA needs --attention-backend flashinfer)." if p.attention == "MLA" else "."))
    if p.attention == "MLA":
        out.append("  MLA: the latent KV is replicated on every TP rank, so KV tokens grow with memory per GPU, "
                   "not with tp_size" + (" (unless lever 4 splits it)." if p.dcp_max > 1 else "."))
    return out


def plan_from_args(model_config: Path, *, gpu_mem_gb: float, tp_size: int, mem_fraction_static: float,
                   tokens_per_sample: int, weights_gb: float | None = None, params_b: float | None = None,
                   weight_dtype: str | None = None, kv_dtypes: tuple[str, ...] = COMPARED_KV,
                   hicache_gb: float = 0.0, overhead_gb: float = 0.0, inputs_note: str = "",
                   kv_in_use: str = "", dcp_size: int = 1, draft: Draft | None = None,
                   max_total_tokens: int | None = None) -> Plan:
    """`plan`'s flags (each keyword is the flag of that name) → the Plan (format_plan prints it);
    ConfigError for a missing weight size or an unreadable config, naming the flag."""
    try:  # the file first: a missing one is the first thing to fix, whatever else is missing
        cfg = json.loads(Path(model_config).read_text())
    except FileNotFoundError:
        raise ConfigError(f"--model-config {model_config}: no such file (pass the model's config.json).") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{model_config}: not valid JSON ({e}).") from None
    except OSError as e:
        raise ConfigError(f"--model-config {model_config}: cannot be read ({e.strerror or e}); pass the model's "
                          "config.json.") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{model_config}: expected a JSON object (a Hugging Face config.json).")
    bundled = weights_gb is None and params_b is None and Path(model_config).resolve() == BUNDLED_CONFIG.resolve()
    weights_gb = BUNDLED_WEIGHTS_GIB if bundled else weights_gb
    if weights_gb is None and params_b is None:
        raise ConfigError(f"plan needs the weight size: pass {WEIGHTS_EXAMPLE}.")
    if params_b is not None and weights_gb is None and weight_dtype is None:
        raise ConfigError(f"--params-b {params_b:g} needs --weight-dtype ({', '.join(WEIGHT_BYTES)}): the "
                          "bytes per parameter. For a mixed-precision checkpoint (Kimi-K2.5 INT4) pass --weights-gb.")
    p = plan(cfg, gpu_mem_gb=gpu_mem_gb, tp_size=tp_size, mem_fraction_static=mem_fraction_static,
             tokens_per_sample=tokens_per_sample, weights_gb=weights_gb, params_b=params_b,
             weight_dtype=weight_dtype, kv_dtypes=kv_dtypes, hicache_gb=hicache_gb, overhead_gb=overhead_gb,
             dcp_size=dcp_size, draft=draft, max_total_tokens=max_total_tokens)
    if bundled:
        p = replace(p, weights_note=f"weights: {BUNDLED_WEIGHTS_GIB:g} GiB (Kimi-K2.5 INT4, 594 GB on disk: the "
                                    "bundled config's default; --weights-gb for another checkpoint)")
    return replace(p, inputs_note=inputs_note, kv_in_use=kv_in_use)


def option_in_use(p: Plan) -> KvOption:
    """The row of the profile's KV dtype (the first row when the plan names none)."""
    return next((o for o in p.options if o.kv_dtype == p.kv_in_use), p.options[0])


def kv_bytes_factor(p: Plan, o: KvOption) -> float:
    """o's bytes per KV token relative to bf16's (fp8: 0.5): what attention reads per token."""
    bf16 = next((x for x in p.options if KV_BYTES[x.kv_dtype] == 2), None)
    return o.bytes_per_token / bf16.bytes_per_token if bf16 else KV_BYTES[o.kv_dtype] / 2
