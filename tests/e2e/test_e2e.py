"""End to end through the real CLI process, the real launcher and the simulator over TCP."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from sglang_sim.testing import start_sim

from pipeline_helpers import REPO, SIM_FAST, assert_exact, kill_group, run_cli, start_cli, wait_for, write_dataset
from user_docs import user_docs


def status_json(out: Path, name: str) -> dict:
    r = run_cli("status", "--json", "--output-dir", out, "--dataset", name)
    assert r.returncode == 0, r.stderr
    return orjson.loads(r.stdout)["datasets"][name]


def test_demo_run_writes_exactly_the_target_then_resumes_with_nothing_to_do(tmp_path: Path) -> None:
    r = run_cli("generate", "--dataset", "demo", "--server", "sim", "--output-dir", tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    assert r.stdout.strip().splitlines()[-1].startswith("demo: 240/240 samples (100.0%), +240 this run in ")
    assert "6 invalid rows skipped; target reached." in r.stdout
    samples = assert_exact(tmp_path, 240, "demo")
    assert {s["meta"]["backend"] for s in samples} == {"sim"}
    assert all("reasoning_content" in m for s in samples for m in s["conversations"] if m["role"] == "assistant")
    assert any(s["meta"]["turns"] > 1 for s in samples)
    assert len(list((tmp_path / "demo").glob("shard-*.jsonl"))) == 3  # shard_max_samples = 100
    rejects = (tmp_path / "demo" / "rejects.jsonl").read_bytes().splitlines()
    assert len(rejects) == 6
    st = status_json(tmp_path, "demo")
    assert (st["done"], st["target"], st["rejects"]) == (240, 240, 6)
    again = run_cli("generate", "--dataset", "demo", "--server", "sim", "--output-dir", tmp_path)
    assert again.returncode == 0
    assert again.stdout.strip() == "demo: 240/240 samples (100.0%); the target is already reached, nothing to do."
    v = run_cli("validate", "--dataset", "demo", "--output-dir", tmp_path)
    assert v.returncode == 0, v.stdout
    assert_exact(tmp_path, 240, "demo")


def test_limit_then_torn_tail_then_resume_is_exact(tmp_path: Path) -> None:
    toml = write_dataset(tmp_path / "cfg", target=50)
    out = tmp_path / "out"
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", out, "--limit", "20")
    assert r.returncode == 0, r.stderr
    assert "+20 this run" in r.stdout and "stopped at --limit; run again to continue." in r.stdout
    assert_exact(out, 20)
    shard = sorted((out / "T").glob("shard-*.jsonl"))[-1]
    with open(shard, "ab") as f:  # a run that died mid-line
        f.write(b'{"id": "T-torn", "dataset": "T", "conversa')
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", out)
    assert r.returncode == 0, r.stderr
    samples = assert_exact(out, 50)
    assert "T-torn" not in {s["id"] for s in samples}


def test_changed_config_is_refused_and_nothing_is_lost(tmp_path: Path) -> None:
    toml = write_dataset(tmp_path / "cfg", target=30)
    out = tmp_path / "out"
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", out, "--limit", "10")
    assert r.returncode == 0
    before = {p.name: p.read_bytes() for p in (out / "T").glob("shard-*.jsonl")}
    toml.write_text(toml.read_text().replace("temperature = 0.7", "temperature = 0.2"))
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", out)
    assert r.returncode == 4
    assert "sampling" in r.stderr and "0.7" in r.stderr and "0.2" in r.stderr
    assert "Traceback" not in r.stderr
    assert {p.name: p.read_bytes() for p in (out / "T").glob("shard-*.jsonl")} == before


def test_status_of_a_run_that_died(tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"q {i}"}]} for i in range(450)]
    toml = write_dataset(tmp_path / "cfg", target=400, rows=rows, max_new_tokens=400)
    out = tmp_path / "out"
    # a tenth of the speed (the last --time-scale counts): 400 samples take minutes, the wait below at most 60 s
    with start_sim([*SIM_FAST, "--time-scale", "1"]) as sim:
        proc = start_cli("generate", "--dataset", toml, "--server-url", sim.url, "--output-dir", out, "--window", "8",
                         log=tmp_path / "cli.log")
        try:
            wait_for(lambda: any((out / "T").glob("shard-*.jsonl")) and status_json(out, "T")["done"] >= 10,
                     timeout_s=60)
            # still running by construction, however slow the machine: every request from now on waits
            # 10 minutes, and at most 8 (the window) are in flight, far from the 400 of the target
            stall = httpx.post(sim.url + "/sim/faults", json={"stall_rate": 1.0, "stall_s": 600}, timeout=5)
            assert stall.status_code == 200, stall.text
            live = status_json(out, "T")
            assert live["state"].startswith("running"), live
        finally:
            kill_group(proc, signal.SIGKILL)
    dead = status_json(out, "T")
    assert dead["state"].startswith("died") and dead["done"] >= live["done"]
    text = run_cli("status", "--output-dir", out, "--dataset", "T").stdout
    assert "died" in text and "/400" in text


def test_every_command_has_help_and_is_in_the_docs(capsys: pytest.CaptureFixture[str]) -> None:
    """Every command of the parser has --help text and is shown in the docs (README + docs site)."""
    from gen_pipeline.cli import main
    from gen_pipeline.cli.parser import build_parser

    docs = user_docs()
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert len(commands) >= 10
    for command in commands:
        with pytest.raises(SystemExit) as e:
            main([command, "--help"])
        assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: gen-pipeline " + command)
        assert re.search(rf"gen-pipeline {command}(?![\w-])", docs), command
    sim = subprocess.run([sys.executable, "-m", "sglang_sim", "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert sim.returncode == 0 and "--time-scale" in sim.stdout and "python -m sglang_sim --help" in docs
    readme = (REPO / "README.md").read_text()
    for target in ("make demo", "make test", "make generate DATASET=", "make status", "make venv EXTRAS=gpu"):
        assert target in readme
    assert "make bench" in docs and len(readme.splitlines()) <= 200
