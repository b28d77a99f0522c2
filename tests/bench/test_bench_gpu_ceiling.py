"""The GPU check's phase `ceiling`: its plan, the commands it gives SGLang's two clients, what it reads
from SGLang's decode log, and its result shape through the report, on a synthetic result."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.gpu import ceiling, h200_check, offline_engine, report
from bench.gpu.offline_engine import engine_flags
from bench.gpu.setup import LONG_DATASET, SHORT_DATASET, write_configs
from gen_pipeline.config.server import load_server_profile
from gen_pipeline.server.command import build_command

pytestmark = pytest.mark.bench  # make bench-test


def test_plan_alternates_regimes_and_rotates_the_three_clients() -> None:
    assert ceiling.plan(2, ("short", "long")) == [
        (1, "short", "gen_pipeline"), (1, "short", "bench_serving"), (1, "short", "offline"),
        (1, "long", "gen_pipeline"), (1, "long", "bench_serving"), (1, "long", "offline"),
        (2, "long", "bench_serving"), (2, "long", "offline"), (2, "long", "gen_pipeline"),
        (2, "short", "bench_serving"), (2, "short", "offline"), (2, "short", "gen_pipeline")]
    assert ceiling.plan(3, ("short",), ("gen_pipeline", "bench_serving")) == [
        (1, "short", "gen_pipeline"), (1, "short", "bench_serving"), (2, "short", "bench_serving"),
        (2, "short", "gen_pipeline"), (3, "short", "gen_pipeline"), (3, "short", "bench_serving")]


def test_sampling_is_the_regimes_as_sglang_native_params_and_the_engine_the_servers_flags(tmp_path: Path) -> None:
    cfg = write_configs(tmp_path, "/models/rand", sim=False)
    launch = build_command(load_server_profile("h200", cfg / "server.toml"), port=1234, python="py")
    flags = engine_flags(launch)  # without metrics
    assert flags == [a for a in launch[3:] if a != "--enable-metrics"] and "--enable-metrics" in launch
    assert flags[:2] == ["--model-path", "/models/rand"] and "--max-total-tokens" in flags
    assert ceiling.native_sampling(cfg / f"{SHORT_DATASET}.toml") == {
        "max_new_tokens": 512, "temperature": 1.0, "top_p": 1.0, "ignore_eos": False}
    assert ceiling.native_sampling(cfg / f"{LONG_DATASET}.toml") == {
        "max_new_tokens": 4096, "temperature": 1.0, "top_p": 1.0, "ignore_eos": False, "min_new_tokens": 1000}
    odd = tmp_path / "odd.toml"
    odd.write_text("[sampling]\nmax_new_tokens = 8\ntemperature = 1.0\ntop_p = 1.0\n[sampling.extra_body]\n"
                   "logit_bias = 1\n")
    with pytest.raises(ValueError) as e:
        ceiling.native_sampling(odd)
    assert str(e.value) == (f"{odd}: [sampling.extra_body] logit_bias has no native name here; add it to "
                            "bench/gpu/ceiling.py NATIVE_NAMES (SGLang's protocol.py to_sampling_params)")


def test_bench_serving_runs_at_full_rate_on_our_prompts_and_sampling(tmp_path: Path) -> None:
    prompts = {"sharegpt": tmp_path / "p.json", "prompts": 1200}
    sampling = {"max_new_tokens": 4096, "temperature": 1.0, "top_p": 1.0, "ignore_eos": False, "min_new_tokens": 1000}
    argv = ceiling.bench_serving_argv("py", False, "http://h:1", prompts, sampling, tmp_path / "tok",
                                      tmp_path / "o.jsonl")
    assert argv == ["py", "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", "http://h:1",
                    "--dataset-name", "sharegpt", "--dataset-path", str(tmp_path / "p.json"), "--num-prompts", "1200",
                    "--sharegpt-output-len", "4096", "--request-rate", "inf", "--temperature", "1.0", "--top-p", "1.0",
                    "--disable-ignore-eos", "--extra-request-body",
                    '{"sampling_params": {"max_new_tokens": 4096, "temperature": 1.0, "top_p": 1.0, '
                    '"ignore_eos": false, "min_new_tokens": 1000}}',
                    "--tokenizer", str(tmp_path / "tok"), "--flush-cache", "--disable-tqdm",
                    "--output-file", str(tmp_path / "o.jsonl")]
    dry = ceiling.bench_serving_argv("py", True, "u", prompts, sampling, tmp_path, tmp_path)
    assert dry[2] == "bench.gpu.sglang_client"


def test_decode_speed_reads_the_steady_state_of_the_decode_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    before = "[x] Decode batch, #running-req: 999, #token: 1, token usage: 0.10, cuda graph: True, " \
             "gen throughput (token/s): 1.00, #queue-req: 0\n"
    lines = [(10, 1000.0, 5), (100, 9000.0, 5), (100, 10000.0, 5), (100, 11000.0, 5), (100, 10000.0, 0),
             (50, 6000.0, 0), (200, 1.0, 0), (200, 1.0, 0), (20, 2000.0, 0), (5, 800.0, 0)]
    log.write_text(before + "".join(
        f"[2026-12-05 10:00:{i:02d}] Decode batch, #running-req: {r}, #token: 5000, token usage: 0.30, cuda graph: "
        f"True, gen throughput (token/s): {g:.2f}, #queue-req: {q}\n" for i, (r, g, q) in enumerate(lines)))
    speed = ceiling.decode_speed(log, len(before))
    # lines 2..3 (from 20 % of 10 lines to the last one with requests queued)
    assert speed == {"lines": 10, "steady_lines": 2, "running_mean": 100.0, "gen_tok_s_mean": 10500.0,
                     "tok_s_per_running": 105.0}
    assert ceiling.decode_speed(tmp_path / "none.log", 0) == {"lines": 0}


def _row(rnd: int, regime: str, client: str, tok_s: float, per_running: float, prompt_tokens: int = 1000) -> dict:
    return {"round": rnd, "regime": regime, "client": client, "rc": 0, "rows": 10, "tok_s": tok_s,
            "prompt_tokens": prompt_tokens, "completion_tokens": 5000, "steady_tok_s": None, "trace_summary": {},
            "client_cpu_ms_per_1k_tokens": 40.0 if client != "offline" else None,
            "decode_log": {"tok_s_per_running": per_running}, "slots_log": round(tok_s / per_running, 1),
            "slots_trace": None}


def test_summary_and_report_on_a_synthetic_result() -> None:
    runs = [_row(1, "short", "gen_pipeline", 9700, 100), _row(1, "short", "bench_serving", 10000, 100),
            _row(1, "short", "offline", 11000, 110),
            _row(2, "short", "bench_serving", 9000, 90), _row(2, "short", "offline", 12000, 100),
            _row(2, "short", "gen_pipeline", 9600, 100),
            # gen_pipeline as it was before reader processes (--clients gen_pipeline-readers0)
            {**_row(1, "short", "gen_pipeline-readers0", 8000, 100), "readers_started": 0},
            {**_row(2, "short", "gen_pipeline-readers0", 8200, 100), "readers_started": 0}]
    for r in runs[0], runs[5]:  # two readers read its answers: the main process's share of the client CPU
        r.update(readers_started=2, main_cpu_ms_per_1k_tokens=6.0 if r is runs[0] else 8.0)
    s = ceiling.summarize_ceiling(runs)["short"]
    assert s["clients"]["offline"] == {
        "rounds": 2, "tok_s_median": 11500.0, "spread": 0.087, "slots_log_median": 110.0, "slots_trace_median": None,
        "tok_s_per_running_median": 105.0, "prompt_tokens": [1000], "client_cpu_ms_per_1k_tokens_median": None,
        "main_cpu_ms_per_1k_tokens_median": None, "readers_started": []}
    assert (s["clients"]["gen_pipeline"]["main_cpu_ms_per_1k_tokens_median"],
            s["clients"]["gen_pipeline"]["readers_started"]) == (7.0, [2])
    assert s["over_gen_pipeline-readers0"]["median"] == round(9650 / 8100, 3)
    assert s["over_gen_pipeline-readers0"]["per_round"] == {"1": round(9700 / 8000, 3), "2": round(9600 / 8200, 3)}
    assert s["over_bench_serving"] == {
        "of": "bench_serving", "median": 1.016, "per_round": {"1": 0.97, "2": 1.067}, "per_round_median": 1.018,
        "per_round_log": {"1": 0.97, "2": 0.96}, "per_round_log_median": 0.965,
        "per_round_trace": {}, "per_round_trace_median": None}
    assert s["over_better"]["of"] == "offline" and s["over_better"]["median"] == 0.839
    assert s["over_better"]["per_round_log"] == {"1": 0.97, "2": 0.8}
    assert ceiling.headline({"short": s})["short"]["over_offline"] == {
        "of": "offline", "median": 0.839, "per_round_median": 0.841, "gpu_factored_out_median": 0.885}
    c = {"date": "2026-12-06", "sim": False, "profile": "h200",
         "short": {"runs": [{**r, "trace": []} for r in runs]},
         "prompts": {"short": {"prompts": 10, "prompt_tokens": 1000, "retokenized_differ": 0}}}
    text = report.ceiling_markdown(c, "h200_traces_vs_sglang.json", "CMD")
    assert text.startswith("## gen_pipeline against SGLang's own ceiling (`bench/gpu/` phase `ceiling`): "
                           "h200_traces_vs_sglang.json\n\nRun 2026-12-06 on the H200 ")
    assert "| short | SGLang offline engine | 2 | 11,500 | 9 % | 105.0 | 110.0 | - | 1,000 | - |" in text
    assert ("| short | the better of the two | SGLang offline engine | **0.839** | 0.882 / 0.8 | 0.841 | "
            "0.97 / 0.8 | 0.885 | - | None |") in text
    assert "Offline engine not run" not in text and "failed" not in text
    small = report.ceiling_markdown({**c, "profile": "h200-small"}, "f.json", "CMD")
    assert "the random-weight 9.8M Llama (shape `small`: hidden 512, 4 layers) of bench/gpu/make_model.py" in small
    assert "profile h200-small: 400,000 bf16 KV tokens, 512 running, CUDA graphs up to 512" in small
    failed = report.ceiling_markdown({**c, "offline_errors": ["the offline engine exited before it was ready; last "
                                                              "lines of x.log:\nOOM"]}, "f.json", "CMD")
    assert ("The offline engine failed 1 time(s), first: `the offline engine exited before it was ready; last lines "
            "of x.log:`.") in failed


def test_dry_run_skips_the_offline_engine_with_a_line_and_runs_no_client_when_none_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = h200_check.main(["--work", str(tmp_path), "--sim", "--clients", "offline", "ceiling"])
    out = capsys.readouterr().out
    r = json.loads((tmp_path / "results.json").read_text())
    assert rc == 0 and "errors" not in r and r["ceiling"]["runs"] == []
    assert ("ceiling: offline engine skipped (dry run: SGLang's offline engine needs a GPU (sglang.Engine); "
            "not run)") in out
    assert "ceiling: no client to run (--clients names none of gen_pipeline, bench_serving, offline)" in out


FAKE_ENGINE = '''
import sys


class Engine:
    """sglang.srt.entrypoints.engine.Engine as bench/gpu/offline_engine.py calls it, on no GPU."""

    def __init__(self, **server_args):
        self.argv = server_args["argv"]
        print("fake engine flags", " ".join(self.argv), flush=True)

    def flush_cache(self):
        print("fake engine flush", flush=True)

    def generate(self, input_ids, sampling_params):
        print(f"fake engine generate {len(input_ids)} {sampling_params[0]}", flush=True)
        for running, queued in ((len(input_ids), 1), (len(input_ids), 0)):
            print(f"Decode batch, #running-req: {running}, #token: 9, token usage: 0.01, cuda graph: True, "
                  f"gen throughput (token/s): {100.0 * running:.2f}, #queue-req: {queued}", file=sys.stderr, flush=True)
        return [{"meta_info": {"completion_tokens": 7, "finish_reason": {"type": "stop"}}} for _ in input_ids]

    def get_server_info(self):
        return {"internal_states": [{"last_gen_throughput": 123.0}]}

    def shutdown(self):
        print("fake engine shutdown", flush=True)
'''
FAKE_SERVER_ARGS = '''
import argparse
import dataclasses


@dataclasses.dataclass
class ServerArgs:
    argv: list

    @staticmethod
    def add_cli_args(parser):
        parser.parse_args = lambda args=None, namespace=None: argparse.Namespace(argv=list(args))

    @classmethod
    def from_cli_args(cls, args):
        return cls(argv=args.argv)
'''


def _fake_sglang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in `sglang` package (Engine, ServerArgs) first on the PYTHONPATH of the processes started."""
    fake = tmp_path / "fake"
    for pkg in ("sglang", "sglang/srt", "sglang/srt/entrypoints"):
        (fake / pkg).mkdir(parents=True)
        (fake / pkg / "__init__.py").write_text("")
    (fake / "sglang/srt/entrypoints/engine.py").write_text(FAKE_ENGINE)
    (fake / "sglang/srt/server_args.py").write_text(FAKE_SERVER_ARGS)
    monkeypatch.setenv("PYTHONPATH", f"{fake}{os.pathsep}{Path(__file__).resolve().parents[2]}")


