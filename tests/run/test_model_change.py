"""A server that comes back serving another model is refused by name, never written from: checked when it
comes back from an outage (real TCP; every answer's `model`: tests/run/test_client.py)."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from gen_pipeline.server.fleet import Fleet
from sglang_sim.testing import start_sim
from tests.server.server_helpers import SIM, dataset, generate

from pipeline_helpers import finish_cli, read_samples, restart_sim_on_same_port, sigkill_sim, wait_lines, wait_until


def _generate(tmp_path: Path, urls: str):
    return generate(tmp_path, dataset(tmp_path, 300), urls, "--health-interval-s", "0.3", "--server-wait-s", "60")


def _freeze(sim, hung: bool) -> None:
    faults = {"scheduler_hung": hung, "health_check_timeout_s": 600}
    httpx.post(sim.url + "/sim/faults", json=faults, timeout=5).raise_for_status()


def _completed(url: str) -> int:
    return httpx.get(url + "/sim/stats", timeout=5).json()["requests_completed"]


@pytest.mark.e2e  # a simulator SIGKILLed and restarted under a CLI process: make e2e
def test_a_server_back_with_another_model_stops_the_run_naming_both(tmp_path: Path) -> None:
    with ExitStack() as stack:
        sim = stack.enter_context(start_sim([*SIM, "--served-model-name", "m-one"]))
        proc, log = _generate(tmp_path, sim.url)
        wait_lines(tmp_path / "out" / "T", 40, proc)
        sigkill_sim(sim)
        wait_until(lambda: "no server answers" in log.read_text(), proc)
        other = restart_sim_on_same_port(sim, [*SIM, "--served-model-name", "other-org/Other-7B"])
        stack.callback(other.stop)
        rc = proc.wait(timeout=60)
        text = log.read_text()
        served_by_other = _completed(other.url)
    assert rc == 3, text[-2000:]
    assert (
        f"error: No server serves 'm-one' any more ({sim.url} now serves 'other-org/Other-7B'): restarted with "
        "another model? Nothing written is lost and nothing the other model answered was written: serve "
        "'m-one' there again and run the same command to resume.") in text.splitlines(), text[-2000:]
    assert "Traceback" not in text
    samples = read_samples(tmp_path / "out")
    assert len(samples) >= 40 and {s["meta"]["model"] for s in samples} == {"m-one"}
    assert served_by_other == 0  # refused when it came back: not one request was sent to it


@pytest.mark.e2e  # a simulator SIGKILLed and restarted under a CLI process: make e2e
def test_a_fleet_member_back_with_another_model_is_left_out(tmp_path: Path) -> None:
    with ExitStack() as stack:
        sims = [stack.enter_context(start_sim([*SIM, "--served-model-name", "m-one"])) for _ in range(2)]
        proc, log = _generate(tmp_path, ",".join(s.url for s in sims))
        wait_lines(tmp_path / "out" / "T", 40, proc)
        # the survivor's scheduler frozen (its /health and /v1/models still answer) until the member is refused:
        # the run cannot end before the restart is seen, however slow the machine (CI's once did)
        _freeze(sims[0], True)
        sigkill_sim(sims[1])
        wait_until(lambda: f"took {sims[1].url} out" in log.read_text(), proc)  # before it answers again
        other = restart_sim_on_same_port(sims[1], [*SIM, "--served-model-name", "m-two"])
        stack.callback(other.stop)
        wait_until(lambda: f"stopped sending to {other.url}" in log.read_text(), proc)
        _freeze(sims[0], False)
        text = finish_cli(proc, log, 120)
        served_by_other = _completed(other.url)
    samples = read_samples(tmp_path / "out")
    assert len(samples) == 300 and {s["meta"]["model"] for s in samples} == {"m-one"}
    assert (f"stopped sending to {other.url}: it now serves 'm-two', not 'm-one' (restarted with another model?); "
            "1 of 2 servers left") in text, text[-3000:]
    assert served_by_other == 0


def test_a_refused_server_never_comes_back() -> None:
    fleet = Fleet(["http://a", "http://b"], probe_initial_s=1.0)
    assert fleet.refuse("http://a", "m-two", "m-one", 0.0) == (
        "stopped sending to http://a: it now serves 'm-two', not 'm-one' (restarted with another model?); 1 of 2 "
        "servers left")
    assert fleet.refuse("http://a", "m-two", "m-one", 0.0) is None  # said once
    fleet.mark_up("http://a")
    fleet.succeeded("http://a", 5.0)
    assert (fleet.up_urls, fleet.down_urls, fleet.due_probes(100.0), fleet.refusal("m-one")) == (
        ["http://b"], [], [], None)
    fleet.refuse("http://b", "m-three", "m-one", 0.0)
    assert fleet.refusal("m-one") == (
        "No server serves 'm-one' any more (http://a now serves 'm-two', http://b now serves 'm-three'): restarted "
        "with another model? Nothing written is lost and nothing the other model answered was written: serve "
        "'m-one' there again and run the same command to resume.")
