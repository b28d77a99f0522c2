"""What a user sees of a run: start-up messages, progress lines (a bar on a terminal, plain lines in a log),
run.log, errors.jsonl."""

from __future__ import annotations

import io
import re
import subprocess
from pathlib import Path

import pytest
from servers import sim_in_thread

from gen_pipeline.display import format_duration
from gen_pipeline.records import RunSnapshot
from gen_pipeline.run.progress import Progress

from pipeline_helpers import REPO, SIM_FAST, cli_cmd, run_cli, write_dataset

NUM = r"[\d,.]+"


def merged(*args: str | Path) -> str:
    """The CLI's stdout and stderr as one stream, in the order written (both go to one pipe)."""
    r = subprocess.run(cli_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                       timeout=120)
    assert r.returncode == 0, r.stdout
    return r.stdout


def slow_sim(folder: Path) -> Path:
    """A config dir whose "sim" profile is the demo's at a tenth of its speed: a run lasts a few load polls."""
    text = (REPO / "datasets_cfg" / "server.toml").read_text()
    (folder / "server.toml").write_text(text.replace('"--time-scale", "10", "--sim-startup-s", "0.5"',
                                                     '"--time-scale", "1", "--sim-startup-s", "0.5"'))
    return folder


@pytest.mark.e2e  # the process is the subject: make e2e
def test_log_mode_start_up_first_then_figures_with_load_then_peaks(tmp_path: Path) -> None:
    toml = write_dataset(tmp_path / "ds", target=60, max_new_tokens=64)
    lines = merged("generate", "--dataset", toml, "--server", "sim", "--config-dir", slow_sim(tmp_path / "ds"),
                   "--output-dir", tmp_path / "out", "--progress", "log").splitlines()
    assert lines[0] == "T: loading the source T.jsonl"  # the set-up's one slow step (a hub download: minutes)
    assert re.fullmatch(r"starting SGLang \(sim\) on http://127\.0\.0\.1:\d+, log: \S+/out/T/server\.log", lines[1])
    assert re.fullmatch(r"SGLang ready after \d+ s, pid \d+: Kimi-K2\.5 tp=8 kv=fp8_e4m3 24,576 KV tokens, max running "
                        r"[\d,]+, hicache 48 GB", lines[2]), lines
    figures, summary = lines[3:-1], lines[-1]
    # the first line already carries the server's load (it waits for a poll) and the controller
    assert re.fullmatch(rf"T {NUM}/60 \({NUM}%\) {NUM} samples/s, {NUM} tok/s, in flight \d+/\d+, running \d+ "
                        rf"queued \d+, KV \d+%, controller (load|model): .+?(, eta \S+)?", figures[0]), figures
    # the last: the run's peaks instead of the last poll's load; nothing in flight, no ETA
    assert re.fullmatch(rf"T 60/60 \(100\.0%\) {NUM} samples/s, {NUM} tok/s, peak running \d+ queued \d+, "
                        rf"peak KV \d+%", figures[-1]), figures
    assert re.fullmatch(r"T: 60/60 samples \(100\.0%\), \+60 this run in \d+s; target reached\.", summary)


@pytest.mark.e2e  # the process is the subject: make e2e
def test_bar_appears_after_the_start_up_messages(tmp_path: Path) -> None:
    toml = write_dataset(tmp_path / "ds", target=20, max_new_tokens=32)
    text = merged("generate", "--dataset", toml, "--server", "sim", "--output-dir", tmp_path / "out",
                  "--progress", "bar")
    before, ready, after = text.partition("SGLang ready after ")
    started = "T: loading the source T.jsonl\nstarting SGLang (sim) on http://127.0.0.1:"
    assert ready and before.startswith(started) and before.endswith(
        "/out/T/server.log\n"), before  # a whole line, no bar drawn yet
    assert "%|" not in before and "%|" in after
    assert after.rstrip().splitlines()[-1].startswith("T: 20/20 samples (100.0%), +20 this run in ")


