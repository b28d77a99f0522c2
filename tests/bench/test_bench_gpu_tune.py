"""bench/gpu's `tune` phase: tune's round-1 pick judged by the later rounds, the committed H100 run, and the phase
on the simulator stopped between trials and resumed with no trial measured twice."""

from __future__ import annotations

import json
import re
import sys

import pytest

from bench.gpu import h200_check, report, tune_check

pytestmark = pytest.mark.bench  # make bench-test


def _trial(r: int, name: str, tok_s: float, refused: bool = False) -> dict:
    return {"round": r, "name": name, "tok_s": tok_s, "server_tok_s": [], "check": "fine", "refused": refused}


def test_round_ones_pick_is_judged_by_the_later_rounds_alone() -> None:
    # round 1 favours "b" by luck; rounds 2 and 3 say "c"; "d" was refused in round 1 and never ran again
    trials = [_trial(0, "s", 100), _trial(0, "b", 130), _trial(0, "c", 110), _trial(0, "d", 500, refused=True),
              _trial(1, "s", 100), _trial(1, "b", 101), _trial(1, "c", 140),
              _trial(2, "c", 150), _trial(2, "s", 104), _trial(2, "b", 99)]
    v = tune_check.verdict({"trials": trials})
    assert (v["pick_round1"], v["best_later"], v["pick_all_rounds"]) == ("b", "c", "c")
    assert v["later_medians"] == {"s": 102, "b": 100, "c": 145}
    assert (v["pick_vs_best"], v["pick_vs_shipped"], v["goal_met"]) == (0.69, 0.98, False)
    assert tune_check.summary_line(v) == (
        "tune: round 1 picks b: 0.690 x the best by rounds [2, 3] (c), 0.980 x the shipped profile; all rounds pick "
        "c; goal NOT met")
    # round 2 unfinished: round 1 alone cannot be judged
    assert tune_check.verdict({"trials": trials[:6]})["complete"] is False


def test_the_committed_h100_tune_run_picks_the_best_and_its_report_says_so() -> None:
    r = json.loads((report.HERE / "h100_tune_results.json").read_text())
    v = tune_check.verdict({"trials": r["tune"]["trials"]})
    assert v == r["tune"]["verdict"]  # the verdict the device printed, recomputed from the trials it measured
    assert v["pick_round1"] == v["best_later"] == "h200-ceiling+cuda_graph_max_bs=512" and v["goal_met"]
    assert v["pick_vs_shipped"] == 1.739 and v["later_medians"]["h200-ceiling"] == 14137
    text = report.tune_markdown(r, "h100_tune_results.json", "cmd")
    assert ("| h200-ceiling+cuda_graph_max_bs=512 | 21,765 | 23,649 | 25,529 | 24,589 | 1.739 | caution: top-1 changes "
            "on 2.15 % of 512 positions") in text
    assert '\n[profile.h200-ceiling-tuned]\ninherits = "h200-ceiling"\n' in text
    assert text.count('"--cuda-graph-max-bs", "512"]') == 1
    assert "Not tried" not in text  # that run's plan skipped nothing
    skipped = "h200-ceiling+mem_fraction_static=0.87: plan predicts the shipped pool, 120,000 KV tokens"
    r["tune"]["plan"].insert(4, f"  skipped {skipped}")
    assert f"\n- Not tried: {skipped}\n" in report.tune_markdown(r, "h100_tune_results.json", "cmd")


def test_the_committed_kv_tune_run_shows_the_refused_candidate_and_that_no_file_was_written() -> None:
    """bf16 KV against the shipped fp8 on the H100 (2026-12-07): refused by the output check in round 1, so never
    measured again; the phase stopped tune after its last trial, so no profile file: the report says both."""
    r = json.loads((report.HERE / "h100_tune_kv_results.json").read_text())
    text = report.tune_markdown(r, "h100_tune_kv_results.json", "cmd")
    assert ("| h200-ceiling+kv_cache_dtype=bf16 | 19,654 | - (refused: not tried again) | - | - | its answers differ "
            "from h200-ceiling's: top-1 changes on 15.43 % of 512 positions") in text, text
    assert "| h200-ceiling | 18,544 | 20,464 | 20,464 | 1.000 | reference |" in text
    assert "- tune wrote no file: the phase stopped it (exit 130) after its last trial" in text
    assert "- Not tried: h200-ceiling+mem_fraction_static=0.87: plan predicts the shipped pool" in text


