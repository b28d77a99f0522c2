"""The GPU check's pieces (bench/gpu/) on this machine: configs, output counting, the simulator dry
run through real processes, the sim-vs-real fit, and the committed H200 results."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from bench import sim_vs_real as svr
from bench import sim_vs_real_long as long_regime
from bench.engine_run import run_traced
from bench.gpu import ceiling, h200_check, regimes, report, runs, setup
from bench.gpu.make_model import SHAPES
from bench.gpu.regimes import summarize_regimes
from bench.gpu.setup import KV_TOKENS, PROMPTS, SPEC_DATASET, SPEC_SAMPLES, STARVED_KV_TOKENS, write_configs
from bench.gpu.traces import decode_speed, summarize
from bench.sim_vs_real_long import step_line
from gen_pipeline.config.dataset import find_dataset_config
from gen_pipeline.config.server import load_server_profile
from gen_pipeline.server.command import build_command, build_env
from sglang_sim.profiles import get_profile

pytestmark = pytest.mark.bench  # make bench-test


def test_profiles_build_the_flags_the_check_needs(tmp_path: Path) -> None:
    cfg = write_configs(tmp_path, "/models/rand", sim=False)
    argv = {name: build_command(load_server_profile(name, cfg / "server.toml"), port=1234, python="py")
            for name in ("h200", "h200-fp8", "h200-starved", "h200-starved-eager", "probe-bf16", "probe-fp8",
                         "h200-spec", "h200-small", "h200-small-i1", "h200-small-i1-tw4", "h200-small-fast")}
    main = " ".join(argv["h200"])
    assert argv["h200"][:3] == ["py", "-m", "sglang.launch_server"]
    for flag in ("--model-path /models/rand", "--attention-backend triton", "--sampling-backend pytorch",
                 "--enable-metrics", f"--max-total-tokens {KV_TOKENS}", "--port 1234"):
        assert flag in main
    assert "--kv-cache-dtype fp8_e4m3" in " ".join(argv["h200-fp8"]) and "--max-total-tokens" not in argv["h200-fp8"]
    assert f"--max-total-tokens {STARVED_KV_TOKENS}" in " ".join(argv["h200-starved"])
    assert "--schedule-conservativeness 0.3" in " ".join(argv["h200-starved-eager"])
    assert "--mem-fraction-static 0.4" in " ".join(argv["probe-fp8"])
    assert "NCCL_NVLS_ENABLE" not in load_server_profile("h200", cfg / "server.toml").env
    ds = find_dataset_config(str(cfg / "h200.toml"), cfg)
    assert ds.target_samples == PROMPTS and ds.sampling.max_new_tokens == 512
    ids = [json.loads(line)["id"] for line in (cfg / "prompts.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == PROMPTS
    # the spec profile runs the target as its own draft
    spec = " ".join(argv["h200-spec"])
    assert ("--speculative-algorithm STANDALONE --speculative-draft-model-path /models/rand --speculative-num-steps 3 "
            "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --disable-cuda-graph") in spec, spec
    ds = find_dataset_config(str(cfg / f"{SPEC_DATASET}.toml"), cfg)
    # greedy and whole answers: 0.5.17 returns meta_info (the acceptance) only to a request that does not stream
    assert ds.target_samples == SPEC_SAMPLES and ds.sampling.temperature == 0.0 and ds.generation.on_loop == "off"
    # the small model's profile serves the small shape with graphs over its whole batch
    small = " ".join(argv["h200-small"])
    assert "--model-path /models/rand-small " in small and "--max-total-tokens 400000" in small, small
    assert "--max-running-requests 512 --cuda-graph-max-bs 512" in small and SHAPES["small"][0] == 512
    # ... and at SGLang's default stream interval, the flag after the shared --stream-interval 8 (the last wins)
    i1 = argv["h200-small-i1"]
    assert " ".join(i1).replace(" --stream-interval 1", "") == small
    assert max(i for i, a in enumerate(i1) if a == "--stream-interval") > i1.index("--stream-interval")
    # ... and that with SGLang's front end in 4 processes
    assert " ".join(argv["h200-small-i1-tw4"]) == " ".join(i1) + " --tokenizer-worker-num 4"
    # ... and the fast one: twice the batch and pool at interval 8, its front end in 4 processes
    assert " ".join(argv["h200-small-fast"]) == small.replace("400000", "800000").replace("512", "1024") + (
        " --tokenizer-worker-num 4")


def test_sim_profiles_point_at_the_simulator(tmp_path: Path) -> None:
    cfg = write_configs(tmp_path, "sim/m", sim=True, time_scale=5)
    p = load_server_profile("probe-fp8", cfg / "server.toml")
    argv = build_command(p, port=1, python="py")
    assert argv[:3] == ["py", "-m", "sglang_sim"] and "--sim-profile" in argv and "h200" in argv
    assert "--sim-kv-perturb" in argv and p.backend == "sim"
    assert "NCCL_NVLS_ENABLE" not in build_env(p, {})


def _row(i: str, content: str = "text", completion: int = 10) -> bytes:
    return orjson.dumps({"id": f"h200-{i}", "conversations": [{"role": "user", "content": "q"},
                         {"role": "assistant", "content": content}],
                         "meta": {"completion_tokens": completion, "prompt_tokens": 3, "finish_reason": "stop"}})


def test_read_outputs_counts_duplicates_missing_and_empty_turns(tmp_path: Path) -> None:
    (tmp_path / "shard-00000.jsonl").write_bytes(b"\n".join([_row("p0"), _row("p1", " "), _row("p0")]) + b"\n")
    (tmp_path / "shard-00001.jsonl").write_bytes(_row("p2", completion=5) + b"\n" + b'{"torn')
    out = runs.read_outputs(tmp_path, {"p0", "p1", "p2", "p3"})
    assert (out["rows"], out["unique"], out["duplicates"], out["missing"]) == (4, 3, 1, 1)
    assert out["unparseable"] == 1 and out["empty_assistant_turns"] == 1 and out["completion_tokens"] == 35
    assert runs.lengths(tmp_path) == [[3, 10], [3, 10], [3, 10], [3, 5]]


def test_dry_run_on_the_simulator_kills_and_resumes_exactly_once(tmp_path: Path) -> None:
    """setup, serve, kill (two SIGKILLs + resume), unserve, summary through real processes."""
    rc = h200_check.main(["--work", str(tmp_path), "--sim", "--prompts", "300", "--time-scale", "2",
                          "--kill-after-s", "0.5", "setup", "serve", "kill", "unserve", "summary"])
    r = json.loads((tmp_path / "results.json").read_text())
    assert rc == 0 and "errors" not in r
    k = r["kill"]
    assert k["attempts"][0]["killed"] and k["attempts"][0]["rc"] == -9
    assert (k["rows"], k["duplicates"], k["missing"], k["unparseable"]) == (300, 0, 0, 0)
    assert k["resume_rc"] == 0 and r["summary"]["kill"]["missing"] == 0
    assert all(v is None for v in r["servers"].values()) and r["leftover_at_end"] == []


def test_fit_recovers_a_known_step_time_model() -> None:
    """Sweep figures made by the simulator with known coefficients: the fit finds them again."""
    rng = random.Random(3)
    lengths = [(rng.randint(100, 300), rng.randint(1, 512)) for _ in range(400)]
    truth = get_profile("h200").__class__(**{**vars(get_profile("h200")), "step_base_s": 0.003,
                                            "decode_per_req_s": 2e-5, "decode_per_kv_token_s": 5e-8})
    real = svr.RealRun("synthetic", {}, [], lengths, 20_000, 8192, 4096)
    fixed, _ = svr.simulate(real, truth)
    real = svr.RealRun("synthetic", {k: r.gen_tok_s for k, r in fixed.items()}, [], lengths, 20_000, 8192, 4096)
    fitted, info = svr.fit(real, get_profile("h200"))
    assert info["max_rel_makespan_error"] < 0.01
    # per-request and per-KV-token costs trade off on one job; what must hold is the curve itself
    again, _ = svr.simulate(real, fitted)
    for k, r in again.items():
        assert r.gen_tok_s == pytest.approx(real.fixed_tok_s[k], rel=0.01), k
    assert fitted.step_base_s == pytest.approx(0.003, rel=0.2)


def test_committed_h200_results_give_the_tables() -> None:
    r = json.loads(report.RESULTS.read_text())
    text = report.markdown(r)
    assert "1,500 rows, 0 duplicated, 0 missing" in text
    assert "| fixed 128 | 16,372 |" in text and "SGLang ready after 79 s" in text
    assert "| bf16 vs fp8_e4m3 KV | 200 | 1.0 % |" in text and "| bf16 vs itself (noise floor) | 200 |" in text
    real = svr.mean_real(svr.load_real())
    c = svr.compare(real, *svr.simulate(real, get_profile("h200")), svr.load_real().fixed_tok_s)
    assert c["all_within_10pct"], c["rows"]


# ---- phase `regimes` and the traces it records


def test_regimes_interleave_regimes_and_rotate_clients_and_can_run_some(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    p = regimes.plan(3)
    assert len(p) == 18 and len(set(p)) == 18
    assert p[:6] == [(1, "short", "fixed-128"), (1, "short", "all"), (1, "short", "adaptive"),
                     (1, "long", "fixed-40"), (1, "long", "all"), (1, "long", "adaptive")]
    assert p[6:9] == [(2, "long", "all"), (2, "long", "adaptive"), (2, "long", "fixed-40")]
    assert [c for r, g, c in p if (r, g) == (3, "short")] == ["adaptive", "fixed-128", "all"]
    # --clients all,adaptive leaves the fixed windows out of every round; the long dataset holds 900 prompts
    # (the first 300 the default runs' own); an unknown client name is refused with the known ones
    p = regimes.plan(2, ("long", "short"), frozenset({"all", "adaptive"}))
    assert p == [(1, "long", "all"), (1, "long", "adaptive"), (1, "short", "all"), (1, "short", "adaptive"),
                 (2, "short", "adaptive"), (2, "short", "all"), (2, "long", "adaptive"), (2, "long", "all")]
    cfg = setup.write_configs(tmp_path, "model", sim=True)
    rows = (cfg / "prompts-long.jsonl").read_text().splitlines()
    assert len(rows) == setup.LONG_PROMPTS_MAX == 900 and "target_samples = 900" in (cfg / "h200long.toml").read_text()
    setup.write_long_prompts(tmp_path / "first.jsonl", setup.LONG_PROMPTS)
    assert (tmp_path / "first.jsonl").read_text().splitlines() == rows[:setup.LONG_PROMPTS]
    with pytest.raises(SystemExit) as e:
        h200_check.main(["regimes", "--work", str(tmp_path / "w"), "--sim", "--clients", "all,adaptiv"])
    assert e.value.code == 2
    known = ("adaptive, all, bench_serving, fixed-128, fixed-256, fixed-40, gen_pipeline, gen_pipeline-readers0, "
             "gen_pipeline-readers4, offline")
    assert f"--clients: unknown adaptiv (known: {known})" in capsys.readouterr().err

def _trace(running: list[int], queued: list[int]) -> list[dict]:
    return [{"t_s": float(t), "running": r, "queued": q, "token_usage": 0.01 * r, "new_token_ratio": 0.7 if t < 3 else
             0.098, "gen_throughput": 250.0 * r, "retractions_total": 0 if t < 10 else 2,
             "gen_tokens_total": 1000 * t} for t, (r, q) in enumerate(zip(running, queued, strict=True))]


def test_a_trace_summary_reads_first_round_ramp_and_steady_state() -> None:
    running = [0, 16, 16, 30, 38, 40, 40, 39, 40, 41, 40, 40, 38, 20, 5]
    queued = [0, 20, 20, 10, 8, 8, 9, 8, 7, 9, 8, 3, 0, 0, 0]
    s = summarize(_trace(running, queued))
    assert s["first_round"] == {"t_s": 1.0, "running": 16}
    assert s["ramp_s"] == 4.0  # 38 >= 0.9 x the steady median 40
    assert s["steady_s"] == [4.0, 11.0] and s["steady_running_mean"] == 39.8 and s["steady_queued_max"] == 9
    assert s["ratio_warm_s"] == 3.0 and s["retractions"] == 2 and s["steady_gen_throughput_mean"] == 250 * 39.75


def _regime_row(client: str, rnd: int, tok_s: float, steady: float | None, diagnose: tuple[str, ...] = (),
                **summary: object) -> dict:
    return {"regime": "long", "client": client, "round": rnd, "rc": 0, "tok_s": tok_s, "steady_tok_s": steady,
            "trace_summary": {"ramp_s": 3.0, "steady_running_mean": 39.0, "steady_queued_mean": 10.0,
                              "steady_queued_max": 20, "retractions": 1, **summary}, "diagnose": list(diagnose)}


def test_regime_summary_gives_adaptive_over_the_best_median() -> None:
    def row(client: str, rnd: int, tok_s: float) -> dict:
        return _regime_row(client, rnd, tok_s, tok_s, ("kv_bound",))

    rows = [row("fixed-40", 1, 9800), row("fixed-40", 2, 10000), row("fixed-40", 3, 10400),
            row("all", 1, 10500), row("all", 2, 10200), row("all", 3, 11000),
            row("adaptive", 1, 10400), row("adaptive", 2, 10600), row("adaptive", 3, 10100)]
    s = summarize_regimes(rows)["long"]
    assert s["best_fixed"] == "all" and s["adaptive_over_best"] == round(10400 / 10500, 3)
    assert s["clients"]["all"]["spread"] == round(800 / 10500, 3) and s["clients"]["adaptive"]["rounds"] == 3


def test_per_round_ratios_with_the_gpu_speed_factored_out() -> None:
    """A GPU 20 % slower per running request during adaptive's run reads 0.8 whole-run and 1.0 factored out;
    fewer requests running at the same speed still counts; a run without steady figures leaves its round out."""
    def row(client: str, rnd: int, tok_s: float, running: float, per_request: float | None) -> dict:
        steady = None if per_request is None else running * per_request
        return _regime_row(client, rnd, tok_s, steady, steady_running_mean=running, retractions=rnd,
                           steady_gen_throughput_mean=steady)

    rows = [row("all", 1, 10_000, 42, 360), row("adaptive", 1, 8_000, 42, 288),  # the GPU, not the client
            row("all", 2, 10_000, 42, 360), row("adaptive", 2, 9_500, 40, 360),  # fewer running: the client
            row("all", 3, 10_000, 42, 360), row("adaptive", 3, 10_000, 42, None)]  # no steady figures
    s = summarize_regimes(rows)["long"]
    assert s["adaptive_over_best_per_round"] == {"1": 0.8, "2": 0.95, "3": 1.0}
    assert s["adaptive_over_best_per_round_gpu_normalized"] == {"1": 1.0, "2": 0.95}
    assert s["clients"]["adaptive"]["retractions_each"] == [1, 2, 3]

def test_the_real_lengths_overrun_the_pool_in_submission_order_not_in_completion_order() -> None:
    """The shards hold the real lengths in completion order, whose replay never overruns the pool; a seeded order
    overruns at the first cohort as the H200 did, and SGLang retracts. first_overrun() reads a real trace."""
    data = json.loads((long_regime.REAL_TRACES.parent / "h200_traces_run3.json").read_text())["long"]
    pairs = data["lengths"]
    assert sorted(map(tuple, long_regime.job_of_lengths(pairs, seed=1).lengths)) == sorted(
        map(tuple, long_regime.job_of_lengths(pairs).lengths))
    flood = len(pairs)
    _, in_completion_order = run_traced(long_regime.job_of_lengths(pairs), long_regime.LongServer(), flood)
    assert long_regime.first_overrun(in_completion_order)["retractions_run"] == 0
    _, shuffled = run_traced(long_regime.job_of_lengths(pairs, seed=1), long_regime.LongServer(), flood)
    head = long_regime.first_overrun(shuffled)
    first = next(r["t_s"] for r in shuffled if r["retractions_total"])
    assert head["retractions"] == 10 and head["peak_running"] == 55 and head["peak_usage"] >= 0.99
    assert 6.0 < first <= 7.1  # the poll after it (once a second); the H200 showed it at 5.5-6.1 s
    real_all = next(r for r in data["runs"] if r["client"] == "all")
    assert long_regime.first_overrun(real_all["trace"]) == {"peak_running": 52, "peak_usage": 0.991,
                                                            "retractions": 2, "retractions_run": 2}


# ---- the long regime's simulator held to the traces at the traced host's speed (bench/sim_vs_real_long.py)


def _poll(t_s: float, running: int, queued: int, ratio: float, step_ms: float | None) -> dict:
    return {"t_s": t_s, "running": running, "queued": queued, "token_usage": 0.01 * running,
            "new_token_ratio": ratio, "gen_throughput": 1e3 * running / step_ms if step_ms else 0.0,
            "retractions_total": 0, "gen_tokens_total": 0}


def test_decode_speed_reads_the_first_round_and_the_steady_step() -> None:
    trace = [_poll(0.4, 0, 0, 0.098, None)]  # the ratio the previous run left, nothing running yet
    trace += [_poll(t + 0.4, 13, 27, 0.7, 2.8) for t in range(1, 4)]  # the first round, 2.8 ms a step
    trace += [_poll(t + 0.4, 40, 5, 0.098, 3.4) for t in range(4, 17)]  # warm, 3.4 ms a step
    trace += [_poll(t + 0.4, r, 0, 0.098, 3.0) for t, r in ((17, 20), (18, 10), (19, 0))]  # the drain
    assert decode_speed(trace) == {"first_batch": 13, "first_step_ms": 2.8, "steady_batch": 40.0,
                                   "steady_step_ms": 3.4}
    assert decode_speed(trace[4:]) == {"first_batch": None, "first_step_ms": None, "steady_batch": 40.0,
                                       "steady_step_ms": 3.4}  # a client that started warm


def test_step_line_keeps_both_terms_non_negative() -> None:
    base = get_profile("h200")
    assert step_line([(40, 3.4), (15, 2.4)], base) == pytest.approx((0.0018, 4e-5))
    assert step_line([(15, 3.3), (40, 3.1)], base) == pytest.approx((0.0032, 0.0))  # the bigger batch faster
    step_base_s, per_req_s = step_line([(40, 3.6)], base)  # one figure: the profile's line, scaled
    assert step_base_s + 40 * per_req_s == pytest.approx(0.0036)
    assert step_base_s / per_req_s == pytest.approx(base.step_base_s / base.decode_per_req_s)
    assert step_line([], base) == (base.step_base_s, base.decode_per_req_s)


def test_fit_speed_finds_a_slower_host_and_ramps_where_its_trace_does() -> None:
    """A trace made on a host at 0.7 x the profile's speed: the fit finds that host's step times, and its run
    ramps at the same poll; the profile's own speed ramps at least a poll earlier."""
    base = get_profile("h200")
    slow = replace(base, step_base_s=base.step_base_s / 0.7, decode_per_req_s=base.decode_per_req_s / 0.7)
    job = long_regime.synthetic_job(120)

    def simulate_with(profile):
        return long_regime.run_client(job, "fixed-40", long_regime.LongServer(profile=profile), trace_phase_s=0.37)

    _, real_trace = simulate_with(slow)
    assert [r["t_s"] for r in real_trace[:3]] == [0.37, 1.37, 2.37]
    fitted, _, trace, info = long_regime.fit_speed(decode_speed(real_trace), base, simulate_with)
    for batch in (16, 40):
        assert fitted.step_time_s(batch, 0, 0) == pytest.approx(slow.step_time_s(batch, 0, 0), rel=0.02), batch
    assert info["max_rel_error"] <= long_regime.FIT_TOLERANCE and info["rounds"] >= 1
    real_ramp = summarize(real_trace)["ramp_s"]
    assert summarize(trace)["ramp_s"] == real_ramp
    assert real_ramp - info["unfitted"]["ramp_s"] >= 1.0


