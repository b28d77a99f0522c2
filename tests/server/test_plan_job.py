"""`plan` for the reference node (8 x RTX PRO 6000 Blackwell, 96 GB) and the job's wall time it prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from gen_pipeline.cli import main
from gen_pipeline.cli import parser as cli_parser
from gen_pipeline.reports import job_time
from gen_pipeline.server.plan import REFERENCE_GPU, REFERENCE_GPU_MEM_GIB, REFERENCE_OVERHEAD_GIB
from sglang_sim.profiles import PROFILES

from user_docs import user_docs

REPO = Path(__file__).resolve().parents[2]


def test_the_reference_node_is_one_set_of_numbers() -> None:
    assert (cli_parser.REFERENCE_GPU, cli_parser.REFERENCE_GPU_MEM_GIB, cli_parser.REFERENCE_OVERHEAD_GIB) == (
        REFERENCE_GPU, REFERENCE_GPU_MEM_GIB, REFERENCE_OVERHEAD_GIB)
    seed = PROFILES["seed"]  # the simulator's seed profile is the job's step model
    model = job_time.StepModel(seed.step_base_s, seed.decode_per_req_s, seed.decode_per_kv_token_s,
                               seed.prefill_per_token_s)
    assert model == job_time.REFERENCE_NODE


@pytest.mark.parametrize("profile, mem, kv, seen", [
    ("baseline", "0.85", "bf16", 116_000), (None, "0.88", "bf16", 159_000), ("tuned", "0.9", "fp8_e4m3", 376_000)])
def test_the_defaults_reproduce_the_seeds_three_pools(profile: str | None, mem: str, kv: str, seen: int,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--server", profile] if profile else ["--mem-fraction-static", mem, "--kv-cache-dtype", kv]
    assert main(["plan", "--output-dir", "/nonexistent-outputs", *args]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(f"{kv} "))
    assert int(row.split()[2].replace(",", "")) == pytest.approx(seen, rel=0.01)


def test_plan_prints_the_reference_nodes_plan_and_the_88k_jobs_wall_time_as_the_readme_shows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    assert main(["plan", "--output-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    readme = user_docs()
    table = readme[readme.index("```text\ndataset     to do") + len("```text\n"):]
    table = table[:table.index("```")].splitlines()
    start = lines.index(table[0])
    assert lines[start:start + len(table)] == table
    assert lines[1] == ("weights: 553 GiB (Kimi-K2.5 INT4, 594 GB on disk: the bundled config's default; "
                        "--weights-gb for another checkpoint)")
    assert lines[2] == ("MLA attention, 61 layers; tp=8, 95.6 GiB/GPU × mem_fraction_static 0.9 − weights 69.1 "
                        "GiB/GPU − overhead 4.5 GiB = 12.4 GiB/GPU for the KV cache")
    assert ("fp8_e4m3             35,136      379,397            84     +29,214  <- the profile's kv_cache_dtype"
            in lines)
    job = lines[next(i for i, line in enumerate(lines) if line.startswith("the job ")):]
    assert job == [
        "the job (B1, B2, B6, B7 of datasets_cfg/: 88,000 samples to do) with 379,397 KV tokens (fp8_e4m3), at the "
        "reference node's decode rate (Kimi-K2.5 on 8 x RTX PRO 6000, fitted to its measured B2 runs; for "
        "another model or GPU pass --decode-tok-s with a measured rate: make status shows a run's tok/s):",
        "dataset     to do      tokens/sample lengths from              running   tok/s  output tokens     time",
        "B1         30,000          300 + 610 assumed                       627   2,556          18.3M    2h09m",
        "B2         18,000        790 + 3,630 assumed                       146   1,443          65.3M   12h51m",
        "B6         20,000          360 + 750 assumed                       516   2,434          15.0M    1h51m",
        "B7         20,000          100 + 600 assumed                       948   2,775          12.0M    1h14m",
        "total      88,000                                                                      110.6M   18h16m  "
        "(with 10m00s of start-up)",
        "assumptions: tokens/sample = prompt + output, measured once a dataset has 20 samples; running = KV tokens "
        "/ (prompt + output/2), the KV a request holds on average;",
        "  the adaptive controller keeps the server at that (docs/measurements.md, job: within 1 % of the ideal); "
        "prefill at the reference node's cost; one server start for the whole job;",
        "  the rate was fitted on B2-like long requests (100-150 running): short-output datasets at hundreds "
        "running are an extrapolation, and SGLang's max_running_requests or CUDA-graph batch sizes may cap them "
        "lower.",
        # issue 34: past SGLang's CUDA-graph ceiling (512 on the 8-GPU reference node) a decode step is ~2x slower
        "WARNING: B1, B6, B7 would run 627 / 516 / 948 requests at once, above SGLang's CUDA-graph ceiling of 512 "
        "on this node (SGLang's default for 95.6 GiB GPUs at tp 8): a decode batch above it runs without a CUDA "
        "graph, ~2x the step time. The adaptive controller holds the batch at 512 (it reads cuda_graph_max_bs from "
        "the server), so these datasets run at most 512 at once and their times above are optimistic; to use the "
        'KV for more, raise it in the server profile: extra_args = ["--cuda-graph-max-bs", "1024"] (more GPU '
        "memory for graphs, a longer start-up).",
    ]


def test_a_measured_rate_gives_output_tokens_over_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "server.toml").write_text((REPO / "datasets_cfg" / "server.toml").read_text())
    (cfg / "B2.toml").write_text((REPO / "datasets_cfg" / "B2.toml").read_text())
    (cfg / "X.toml").write_text((REPO / "datasets_cfg" / "B2.toml").read_text().replace('"B2"', '"X"'))
    assert main(["plan", "--config-dir", str(cfg), "--output-dir", str(tmp_path / "out"),
                 "--decode-tok-s", "1000"]) == 0
    out = capsys.readouterr().out.splitlines()
    job = out[next(i for i, line in enumerate(out) if line.startswith("the job ")):]
    # 18,000 × 3,630 = 65.3M tokens at 1,000 tok/s = 65,340 s = 18h09m, + 10 min of start-up
    assert job[0].endswith("36,000 samples to do) with 379,397 KV tokens (fp8_e4m3), at a measured 1,000 tok/s "
                           "(--decode-tok-s):")
    assert job[2] == ("B2         18,000        790 + 3,630 assumed                       146   1,000          65.3M"
                      "   18h09m")
    assert job[3] == "X          18,000                  ? unknown: run LIMIT=100 first"
    assert job[4] == ("total      18,000                                                                       65.3M"
                      "   18h19m  (with 10m00s of start-up)")
    assert job[5] == "  the datasets marked ? are not in the total: no samples to measure and no assumed lengths"


def test_a_rate_that_is_not_positive_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--output-dir", "/nonexistent-outputs", "--decode-tok-s", "0"]) == 2
    assert capsys.readouterr().err == ("error: --decode-tok-s 0 must be above 0 (a measured tokens/s; make status "
                                       "shows a run's).\n")


def _plans(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra_args: str) -> list[list[str]]:
    """`plan` of the tuned profile, then of the same with `extra_args` (a TOML array)."""
    cfg = tmp_path / "cfg"
    cfg.mkdir(exist_ok=True)
    (cfg / "server.toml").write_text((REPO / "datasets_cfg" / "server.toml").read_text()
                                     + f'\n[profile.draft]\ninherits = "tuned"\nextra_args = {extra_args}\n')
    plans = []
    for name in ("tuned", "draft"):
        assert main(["plan", "--config-dir", str(cfg), "--server", name, "--output-dir", str(tmp_path / "o")]) == 0
        plans.append(capsys.readouterr().out.splitlines())
    return plans


def _fp8(lines: list[str]) -> tuple[int, int]:
    row = next(x for x in lines if x.startswith("fp8_e4m3 "))
    return int(row.split()[1].replace(",", "")), int(row.split()[2].replace(",", ""))


def test_an_eagle_draft_not_on_this_machine_counts_one_layer_of_kv(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang pools an EAGLE-family draft's KV with the target's (cell size x (1 + 1/61) for Kimi-K2.5's 61
    layers); a draft path that is not a local folder: one layer assumed, its weights not counted, said."""
    tuned, draft = _plans(tmp_path, capsys, '["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", '
                                            '"org/kimi-eagle3", "--speculative-num-draft-tokens", "4"]')
    assert _fp8(tuned) == (35_136, 379_397)
    per_token, tokens = _fp8(draft)
    assert per_token == 35_136 * 62 // 61 == 35_712 and abs(tokens - 379_397 * 35_136 / 35_712) < 1
    assert ("draft (EAGLE3): 1 layer assumed and its weights not counted (org/kimi-eagle3 is not a local folder with "
            "a config.json here): KV bytes per token x (1 + 1/61), as SGLang pools the draft's KV with the target's"
            ) in draft


