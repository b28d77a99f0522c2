"""Command line of `python -m sglang_sim`: SGLang's own flags (real spellings, from
python/sglang/srt/server_args.py) so the launcher starts the sim through the same code path,
plus sim-only `--sim-*` flags. Unknown flags are an argparse error (exit 2), as in SGLang."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from sglang_sim.faults import FaultSettings
from sglang_sim.profiles import PROFILES

# SGLang's --kv-cache-dtype choices (server_args.py); "bfloat16" is its long spelling of bf16.
KV_CACHE_DTYPES = ("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _sglang_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-path", "--model", default="sim/Kimi-K2.5")
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", dest="tp_size", type=int, default=1)
    p.add_argument("--dp-size", dest="dp_size", type=int, default=1)
    p.add_argument("--ep-size", "--ep", dest="ep_size", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    p.add_argument("--enable-hierarchical-cache", action="store_true")
    p.add_argument("--hicache-size", type=int, default=0, help="host KV cache per rank, GB")
    p.add_argument("--hicache-ratio", type=float, default=2.0)
    p.add_argument("--num-continuous-decode-steps", type=int, default=1)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--enable-cache-report", action="store_true")
    p.add_argument("--reasoning-parser", default=None)
    p.add_argument("--tool-call-parser", default=None)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--max-prefill-tokens", type=int, default=16384)
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--schedule-conservativeness", type=float, default=1.0)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    p.add_argument("--log-level-http", choices=LOG_LEVELS, default=None)
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument("--stream-interval", type=int, default=1, help="tokens per streamed chunk (SGLang's; >= 1)")
    p.add_argument("--tokenizer-worker-num", type=int, default=1,
                   help="accepted; the simulator's front end is one process whatever N")
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--cuda-graph-max-bs", dest="cuda_graph_max_bs_decode", type=int, default=None)  # an alias in 0.5.17
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--watchdog-timeout", type=float, default=300.0)
    p.add_argument("--speculative-algorithm", default=None)  # EAGLE, EAGLE3, NEXTN, ... (no speed effect here)
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model", default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)


def _sim_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("simulator (not SGLang)")
    g.add_argument("--sim-profile", choices=tuple(PROFILES), default="fast")
    g.add_argument("--time-scale", type=float, default=1.0, help="simulated seconds per real second")
    g.add_argument("--sim-startup-s", type=float, default=0.0, help="real seconds of 503 on /health")
    g.add_argument("--sim-output-mean", type=float, default=512.0, help="mean output tokens")
    g.add_argument("--sim-output-spread", type=float, default=0.6, help="lognormal sigma of output length")
    g.add_argument("--sim-seed", type=int, default=0)
    g.add_argument("--sim-no-graph-factor", type=float, default=None, metavar="X",
                   help="a decode step above the CUDA-graph ceiling takes X times a graphed one (default: the "
                        "profile's, 1.9 as measured on an H100); tests widen it to make one candidate clearly fastest")
    g.add_argument("--sim-kv-perturb", type=float, default=0.0, metavar="RATE",
                   help="with an fp8 --kv-cache-dtype: share of positions whose top-1 token flips, plus small "
                        "logprob noise everywhere, in /generate's return_logprob path (sglang_sim/logprob_model.py)")
    g.add_argument("--sim-accept-length", type=float, default=2.5, metavar="L",
                   help="with --speculative-algorithm: mean tokens accepted per verify step (sglang_sim/spec.py)")
    f = p.add_argument_group("simulator faults (see sglang_sim/faults.py)")
    f.add_argument("--sim-crash-after", type=int, default=0)
    f.add_argument("--sim-error-rate", type=float, default=0.0)
    f.add_argument("--sim-error-status", type=int, choices=(500, 502, 503, 504), default=500)
    f.add_argument("--sim-429-rate", dest="sim_too_many_rate", type=float, default=0.0)
    f.add_argument("--sim-stall-rate", type=float, default=0.0)
    f.add_argument("--sim-stall-s", type=float, default=600.0)
    f.add_argument("--sim-cut-rate", type=float, default=0.0)
    f.add_argument("--sim-bad-json-rate", type=float, default=0.0)
    f.add_argument("--sim-wrong-content-type-rate", type=float, default=0.0)
    f.add_argument("--sim-no-usage-rate", type=float, default=0.0)
    f.add_argument("--sim-empty-turn-rate", type=float, default=0.0)
    f.add_argument("--sim-loop-rate", type=float, default=0.0,
                   help="share of requests whose output falls into a loop and runs to max_tokens")
    f.add_argument("--sim-leak-rate", type=float, default=0.0,
                   help="share of chat requests whose reasoning leaks into content")
    f.add_argument("--sim-marker-only-rate", type=float, default=0.0,
                   help="share of requests answered with think markers only")
    f.add_argument("--sim-health-503-after-s", type=float, default=0.0)
    f.add_argument("--sim-health-503-for-s", type=float, default=0.0)
    f.add_argument("--sim-fail-startup", metavar="LINE", default=None)
    f.add_argument("--sim-startup-log", metavar="LINE", action="append", default=[],
                   help="log LINE at start-up and carry on (e.g. a warning real SGLang prints)")
    f.add_argument("--sim-never-healthy", action="store_true")
    f.add_argument("--sim-ignore-sigterm", action="store_true",
                   help="SIGTERM does nothing (a server hung in its shutdown): only SIGKILL stops it")
    f.add_argument("--sim-scheduler-hung", action="store_true",
                   help="the scheduler stops (an NCCL hang); usually set mid-run: POST /sim/faults")
    f.add_argument("--sim-health-check-timeout-s", type=float, default=20.0,
                   help="a hung scheduler's /health answers 503 after this long (SGLANG_HEALTH_CHECK_TIMEOUT)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sglang_sim",
        description="SGLang simulator: a stand-in server that speaks SGLang's HTTP API (it is not SGLang).",
        allow_abbrev=False,
    )
    _sglang_flags(p)
    _sim_flags(p)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check the flags; on a bad flag or value prints usage and exits 2 (argparse)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.time_scale <= 0:
        parser.error(f"--time-scale must be > 0 (got {ns.time_scale})")
    if ns.served_model_name is None:
        ns.served_model_name = ns.model_path
    if not 0.0 <= ns.sim_kv_perturb <= 1.0:
        parser.error(f"--sim-kv-perturb must be in [0, 1] (got {ns.sim_kv_perturb})")
    if ns.sim_no_graph_factor is not None and ns.sim_no_graph_factor < 1.0:
        parser.error(f"--sim-no-graph-factor must be >= 1 (got {ns.sim_no_graph_factor})")
    if ns.sim_accept_length < 1.0:
        parser.error(f"--sim-accept-length must be >= 1 (got {ns.sim_accept_length})")
    if ns.kv_cache_dtype == "bfloat16":
        ns.kv_cache_dtype = "bf16"
    try:
        ns.faults = fault_settings(ns)
    except ValueError as e:
        parser.error(str(e))
    return ns


def fault_settings(ns: argparse.Namespace) -> FaultSettings:
    """The --sim-* fault flags as FaultSettings. Raises ValueError on an out-of-range value."""
    return FaultSettings(
        crash_after=ns.sim_crash_after, error_rate=ns.sim_error_rate, error_status=ns.sim_error_status,
        too_many_rate=ns.sim_too_many_rate, stall_rate=ns.sim_stall_rate, stall_s=ns.sim_stall_s,
        cut_rate=ns.sim_cut_rate, bad_json_rate=ns.sim_bad_json_rate,
        wrong_content_type_rate=ns.sim_wrong_content_type_rate, no_usage_rate=ns.sim_no_usage_rate,
        empty_turn_rate=ns.sim_empty_turn_rate, loop_rate=ns.sim_loop_rate, leak_rate=ns.sim_leak_rate,
        marker_only_rate=ns.sim_marker_only_rate,
        health_503_after_s=ns.sim_health_503_after_s, health_503_for_s=ns.sim_health_503_for_s,
        never_healthy=ns.sim_never_healthy, scheduler_hung=ns.sim_scheduler_hung,
        health_check_timeout_s=ns.sim_health_check_timeout_s, seed=ns.sim_seed,
    )


def server_args_dict(ns: argparse.Namespace) -> dict[str, Any]:
    """The flat server args as /server_info dumps them (SGLang: dataclasses.asdict(ServerArgs))."""
    return {k: v for k, v in vars(ns).items() if k != "faults"}
