"""Telemetry of every load poll, the report and the diagnosis, on simulator runs built to land in each regime."""

from __future__ import annotations

import base64
import json
import signal
from pathlib import Path

import orjson
import pytest

from gen_pipeline.reports import diagnose as bottleneck
from gen_pipeline.store import telemetry
from gen_pipeline.store.telemetry import TELEMETRY_NAME, append_rows, read_file, read_telemetry
from tests.reports.test_check import config_dir_with

from pipeline_helpers import assert_exact, freeze, kill_group, make_rows, run_cli, start_cli, wait_for, write_dataset

FAST = ["--sim-profile", "fast", "--sim-startup-s", "0.2"]


def _config(tmp: Path, keys: dict, extra_args: list[str]) -> Path:
    """A config dir with server.toml + a profile `t` inheriting the small simulator."""
    lines = [f"{k} = {orjson.dumps(v).decode()}" for k, v in {**keys, "extra_args": extra_args}.items()]
    return config_dir_with(tmp, '[profile.t]\ninherits = "sim"\n' + "\n".join(lines) + "\n")


def scenario(tmp: Path, *, keys: dict | None = None, sim: list[str], target: int, max_new_tokens: int,
             window: int | None = None, rows: list[dict] | None = None,
             extra: tuple[str, ...] = ()) -> tuple[str, list[dict]]:
    """Generate dataset T on profile `t` to its target; (diagnose's output, telemetry rows)."""
    cfg = _config(tmp, keys or {}, sim)
    write_dataset(cfg, rows=rows if rows is not None else make_rows(target + 20), target=target,
                  max_new_tokens=max_new_tokens, shard_max_samples=500, fsync_every=64)
    out = tmp / "out"
    gen = run_cli("generate", "--dataset", cfg / "T.toml", "--server", "t", "--config-dir", cfg, "--output-dir", out,
                  "--progress", "quiet", "--poll-interval-s", "0.25", *(["--window", str(window)] if window else []),
                  *extra, timeout_s=560)  # a bound for a stuck run only: the slow scenarios take minutes when loaded
    assert gen.returncode == 0, gen.stdout + gen.stderr
    d = run_cli("diagnose", "--dataset", "T", "--output-dir", out, "--config-dir", cfg)
    assert d.returncode == 0, d.stderr
    return d.stdout, read_telemetry(out / "T")


def rules(text: str) -> list[str]:
    return [line.split(":")[0] for line in text.splitlines() if line and not line.startswith((" ", "T:"))]


# ---------------------------------------------------------------- the file


def _row(i: int, run: int = 1, restarts: int = 0) -> dict:
    return {"t": 1000.0 + i, "t_run_s": float(i), "run": run, "restarts": restarts, "in_flight": 4, "window": 4}


def test_torn_tail_is_skipped_and_mended(tmp_path: Path) -> None:
    path = tmp_path / TELEMETRY_NAME
    append_rows(path, [_row(0), _row(1)])
    with open(path, "ab") as f:
        f.write(b'{"t": 1002.0, "t_run_s": 2.0, "ru')  # kill -9 mid-write
    assert [r["t_run_s"] for r in read_file(path)] == [0.0, 1.0]
    append_rows(path, [_row(3, run=2)], mend_tail=True)  # the next run's first row is not swallowed
    assert [(r["run"], r["t_run_s"]) for r in read_telemetry(tmp_path)] == [(1, 0.0), (1, 1.0), (2, 3.0)]


