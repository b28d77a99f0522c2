"""Every fault does what it says over real TCP (one shared sim, POST /sim/faults); start-up, aborts and client
disconnects; crash, start-up and flag tests run their own processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from sglang_sim.faults import Fault, FaultSettings, decide, health_ok
from sglang_sim.testing import start_sim

# Long outputs (~2000 tokens at ~2 ms a step) so aborts and disconnects land mid-request.
SIM_ARGS = ["--sim-output-mean", "2000", "--sim-output-spread", "0", "--sim-seed", "7"]
SHORT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
NO_FAULTS = FaultSettings().to_json() | {"seed": 7}


def next_seq(client: httpx.Client) -> int:
    return client.get("/sim/stats").json()["requests_seen"] + 1


def test_decide_is_seeded_and_matches_rates_and_the_health_window() -> None:
    s = FaultSettings(error_rate=0.25, too_many_rate=0.25, seed=3)
    picks = [decide(s, i) for i in range(1, 4001)]
    assert picks == [decide(s, i) for i in range(1, 4001)]
    assert 900 < picks.count(Fault.ERROR) < 1100 and 900 < picks.count(Fault.TOO_MANY) < 1100
    assert picks != [decide(FaultSettings(error_rate=0.25, too_many_rate=0.25, seed=4), i) for i in range(1, 4001)]
    s = FaultSettings(health_503_after_s=10, health_503_for_s=5)
    assert [health_ok(s, t) for t in (0, 9.9, 10, 14.9, 15)] == [True, True, False, False, True]
    assert health_ok(FaultSettings(never_healthy=True), 0) is False


def test_fault_settings_reject_bad_values_and_errors_follow_the_seeded_plan(client: httpx.Client,
                                                                            faults: callable) -> None:
    r = client.post("/sim/faults", json={"eror_rate": 0.5})
    assert r.status_code == 400 and r.json()["message"].startswith("unknown fault key 'eror_rate'; known keys: [")
    r = client.post("/sim/faults", json={"error_rate": 0.7, "cut_rate": 0.6})
    assert r.json()["message"] == "fault rates sum to 1.300; at most one fault hits a request, keep the sum <= 1"
    assert client.get("/sim/faults").json() == NO_FAULTS
    # the error and 429 fractions follow the seeded plan
    settings = faults(error_rate=0.3, error_status=503, **{"429_rate": 0.2})
    start = next_seq(client)
    expected = [decide(FaultSettings().updated(settings), s) for s in range(start, start + 30)]
    statuses = [client.post("/v1/chat/completions", json=SHORT).status_code for _ in range(30)]
    status_of = {Fault.ERROR: 503, Fault.TOO_MANY: 429, Fault.NONE: 200}
    assert statuses == [status_of[f] for f in expected]
    assert 0 < statuses.count(503) < 30 and 0 < statuses.count(429) < 30
    r = next(r for r in (client.post("/v1/chat/completions", json=SHORT) for _ in range(50)) if r.status_code == 503)
    assert r.json() == {"object": "error", "message": "Simulated server error (--sim-error-rate).",
                        "type": "InternalServerError", "param": None, "code": 503}


def test_bad_json_wrong_content_type_and_no_usage(client: httpx.Client, faults: callable) -> None:
    faults(bad_json_rate=1.0)
    r = client.post("/v1/chat/completions", json=SHORT)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.content)
    with client.stream("POST", "/v1/chat/completions", json={**SHORT, "stream": True}) as s:
        first = next(line for line in s.iter_lines() if line)
    with pytest.raises(json.JSONDecodeError):
        json.loads(first.removeprefix("data: "))
    faults(bad_json_rate=0.0, wrong_content_type_rate=1.0)
    r = client.post("/v1/chat/completions", json=SHORT)
    assert (r.status_code, r.headers["content-type"]) == (200, "text/html; charset=utf-8")
    assert r.text.startswith("<html>")
    faults(wrong_content_type_rate=0.0, no_usage_rate=1.0)
    body = client.post("/v1/chat/completions", json=SHORT).json()
    assert "usage" not in body and body["choices"][0]["finish_reason"] == "length"
    with client.stream("POST", "/v1/chat/completions",
                       json={**SHORT, "stream": True, "stream_options": {"include_usage": True}}) as s:
        events = [line for line in s.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(json.loads(e.removeprefix("data: ")).get("usage") is None for e in events[:-1])


def test_cut_mid_body_makes_httpx_raise_and_a_stall_holds_the_response(client: httpx.Client,
                                                                       faults: callable) -> None:
    faults(cut_rate=1.0)
    with pytest.raises(httpx.RemoteProtocolError):
        client.post("/v1/chat/completions", json=SHORT)
    with pytest.raises(httpx.RemoteProtocolError):  # the cut comes while reading the stream
        with client.stream("POST", "/v1/chat/completions", json={**SHORT, "stream": True}) as s:
            for _ in s.iter_lines():
                pass
    faults(cut_rate=0.0, stall_rate=1.0, stall_s=60)  # a stall holds the response
    before = client.get("/sim/stats").json()
    with pytest.raises(httpx.ReadTimeout):
        client.post("/v1/chat/completions", json=SHORT, timeout=httpx.Timeout(5.0, read=0.5))
    after = client.get("/sim/stats").json()
    # held by the stall (counted as one), not answered: a 4-token answer would have come back at once
    assert after["faults"]["stall"] == before["faults"]["stall"] + 1
    assert after["requests_completed"] == before["requests_completed"]


def test_health_flaps_for_the_window(client: httpx.Client, faults: callable) -> None:
    """200 before the window, 503 inside, 200 after, each answer judged by the sim's clock read just before and
    after it (one that straddles an edge proves nothing; a poller stalled past the whole window sets a new one)."""
    def since_ready() -> float:
        return client.get("/sim/stats").json()["since_ready_s"]

    phases: set[str] = set()
    deadline = time.monotonic() + 60
    while phases != {"before", "inside", "after"}:
        assert time.monotonic() < deadline, f"no whole window seen in 60 s (last: {sorted(phases)})"
        phases.clear()
        start = since_ready() + 0.3
        faults(health_503_after_s=start, health_503_for_s=1.0)
        t0 = since_ready()
        while "after" not in phases:
            code = client.get("/health").status_code
            t1 = since_ready()
            if t1 < start:
                phases.add("before")
                assert code == 200, (t0, t1, start)
            elif start <= t0 and t1 < start + 1.0:
                phases.add("inside")
                assert code == 503, (t0, t1, start)
            elif t0 >= start + 1.0:
                phases.add("after")
                assert code == 200, (t0, t1, start)
            t0 = t1
            time.sleep(0.02)  # pacing only: every answer is judged by the clock readings around it


def wait_idle(client: httpx.Client, timeout_s: float = 30.0) -> None:
    """Until the engine runs nothing (a bound that only a stuck request reaches)."""
    t0 = time.monotonic()
    while client.get("/v1/loads").json()["loads"][0]["num_running_reqs"]:
        assert time.monotonic() - t0 < timeout_s, f"request still running after {timeout_s:g} s"
        time.sleep(0.02)


def decoded(client: httpx.Client) -> int:
    return client.get("/sim/stats").json()["counters"]["decode_tokens_total"]


def test_abort_request_and_a_client_disconnect_end_the_request(client: httpx.Client) -> None:
    """/abort_request ends a stream (finish_reason abort); a client that leaves mid-output frees the engine: the
    request stops short of its 2,000 tokens."""
    with client.stream("POST", "/v1/chat/completions", json={"messages": SHORT["messages"], "stream": True}) as s:
        lines = s.iter_lines()
        rid = json.loads(next(line for line in lines if line).removeprefix("data: "))["id"]
        assert client.post("/abort_request", json={"rid": rid}).status_code == 200
        events = [json.loads(line.removeprefix("data: ")) for line in lines if line and line != "data: [DONE]"]
    assert events[-1]["choices"][0]["finish_reason"] == "abort"
    wait_idle(client)
    start = decoded(client)
    with client.stream("POST", "/v1/chat/completions", json={"messages": SHORT["messages"], "stream": True}) as s:
        next(line for line in s.iter_lines() if line)
    wait_idle(client)
    assert decoded(client) - start < 2000
    start = decoded(client)
    with pytest.raises(httpx.ReadTimeout):
        client.post("/v1/chat/completions", json={"messages": SHORT["messages"]},
                    timeout=httpx.Timeout(5.0, read=0.3))
    wait_idle(client)
    assert decoded(client) - start < 2000


def test_crash_after_n_completed_requests() -> None:
    with start_sim(["--sim-crash-after", "3", "--sim-output-mean", "5"], ready_timeout_s=30) as sim:
        with httpx.Client(base_url=sim.url, timeout=10) as c:
            for _ in range(3):
                assert c.post("/v1/chat/completions", json=SHORT).status_code == 200
            assert sim.wait_exit(timeout_s=5) == 1
            with pytest.raises(httpx.ConnectError):
                c.post("/v1/chat/completions", json=SHORT)
        assert "RuntimeError: CUDA error: an illegal memory access was encountered" in sim.log_text()


def test_fail_startup_prints_line_after_capacity_and_exits_1() -> None:
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    with start_sim(["--sim-fail-startup", line], wait_ready=False) as sim:
        assert sim.wait_exit(timeout_s=20) == 1
        text = sim.log_text()
    assert text.index("max_total_num_tokens=") < text.index(line)
    assert "ready to roll" not in text


def test_startup_delay_then_ready_or_never_healthy(tmp_path) -> None:
    # 3 s of start-up (long enough on a loaded machine): the port opens while it runs; a poll lands inside it
    with start_sim(["--sim-startup-s", "3.0"], wait_ready=False, log_path=tmp_path / "s.log") as sim:
        codes = set()
        with httpx.Client(base_url=sim.url, timeout=2) as c:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    code = c.get("/health").status_code
                except httpx.TransportError:
                    time.sleep(0.05)
                    continue
                codes.add(code)
                if code == 200:
                    break
                time.sleep(0.05)
        assert codes == {503, 200}
        assert "The server is fired up and ready to roll!" in sim.log_text()
    # --sim-never-healthy: the log says ready, /health never does
    with start_sim(["--sim-never-healthy"], wait_ready=False, log_path=tmp_path / "n.log") as sim:
        deadline = time.monotonic() + 20
        while "ready to roll" not in sim.log_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with httpx.Client(base_url=sim.url, timeout=2) as c:
            assert {c.get("/health").status_code for _ in range(5)} == {503}
            assert c.get("/server_info").status_code == 200


@pytest.mark.parametrize(("args", "error"), [
    (["--tp-size", "8", "--no-such-flag"], "error: unrecognized arguments: --no-such-flag"),
    (["--sim-error-rate", "1.5"], "error: fault error_rate must be within [0, 1] (got 1.5)")])
def test_bad_flags_exit_2_before_starting_up(args: list[str], error: str) -> None:
    r = subprocess.run([sys.executable, "-m", "sglang_sim", *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert error in r.stderr
    assert "SGLang simulator (not SGLang): profile=" not in r.stdout + r.stderr