def test_run_log_appends_timestamped_events_across_runs(tmp_path: Path) -> None:
    toml = write_dataset(tmp_path / "ds", target=30, max_new_tokens=32)
    out = tmp_path / "out"
    for _ in range(2):
        assert run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", out, "--limit", "15",
                       "--progress", "quiet").returncode == 0
    lines = (out / "T" / "run.log").read_text().splitlines()
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO "
    starts = [i for i, ln in enumerate(lines) if re.fullmatch(stamp + r"run of T: \d+/30 samples done", ln)]
    assert len(starts) == 2 and re.fullmatch(stamp + "run of T: 0/30 samples done", lines[starts[0]])
    assert re.fullmatch(stamp + "run of T: 15/30 samples done", lines[starts[1]])
    assert re.fullmatch(stamp + r"starting SGLang \(sim\) on .+", lines[starts[0] + 1])
    assert any(re.fullmatch(stamp + r"controller (load|model): .+ \(window \d+\)", ln) for ln in lines)
    assert re.fullmatch(stamp + r"T: 15/30 samples \(50\.0%\), \+15 this run in \d+s; stopped at --limit; "
                        r"run again to continue\.", lines[starts[1] - 1])
    assert re.fullmatch(stamp + r"T: 30/30 samples \(100\.0%\), \+15 this run in \d+s; target reached\.", lines[-1])


B2 = {"done": 900, "target": 18_000, "samples_per_s": 0.5, "tokens_per_s": 1400.0, "in_flight": 150, "running": 140,
      "queued": 10, "kv_usage": 0.93}


@pytest.mark.parametrize(("snapshots", "lines"), [
    ([RunSnapshot(**B2, window=152, retractions_total=40, retractions_run=4),
      RunSnapshot(done=1000, target=18_000, samples_per_s=0.5, tokens_per_s=1412.0, in_flight=150, window=152)],
     ["B2 900/18,000 (5.0%) 0.50 samples/s, 1,400 tok/s, in flight 150/152, running 140 queued 10, KV 93%, "
      "retracted 4, eta 9h30m",
      "B2 1,000/18,000 (5.6%) 0.50 samples/s, 1,412 tok/s, in flight 150/152, eta 9h26m"]),
    ([RunSnapshot(**B2, window=120, controller_mode="load",
                  controller_reason="retraction burst (6 in one poll): step back, no growth for 30 s")],
     ["B2 900/18,000 (5.0%) 0.50 samples/s, 1,400 tok/s, in flight 150 (window lowered to 120; 30 finishing "
      "before new ones), running 140 queued 10, KV 93%, controller load: retraction burst (6 in one poll): "
      "step back, no growth for 30 s, eta 9h30m"]),
], ids=["log-lines", "window-lowered"])
def test_log_lines_when_not_a_terminal(snapshots: list[RunSnapshot], lines: list[str]) -> None:
    out = io.StringIO()
    p = Progress("B2", stream=out, log_every_s=3600)
    assert p.mode == "log"
    for snapshot in snapshots:
        p.update(snapshot)
    p.close()
    assert out.getvalue().splitlines() == lines


def test_durations() -> None:
    assert [format_duration(s) for s in (None, 5, 65, 3600 * 27 + 60)] == ["?", "5s", "1m05s", "27h01m"]


async def test_load_observers_get_every_poll(tmp_path: Path) -> None:
    from gen_pipeline.config.dataset import load_dataset_config
    from gen_pipeline.run import RunOptions, run_generate

    cfg = load_dataset_config(write_dataset(tmp_path / "ds", target=40, max_new_tokens=64))
    polls: list[RunSnapshot] = []
    # a tenth of the speed (the last --time-scale wins): the run lasts several polls
    with sim_in_thread([*SIM_FAST, "--time-scale", "1"], ready_timeout_s=30) as sim:
        opts = RunOptions(output_root=tmp_path / "out", server_urls=(sim.url,),
                          poll_interval_s=0.05, load_observers=(polls.append,))
        summary = await run_generate(cfg, opts)
    assert summary.done == 40 and len(polls) >= 2
    assert [p.time_s for p in polls] == sorted(p.time_s for p in polls)
    assert [p.completions for p in polls] == sorted(p.completions for p in polls) and polls[-1].completions <= 40
    for p in polls:
        assert p.kv_capacity_tokens and p.kv_capacity_tokens > 0 and p.window >= 1
        assert p.running is not None and p.queued is not None and 0 <= (p.kv_usage or 0) <= 1
        assert p.controller_mode in ("load", "model") and p.controller_reason
