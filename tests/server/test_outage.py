"""Servers that go away, hang or refuse, with real processes (simulators over TCP, the CLI as a subprocess).
Every run that ends ends exact: no sample lost, none written twice, no failure recorded for an outage."""

from __future__ import annotations

import os
import re
import signal
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from sglang_sim.testing import SimProcess, free_port, start_sim

from pipeline_helpers import (
    _shard_lines,
    assert_exact,
    finish_cli,
    restart_sim_on_same_port,
    run_cli,
    sigkill_sim,
    wait_lines,
    wait_until,
)
from server_helpers import SIM, dataset, generate

SIM_SLOW = [*SIM, "--time-scale", "0.2"]
# --server-wait-s as shipped (docs/measurements.md, "Outages"): the test ends the outage once the run waits
WAIT_S = 600
POLL = ("--health-interval-s", "0.3")
SUMMARY = re.compile(r"^T: (\d+)/(\d+) samples \(100\.0%\), \+(\d+) this run in [\dms]+; target reached\.$", re.M)


# A fixed window for the tests that break a server mid-run: most of the 300 are still to be sent when the
# fault lands (an adaptive window sends all 300 at once and a quick machine ends the run first)
WINDOW = ("--window", "48")


def hang_holding_requests(sim: SimProcess, proc) -> None:
    """Stop `sim`'s scheduler (an NCCL hang), then wait until it holds requests that can no longer end: the
    run keeps sending while work remains, so the fault has landed on requests once in_flight > 0."""
    assert httpx.post(sim.url + "/sim/faults", json={"scheduler_hung": True}, timeout=5).status_code == 200
    wait_until(lambda: stats(sim)["in_flight"] > 0, proc, 60)


def freeze_sim(sim: SimProcess) -> None:
    os.killpg(sim.process.pid, signal.SIGSTOP)  # port open, nothing answers: a hung server


def thaw_sim(sim: SimProcess) -> None:
    os.killpg(sim.process.pid, signal.SIGCONT)


def stats(sim: SimProcess) -> dict:
    return httpx.get(sim.url + "/sim/stats", timeout=5).json()


def assert_no_failures(tmp_path: Path, text: str, target: int) -> None:
    """Exact output, and the summary line: every sample this run, nothing failed."""
    assert_exact(tmp_path / "out", target)
    m = SUMMARY.search(text)
    assert m is not None and m.groups() == (str(target), str(target), str(target)), text[-2000:]
    assert not (tmp_path / "out" / "T" / "errors.jsonl").exists()


# ---------------------------------------------------------------- item 1: outages are waited out

@pytest.mark.parametrize(("how", "servers"), [("restarted", 1), ("frozen", 1), ("restarted", 2)])
def test_an_attached_run_waits_out_an_outage_of_every_server(tmp_path: Path, how: str, servers: int) -> None:
    with ExitStack() as stack:
        sims = [stack.enter_context(start_sim(SIM)) for _ in range(servers)]
        sim = sims[0]
        toml = dataset(tmp_path, 300)
        proc, log = generate(tmp_path, toml, ",".join(s.url for s in sims), *POLL, "--server-wait-s", str(WAIT_S),
                             *WINDOW)
        wait_lines(tmp_path / "out" / "T", 40, proc)
        for s in sims:  # restarted: refused until it is back (an operator restart); frozen: the port open, no answer
            sigkill_sim(s) if how == "restarted" else freeze_sim(s)
        wait_until(lambda: "no server answers" in log.read_text(), proc)
        assert f"waiting up to {WAIT_S:g} s for one to come back" in log.read_text()
        for s in sims:
            stack.callback(restart_sim_on_same_port(s, SIM).stop) if how == "restarted" else thaw_sim(s)
        text = finish_cli(proc, log, 60)
    assert_no_failures(tmp_path, text, 300)
    assert re.search(r"^server is back after \d+ s: ", text, re.M), text[-2000:]
    if servers > 1:
        return
    if how == "frozen":  # it says why: the port is open but nothing answers (/health's or /v1/models' words)
        said = (rf"no server answers \({re.escape(sim.url)}: (no answer within the request timeout \([\d.]+ s\)|"
                r"no answer to GET /v1/models within [\d.]+ s)\)")
        assert re.search(said, text), text[-2000:]
    else:
        # refused, or the connections it had cut (whichever the health check or a request saw last)
        said = rf"no server answers \({re.escape(sim.url)}: (Connection refused|\w+Error: [^)]+)\)"
        assert re.search(said, text), text[-2000:]


