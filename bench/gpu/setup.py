"""The GPU check's inputs: the prompt file, the dataset TOML and the server.toml profiles it runs.

Written into the work folder at run time because the model path is only known there. `sim=True`
points every profile at the simulator (profile "h200") so the whole check runs on a laptop.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench.gpu.make_model import synthetic_text

PROMPTS = 1500
MAX_NEW_TOKENS = 512
KV_TOKENS = 60_000
STARVED_KV_TOKENS = 20_000
# Issue 34: a pool where SGLang's own admission runs the short regime past its CUDA-graph ceiling (256 on
# one GPU): 120,000 fp8 KV tokens hold ~300 short requests. Profile "h200-ceiling".
CEILING_KV_TOKENS = 120_000
# Issue 34's small-model case: make_model's "small" shape (work/model-small), a step short enough for >= 50K tok/s,
# where the client's CPU, not the GPU, would bind; CUDA graphs up to the whole batch, so the window does not matter.
SMALL_KV_TOKENS = 400_000
SMALL_MAX_RUNNING = 512
# h200-small-fast: the small model with twice the batch (SGLang's step costs its scheduler about as much CPU at
# 1,024 as at 512) and its front end in 4 processes, for the >= 50K tok/s the issue asks of the small-model case
FAST_KV_TOKENS = 800_000
FAST_MAX_RUNNING = 1024
PROFILE_KV_TOKENS = {"h200": KV_TOKENS, "h200-ceiling": CEILING_KV_TOKENS, "h200-small": SMALL_KV_TOKENS,
                     "h200-small-i1": SMALL_KV_TOKENS, "h200-small-i1-tw4": SMALL_KV_TOKENS,
                     "h200-small-fast": FAST_KV_TOKENS}
DATASET = "h200"
# The long-output regime (issue 19): prompts of ~300-500 tokens, every output >= 1,000 tokens (mean
# ~1,300: the random model's EOS comes with probability ~1/320 a token), ~40 requests fit in 60K tokens.
LONG_DATASET = "h200long"
LONG_PROMPTS = 300  # a long-regime run's prompts by default (h200_check --long-prompts: up to LONG_PROMPTS_MAX)
LONG_PROMPTS_MAX = 900  # what the long dataset holds (the same seed: its first rows are the 300's)
LONG_MAX_NEW_TOKENS = 4096
LONG_MIN_TOKENS = 1000
# The short regime of issue 19's rounds: enough prompts that SGLang's own ramp (~4 s to its steady
# ~150 running) weighs ~a tenth of a run (~35 s on the H200).
SHORT_DATASET = "h200short"
SHORT_PROMPTS = 3000
# --stream-interval 8: a chunk every 8 tokens. At 1 (SGLang's default) the streaming client (loop detector on)
# took 0.9 of a core at ~9K tok/s on the lent H200's host and was the bottleneck (issue 22).
SGLANG_FLAGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--dtype", "bfloat16",
                "--stream-interval", "8"]
# Issue 34: speculative decoding through the launcher. STANDALONE (a plain LLM as the draft) with the target
# itself as its draft and greedy sampling: the mechanics and the recorded acceptance, checked against SGLang's
# own decode log. Not the gain: the random model's near-tied logits make the draft's argmax (another batch
# shape) differ from the target's, so it accepted ~1.2 of a possible 4 on an H100 (docs/measurements.md).
SPEC_DATASET = "h200spec"
SPEC_SAMPLES = 300
SPEC_STEPS = 3
SIM_FLAGS = ["--sim-profile", "h200", "--sim-startup-s", "1", "--sim-output-mean", "255",
             "--sim-output-spread", "0.9", "--stream-interval", "8"]


def write_prompts(path: Path, n: int = PROMPTS, seed: int = 9) -> int:
    """n single-turn prompts (~200 tokens each with this tokenizer), ids p00000...; returns n."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        words = max(8, int(rng.lognormvariate(3.85, 0.35)))
        text = f"Question {i}: " + synthetic_text(rng, words) + " Continue the text."
        lines.append(json.dumps({"id": f"p{i:05d}", "messages": [{"role": "user", "content": text}]}))
    path.write_text("\n".join(lines) + "\n")
    return n


def write_long_prompts(path: Path, n: int = LONG_PROMPTS, seed: int = 19) -> int:
    """n prompts of 72-120 words (~300-500 tokens with this tokenizer), ids q00000...; returns n."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        text = f"Story {i}: " + synthetic_text(rng, rng.randint(72, 120)) + " Continue the story at length."
        lines.append(json.dumps({"id": f"q{i:05d}", "messages": [{"role": "user", "content": text}]}))
    path.write_text("\n".join(lines) + "\n")
    return n


def long_dataset_toml(prompts: Path, n: int = LONG_PROMPTS) -> str:
    return f"""# Written by bench/gpu/setup.py: {n} synthetic prompts of ~300-500 tokens, long outputs (issue 19).
