"""`tune` on the simulator: the candidate the sim is told is fastest wins, the one whose answers change is
refused, the budget is stated first, the shipped trial's samples stay in the store once; bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pipeline_helpers import assert_exact, run_cli, write_dataset

PROMPTS = 12
# The shipped profile: bf16 KV, CUDA graphs up to batch 6, so a trial of 12 at once runs without them, each
# step 4x slower than with (the sim told so: a gap no load spike on a shared CI machine closes), slow enough
# (time scale 0.25) that the step, not the client, sets the pace.
SERVER_TOML = """
[profile.t]
model_path = "sim/Kimi-K2.5"
command = ["{python}", "-m", "sglang_sim"]
backend = "sim"
kv_cache_dtype = "bf16"
tp_size = 8
mem_fraction_static = 0.90
stream_interval = 8
extra_args = ["--sim-profile", "fast", "--time-scale", "0.25", "--sim-startup-s", "0", "--sim-output-mean", "40",
              "--sim-output-spread", "0.3", "--cuda-graph-max-bs", "6", "--sim-kv-perturb", "0.3",
              "--sim-no-graph-factor", "4"]
startup_timeout_s = 30
health_interval_s = 0.5
restart_backoff_s = 0.5
stop_grace_s = 3
"""


def _config(tmp_path: Path) -> tuple[Path, Path]:
    cfg = tmp_path / "cfg"
    write_dataset(cfg, target=20, max_new_tokens=64)
    (cfg / "server.toml").write_text(SERVER_TOML)
    return cfg, tmp_path / "out"


def _tune(cfg: Path, out: Path, *args: str):
    return run_cli("tune", "--dataset", "T", "--server-profile", "t", "--config-dir", cfg, "--output-dir", out,
                   "--prompts", str(PROMPTS), "--probe-prompts", "6", *args)


def test_tune_picks_the_fastest_refuses_changed_answers_and_keeps_its_samples(tmp_path: Path) -> None:
    cfg, out = _config(tmp_path)
    r = _tune(cfg, out, "--levers", "kv_cache_dtype,cuda_graph_max_bs", "--budget-s", "3600", "--rounds", "1")
    assert r.returncode == 0, r.stderr + r.stdout
    lines = r.stdout.splitlines()
    assert lines[0] == ("tune budget: 1h00m (--budget-s); 1 round(s) x 3 trials (the shipped t + 2 candidates) of "
                        "the job's next 12 prompts (the same for each), predicted 16s")
    # the sim's perturbation is seeded by the prompt, so the figures repeat exactly
    why = ("its answers differ from t's: top-1 changes on 26.61 % of 248 positions, mean KL >= 0.2545 nats, 0 % of "
           "6 greedy answers equal (probe-kv's limits: top-1 change <= 3 %, mean KL <= 0.05 nats)")
    trial = next(line for line in lines if line.startswith("  round 1: t+kv_cache_dtype=fp8_e4m3: "))
    assert trial.endswith(f" tok/s; refused: {why}")
    refused = next(line for line in lines if line.startswith("t+kv_cache_dtype=fp8_e4m3 "))
    assert refused.endswith(f"  refused: {why}")
    winner = next(line for line in lines if line.endswith(" <- winner"))
    assert winner.startswith("t+cuda_graph_max_bs=12 "), r.stdout
    written = (out / "T" / "tune" / "t-tuned.toml").read_text()
    assert "\n[profile.t-tuned]\ninherits = \"t\"\nextra_args = [" in written
    assert '"--sim-no-graph-factor", "4", "--cuda-graph-max-bs", "12"]' in written
    assert "# t+kv_cache_dtype=fp8_e4m3" in written
    assert f"kept {PROMPTS} samples of the t trial in the store (the other trials did the same prompts: dropped)" \
        in lines
    assert sorted(p.name for p in (out / "T" / "tune").iterdir()) == ["logs", "state.json", "t-tuned.toml"]
    again = _tune(cfg, out, "--levers", "kv_cache_dtype,cuda_graph_max_bs", "--budget-s", "3600", "--rounds", "1")
    assert again.returncode == 0, again.stderr + again.stdout
    assert "  resuming: 3 trials of this plan measured before (" in again.stdout and "round 1:" not in again.stdout
    assert [line for line in again.stdout.splitlines() if line.startswith("t")] == \
        [line for line in lines if line.startswith("t")]  # the same table, nothing launched
    # a run stopped before its last trial (the store was empty before the first, as seed/ would hold)
    state = json.loads((out / "T" / "tune" / "state.json").read_text())
    last = state["trials"].pop()
    (out / "T" / "tune" / "state.json").write_text(json.dumps(state))
    resumed = _tune(cfg, out, "--levers", "kv_cache_dtype,cuda_graph_max_bs", "--budget-s", "3600", "--rounds", "1")
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    assert "  resuming: 2 trials of this plan measured before (" in resumed.stdout
    assert [line.split(":")[1] for line in resumed.stdout.splitlines() if line.startswith("  round 1:")] == \
        [f" {last['name']}"]
    assert len(assert_exact(out, PROMPTS)) == PROMPTS
    g = run_cli("generate", "--dataset", "T", "--server", "t", "--config-dir", cfg, "--output-dir", out)
    assert g.returncode == 0, g.stderr + g.stdout
    assert len(assert_exact(out, 20)) == 20


LEVERS = ("kv_cache_dtype, mem_fraction_static, cuda_graph_max_bs, schedule_conservativeness, "
          "num_continuous_decode_steps, chunked_prefill_size, stream_interval, tokenizer_worker_num")
INERT = ("SGLang 0.5.17 parses --num-continuous-decode-steps but its scheduler never reads it: a trial would "
         "measure nothing")


@pytest.mark.parametrize("args, backend, message", [
    (("--levers", "kv_cache_dtype,turbo", "--budget-s", "60"), "sim",
     f"--levers turbo: no such lever; choose from {LEVERS} (comma-separated)."),
    (("--levers", "dcp_size", "--budget-s", "60"), "sim",
     "--levers dcp_size: --dcp-size (decode context parallelism: splits the MLA cache over TP ranks) needs several "
     f"GPUs or a draft; tune tries single-GPU levers only: {LEVERS}."),
    (("--levers", "cuda_graph_max_bs", "--budget-s", "2"), "sim",
     "tune: one round of 2 trials (t + 1 candidates) takes 11s: each a start-up of 5s and 12 prompts, predicted 0s. "
     "That is more than the budget of 2s (--budget-s). Raise --budget-share or --budget-s, lower --prompts, or name "
     "fewer --levers."),
    (("--budget-s", "60"), "vllm",
     "tune: {cfg}/server.toml [profile.t] launches a vllm server (backend = 'vllm'); tune checks each candidate's "
     "answers through SGLang's native /generate (as probe-kv does): tune an SGLang profile."),
], ids=["unknown-lever", "multi-gpu-lever", "budget-too-small", "not-sglang"])
def test_bad_input_is_refused_before_any_launch(tmp_path: Path, args: tuple[str, ...], backend: str,
                                                message: str) -> None:
    cfg, out = _config(tmp_path)
    (cfg / "server.toml").write_text(SERVER_TOML.replace('backend = "sim"', f'backend = "{backend}"'))
    r = _tune(cfg, out, *args)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error: {message.format(cfg=cfg)}\n")
    assert not out.exists() or not any(out.rglob("*.jsonl"))


def _plan(tmp_path: Path, toml: str = SERVER_TOML, **kw):
    from gen_pipeline.config.dataset import find_dataset_config
    from gen_pipeline.tune import TuneOptions, make_plan, shipped_profile

    cfg, out = _config(tmp_path)
    (cfg / "server.toml").write_text(toml)
    opts = TuneOptions(output_root=out, config_dir=cfg, **{"budget_s": 3600, "prompts": PROMPTS, **kw})
    return make_plan(find_dataset_config("T", cfg), shipped_profile(cfg, "t"), opts)


def test_a_trial_whose_line_was_printed_is_not_measured_again_after_a_stop(tmp_path: Path) -> None:
    import anyio

    from gen_pipeline.config.dataset import find_dataset_config
    from gen_pipeline.tune import TuneOptions, run_tune

    tp = _plan(tmp_path, levers=("cuda_graph_max_bs",), rounds=1)
    cfg, out = tmp_path / "cfg", tmp_path / "out"
    opts = TuneOptions(output_root=out, config_dir=cfg, budget_s=3600, prompts=PROMPTS, levers=("cuda_graph_max_bs",),
                       rounds=1)
    said: list[str] = []

    def stop_after_the_first_trial(line: str) -> None:  # Ctrl-C as the first trial's line is read
        said.append(line)
        if line.startswith("  round 1: "):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        anyio.run(run_tune, find_dataset_config("T", cfg), tp, opts, stop_after_the_first_trial)
    assert [ln.split(":")[1] for ln in said if ln.startswith("  round 1: ")] == [" t"]
    said.clear()
    anyio.run(run_tune, find_dataset_config("T", cfg), tp, opts, said.append)
    assert said[0].startswith("  resuming: 1 trials of this plan measured before (")
    assert [ln.split(":")[1] for ln in said if ln.startswith("  round 1: ")] == [" t+cuda_graph_max_bs=12"]
    assert len(assert_exact(out, PROMPTS)) == PROMPTS


def test_every_candidate_is_the_shipped_profile_with_one_change_and_each_trial_fills_the_slots(tmp_path: Path) -> None:
    from dataclasses import fields

    tp = _plan(tmp_path, prompts=None)
    assert [c.name for c in tp.candidates] == [
        "t+kv_cache_dtype=fp8_e4m3", "t+mem_fraction_static=0.92", "t+cuda_graph_max_bs=12",
        "t+schedule_conservativeness=0.5", "t+chunked_prefill_size=16384", "t+stream_interval=16",
        "t+tokenizer_worker_num=4"]
    for c in tp.candidates:
        differ = [f.name for f in fields(c.profile) if f.name != "name"
                  and getattr(c.profile, f.name) != getattr(tp.shipped.profile, f.name)]
        assert differ == list(c.change), (c.name, differ)
    assert abs(tp.candidates[0].kv_tokens - 2 * tp.shipped.kv_tokens) <= 1  # plan: fp8 halves the bytes per token
    assert tp.skipped == (("t+num_continuous_decode_steps=2", INERT),)
    # without --prompts each trial fills the slots and takes its share of the budget
    fill = tp.shipped.kv_tokens // (300 + 64 // 2) + 1  # T's assumed lengths: 300 prompt tokens + max_new_tokens 64
    assert (tp.rounds, tp.trials, tp.prompts) == (3, 8, 2 * fill)  # an hour is plenty: twice the slots, 3 rounds
    per_prompt_s = (tp.trial_s - 5.0) / tp.prompts
    tight = 8 * (5.0 + fill * per_prompt_s) * 1.5  # one round of trials that fill the slots, not two
    tp = _plan(tmp_path / "tight", prompts=None, budget_s=tight)
    assert tp.rounds == 1 and fill <= tp.prompts < 2 * fill
    assert tp.rounds * tp.trials * tp.trial_s <= tight


def test_a_candidate_plan_says_cannot_start_is_skipped_and_named(tmp_path: Path) -> None:
    toml = SERVER_TOML.replace("mem_fraction_static = 0.90", "mem_fraction_static = 0.99").replace(
        '"--cuda-graph-max-bs", "6"', '"--cuda-graph-max-bs-decode", "6"')
    tp = _plan(tmp_path, toml, levers=("mem_fraction_static", "cuda_graph_max_bs", "stream_interval"))
    # a profile with the decode spelling: 2 x its own 6 (not SGLang's default), in one spelling (no two settings)
    assert [c.name for c in tp.candidates] == ["t+cuda_graph_max_bs=12", "t+stream_interval=16"]
    assert tp.candidates[0].profile.extra_args[-2:] == ("--cuda-graph-max-bs", "12")
    assert "--cuda-graph-max-bs-decode" not in tp.candidates[0].profile.extra_args
    why = "plan refuses it: --mem-fraction-static 1.01 must be above 0 and below 1."
    assert tp.skipped == (("t+mem_fraction_static=1.01", why),)
    assert f"  skipped t+mem_fraction_static=1.01: {why}" in tp.lines()


def test_a_lever_that_only_sizes_the_pool_is_skipped_where_the_pool_is_capped(tmp_path: Path) -> None:
    # --max-total-tokens pins the pool: more memory for it changes nothing a trial could measure
    toml = SERVER_TOML.replace('"--sim-profile", "fast",', '"--sim-profile", "fast", "--max-total-tokens", "20000",')
    tp = _plan(tmp_path, toml, levers=("kv_cache_dtype", "mem_fraction_static", "stream_interval"))
    assert tp.shipped.kv_tokens == 20000
    # fp8 stays: its pool is the same, but attention reads half the bytes a token
    assert [c.name for c in tp.candidates] == ["t+kv_cache_dtype=fp8_e4m3", "t+stream_interval=16"]
    why = ("plan predicts the shipped pool, 20,000 KV tokens (--max-total-tokens caps it), and --mem-fraction-static "
           "only sizes the pool: a trial would measure nothing")
    assert tp.skipped == (("t+mem_fraction_static=0.92", why),)
    assert f"  skipped t+mem_fraction_static=0.92: {why}" in tp.lines()
    assert tp.trials == 3


def test_a_lever_sglang_never_reads_is_skipped_and_named_not_refused(tmp_path: Path) -> None:
    # --levers still takes it (no error); the plan says why no trial of it is run
    tp = _plan(tmp_path, levers=("num_continuous_decode_steps", "stream_interval"))
    assert [c.name for c in tp.candidates] == ["t+stream_interval=16"]
    assert tp.skipped == (("t+num_continuous_decode_steps=2", INERT),)
    figures = f"plan {tp.shipped.kv_tokens:,} KV tokens, {tp.shipped.slots:,} decode slots"  # plan's, not ours
    assert tp.lines()[1:] == [
        f"  t: {figures}",
        f"  t+stream_interval=16: {figures}",
        "  skipped t+num_continuous_decode_steps=2: SGLang 0.5.17 parses --num-continuous-decode-steps but its "
        "scheduler never reads it: a trial would measure nothing",
        "  not tried on one GPU: --dcp-size (decode context parallelism: splits the MLA cache over TP ranks); "
        "--tp-size (tensor parallelism); --speculative-algorithm EAGLE3 (needs a trained draft model)"]


@pytest.mark.parametrize("passed, value", [
    ((), "4"),  # SGLang's default, one front-end process
    (("--tokenizer-worker-num", "1"), "4"),
    (("--tokenizer-worker-num=3",), "6"),
], ids=["unset", "one", "three"])
def test_the_front_end_lever_launches_the_candidate_with_more_tokenizer_workers(
        tmp_path: Path, passed: tuple[str, ...], value: str) -> None:
    from gen_pipeline.server.command import build_command

    extra = "".join(f'"{a}", ' for a in passed)
    toml = SERVER_TOML.replace('"--sim-profile", "fast",', f'{extra}"--sim-profile", "fast",')
    tp = _plan(tmp_path, toml, levers=("tokenizer_worker_num",))
    (c,) = tp.candidates
    assert c.name == f"t+tokenizer_worker_num={value}"
    argv = build_command(c.profile, port=30000, python="python")
    assert argv[-2:] == ["--tokenizer-worker-num", value]
    assert sum(a.startswith("--tokenizer-worker-num") for a in argv) == 1  # the profile's own setting replaced
    assert list(c.change) == ["extra_args"] and (c.kv_tokens, c.slots) == (tp.shipped.kv_tokens, tp.shipped.slots)


def test_a_keyed_lever_the_profile_passes_in_extra_args_is_moved_there(tmp_path: Path) -> None:
    # SGLang reads extra_args after the keys: a key beside `--stream-interval 8` would be overridden by it
    passed = '"--sim-profile", "fast", "--stream-interval", "8", "--kv-cache-dtype", "fp8_e4m3",'
    toml = SERVER_TOML.replace("stream_interval = 8\n", "").replace('"--sim-profile", "fast",', passed)
    tp = _plan(tmp_path, toml, levers=("kv_cache_dtype", "stream_interval"))
    assert [c.name for c in tp.candidates] == ["t+kv_cache_dtype=bf16", "t+stream_interval=16"]
    for c, flag, value in zip(tp.candidates, ("--kv-cache-dtype", "--stream-interval"), ("bf16", "16"), strict=True):
        args = c.profile.extra_args
        assert args.count(flag) == 1 and args[-2:] == (flag, value), args
        assert list(c.change) == ["extra_args"]
    assert tp.candidates[1].profile.stream_interval is None


def test_the_shipped_profile_stays_unless_an_accepted_candidate_beats_it_by_more_than_the_noise(tmp_path: Path) -> None:
    from gen_pipeline.tune.report import write_result
    from gen_pipeline.tune.trials import Outcome, pick_winner

    tp = _plan(tmp_path, levers=("cuda_graph_max_bs", "stream_interval"))
    shipped = Outcome(tp.shipped, [100.0, 104.0])  # its own spread over two rounds: 3.9 %, above the 3 % floor
    close = Outcome(tp.candidates[0], [105.0, 106.0], check="fine: ...")  # 3.4 % faster: within the noise
    refused = Outcome(tp.candidates[1], [200.0], check="its answers differ ...", refused=True)
    res = pick_winner([shipped, close, refused], kept=12)
    assert res.winner is shipped and round(res.noise, 4) == 0.0392
    path, lines = write_result(tp, res, tmp_path / "tune", tmp_path / "cfg")
    assert lines[-2] == "no candidate beat t by more than the noise (4 %): the shipped profile stays."
    assert "[profile." not in path.read_text() and path.read_text().endswith(f"# {lines[-2]}\n")
    res = pick_winner([shipped, Outcome(tp.candidates[0], [107.0], check="fine: ...")], kept=12)
    assert res.winner.candidate.name == "t+cuda_graph_max_bs=12"
