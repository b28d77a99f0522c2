"""A server running a draft (speculative decoding): each whole answer's acceptance in meta.per_turn, the
server-wide gauge for streamed ones (SGLang 0.5.17 refuses return_meta_info on a stream; the request fields:
test_client.py), and the figure per dataset in status, status --json and the card; nothing of it without a draft."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from servers import sim_in_thread

from pipeline_helpers import SIM_FAST, make_rows, read_samples, run_cli, write_dataset

ROWS = 8
DRAFT = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "sim/draft",
         "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
         "--sim-accept-length", "2.5"]
SERVER_WIDE = ("tokens per verify step, server-wide (sglang:spec_accept_length); per turn needs whole answers: "
               "SGLang 0.5.17 returns meta_info only without streaming (generation.on_loop = \"off\" gives it, "
               "without the loop gate's early stop)")


@pytest.fixture(scope="module")
def draft_sim():
    with sim_in_thread([*SIM_FAST, "--enable-metrics", *DRAFT]) as s:
        yield s


def _run(url: str, folder: Path, on_loop: str) -> tuple[Path, Path, list[dict], str, dict, str]:
    """generate (one request at a time, polled often), then status, status --json and an export's card."""
    toml, out = write_dataset(folder, target=ROWS, rows=make_rows(ROWS), extra=f'on_loop = "{on_loop}"'), folder / "out"
    r = run_cli("generate", "--dataset", toml, "--server-url", url, "--output-dir", out, "--progress", "quiet",
                "--window", "1", "--poll-interval-s", "0.05")
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = ("--dataset", "T", "--output-dir", out, "--config-dir", toml.parent)
    st = run_cli("status", *cfg)
    assert st.returncode == 0, st.stdout + st.stderr
    js = orjson.loads(run_cli("status", *cfg, "--json").stdout)["datasets"]["T"]
    e = run_cli("export", "--output-dir", out, "--dataset", "T", "--format", "specforge", "--out", folder / "x.jsonl")
    assert e.returncode == 0, e.stdout + e.stderr
    return toml, out, read_samples(out), st.stdout, js, (folder / "README.md").read_text()


def test_whole_answers_record_each_turns_acceptance(draft_sim, tmp_path: Path) -> None:
    toml, out, samples, status, js, card = _run(draft_sim.url, tmp_path, "off")
    v = run_cli("validate", "--dataset", toml, "--output-dir", out)
    assert v.returncode == 0, v.stdout + v.stderr
    turns = [t for s in samples for t in s["meta"]["per_turn"]]
    assert len(turns) == sum(s["meta"]["turns"] for s in samples) > ROWS
    # SGLang's figure: completion_tokens / spec_verify_ct, capped by the draft's 4 tokens a step
    assert all(t["spec_verify_ct"] > 0 and t["spec_accept_length"] == t["completion_tokens"] / t["spec_verify_ct"]
               for t in turns)
    assert all(1.0 <= t["spec_accept_length"] <= 4.0 for t in turns)
    pooled = sum(t["completion_tokens"] for t in turns) / sum(t["spec_verify_ct"] for t in turns)
    line = f"draft acceptance: {pooled:.2f} tokens per verify step over {len(turns)} turns"
    assert f"T: {line}\n" in status + "\n", status
    assert js["spec_acceptance"] == {"accept_length": round(pooled, 3), "turns": len(turns), "scope": "turns"}
    assert f"## Draft acceptance\n\n- T: {line}\n" in card, card


def test_streamed_turns_show_the_server_wide_figure(draft_sim, tmp_path: Path) -> None:
    _, out, samples, status, js, card = _run(draft_sim.url, tmp_path, "retry")
    assert len(samples) == ROWS  # the sim refuses return_meta_info on a stream (400): none was sent
    assert not any("spec_verify_ct" in t for s in samples for t in s["meta"]["per_turn"])
    figure = orjson.loads((out / "T" / "manifest.json").read_bytes())["progress"]["spec_accept_length"]
    assert 1.0 <= figure <= 4.0
    line = f"draft acceptance: {figure:.2f} {SERVER_WIDE}"
    assert f"T: {line}\n" in status + "\n", status
    assert js["spec_acceptance"] == {"accept_length": figure, "turns": 0, "scope": "server"}
    assert f"## Draft acceptance\n\n- T: {line}\n" in card, card


def test_nothing_shown_without_a_draft(tmp_path: Path) -> None:
    with sim_in_thread([*SIM_FAST, "--enable-metrics"]) as sim:
        _, _, samples, status, js, card = _run(sim.url, tmp_path, "off")
    assert not any("spec_verify_ct" in t for s in samples for t in s["meta"]["per_turn"])
    assert "draft acceptance" not in status and "Draft acceptance" not in card
    assert js["spec_acceptance"] is None


def test_ranks_show_the_mean_of_their_servers_figures(draft_sim, tmp_path: Path) -> None:
    toml, out = write_dataset(tmp_path, target=ROWS, rows=make_rows(ROWS)), tmp_path / "out"
    for rank in (0, 1):
        r = run_cli("generate", "--dataset", toml, "--server-url", draft_sim.url, "--output-dir", out, "--progress",
                    "quiet", "--window", "1", "--poll-interval-s", "0.05", "--rank", str(rank), "--world-size", "2")
        assert r.returncode == 0, r.stdout + r.stderr
    figures = [orjson.loads((out / "T" / f"rank-{r}-of-2" / "manifest.json").read_bytes())["progress"]
               ["spec_accept_length"] for r in (0, 1)]
    st = run_cli("status", "--dataset", "T", "--output-dir", out, "--config-dir", toml.parent)
    assert f"T: draft acceptance: {sum(figures) / 2:.2f} {SERVER_WIDE}\n" in st.stdout + "\n", st.stdout