@pytest.mark.slow
def test_an_attached_run_survives_a_90_s_restart_at_the_default_settings(tmp_path: Path) -> None:
    """At full scale (make chaos): a 90 s restart, --health-interval-s and --server-wait-s as shipped."""
    with ExitStack() as stack:
        sim = stack.enter_context(start_sim(SIM))
        toml = dataset(tmp_path, 300)
        proc, log = generate(tmp_path, toml, sim.url)
        wait_lines(tmp_path / "out" / "T", 40, proc)
        sigkill_sim(sim)
        wait_until(lambda: "no server answers" in log.read_text(), proc, 60)
        time.sleep(90)  # the outage itself
        stack.callback(restart_sim_on_same_port(sim, SIM).stop)
        text = finish_cli(proc, log, 120)
    assert_no_failures(tmp_path, text, 300)
    assert "dispatch paused, waiting up to 600 s for one to come back (--server-wait-s)" in text, text[-2000:]
    back = re.search(r"^server is back after (\d+) s: ", text, re.M)
    assert back is not None and 90 <= int(back.group(1)) < 120, text[-2000:]
    assert re.search(r"no server answers: waiting 1m\d\ds of 10m00s", text), text[-3000:]  # the progress line


def test_an_outage_longer_than_the_wait_ends_the_run_resumable(tmp_path: Path) -> None:
    # SIM_SLOW: the pool holds ~170 of the 300 at once, and the kill must land while the second wave decodes
    # (at time scale 1 that wave took ~0.4 s, which a loaded machine's poll and writer could miss)
    with start_sim(SIM_SLOW) as sim:
        toml = dataset(tmp_path, 300)
        proc, log = generate(tmp_path, toml, sim.url, *POLL, "--server-wait-s", "2", *WINDOW)
        wait_lines(tmp_path / "out" / "T", 40, proc)
        sigkill_sim(sim)
        rc = proc.wait(timeout=60)
    text = log.read_text()
    assert rc == 3, text[-2000:]
    assert (f"error: No server answered for 2 s ({sim.url}: Connection refused); giving up. Nothing written is "
            "lost: run the same command once the server is back (--server-wait-s sets how long a run waits).") \
        in text, text[-2000:]
    assert "Traceback" not in text
    assert not (tmp_path / "out" / "T" / "errors.jsonl").exists()  # the outage recorded no failure


def test_requests_the_server_refuses_end_the_run_naming_its_error(tmp_path: Path) -> None:
    # a context of 64 tokens: every request asks for more, the server answers 400 and /health 200
    with start_sim([*SIM, "--context-length", "64"]) as sim:
        toml = dataset(tmp_path, 60)
        r = run_cli("generate", "--dataset", toml, "--server-url", sim.url, "--output-dir", tmp_path / "out",
                    "--progress", "quiet", "--proceed-anyway")
    assert r.returncode == 3, r.stdout + r.stderr
    error = r.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"error: The last \d+ requests were all refused by the server, which answers /health \(latest: http_400: "
        r"HTTP 400: Requested token count exceeds the model's maximum context length of 64 tokens\. .*\)\. "
        r"Check the model name, the sampling settings and the server log; nothing written is lost, run the same "
        r"command to resume\.", error), error


# ---------------------------------------------------------------- item 2: a hung member of a fleet

