"""plan arithmetic against hand-computed values; fatal-line recognition and advice."""

import json
from pathlib import Path

import pytest

from gen_pipeline.config.server import ServerProfile
from gen_pipeline.errors import ConfigError
from gen_pipeline.server import format_plan, plan, plan_from_args
from gen_pipeline.server.log_advice import advice, find_fatal
from gen_pipeline.server.plan import GIB, kv_bytes_per_token

KIMI = json.loads((Path(__file__).parent / "data" / "kimi-k2.5-config.json").read_text())
LLAMA_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}


@pytest.mark.parametrize("config, dtype, tp, expected", [
    (KIMI, "bf16", 8, ("MLA", 61, 70_272)),  # (512 + 64) latent × 61 layers × 2 bytes, replicated on every GPU
    (KIMI, "bf16", 1, ("MLA", 61, 70_272)),
    (KIMI, "fp8_e4m3", 8, ("MLA", 61, 35_136)),
    (LLAMA_8B, "bf16", 1, ("MHA", 32, 131_072)),  # 2 (K,V) × 32 layers × 8 kv heads × 128 head_dim × 2 bytes
    (LLAMA_8B, "bf16", 2, ("MHA", 32, 65_536)),  # split across tp
    (LLAMA_8B, "fp8_e4m3", 16, ("MHA", 32, 8_192)),  # 16 GPUs > 8 kv heads: each GPU still keeps one head
])
def test_kv_bytes_per_token(config: dict, dtype: str, tp: int, expected: tuple) -> None:
    assert kv_bytes_per_token(config, dtype, tp) == expected


def test_mha_plan_numbers():
    # 80 GiB × 0.9 = 72 GiB − 16 GiB weights = 56 GiB → 56 × 2^30 / 131072 = 458,752 tokens
    p = plan(LLAMA_8B, gpu_mem_gb=80, tp_size=1, mem_fraction_static=0.9, tokens_per_sample=4096,
             weights_gb=16, kv_dtypes=("bf16", "fp8_e4m3"), hicache_gb=8)
    bf16, fp8 = p.options
    assert (p.attention, p.kv_gb_per_gpu) == ("MHA", pytest.approx(56.0))
    assert (bf16.kv_tokens, bf16.decode_slots) == (458_752, 112)
    assert (fp8.kv_tokens, fp8.decode_slots) == (917_504, 224)
    assert bf16.tokens_per_0_01 == int(0.8 * GIB // 131_072) == 6_553
    assert bf16.hicache_tokens == 65_536


def test_mla_plan_reproduces_the_seed_on_94_gib_gpus():
    # The seed's 116K / 159K / 376K fit 94 GiB per GPU with 72.3 GiB of weights + runtime per GPU.
    def tokens(mem, dtype):
        return plan(KIMI, gpu_mem_gb=94, tp_size=8, mem_fraction_static=mem, tokens_per_sample=4500,
                    weights_gb=72.3 * 8, kv_dtypes=(dtype,)).options[0].kv_tokens
    assert tokens(0.85, "bf16") == pytest.approx(116_000, rel=0.01)
    assert tokens(0.88, "bf16") == pytest.approx(159_000, rel=0.01)
    assert tokens(0.90, "fp8_e4m3") == pytest.approx(376_000, rel=0.01)


def test_weights_from_params_and_errors():
    p = plan(LLAMA_8B, gpu_mem_gb=80, tp_size=1, mem_fraction_static=0.9, tokens_per_sample=1000,
             params_b=8, weight_dtype="bf16")
    assert p.weights_gb_per_gpu == pytest.approx(16e9 / GIB)
    with pytest.raises(ConfigError, match="plan needs weights_gb, or params_b"):
        plan(LLAMA_8B, gpu_mem_gb=80, tp_size=1, mem_fraction_static=0.9, tokens_per_sample=1)
    with pytest.raises(ConfigError) as e:
        plan({"num_hidden_layers": 2}, gpu_mem_gb=80, tp_size=1, mem_fraction_static=0.9, tokens_per_sample=1,
             weights_gb=1)
    assert str(e.value) == ("config.json: num_attention_heads = None is missing or not a positive integer; "
                            "plan needs it to size the KV cache.")


def test_plan_text_shows_the_three_levers():
    text = format_plan(plan_from_args(Path(__file__).parent / "data" / "kimi-k2.5-config.json", gpu_mem_gb=94,
                                      tp_size=8, mem_fraction_static=0.85, tokens_per_sample=4500,
                                      weights_gb=72.3 * 8, hicache_gb=48))
    assert "bf16                 70,272      116,126            25     +14,363" in text
    assert "fp8_e4m3             35,136      232,252            51     +28,726" in text
    assert "fp8_e4m3 stores 2x fewer bytes per token than bf16 → 2.0x the tokens at equal memory." in text
    assert "it adds no decode slots" in text
    assert "replicated on every TP rank" in text


@pytest.mark.parametrize("line, kind", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: 0.5",
     "not_enough_memory"),
    ("torch.distributed.DistBackendError: NCCL error in: ../ProcessGroupNCCL.cpp:1970, unhandled system error",
     "nccl"),
    ("launch_server.py: error: unrecognized arguments: --kv-cache-dtyp fp8", "bad_flag"),
    ("launch_server.py: error: argument --kv-cache-dtype: invalid choice: 'fp9'", "bad_flag"),
])
def test_fatal_lines(line, kind):
    assert find_fatal(["INFO starting", line, "more"]).kind == kind