def test_the_trials_left_count_skips_a_refused_candidates_later_rounds_and_tune_is_let_finish_after_its_last(
        tmp_path) -> None:
    """The 2026-12-07 run: shipped + bf16 (refused in round 1) over 2 rounds, then round 2's shipped trial, with
    72 s left. Nothing was left to run, but the phase stopped tune before it printed its table and wrote the
    profile. It now reads tune's state: none left, so tune finishes."""
    key = {"shipped": "s", "candidates": ["s+a", "s+b"], "rounds": 2}
    trial = {"round": 0, "name": "s", "refused": False}
    state = {"key": key, "trials": [trial, {**trial, "name": "s+a", "refused": True}]}
    assert tune_check.trials_left(None) is None
    assert tune_check.trials_left(state) == 3  # round 1's s+b, round 2's s and s+b: not the refused s+a
    state["trials"] += [{**trial, "name": "s+b"}, {**trial, "round": 1}, {**trial, "round": 1, "name": "s+b"}]
    assert tune_check.trials_left(state) == 0
    fake = [sys.executable, "-c", "import time\nprint('  round 2: s: 9 tok/s', flush=True)\ntime.sleep(1)\n"
            "print('table', flush=True)"]
    said: list[str] = []
    rc, lines = tune_check.run_until(fake, tmp_path / "a.log", lambda: 5.0, said.append, lambda: 0)
    assert (rc, lines[-1]) == (0, "table")  # let finish: its last line came
    rc, lines = tune_check.run_until(fake, tmp_path / "b.log", lambda: 5.0, said.append, lambda: 1)
    assert rc != 0 and "table" not in lines and said[-1].endswith("stopped between trials")  # one left: stopped


def test_the_phase_on_the_simulator_stops_between_trials_and_goes_on_without_measuring_one_twice(tmp_path) -> None:
    # two levers tune tries (it skips an inert one), so 3 trials a round whatever the phase's default --levers
    args = ["--work", str(tmp_path), "--sim", "--time-scale", "10", "--server-profile", "h200-ceiling",
            "--rounds", "2", "--tune-prompts", "200", "--levers", "cuda_graph_max_bs,tokenizer_worker_num"]
    assert h200_check.main([*args, "--budget-s", "32", "setup", "tune"]) == 0
    first = json.loads((tmp_path / "results.json").read_text())["tune"]
    assert "errors" not in json.loads((tmp_path / "results.json").read_text())
    assert first["rc"] != 0 and len(first["trials"]) < 6  # stopped before the end: tune's 'interrupted' exit
    assert h200_check.main([*args, "--budget-s", "600", "tune"]) == 0
    r = json.loads((tmp_path / "results.json").read_text())["tune"]
    assert r["rc"] == 0 and r["verdict"]["complete"] and r["written"].startswith("# gen-pipeline tune: 3 profiles")
    done = [(t["round"], t["name"]) for t in r["trials"]]
    assert len(done) == len(set(done)) == 6 and done[:len(first["trials"])] == [
        (t["round"], t["name"]) for t in first["trials"]]
    log = (tmp_path / "logs" / "cli-tune.log").read_text()
    measured = re.findall(r"^  round (\d): (\S+): ", log, flags=re.M)
    assert len(measured) == len(set(measured)) == 6  # every trial line once over both calls
    if first["trials"]:  # on a very busy machine the first call may end before a trial does
        assert f"  resuming: {len(first['trials'])} trials of this plan measured before (" in log