def test_the_offline_engine_process_runs_jobs_and_shuts_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/gpu/offline_engine.py as a process against a stand-in of SGLang's Engine: the profile's flags,
    one warm-up, one job per line (flush, one generate), the result file, the decode log, a clean shutdown."""
    _fake_sglang(tmp_path, monkeypatch)
    cfg = write_configs(tmp_path / "work", "/models/rand", sim=False)
    logs = tmp_path / "logs"
    logs.mkdir()
    engine = offline_engine.Engine.start(cfg, "h200", logs, timeout_s=120)
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps([[1, 2, 3]] * 20))
    sampling = {"max_new_tokens": 512, "temperature": 1.0, "top_p": 1.0, "ignore_eos": False}
    warm, _ = engine.run(ids, sampling, tmp_path / "w.json", timeout_s=60, warmup=True)
    start = engine.log.stat().st_size
    result, wall_s = engine.run(ids, sampling, tmp_path / "r.json", timeout_s=60)
    speed = ceiling.decode_speed(engine.log, start)
    engine.stop()
    assert engine.proc.returncode == 0 and wall_s > 0 and warm == {"warmed": 16}
    assert {k: v for k, v in result.items() if k not in ("duration", "output_throughput", "request_throughput")} == {
        "completed": 20, "total_output_tokens": 140, "total_input_tokens": 60, "finish_reasons": {"stop": 20},
        "last_gen_throughput": 123.0}
    assert result["output_throughput"] == pytest.approx(140 / result["duration"])
    assert speed == {"lines": 2, "steady_lines": 1, "running_mean": 20.0, "gen_tok_s_mean": 2000.0,
                     "tok_s_per_running": 100.0}
    log = engine.log.read_text()
    assert "fake engine flags --model-path /models/rand --tp-size 1" in log and "--enable-metrics" not in log
    assert "fake engine generate 16 {'max_new_tokens': 16, 'temperature': 1.0, 'top_p': 1.0, 'ignore_eos': False, " \
           "'min_new_tokens': 0}" in log  # the warm-up
    assert log.count("fake engine flush") == 1 and log.rstrip().endswith("fake engine shutdown")


def _ceiling_phase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clients: str, *flags: str) -> tuple[Path, dict]:
    """Phase ceiling (2 rounds of 40 short prompts) on the simulator's configs, the stand-in engine in SGLang's
    place; its work folder and results, asserted clean."""
    _fake_sglang(tmp_path, monkeypatch)
    monkeypatch.setattr(ceiling, "offline_skip_reason", lambda check: None)
    work = tmp_path / "work"
    rc = h200_check.main(["--work", str(work), "--sim", "--regimes", "short", "--short-prompts", "40", "--rounds", "2",
                          "--clients", clients, *flags, "setup", "ceiling", "unserve"])
    r = json.loads((work / "results.json").read_text())
    assert rc == 0 and "errors" not in r
    return work, r


def test_the_phase_runs_the_offline_engine_once_per_call_and_records_its_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Phase ceiling with --clients offline on the simulator's configs, the stand-in engine in SGLang's place:
    one engine for both rounds, warmed once, each run's figures, GPU speed and traces entry; stopped at the end."""
    work, r = _ceiling_phase(tmp_path, monkeypatch, "offline")
    c = r["ceiling"]
    assert len(c["engine_ready_s"]) == 1 and "offline_errors" not in c
    assert [(x["round"], x["regime"], x["client"], x["rc"], x["rows"], x["completion_tokens"]) for x in c["runs"]] == [
        (1, "short", "offline", 0, 40, 280), (2, "short", "offline", 0, 40, 280)]
    assert c["prompts"]["short"]["prompts"] == 40 and c["prompts"]["short"]["retokenized_differ"] == 0
    for x in c["runs"]:
        assert x["decode_log"]["tok_s_per_running"] == 100.0 and x["slots_log"] == round(x["tok_s"] / 100.0, 1)
    log = (work / "logs" / "offline-engine.log").read_text()
    assert log.count("fake engine generate 16 ") == 1 and log.count("fake engine generate 40 ") == 2
    assert log.count("fake engine flags") == 1 and log.rstrip().endswith("fake engine shutdown")
    t = json.loads((work / "traces.json").read_text())["ceiling"]
    assert [x["round"] for x in t["short"]["runs"]] == [1, 2]
    assert t["summary"]["short"]["clients"]["offline"]["rounds"] == 2