name = "{LONG_DATASET}"
target_samples = {n}

[source]
files = ["{prompts}"]
schema = "messages"
field = "messages"
id_field = "id"

[sampling]
max_new_tokens = {LONG_MAX_NEW_TOKENS}
temperature = 1.0
top_p = 1.0

[sampling.extra_body]
min_tokens = {LONG_MIN_TOKENS}

[generation]
reasoning = "none"
truncated = "keep"
request_timeout_s = 900
max_attempts = 4

[output]
shard_max_samples = 1000
fsync_every = 64
"""


def dataset_toml(prompts: Path) -> str:
    written_by = (f"Written by bench/gpu/setup.py: {PROMPTS} synthetic prompts, EOS honoured, "
                  f"max {MAX_NEW_TOKENS} new tokens.")
    return f"""# {written_by}
name = "{DATASET}"
target_samples = {PROMPTS}

[source]
files = ["{prompts}"]
schema = "messages"
field = "messages"
id_field = "id"

[sampling]
max_new_tokens = {MAX_NEW_TOKENS}
temperature = 1.0
top_p = 1.0

[generation]
reasoning = "none"
truncated = "keep"
request_timeout_s = 600
max_attempts = 4

[output]
shard_max_samples = 1000
fsync_every = 64
"""


def spec_toml(prompts: Path) -> str:
    """The speculative run's dataset: the short prompts, greedy, whole answers (`on_loop = "off"`: SGLang 0.5.17
    returns meta_info, hence each turn's acceptance, only to a request that does not stream)."""
    return (dataset_toml(prompts).replace(f'name = "{DATASET}"', f'name = "{SPEC_DATASET}"')
            .replace(f"target_samples = {PROMPTS}", f"target_samples = {SPEC_SAMPLES}")
            .replace("temperature = 1.0", "temperature = 0.0")
            .replace('truncated = "keep"', 'truncated = "keep"\non_loop = "off"'))


def spec_flags(model: str, sim: bool) -> tuple[str, ...]:
    flags = ("--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", model,
             "--speculative-num-steps", str(SPEC_STEPS), "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", str(SPEC_STEPS + 1),
             # 0.5.17's draft-graph capture imports deep_gemm (dsa_backend), which the wheel set lacks: eager
             "--disable-cuda-graph")
    return (*flags, "--sim-accept-length", str(SPEC_STEPS + 1)) if sim else flags


def _profile(name: str, model: str, *, kv_dtype: str, mem: float, kv_tokens: int | None, sim: bool,
             time_scale: float, more: tuple[str, ...] = ()) -> str:
    extra = list(SIM_FLAGS) + ["--time-scale", f"{time_scale:g}"] if sim else list(SGLANG_FLAGS)
    if sim and name == "probe-fp8":
        extra += ["--sim-kv-perturb", "0.02"]  # the dry run's known answer: 2 % of top-1 tokens flipped
    if kv_tokens:
        extra += ["--max-total-tokens", str(kv_tokens)]
    extra += list(more)
    command = '\ncommand = ["{python}", "-m", "sglang_sim"]\nbackend = "sim"' if sim else ""
    return f"""
[profile.{name}]
model_path = "{model}"
mem_fraction_static = {mem}
kv_cache_dtype = "{kv_dtype}"
enable_metrics = true
host = "127.0.0.1"
port = 0
extra_args = {json.dumps(extra)}
startup_timeout_s = 900
health_interval_s = 2
unhealthy_after = 5
max_restarts = 1
restart_backoff_s = 5
stop_grace_s = 20{command}
"""


def small_model(model: str, sim: bool) -> str:
    """The small model's folder beside the main one (run_h200.sh's `model` phase builds both)."""
    return model if sim else str(Path(model).with_name(Path(model).name + "-small"))