def test_a_local_draft_adds_its_layers_and_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "draft"
    folder.mkdir()
    (folder / "config.json").write_text('{"num_hidden_layers": 2}')
    with (folder / "model.safetensors").open("wb") as f:
        f.truncate(8 << 30)  # 8 GiB, sparse: 1 GiB on each of the 8 GPUs
    tuned, draft = _plans(tmp_path, capsys, f'["--speculative-algorithm", "STANDALONE", '
                                            f'"--speculative-draft-model-path", "{folder}"]')
    assert (f"draft (STANDALONE): 2 layer(s) and 8.0 GiB of weights from {folder}: KV bytes per token x (1 + 2/61), as "
            "SGLang pools the draft's KV with the target's; weights +1.0 GiB/GPU") in draft
    kv_gb = [float(next(x for x in lines if x.endswith("GiB/GPU for the KV cache")).split("= ")[-1].split(" GiB")[0])
             for lines in (tuned, draft)]
    assert round(kv_gb[0] - kv_gb[1], 1) == 1.0, kv_gb
    assert _fp8(draft)[0] == 35_136 * 63 // 61


def test_a_profile_that_caps_the_pool_plans_the_cap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--max-total-tokens in extra_args: SGLang's pool is the smaller of it and what fits, and so is plan's."""
    tuned, capped = _plans(tmp_path, capsys, '["--max-total-tokens", "120000"]')
    assert _fp8(tuned)[1] == 379_397 and _fp8(capped) == (35_136, 120_000)
    assert ("KV tokens capped at 120,000 by --max-total-tokens (SGLang takes the smaller of it and what fits); the "
            "levers below move what fits, not the cap") in capped
    assert "max_total_tokens 120000 (profile)" in capped[0]
    assert not any("capped" in line for line in tuned) and "max_total_tokens" not in tuned[0]
