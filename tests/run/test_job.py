"""Several datasets in one command through one server lifetime (run/job.py), through the CLI and the
simulator."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import orjson
import pytest
from servers import SimThread

from gen_pipeline.controller import Controller
from gen_pipeline.records import Capacity

from pipeline_helpers import REPO, assert_exact, read_samples, run_cli, write_dataset

# (name, target, max_new_tokens): three datasets of different output caps
JOB = (("A", 40, 48), ("B", 30, 160), ("C", 25, 32))


def _job(folder: Path, job=JOB) -> list[Path]:
    return [write_dataset(folder, name=n, target=t, max_new_tokens=m, shard_max_samples=11) for n, t, m in job]


def test_three_datasets_one_server_exact_counts_and_own_sampling(tmp_path: Path) -> None:
    a, b, c = _job(tmp_path / "ds")
    out = tmp_path / "out"
    args = ("generate", "--dataset", f"{a},{b}", "--dataset", c, "--server", "sim", "--output-dir", out,
            "--progress", "log")
    r = run_cli(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    # the display's last line: the job's samples toward its total (live lines: tests/e2e/test_faults_job.py)
    assert re.search(r"^job \(A, B, C\) 95/95 \(100\.0%\) ", r.stderr, re.M), r.stderr
    # one server for the whole job: one start line, one start in its log (no rotated server.log.1)
    assert len(re.findall(r"^starting SGLang", r.stdout, re.M)) == 1, r.stdout
    logs = [p for p in out.rglob("server.log*")]
    assert [p.name for p in logs] == ["server.log"], logs
    assert logs[0].read_text().count("The server is fired up and ready to roll!") == 1
    for name, target, max_new in JOB:
        samples = assert_exact(out, target, name)
        assert {s["dataset"] for s in samples} == {name}
        assert {s["meta"]["sampling"]["max_new_tokens"] for s in samples} == {max_new}
        assert all(s["meta"]["completion_tokens"] <= max_new * s["meta"]["turns"] for s in samples)
        manifest = orjson.loads((out / name / "manifest.json").read_bytes())
        assert manifest["runs"][-1]["stopped_by"] == "target"
        assert (out / name / "run.log").read_text().count(f"{name}: {target}/{target} samples") == 1
    lines = r.stdout.strip().splitlines()[-4:]
    for line, (name, target, _) in zip(lines, JOB, strict=False):  # the 4th line is the job
        assert re.fullmatch(rf"{name}: {target}/{target} samples \(100\.0%\), \+{target} this run in \d+s; "
                            r"target reached\.", line), line
    assert lines[-1] == "job (A, B, C): 95/95 samples (100.0%), +95 this run; every dataset at its target."
    # a dataset's run.log has its own lines, not the other datasets'
    assert "B: starting" not in (out / "A" / "run.log").read_text()

    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    assert "starting SGLang" not in again.stdout  # nothing to do: no model load
    for name, target, _ in JOB:
        assert f"{name}: {target}/{target} samples (100.0%); the target is already reached, nothing to do." \
            in again.stdout
        assert_exact(out, target, name)


def test_finished_dataset_is_skipped_and_the_others_resume(tmp_path: Path, shared_sim: SimThread) -> None:
    # attached to the session's simulator: the subject is the job's skip and resume, not the launch (above)
    a, b, c = _job(tmp_path / "ds")
    out = tmp_path / "out"

    def generate(*args: str | Path) -> str:
        r = run_cli("generate", "--server-url", shared_sim.url, "--output-dir", out, "--progress", "quiet", *args)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    generate("--dataset", b, "--limit", "12")
    assert len(read_samples(out, "B")) == 12
    generate("--dataset", a)
    stdout = generate("--dataset", f"{a},{b},{c}")
    assert "A: 40/40 samples (100.0%); the target is already reached, nothing to do." in stdout
    assert re.search(r"^B: 30/30 samples \(100\.0%\), \+18 this run in \d+s; target reached\.$", stdout, re.M)
    assert re.search(r"^C: 25/25 samples \(100\.0%\), \+25 this run in \d+s; target reached\.$", stdout, re.M)
    for name, target, _ in JOB:
        assert_exact(out, target, name)


@pytest.mark.parametrize(("bad", "old", "new", "named"), [
    (2, 'files = ["C.jsonl"]', 'files = ["missing.jsonl"]', "missing.jsonl"),  # a source
    (1, "max_new_tokens = 160", "max_new_tokens = -1", "max_new_tokens"),  # a config
], ids=["source", "config"])
def test_a_bad_dataset_stops_the_job_naming_its_toml_before_the_server_starts(tmp_path: Path, bad: int, old: str,
                                                                               new: str, named: str) -> None:
    tomls = _job(tmp_path / "ds")
    tomls[bad].write_text(tomls[bad].read_text().replace(old, new))
    out = tmp_path / "out"
    r = run_cli("generate", "--dataset", ",".join(map(str, tomls)), "--server", "sim", "--output-dir", out)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert str(tomls[bad]) in r.stderr and named in r.stderr, r.stderr
    assert "starting SGLang" not in r.stdout
    assert not list(out.rglob("server.log*")) and not list(out.rglob("shard-*.jsonl"))


def test_dataset_all_takes_every_toml_but_demo(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    _job(cfg, (("A", 6, 16), ("B", 5, 16)))
    write_dataset(cfg, name="demo", target=5, max_new_tokens=16)
    shutil.copy(REPO / "datasets_cfg" / "server.toml", cfg)
    out = tmp_path / "out"
    r = run_cli("generate", "--dataset", "all", "--server", "sim", "--config-dir", cfg, "--output-dir", out,
                "--progress", "quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["A", "B"]
    assert_exact(out, 6, "A")
    assert_exact(out, 5, "B")


def test_controller_mix_shrinks_the_window_as_long_requests_fill_the_pool() -> None:
    """A job's window follows the datasets in flight: short ones → many slots, long ones → few."""
    ctl = Controller(Capacity(100_000, 4096, source="test"), initial_tokens_per_request=500)
    ctl.add_kind("short", 500)
    ctl.add_kind("long", 5000)
    ctl.set_mix({"short": 1, "long": 0})
    only_short = ctl.window(0.0, 10_000)
    ctl.set_mix({"short": 50, "long": 50})
    half = ctl.window(0.0, 10_000)
    ctl.set_mix({"short": 0, "long": 10})
    only_long = ctl.window(0.0, 10_000)
    assert only_short > half > only_long
    slack = lambda n: min(32, max(2, int(0.05 * n)))  # noqa: E731 (queue_slack_* defaults)
    assert only_short == int(0.92 * 100_000 / 500) + slack(0.92 * 100_000 / 500)
    assert only_long == int(0.92 * 100_000 / 5000) + slack(0.92 * 100_000 / 5000)
    # completions of one kind move only that kind's estimate
    for _ in range(200):
        ctl.observe_completion(1.0, 100, 100, 1.0, "short")
    ctl.set_mix({"short": 0, "long": 10})
    assert ctl.window(1.0, 10_000) == only_long