@pytest.mark.parametrize("readers", ["0", "2"])
def test_a_hung_server_is_taken_out_within_seconds_and_its_requests_resent(tmp_path: Path, readers: str) -> None:
    """1 of 3 sims SIGSTOPped mid-run at the shipped defaults: taken out once its requests make no progress
    and GET /v1/models goes unanswered, its requests re-sent at once, not after request_timeout_s (600 s).
    The same with two reader processes reading the answers (run/readers.py)."""
    with ExitStack() as stack:
        sims = [stack.enter_context(start_sim(SIM_SLOW)) for _ in range(3)]
        toml = dataset(tmp_path, 300, request_timeout_s=600)
        # a fixed window: the adaptive one's first wave can end a run of 300 before the freeze on a busy machine
        proc, log = generate(tmp_path, toml, ",".join(s.url for s in sims), *WINDOW, "--readers", readers)
        wait_lines(tmp_path / "out" / "T", 30, proc)
        hung = sims[2]
        # freeze it while it holds requests (on a busy machine a poll can find it between two of them)
        seen: list[int] = []
        wait_until(lambda: seen.append(stats(hung)["in_flight"]) or seen[-1] > 0, proc, 60)
        stuck = seen[-1]
        freeze_sim(hung)
        stack.callback(thaw_sim, hung)
        lines_at_freeze = _shard_lines(tmp_path / "out" / "T")
        wait_until(lambda: f"took {hung.url} out" in log.read_text(), proc, 120)
        lines_at_take_out = _shard_lines(tmp_path / "out" / "T")
        text = finish_cli(proc, log, 120)
    assert_no_failures(tmp_path, text, 300)
    line = next(x for x in text.splitlines() if f"took {hung.url} out" in x)
    m = re.fullmatch(rf"took {re.escape(hung.url)} out after no progress for ([\d.]+) s on (\d+) in-flight requests "
                     r"and no answer to GET /v1/models within 3 s: stopped or frozen\? (\d+) in-flight requests "
                     r"re-sent to the others; 2 of 3 servers left, probing it back with backoff", line)
    assert m is not None, line
    # its own figure (the silence it measured): seconds, where base said 44 s (bound loose: a busy machine)
    assert float(m.group(1)) < 30, line
    assert stuck > 0 and int(m.group(2)) == int(m.group(3)) > 0
    # the order of events: frozen mid-run, taken out mid-run (the live servers still had work), then the
    # run's end; every sample exact above (its requests were sent again, none waited out 600 s)
    assert lines_at_freeze <= lines_at_take_out < 300, (lines_at_freeze, lines_at_take_out)
    assert text.index(line) < text.index("T: 300/300 samples")
    for live in sims[:2]:
        assert f"took {live.url} out" not in text


def test_a_live_server_that_is_slow_is_not_taken_out(tmp_path: Path) -> None:
    """Every answer starts after 8 s, longer than --hang-timeout-s, but GET /v1/models answers: busy, not
    hung. /health every 30 s: the sim answers /health at once, which would otherwise break the silence."""
    with ExitStack() as stack:
        fast = stack.enter_context(start_sim(SIM))
        slow = stack.enter_context(start_sim([*SIM, "--sim-stall-rate", "1", "--sim-stall-s", "8"]))
        toml = dataset(tmp_path, 60, request_timeout_s=600)
        proc, log = generate(tmp_path, toml, f"{fast.url},{slow.url}", "--health-interval-s", "30")
        text = finish_cli(proc, log, 120)
        served = stats(slow)
    assert_no_failures(tmp_path, text, 60)
    assert "took " not in text, text[-2000:]
    assert served["faults"]["stall"] > 0 and served["requests_completed"] > 0, served


def test_a_stuck_scheduler_is_taken_out_once_health_says_so(tmp_path: Path) -> None:
    """An NCCL hang: the scheduler stops, the HTTP process still answers /v1/models and /v1/loads and says
    /health 503 after SGLANG_HEALTH_CHECK_TIMEOUT (2 s here): taken out, its requests re-sent."""
    with ExitStack() as stack:
        sims = [stack.enter_context(start_sim([*SIM_SLOW, "--sim-health-check-timeout-s", "2"])) for _ in range(3)]
        toml = dataset(tmp_path, 300, request_timeout_s=600)
        proc, log = generate(tmp_path, toml, ",".join(s.url for s in sims), "--health-interval-s", "1", *WINDOW)
        wait_lines(tmp_path / "out" / "T", 30, proc)
        hung = sims[2]
        hang_holding_requests(hung, proc)
        wait_until(lambda: f"took {hung.url} out" in log.read_text(), proc, 120)
        assert httpx.get(hung.url + "/v1/loads", timeout=5).status_code == 200  # its HTTP side still answers
        text = finish_cli(proc, log, 120)
    assert_no_failures(tmp_path, text, 300)
    line = next(x for x in text.splitlines() if f"took {hung.url} out" in x)
    assert re.fullmatch(rf"took {re.escape(hung.url)} out after no progress for [\d.]+ s on (\d+) in-flight requests "
                        r"and /health answered HTTP 503: scheduler stuck\? \1 in-flight requests re-sent to the "
                        r"others; 2 of 3 servers left, probing it back with backoff", line), line