def test_rotation_bounds_bytes_and_keeps_boundaries(tmp_path: Path) -> None:
    path, max_bytes = tmp_path / TELEMETRY_NAME, 4096
    for i in range(3000):
        append_rows(path, [_row(i, run=1 + i // 1000, restarts=int(i > 1500))], max_bytes=max_bytes)
    total = path.stat().st_size + (tmp_path / telemetry.ARCHIVE_NAME).stat().st_size
    assert total <= 2 * max_bytes + 200, total
    rows = read_telemetry(tmp_path)
    assert rows[-1]["t_run_s"] == 2999.0 and len(rows) < 3000
    kept = {(r["run"], r["restarts"]) for r in rows}
    assert kept == {(1, 0), (2, 0), (2, 1), (3, 1)}  # every run and restart still visible
    assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)
    assert telemetry.decimate([_row(i) for i in range(25)], 10) == [_row(0), _row(10), _row(20), _row(24)]


def test_disk_error_turns_telemetry_off_once(tmp_path: Path) -> None:
    (tmp_path / TELEMETRY_NAME).mkdir()  # cannot be opened as a file
    events: list[str] = []
    tel = telemetry.Telemetry(tmp_path, run=1, on_event=events.append)
    from gen_pipeline.records import RunSnapshot
    snapshot = RunSnapshot(done=0, target=1, samples_per_s=0.0, tokens_per_s=0.0, in_flight=0, window=1)
    for _ in range(5):
        tel.poll(snapshot)
    tel.close()
    assert len(events) == 1 and "telemetry off" in events[0] and TELEMETRY_NAME in events[0], events
    assert tel.enabled is False


def test_unwritable_telemetry_never_fails_a_run(tmp_path: Path) -> None:
    toml = write_dataset(tmp_path / "ds", target=40, max_new_tokens=48)
    (tmp_path / "out" / "T" / TELEMETRY_NAME).mkdir(parents=True)
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", tmp_path / "out",
                "--progress", "quiet")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("telemetry off for this run") == 1, r.stdout
    assert_exact(tmp_path / "out", 40)


@pytest.mark.e2e  # the process is the subject: make e2e
def test_telemetry_survives_kill_9_and_resume_appends(tmp_path: Path) -> None:
    # 150 outputs of ~300 tokens take >= 2 simulated s (~1 s real at --time-scale 2) over a 24,576-token
    # pool, far more than the 3 polls (0.15 s) awaited: the run is mid-way when it is frozen, then killed.
    cfg = _config(tmp_path, {}, FAST + ["--time-scale", "2", "--sim-output-mean", "300"])
    toml = write_dataset(cfg, rows=make_rows(200), target=150, max_new_tokens=400)
    out, path = tmp_path / "out", tmp_path / "out" / "T" / TELEMETRY_NAME
    args = ("generate", "--dataset", toml, "--server", "t", "--config-dir", cfg, "--output-dir", out,
            "--progress", "log", "--poll-interval-s", "0.05")
    proc = start_cli(*args, log=tmp_path / "cli.log")
    wait_for(lambda: path.exists() and path.read_bytes().count(b"\n") >= 3, timeout_s=60, interval_s=0.005)
    freeze(proc)
    assert proc.poll() is None  # still running: the kill lands mid-run
    kill_group(proc, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    first = read_file(path)
    with open(path, "ab") as f:
        f.write(b'{"t": 17')  # what a kill inside a write leaves
    r = run_cli(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = read_telemetry(out / "T")
    assert rows[:len(first)] == first  # nothing of the killed run lost
    second = [x for x in rows if x["run"] == 2]
    assert len(second) >= 1 and len(rows) == len(first) + len(second)
    assert second[-1]["done"] == 150 and {x["run"] for x in rows} == {1, 2}
    assert all(set(x) >= {"window", "in_flight", "running", "queued", "kv_usage", "kv_capacity_tokens", "gen_tok_s",
                          "retractions", "mode", "reason", "restarts", "client_cpu"} for x in rows)
    # the CLI's own CPU, in cores: a figure once the run is a second old (a poll a second here)
    assert all(x["client_cpu"] is None or 0 <= x["client_cpu"] < 8 for x in rows)
    assert any(x["client_cpu"] is not None for x in rows)
    assert_exact(out, 150)


# ---------------------------------------------------------------- report


def _png_of(page: str) -> bytes:
    b64 = page.split("data:image/png;base64,", 1)[1].split('"', 1)[0]
    return base64.b64decode(b64)


def test_report_renders_from_the_demo_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    g = run_cli("generate", "--dataset", "demo", "--server", "sim", "--output-dir", out, "--progress", "quiet")
    assert g.returncode == 0, g.stderr
    r = run_cli("report", "--dataset", "demo", "--output-dir", out)
    assert r.returncode == 0, r.stderr
    page = (out / "demo" / "report.html").read_text()
    assert _png_of(page)[:8] == b"\x89PNG\r\n\x1a\n"
    assert "240/240" in page and "finished" in page  # the status table
    assert "1 run, 0 server restarts" in page
    assert r.stdout.startswith(f"{out / 'demo' / 'report.html'}: ")


@pytest.mark.e2e  # a launched simulator crashes (--sim-crash-after) and is restarted: make e2e
def test_report_and_diagnose_mark_a_server_restart(tmp_path: Path) -> None:
    text, rows = scenario(tmp_path, sim=FAST + ["--time-scale", "4", "--sim-output-mean", "200", "--sim-crash-after",
                                                "40"], target=100, max_new_tokens=300)
    restarts = max(r["restarts"] for r in rows)
    assert restarts >= 1
    assert rules(text)[0] == "server_restarts" and f"restarted {restarts} time(s) (run 1: {restarts})" in text, text
    r = run_cli("report", "--dataset", "T", "--output-dir", tmp_path / "out", "--config-dir", tmp_path / "cfg",
                "--out", tmp_path / "r.html")
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "r.html").read_text()
    assert f"1 run, {restarts} server restart{'s' if restarts > 1 else ''}" in page and "server_restarts" in page
    assert len(_png_of(page)) > 10_000
    from gen_pipeline.reports.page import timeline
    assert len(timeline(rows)[2]) == restarts  # a red line per restart


@pytest.mark.e2e  # a launched simulator, ~3 s of it
def test_a_launched_servers_front_end_cpu_is_in_its_telemetry(tmp_path: Path) -> None:
    _, rows = scenario(tmp_path, sim=FAST + ["--time-scale", "0.4", "--sim-output-mean", "200"], target=100,
                       max_new_tokens=300)
    read = [r["front_end_cpu"] for r in rows if r["front_end_cpu"] is not None]
    assert read and all(0 <= x < 2 for x in read), rows  # the simulator's process: one event loop


@pytest.mark.e2e  # a launched simulator that ignores SIGTERM: its stop takes the profile's 4 s of grace
def test_the_last_telemetry_row_is_the_runs_end_not_the_servers_stop(tmp_path: Path) -> None:
    """The run's last row (done = target) carries the time of its last sample: a launched server's stop after it
    (SIGTERM, grace, SIGKILL) is not an idle tail of the run, nor time in its final rates."""
    import time

    started = time.monotonic()
    _, rows = scenario(tmp_path, keys={"stop_grace_s": 4}, sim=FAST + ["--time-scale", "4", "--sim-output-mean",
                                                                       "100", "--sim-ignore-sigterm"],
                       target=60, max_new_tokens=200)
    assert time.monotonic() - started > 4  # the stop took its grace: the server ignored SIGTERM
    last, before = rows[-1], [r for r in rows[:-1] if r["t"] < rows[-1]["t"]][-1]
    assert last["done"] == 60 and last["in_flight"] == 0
    assert last["t"] - before["t"] < 2.0 and last["t_run_s"] - before["t_run_s"] < 2.0, rows[-3:]


def test_diagnose_without_telemetry_says_so(tmp_path: Path) -> None:
    (tmp_path / "T").mkdir()
    r = run_cli("diagnose", "--dataset", "T", "--output-dir", tmp_path)
    assert r.returncode == 0 and "no telemetry yet" in r.stdout
    r = run_cli("diagnose", "--dataset", "nope", "--output-dir", tmp_path)
    assert r.returncode == 2 and "no such output folder" in r.stderr


# ---------------------------------------------------------------- one simulator run per verdict


@pytest.mark.slow  # 200x simulated time: a CPU-starved client reads as client_bound (make chaos)
def test_kv_bound_seed_b2(tmp_path: Path) -> None:
    """The seed's B2: bf16 KV at 0.85 (116K tokens), 4K-token outputs, 150 in flight."""
    text, rows = scenario(tmp_path, keys={"mem_fraction_static": 0.85, "kv_cache_dtype": "bf16",
                                          "enable_hierarchical_cache": False, "hicache_size_gb": 0},
                          sim=["--sim-profile", "seed", "--time-scale", "200", "--sim-startup-s", "0.2",
                               "--sim-output-mean", "4000", "--sim-output-spread", "0.25"],
                          target=300, max_new_tokens=8192, window=150)
    assert rules(text)[0] == "kv_bound", text
    assert "116,000 KV tokens" in text and "fp8_e4m3: 2x the KV tokens (116,000 → 232,000," in text
    assert "2.0x decode slots" in text  # more than twice the running requests want a slot
    assert "hierarchical cache" in text and "adds no decode slots" in text
    assert rows[0]["kv_capacity_tokens"] == 116_000 and rows[0]["kv_dtype"] == "bf16"


@pytest.mark.slow  # ~10-20 s of simulator run each on a loaded machine (make chaos)
@pytest.mark.parametrize("keys, sim, target, max_new_tokens, window, rule, said", [
    ({"max_running_requests": 8}, ["--sim-output-mean", "200"], 150, 300, 64, "admission_bound",
     ["of max_running_requests 8", "raise --max-running-requests"]),
    # KV nearly empty yet requests wait: the scheduler reserves for max_new_tokens, not the real outputs
    ({}, ["--sim-output-mean", "100"], 150, 16384, 64, "compute_bound", []),
    # heavy-tailed output lengths: the last, longest requests run alone
    ({}, ["--sim-output-mean", "150", "--sim-output-spread", "1.4"], 200, 6000, 40, "idle_tail", []),
], ids=["admission_bound", "compute_bound", "idle_tail"])
def test_a_run_in_each_regime_gets_its_verdict(tmp_path: Path, keys: dict, sim: list[str], target: int,
                                               max_new_tokens: int, window: int, rule: str, said: list[str]) -> None:
    text, _ = scenario(tmp_path, keys=keys, sim=FAST + ["--time-scale", "2", *sim], target=target,
                       max_new_tokens=max_new_tokens, window=window)
    assert rule in rules(text) and [s for s in said if s not in text] == [], text


@pytest.mark.slow  # ~10-20 s of simulator run each on a loaded machine (make chaos)
@pytest.mark.timeout(600)  # 30,100 rows read twice (the pre-launch check, the run): minutes on a loaded machine
def test_client_bound_by_a_slow_source(tmp_path: Path) -> None:
    """Most rows are invalid: the producer spends its time filtering, the window is not kept full. Sized by
    work, not timing: each valid row costs the producer 300 rejected rows, its request three server steps."""
    good = make_rows(100)
    bad = {"id": "x", "messages": [{"role": "user", "content": ""}]}
    rows = [r for g in good for r in [g] + [{**bad, "id": f"{g['id']}-bad{k}"} for k in range(300)]]
    text, _ = scenario(tmp_path, sim=FAST + ["--time-scale", "10", "--sim-output-mean", "2", "--sim-output-spread",
                                             "0"], target=100, max_new_tokens=4, window=48, rows=rows,
                       extra=("--proceed-anyway",  # the pre-launch check refuses a mostly-rejected source
                              "--poll-interval-s", "0.05"))
    assert "client_bound" in rules(text), text


@pytest.mark.slow  # ~10-20 s of simulator run each on a loaded machine (make chaos)
def test_retraction_storm(tmp_path: Path) -> None:
    """A small pool (24,576 tokens), outputs (~6K) beyond SGLang's 4,096-token reservation clip: it admits
    more than fit, the pool fills mid-decode and it retracts, again and again."""
    text, rows = scenario(tmp_path, sim=FAST + ["--time-scale", "20", "--sim-output-mean", "6000",
                                                "--sim-output-spread", "0.1"], target=40, max_new_tokens=8192,
                          window=60)
    assert "retraction_storm" in rules(text), text
    assert rows[-1]["retractions"] >= 10 and f"{rows[-1]['retractions']} retractions for 40 completed" in text


def test_rules_are_pure_on_rows() -> None:
    """Each rule reads only rows: a synthetic flat run fires nothing, a short one says so."""
    flat = [{**_row(i), "running": 4, "queued": 0, "kv_usage": 0.5, "window": 10, "in_flight": 10, "done": i}
            for i in range(30)]
    assert bottleneck.diagnose(flat) == []
    assert bottleneck.diagnose(flat[:3])[0].rule == "too_short"


def said(rows: list[dict], rule: str) -> list[str]:
    """The lines diagnose prints for `rule`'s verdict on `rows`."""
    return [line for v in bottleneck.diagnose(rows) if v.rule == rule for line in v.lines()]


def _h200_streamed(i: int, cpu: float | None, queued: int = 0) -> dict:
    """A poll of the H200 run that was client-bound (short outputs, SGLang's --stream-interval 1, fixed
    window 128): 58 running, nothing queued, the generate process at ~0.9 of a core."""
    return {**_row(i), "window": 128, "in_flight": 128, "running": 58, "queued": queued, "kv_usage": 0.3,
            "gen_tok_s": 8100.0, "client_tok_s": 8000.0, "client_cpu": cpu, "done": 10 * i}


def test_a_client_at_a_core_with_free_server_slots_is_client_bound_and_told_the_fix() -> None:
    rows = [_h200_streamed(i, 0.92 if i % 2 else 0.9) for i in range(30)]
    assert said(rows, "client_bound") == [
        "client_bound: the client's own CPU bounds the run",
        "  the generate process used 0.91 of a core (median of 24 steady polls) while the server ran 58 requests "
        "of a window of 128 (in flight 100% of it on average) and queued requests in 0% of polls",
        "  → read the answers in reader processes: --readers N (without the flag one is added each time the main "
        "process used half a core over 2 s, up to half the cores; --readers 0 turns them off)",
        "  → each streamed chunk costs the client CPU: raise SGLang's --stream-interval (e.g. 8, the shipped "
        "profiles' stream_interval; a loop is then aborted at most 7 tokens later) or set [generation] on_loop = "
        '"off" (turns sent whole, no loop gate)']


@pytest.mark.parametrize("cpu, queued", [(0.4, 0), (None, 0), (0.95, 20)])
def test_a_client_with_cpu_to_spare_or_a_server_that_queues_is_not_client_bound(cpu: float | None,
                                                                                  queued: int) -> None:
    rows = [_h200_streamed(i, cpu, queued) for i in range(30)]
    assert "client_bound" not in [v.rule for v in bottleneck.diagnose(rows)]


def _h100_small_i1(i: int, front_end: float | None) -> dict:
    """A poll of the H100 run at SGLang's --stream-interval 1 with the small model: SGLang's main process at
    ~0.95 of a core, ~47 running, the client's own main process light (its answers read in reader processes)."""
    return {**_row(i), "window": 512, "in_flight": 512, "running": 47, "queued": 0, "kv_usage": 0.1,
            "gen_tok_s": 11800.0, "client_tok_s": 11800.0, "client_cpu": 0.2, "front_end_cpu": front_end,
            "done": 50 * i}


def test_a_server_front_end_at_a_core_is_named_with_its_levers() -> None:
    rows = [_h100_small_i1(i, 0.95 + 0.01 * (i % 3 - 1)) for i in range(30)]
    assert said(rows, "front_end_bound") == [
        "front_end_bound: SGLang's HTTP front end uses a whole core: it, not the GPU, bounds the run",
        "  SGLang's busiest front-end process (its HTTP server and tokenizer manager: the main process or one of its "
        "tokenizer workers, an event loop each) used 0.95 of a core (median of 24 steady polls) while the server ran "
        "47 requests at 11,800 tok/s",
        "  → every streamed chunk costs it CPU: raise SGLang's --stream-interval (the profile's stream_interval; 8 in "
        "the shipped profiles, SGLang's default is 1): a chunk every 8 tokens instead of every token",
        "  → SGLang 0.5.17 can run its front end in several processes: --tokenizer-worker-num 4 (or more than the "
        "profile has) in its extra_args, which made a small model's run at interval 1 1.5 x as fast on one H100; or "
        "split the GPUs into more servers, each with its own"]
    assert "client_bound" not in [v.rule for v in bottleneck.diagnose(rows)]


@pytest.mark.parametrize("front_end", [0.8, None])  # the interval-8 run's 0.80-0.86; an attached server: no figure
def test_a_front_end_with_cpu_to_spare_or_unknown_is_not_named(front_end: float | None) -> None:
    rows = [_h100_small_i1(i, front_end) for i in range(30)]
    assert "front_end_bound" not in [v.rule for v in bottleneck.diagnose(rows)]


def test_levers_are_plans_arithmetic() -> None:
    """The memory-fraction lever is plan's +0.01 figure; fp8 doubles the tokens; hicache adds no slots."""
    from gen_pipeline.server.plan import plan
    cfg = json.loads((Path(__file__).parents[2] / "datasets_cfg/models/kimi-k2.5-config.json").read_text())
    p = plan(cfg, gpu_mem_gb=141, tp_size=8, mem_fraction_static=0.85, tokens_per_sample=4000, weights_gb=594)
    per_001 = p.options[0].tokens_per_0_01
    levers = bottleneck.kv_levers(116_000, "bf16", 4000, running=30, queued=100,
                                  hw=bottleneck.Hardware(cfg, 141, 8, "kimi"))
    assert "(116,000 → 232,000, 58 requests at their end) → ~60 running of the 130 wanting a slot: 2.0x" in levers[0]
    assert f"+{per_001:,} KV tokens (+{per_001 / 4000:.0f} slots" in levers[1]
    assert "adds no decode slots" in levers[2]
    assert not bottleneck.kv_levers(232_000, "fp8_e4m3", 4000, 60, 10)[0].startswith("--kv-cache-dtype")