def test_a_job_of_one_sizes_its_window_as_a_lone_dataset() -> None:
    """A single dataset runs as a job of one (its dispatcher a member of the window, its dataset a kind of the
    controller): on the same completions and polls, the window is the one the bare controller gives."""
    import random

    from gen_pipeline.records import LoadSnapshot
    from gen_pipeline.run.dispatch import Dispatcher, Window
    from gen_pipeline.run.stats import RunStats

    def windows(job_of_one: bool) -> list[int]:
        rng, now = random.Random(7), [0.0]
        window = Window(clock=lambda: now[0])
        window.controller = Controller(Capacity(24_576, 2048, source="test"), initial_tokens_per_request=300)
        d = Dispatcher(1200, window, RunStats(clock=lambda: now[0]), "T")
        if job_of_one:
            window.controller.add_kind("T", 300)
            window.members = [d]
        sizes, gen = [], 0
        for step in range(3000):
            now[0] += 0.05
            d.in_flight = min(window.size, d.need())
            if rng.random() < 0.6 and d.need() > 0:
                d.ok += 1
                window.observe_completion(rng.randint(20, 80), rng.randint(50, 250), rng.uniform(0.5, 3.0),
                                          "T" if job_of_one else None)
                d.retune()
            if step % 20 == 0:
                gen += rng.randint(1000, 3000)
                window.observe_load(LoadSnapshot(now[0], running=min(d.in_flight, 110),
                                                 queued=max(0, d.in_flight - 110),
                                                 token_usage=min(1.0, d.in_flight * 200 / 24_576),
                                                 retractions_total=0, gen_tokens_total=gen))
                d.retune()
            sizes.append(window.size)
        return sizes

    lone, job = windows(False), windows(True)
    assert len(set(lone)) > 3  # the controller moved the window
    assert job == lone