def test_requests_stalled_on_a_server_out_already_are_resent(tmp_path: Path) -> None:
    """/health 503 at once: 3 failed checks take it out before its requests are silent for --hang-timeout-s,
    leaving them to end by themselves; they never do, so once silent that long they are re-sent."""
    with ExitStack() as stack:
        sims = [stack.enter_context(start_sim([*SIM_SLOW, "--sim-health-check-timeout-s", "0"])) for _ in range(2)]
        toml = dataset(tmp_path, 300, request_timeout_s=600)
        proc, log = generate(tmp_path, toml, ",".join(s.url for s in sims), *POLL, *WINDOW)
        wait_lines(tmp_path / "out" / "T", 30, proc)
        hung = sims[1]
        hang_holding_requests(hung, proc)
        text = finish_cli(proc, log, 120)
    assert_no_failures(tmp_path, text, 300)
    assert (f"took {hung.url} out after 3 failed health checks in a row (/health answered HTTP 503); 1 of 2 "
            "servers left, probing it back with backoff") in text, text[-3000:]
    assert re.search(rf"^{re.escape(hung.url)} is out and its \d+ in-flight requests made no progress for [\d.]+ s: "
                     "re-sent to the others$", text, re.M), text[-3000:]


# ---------------------------------------------------------------- item 3: every URL is equal at start

def test_the_first_url_down_at_start_is_taken_out_not_fatal(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with start_sim(SIM) as sim:
        toml = dataset(tmp_path, 60)
        proc, log = generate(tmp_path, toml, f"{dead},{sim.url}", *POLL)
        text = finish_cli(proc, log, 60)
    assert_no_failures(tmp_path, text, 60)
    assert (f"took {dead} out after it could not be reached at start (Connection refused); 1 of 2 servers left, "
            "probing it back with backoff") in text, text[-2000:]


def test_servers_of_different_models_are_refused_naming_both(tmp_path: Path) -> None:
    with start_sim([*SIM, "--served-model-name", "m-one"]) as one, \
            start_sim([*SIM, "--served-model-name", "m-two"]) as two:
        toml = dataset(tmp_path, 60)
        r = run_cli("generate", "--dataset", toml, "--server-url", f"{one.url},{two.url}", "--output-dir",
                    tmp_path / "out", "--progress", "quiet")
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: The servers serve different models: {one.url} serves 'm-one', {two.url} serves 'm-two'. "
        "Every --server-url must serve the same model (or put an sglang-router in front of the ones that do).")
    assert _shard_lines(tmp_path / "out" / "T") == 0  # nothing written


# ---------------------------------------------------------------- the words (pure)

def test_the_streak_rule_says_whether_the_server_went_away_or_refused() -> None:
    from gen_pipeline.records import Failure
    from gen_pipeline.run.stats import FAILURE_STREAK_FATAL, RunStats

    gone, refused = RunStats(), RunStats()
    for i in range(FAILURE_STREAK_FATAL):
        gone.count_failure(Failure(f"r{i}", "T", "server_gone", "no server took it for 600 s"), ok_so_far=0)
        refused.count_failure(Failure(f"r{i}", "T", "http_400", "HTTP 400: too long", retryable=False), ok_so_far=0)
    assert str(gone.fatal) == (
        "The last 50 requests all failed because the server went away (latest: server_gone: no server took it "
        "for 600 s). Check SERVER_URL and that the server is running; nothing written is lost, run the same "
        "command to resume.")
    assert str(refused.fatal) == (
        "The last 50 requests were all refused by the server, which answers /health (latest: http_400: HTTP 400: "
        "too long). Check the model name, the sampling settings and the server log; nothing written is lost, run "
        "the same command to resume.")


def test_the_progress_line_shows_the_wait() -> None:
    from gen_pipeline.records import RunSnapshot
    from gen_pipeline.run.progress import postfix

    s = RunSnapshot(done=57, target=300, samples_per_s=0.0, tokens_per_s=0.0, in_flight=140, window=140,
                    server_wait_s=69.4, server_wait_limit_s=600.0)
    assert postfix(s) == "no server answers: waiting 1m09s of 10m00s, 0 tok/s, in flight 140/140"
