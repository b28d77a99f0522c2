"""The reference job's shape offline: datasets_cfg/offline/ (B1/B2/B6/B7-shaped local sources in the hub
sources' schemas) through the simulator, as docs/simulator.md "Try the job without a GPU" runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_helpers import REPO, assert_exact, run_cli

OFFLINE = REPO / "datasets_cfg" / "offline"
TARGETS = {"B1": 30, "B2": 20, "B6": 30, "B7": 30}


def test_the_bundled_sources_are_what_make_offline_writes_in_the_hub_datasets_columns(tmp_path: Path) -> None:
    script = OFFLINE / "data" / "make_offline.py"
    copy = tmp_path / "make_offline.py"
    copy.write_text(script.read_text())
    subprocess.run([sys.executable, str(copy)], check=True, timeout=60)
    for name in TARGETS:
        shipped = (OFFLINE / "data" / f"{name}.jsonl").read_bytes()
        assert (tmp_path / f"{name}.jsonl").read_bytes() == shipped, name
        assert len(shipped) < 20_000 and len(shipped.splitlines()) == 40
    # they keep the hub datasets' columns
    first = {n: json.loads((OFFLINE / "data" / f"{n}.jsonl").read_text().splitlines()[0]) for n in TARGETS}
    assert set(first["B1"]) == {"id", "conversations"} and set(first["B1"]["conversations"][0]) == {"from", "value"}
    assert {"problem", "solution", "answer", "uuid"} <= set(first["B2"])
    assert set(first["B6"]) == {"prompt", "prompt_id", "messages"}
    assert {"uuid", "instruction", "response", "conversations"} <= set(first["B7"])


@pytest.mark.timeout(300)
def test_the_offline_job_runs_to_exact_counts_and_plan_measures_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = run_cli("generate", "--dataset", "all", "--server", "sim", "--config-dir", OFFLINE, "--output-dir", out)
    assert r.returncode == 0, r.stderr + r.stdout
    lines = r.stdout.splitlines()
    assert lines[:5] == [f"{n}: loading the source data/{n}.jsonl" for n in TARGETS] + [
        "job: B1, B2, B6, B7; 0/110 samples done"]
    assert lines[-5:] == [
        "B1: 30/30 samples (100.0%), +30 this run in " + lines[-5].split(" in ")[1].split(",")[0]
        + ", 2 invalid rows skipped; target reached.",
        *(f"{n}: {t}/{t} samples (100.0%), +{t} this run in {line.split(' in ')[1]}"
          for (n, t), line in zip(list(TARGETS.items())[1:], lines[-4:-1], strict=True)),
        "job (B1, B2, B6, B7): 110/110 samples (100.0%), +110 this run; every dataset at its target."]
    assert all(line.endswith("; target reached.") for line in lines[-5:-1])
    turns = {}
    for name, target in TARGETS.items():
        samples = assert_exact(out, target, name)
        turns[name] = max(sum(m["role"] == "assistant" for m in s["conversations"]) for s in samples)
    assert turns == {"B1": 3, "B2": 1, "B6": 3, "B7": 1}  # B1 and B6 are multi-turn, every turn regenerated
    assert sorted(json.loads(x)["reason"] for x in (out / "B1" / "rejects.jsonl").read_text().splitlines()) == [
        "empty_content", "roles_not_alternating"]

    r = run_cli("plan", "--server", "sim", "--config-dir", OFFLINE, "--output-dir", out)
    assert r.returncode == 0, r.stderr
    job = [line for line in r.stdout.splitlines() if line.startswith(("the job ", "B1 ", "B2 ", "total "))]
    assert job[0].startswith("the job (B1, B2, B6, B7 of datasets_cfg/offline/: 0 samples to do) with ")
    assert job[1].split()[:2] == ["B1", "0"] and "measured on 30 samples" in job[1]
    assert job[2].split()[:2] == ["B2", "0"] and "measured on 20 samples" in job[2]
    assert job[3].split() == ["total", "0", "0.0M", "0s"]  # nothing to do: no start-up either


def test_the_offline_b2_has_the_reference_jobs_shape_without_leaks(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The offline sim profile is the reference server's shape: its reasoning parser splits B2's thinking
    into reasoning_content, so no turn is flagged as a leak (without it, 20 of 20 were)."""
    from gen_pipeline.cli import main
    from gen_pipeline.config.server import load_server_profile

    offline, tuned = load_server_profile("sim", OFFLINE / "server.toml"), load_server_profile("tuned")
    shape = ("reasoning_parser", "stream_interval", "num_continuous_decode_steps", "enable_hierarchical_cache",
             "hicache_size_gb", "kv_cache_dtype", "tp_size", "mem_fraction_static", "trust_remote_code")
    assert {k: getattr(offline, k) for k in shape} == {k: getattr(tuned, k) for k in shape}
    out = tmp_path / "out"
    assert main(["generate", "--dataset", "B2", "--server", "sim", "--config-dir", str(OFFLINE),
                 "--output-dir", str(out)]) == 0
    samples = assert_exact(out, TARGETS["B2"], "B2")
    leaks = [t["leak"] for s in samples for t in s["meta"]["per_turn"]]
    assert leaks == [""] * TARGETS["B2"]
    assert all(s["conversations"][-1]["reasoning_content"] for s in samples)
    assert "leaks flagged" not in capsys.readouterr().out