def test_command_echo_and_warnings_are_not_fatal():
    assert find_fatal(["$ python -m sglang_sim --sim-fail-startup 'CUDA out of memory'",
                       "NCCL WARN something harmless", "max_total_num_tokens=1000"]) is None


def test_advice_names_the_key():
    p = ServerProfile(name="tuned", model_path="m", mem_fraction_static=0.9, extra_args=("--bogus", "1"),
                      source="datasets_cfg/server.toml")
    oom = find_fatal(["torch.OutOfMemoryError: CUDA out of memory."])
    assert advice(oom, p) == ("Lower mem_fraction_static in datasets_cfg/server.toml [profile.tuned], now 0.9 "
                              "(the reference job keeps ~3.5 GB free per GPU), or lower max_running_requests / "
                              "context_length.")
    bad = find_fatal(["x.py: error: unrecognized arguments: --bogus 1"])
    assert advice(bad, p) == ("The installed SGLang rejected a flag (--bogus comes from extra_args) in "
                              "datasets_cfg/server.toml [profile.tuned]. Fix or remove that key (or upgrade "
                              "SGLang), then run again.")
    choice = find_fatal(["x.py: error: argument --kv-cache-dtype: invalid choice: 'fp9'"])
    assert "(--kv-cache-dtype comes from kv_cache_dtype)" in advice(choice, p)


def test_dcp_multiplies_the_mla_pool_and_is_refused_where_tp_makes_no_copies():
    """--dcp-size d keeps each token's KV on one of d ranks holding the same heads: d x the tokens
    (SGLang 0.5.17 admits against max_total_num_tokens x dcp_size). MLA's latent is on all tp ranks;
    Llama-8B's 8 KV heads at tp 8 are split without copies, so no d > 1 can split its tokens."""
    def fp8(**kw):
        return plan(KIMI, gpu_mem_gb=94, tp_size=8, mem_fraction_static=0.9, tokens_per_sample=4500,
                    weights_gb=72.3 * 8, kv_dtypes=("fp8_e4m3",), **kw)
    one, four = fp8(), fp8(dcp_size=4)
    assert four.options[0].kv_tokens == 4 * one.options[0].kv_tokens
    assert four.options[0].decode_slots == 4 * one.options[0].kv_tokens // 4500
    text = format_plan(four)
    assert "tp=8, dcp=4 (KV tokens x 4)" in text
    per_rank = one.options[0].kv_tokens
    assert (f"d=2 {2 * per_rank:,} (fp8_e4m3), d=8 {8 * per_rank:,} (fp8_e4m3)") in text
    with pytest.raises(ConfigError) as e:
        plan(LLAMA_8B, gpu_mem_gb=80, tp_size=8, mem_fraction_static=0.9, tokens_per_sample=1000, weights_gb=16,
             dcp_size=2)
    assert str(e.value) == ("--dcp-size 2: at tp_size 8 each KV head is on 1 rank(s), and decode context "
                            "parallelism splits tokens only over ranks holding the same heads: pass a divisor of 1 "
                            "(or 1: this model's heads are already split without copies).")
    with pytest.raises(ConfigError, match=r"^--dcp-size 3: at tp_size 8 its latent KV is on every rank.*"
                                          r"pass a divisor of 8\.$"):
        fp8(dcp_size=3)


def test_dcp_from_the_profile_and_the_flag():
    from gen_pipeline.server.plan import profile_inputs
    prof = ServerProfile(name="p", model_path="m", extra_args=("--dcp-size", "4"))
    values, note = profile_inputs(prof)
    assert values["dcp_size"] == 4 and "dcp_size 4 (profile)" in note
    values, note = profile_inputs(prof, dcp_size=2)
    assert values["dcp_size"] == 2 and "dcp_size 2 (flag)" in note
    long_form = ServerProfile(name="q", model_path="m", extra_args=("--decode-context-parallel-size=8",))
    assert profile_inputs(long_form)[0]["dcp_size"] == 8