def test_sim_vs_real_long_holds_to_the_committed_h200_traces() -> None:
    """bench/gpu/h200_traces.json (run 4): every figure within its tolerance at the fitted speed."""
    c = long_regime.compare()
    assert c["source"] == "h200_traces.json (15 runs)"
    assert c["all_ok"], [r for r in c["rows"] if not r["ok"]]
    assert set(c["fits"]) == {"fixed-40", "all", "adaptive"}
    assert all(f["max_rel_error"] <= long_regime.FIT_TOLERANCE for f in c["fits"].values()), c["fits"]


def test_sim_vs_real_names_a_traces_file_it_cannot_use(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    missing, short_only = tmp_path / "none.json", tmp_path / "short.json"
    short_only.write_text('{"short": {"runs": []}}')
    for path, why in ((missing, "no such file; give a traces file the GPU check wrote "
                                "(bench/gpu/h200_traces*.json)"),
                      (short_only, 'no long-regime runs in it (the GPU check\'s phase `regimes` writes them '
                                   'under "long")')):
        with pytest.raises(SystemExit) as e:
            svr.main(["--regime", "long", "--traces", str(path)])
        assert e.value.code == 2
        assert f"python -m bench.sim_vs_real: error: --traces {path}: {why}\n" in capsys.readouterr().err


def test_the_spec_dry_run_records_each_turns_acceptance_through_the_launcher(tmp_path: Path) -> None:
    rc = h200_check.main(["--work", str(tmp_path), "--sim", "--time-scale", "10", "setup", "spec"])
    r = json.loads((tmp_path / "results.json").read_text())
    assert rc == 0 and "errors" not in r, r.get("errors")
    s = r["spec"]
    assert s["rc"] == 0 and s["rows"] == s["turns_with_acceptance"] == 300, s
    assert s["ready_line"].startswith("SGLang ready after") and s["leftover_processes"] == []
    # each turn's figure is its completion tokens over its verify steps, and status shows the turns' mean
    assert s["verify_ct_total"] > 0 and 1.0 <= s["accept_length_min"] <= s["accept_length_median"]
    assert s["status_spec_acceptance"]["turns"] == 300 and s["status_spec_acceptance"]["scope"] == "turns"


def test_the_frontend_dry_run_reads_the_launched_servers_main_process_and_diagnoses(tmp_path: Path) -> None:
    rc = h200_check.main(["--work", str(tmp_path), "--sim", "--time-scale", "2", "--server-profile", "h200-small-i1",
                          "setup", "frontend"])
    r = json.loads((tmp_path / "results.json").read_text())
    assert rc == 0 and "errors" not in r, r.get("errors")
    f = r["frontend"]["h200-small-i1"]
    assert f["rc"] == 0 and f["diagnose_rc"] == 0 and f["profile"] == "h200-small-i1"
    assert f["summary"].startswith("h200short: 1,500/3,000 samples") and f["rules"], f
    assert [x for x in f["front_end_cpu"] if x is not None], f  # the simulator's process, read through its watcher
    # a second profile in the same work folder (the device call runs -i1, then -i1-tw4) keeps the first's figures
    assert h200_check.main(["--work", str(tmp_path), "--sim", "--time-scale", "2", "--server-profile",
                            "h200-small-i1-tw4", "frontend"]) == 0
    both = json.loads((tmp_path / "results.json").read_text())["frontend"]
    assert both["h200-small-i1"] == f and both["h200-small-i1-tw4"]["rc"] == 0, both
    text = report.frontend_markdown(json.loads((tmp_path / "results.json").read_text()), "results.json", "cmd")
    assert "| h200-small-i1-tw4 (`--stream-interval 1 --tokenizer-worker-num 4`) | " in text, text


def test_the_committed_frontend_run_renders_both_profiles_and_what_diagnose_named() -> None:
    """SGLang's front end at --stream-interval 1 on one H100 (2026-12-07): one process bound the run; with 4
    tokenizer workers the same 1,500 samples took 17 s instead of 25 and diagnose named only the tail."""
    r = json.loads((report.HERE / "h100_frontend_results.json").read_text())
    text = report.frontend_markdown(r, "h100_frontend_results.json", "cmd")
    i1 = "400,000 bf16 KV tokens, 512 running, CUDA graphs up to 512, --stream-interval 1"
    assert (f"| h200-small-i1 (`--stream-interval 1`) | {i1} | 0 | 25s | 11,038 | 1.01 | 0.07 | front_end_bound, "
            "idle_tail |") in text, text
    assert (f"| h200-small-i1-tw4 (`--stream-interval 1 --tokenizer-worker-num 4`) | {i1}, 4 tokenizer workers | 0 | "
            "17s | 18,985 | 0.03 | 0.08 | idle_tail |") in text, text
    assert "the telemetry of this run read only it" in text  # measured before the meter read the workers
    # the meter that reads the workers, on a live server with 4 of them: the busiest at ~0.6 of a core, not 0.03
    fast = json.loads((report.HERE / "h100_frontend_fast_results.json").read_text())
    text = report.frontend_markdown(fast, "h100_frontend_fast_results.json", "cmd")
    assert ("| h200-small-fast (`--stream-interval 8 --tokenizer-worker-num 4, 1,024 running`) | 800,000 bf16 KV "
            "tokens, 1,024 running, CUDA graphs up to 1,024, 4 tokenizer workers | 0 | 7s | 60,489 | 0.62 | 0.03 | "
            "idle_tail |") in text, text
    assert "the busiest of SGLang's front-end processes" in text


def test_the_committed_h100_runs_render_what_the_server_measured() -> None:
    spec = json.loads((report.HERE / "h100_spec_results.json").read_text())
    text = report.spec_markdown(spec, "h100_spec_results.json", "cmd")
    assert "| turns written / with an acceptance | 300 / 300 |" in text
    assert "| `status --json` spec_acceptance | 1.254 over 300 turns |" in text
    assert "| SGLang's decode log `accept len` (first lines) | 1.20 / 1.20 / 1.26 |" in text
    runs = [r for r in json.loads((report.HERE / "h100_traces_ceiling_run3.json").read_text())["short"]["runs"]]
    assert report._cpu_line(runs).startswith(
        "CPU over each run, as a share of one core (medians of 12 runs): SGLang's HTTP server + tokenizer manager "
        "0.69, detokenizer 0.16, scheduler 1.02; gen_pipeline's client 0.71.")


def test_the_committed_h100_ceiling_runs_give_the_ratios_the_run_printed() -> None:
    """The small-model and long-regime calls of 2026-12-06: the summary recomputed from the runs is the one
    the device printed, and the small model's case names the diagnose verdict it got on a real run."""
    small = json.loads((report.HERE / "h100_traces_vs_sglang_small.json").read_text())["ceiling"]
    long_ = json.loads((report.HERE / "h100_traces_vs_sglang_long.json").read_text())["ceiling"]
    heads = {k: ceiling.headline(ceiling.summarize_ceiling(c[k]["runs"]))[k] for k, c in
             (("short", small), ("long", long_))}
    assert heads["short"]["over_bench_serving"]["median"] == 1.245 and heads["short"]["over_offline"]["median"] == 0.98
    assert heads["long"]["over_bench_serving"]["median"] == 0.978 and heads["long"]["over_better"]["median"] == 0.956
    verdicts = [r.get("diagnose") for r in small["short"]["runs"] if r["client"] == "gen_pipeline"]
    assert verdicts.count(["client_bound"]) == 1 and len(verdicts) == 3
    # 600 long prompts (2026-12-06, second session), gen_pipeline and the engine only: the start weighs half as much
    long600 = json.loads((report.HERE / "h100_traces_vs_sglang_long600.json").read_text())["ceiling"]["long"]["runs"]
    head = ceiling.headline(ceiling.summarize_ceiling(long600))["long"]["over_offline"]
    assert head == {"of": "offline", "median": 0.969, "per_round_median": 0.975, "gpu_factored_out_median": 0.977}
    # its last call, bench_serving in place of the engine (one round of gen_pipeline: the budget ended)
    bs = json.loads((report.HERE / "h100_traces_vs_sglang_long600_bs.json").read_text())["ceiling"]["long"]["runs"]
    assert ceiling.headline(ceiling.summarize_ceiling(bs))["long"]["over_bench_serving"]["median"] == 0.991


def test_past_the_graph_ceiling_sglangs_own_clients_run_graphless_and_gen_pipeline_does_not() -> None:
    """The EOS / large fp8 pool regime (profile h200-ceiling, 2,000 short prompts, 2026-12-06 third session)."""
    c = json.loads((report.HERE / "h100_traces_vs_sglang_ceiling.json").read_text())["ceiling"]
    runs = c["short"]["runs"]
    head = ceiling.headline(ceiling.summarize_ceiling(runs))["short"]
    assert (head["over_bench_serving"]["median"], head["over_offline"]["median"]) == (2.102, 1.779)
    ours = [r for r in runs if r["client"] == "gen_pipeline"]
    assert [r["cuda_graph"]["false"] for r in ours] == [0, 0, 0] and all(r["rows"] == 2000 for r in runs)
    assert all(r["slots_log"] > 256 for r in runs if r["client"] != "gen_pipeline")  # past SGLang's graphs


def test_reader_processes_on_the_h100_took_the_reading_off_the_main_process() -> None:
    """The small model at stream interval 8 (2026-12-07): gen_pipeline as shipped started 3 readers in every run,
    its main process took ~10 ms per 1K tokens of ~45; with --readers 0 the one process took ~33 and ~0.85 of a
    core. The throughput did not move (SGLang's scheduler process at one core in every run)."""
    runs = json.loads((report.HERE / "h100_traces_readers_small.json").read_text())["ceiling"]["short"]["runs"]
    shipped = [r for r in runs if r["client"] == "gen_pipeline"]
    alone = [r for r in runs if r["client"] == "gen_pipeline-readers0"]
    assert len(shipped) == len(alone) == 3
    assert all(r["rows"] == 3000 and r["duplicates"] == 0 for r in shipped + alone)
    assert [r["readers_started"] for r in shipped] == [3, 3, 3] and [r["readers_started"] for r in alone] == [0] * 3
    assert all(r["main_cpu_ms_per_1k_tokens"] < 11 < 40 < r["client_cpu_ms_per_1k_tokens"] for r in shipped)
    assert all(r["client_core_share"] > 0.8 and r["server_core_share"]["sglang::schedul"] > 1 for r in alone)
    head = ceiling.headline(ceiling.summarize_ceiling(runs))["short"]
    assert head["over_gen_pipeline-readers0"]["median"] == 0.98


def test_the_small_model_at_1024_running_with_4_tokenizer_workers_is_level_with_bench_serving() -> None:
    """Profile h200-small-fast on one H100 (2026-12-07): 3,000 short prompts, 3 rounds interleaved; gen_pipeline
    0.99 x SGLang's bench_serving by medians (the issue's small-model goal: >= 0.95), every row written once, and
    SGLang's tokenizer workers, not its main process, carried the front end."""
    runs = json.loads((report.HERE / "h100_traces_small_fast.json").read_text())["ceiling"]["short"]["runs"]
    assert sorted(r["client"] for r in runs) == ["bench_serving"] * 3 + ["gen_pipeline"] * 3
    assert all(r["rows"] == 3000 for r in runs)
    ours = [r for r in runs if r["client"] == "gen_pipeline"]
    assert all(r["duplicates"] == 0 and r["server_core_share"]["leader"] < 0.1 < 1.0 < r["server_core_share"][
        "sglang::tokeniz"] for r in ours)
    head = ceiling.headline(ceiling.summarize_ceiling(runs))["short"]["over_bench_serving"]
    assert (head["median"], head["per_round_median"]) == (0.99, 0.99)