def server_toml(model: str, sim: bool = False, time_scale: float = 1.0) -> str:
    """Profiles: h200 (bf16, 60K KV tokens), h200-fp8 (launch mode), h200-ceiling (120K fp8), h200-starved(-eager)
    (20K), h200-small (the small model; -i1: at stream interval 1; -i1-tw4: and 4 tokenizer workers; -fast: 1,024
    running, 800K KV tokens, 4 tokenizer workers), h200-spec, probe-bf16/-fp8."""
    kw = {"sim": sim, "time_scale": time_scale, "model": model}
    return ("# Written by bench/gpu/setup.py for the GPU check (bench/gpu/README.md).\n"
            + _profile("h200", kv_dtype="auto", mem=0.85, kv_tokens=KV_TOKENS, **kw)
            + _profile("h200-fp8", kv_dtype="fp8_e4m3", mem=0.85, kv_tokens=None, **kw)
            + _profile("h200-ceiling", kv_dtype="fp8_e4m3", mem=0.85, kv_tokens=CEILING_KV_TOKENS, **kw)
            + _profile("h200-starved", kv_dtype="auto", mem=0.85, kv_tokens=STARVED_KV_TOKENS, **kw)
            # SGLang's optimistic admission (new_token_ratio from 0.21, not 0.7): retractions come sooner
            + _profile("h200-starved-eager", kv_dtype="auto", mem=0.85, kv_tokens=STARVED_KV_TOKENS,
                       more=("--schedule-conservativeness", "0.3"), **kw)
            + _profile("h200-small", kv_dtype="auto", mem=0.85, kv_tokens=SMALL_KV_TOKENS,
                       more=("--max-running-requests", str(SMALL_MAX_RUNNING),
                             "--cuda-graph-max-bs", str(SMALL_MAX_RUNNING)),
                       **{**kw, "model": small_model(model, sim)})
            # the same at SGLang's default --stream-interval 1 (the last flag wins): a chunk a token, the
            # client's costliest stream (issue 34: reader processes)
            + _profile("h200-small-i1", kv_dtype="auto", mem=0.85, kv_tokens=SMALL_KV_TOKENS,
                       more=("--max-running-requests", str(SMALL_MAX_RUNNING),
                             "--cuda-graph-max-bs", str(SMALL_MAX_RUNNING), "--stream-interval", "1"),
                       **{**kw, "model": small_model(model, sim)})
            # and with SGLang's front end in 4 processes (0.5.17's --tokenizer-worker-num): the lever
            # diagnose's front_end_bound names, measured by the frontend phase beside -i1
            + _profile("h200-small-i1-tw4", kv_dtype="auto", mem=0.85, kv_tokens=SMALL_KV_TOKENS,
                       more=("--max-running-requests", str(SMALL_MAX_RUNNING),
                             "--cuda-graph-max-bs", str(SMALL_MAX_RUNNING), "--stream-interval", "1",
                             "--tokenizer-worker-num", "4"),
                       **{**kw, "model": small_model(model, sim)})
            + _profile("h200-small-fast", kv_dtype="auto", mem=0.85, kv_tokens=FAST_KV_TOKENS,
                       more=("--max-running-requests", str(FAST_MAX_RUNNING), "--cuda-graph-max-bs",
                             str(FAST_MAX_RUNNING), "--tokenizer-worker-num", "4"),
                       **{**kw, "model": small_model(model, sim)})
            + _profile("h200-spec", kv_dtype="auto", mem=0.85, kv_tokens=KV_TOKENS, more=spec_flags(model, sim), **kw)
            + _profile("probe-bf16", kv_dtype="auto", mem=0.4, kv_tokens=KV_TOKENS, **kw)
            + _profile("probe-fp8", kv_dtype="fp8_e4m3", mem=0.4, kv_tokens=KV_TOKENS, **kw))


def write_configs(work: Path, model: str, *, sim: bool, time_scale: float = 1.0, prompts: int = PROMPTS) -> Path:
    """WORK/cfg/{server.toml, h200.toml, prompts.jsonl, h200short.toml, prompts-short.jsonl, h200spec.toml,
    h200long.toml, prompts-long.jsonl}; returns the config dir."""
    cfg = work / "cfg"
    cfg.mkdir(parents=True, exist_ok=True)
    write_prompts(cfg / "prompts.jsonl", prompts)
    text = dataset_toml(cfg / "prompts.jsonl").replace(f"target_samples = {PROMPTS}", f"target_samples = {prompts}")
    (cfg / f"{DATASET}.toml").write_text(text)
    write_prompts(cfg / "prompts-short.jsonl", SHORT_PROMPTS)  # the same seed: its first rows are prompts.jsonl's
    (cfg / f"{SHORT_DATASET}.toml").write_text(
        dataset_toml(cfg / "prompts-short.jsonl").replace(f'name = "{DATASET}"', f'name = "{SHORT_DATASET}"')
        .replace(f"target_samples = {PROMPTS}", f"target_samples = {SHORT_PROMPTS}")
        .replace(f"{PROMPTS} synthetic prompts", f"{SHORT_PROMPTS} synthetic prompts"))
    (cfg / f"{SPEC_DATASET}.toml").write_text(spec_toml(cfg / "prompts-short.jsonl"))
    write_long_prompts(cfg / "prompts-long.jsonl", LONG_PROMPTS_MAX)
    (cfg / f"{LONG_DATASET}.toml").write_text(long_dataset_toml(cfg / "prompts-long.jsonl", LONG_PROMPTS_MAX))
    (cfg / "server.toml").write_text(server_toml(model, sim=sim, time_scale=time_scale))
    return cfg