def test_offline_alone_stops_the_server_for_each_engine_run_and_starts_it_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--offline-alone: the engine first in each round, the server stopped for it and started again after."""
    assert ceiling.plan(2, ("short",), offline_first=True) == [
        (1, "short", "offline"), (1, "short", "gen_pipeline"), (1, "short", "bench_serving"),
        (2, "short", "offline"), (2, "short", "bench_serving"), (2, "short", "gen_pipeline")]
    work, r = _ceiling_phase(tmp_path, monkeypatch, "offline,gen_pipeline", "--offline-alone")
    assert "offline_errors" not in r["ceiling"]
    assert [(x["round"], x["client"], x["rc"], x["rows"]) for x in r["ceiling"]["runs"]] == [
        (1, "offline", 0, 40), (1, "gen_pipeline", 0, 40), (2, "offline", 0, 40), (2, "gen_pipeline", 0, 40)]
    log = (work / "logs" / "offline-engine.log").read_text()
    assert log.count("fake engine flags") == 2 and log.count("fake engine shutdown") == 2  # one engine per run
    starts = [ln for ln in (work / "logs" / "h200.log").read_text().splitlines() if ln.startswith("$ ")]
    assert len(starts) == 2  # after each offline run (the offline run comes first: no start before it)
    assert all(v is None for v in r["servers"].values())


def test_another_profiles_ceiling_runs_in_the_same_work_folder_start_afresh(tmp_path: Path) -> None:
    """The device run of 2026-12-07 ran profile h200-small-i1 after h200-small in one work folder: gen_pipeline's
    runs resumed the first profile's output folders (the same names) and wrote nothing. A run's name now holds
    its profile."""
    args = ["--work", str(tmp_path), "--sim", "--time-scale", "20", "--regimes", "short", "--short-prompts", "60",
            "--rounds", "1", "--clients", "gen_pipeline", "ceiling", "unserve"]
    assert h200_check.main(["--server-profile", "h200-small", *args[:-2], "setup", *args[-2:]]) == 0
    results = tmp_path / "results.json"
    r = json.loads(results.read_text())
    r["ceiling_first"] = r.pop("ceiling")  # as bench/gpu/README.md says between two profiles
    results.write_text(json.dumps(r))
    assert h200_check.main(["--server-profile", "h200-small-i1", *args]) == 0
    [row] = json.loads(results.read_text())["ceiling"]["runs"]
    log = (tmp_path / "out" / "ceiling-h200-small-i1-short-gen_pipeline-1" / SHORT_DATASET / "run.log").read_text()
    assert "run of h200short: 0/3,000 samples done" in log and row["rows"] == 60 and row["completion_tokens"] > 0
    assert (tmp_path / "out" / "ceiling-h200-small-short-gen_pipeline-1").is_dir()
