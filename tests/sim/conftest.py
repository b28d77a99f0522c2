"""One sim process per test module; a module sets `SIM_ARGS = [...]` for its `sim` fixture's flags."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import pytest

from sglang_sim.testing import SimProcess, start_sim


@pytest.fixture(scope="module")
def sim(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    args = list(getattr(request.module, "SIM_ARGS", []))
    log_path = tmp_path_factory.mktemp("sim") / "sim.log"
    with start_sim(args, ready_timeout_s=30, log_path=log_path) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(sim: SimProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, timeout=httpx.Timeout(20.0)) as c:
        yield c


@pytest.fixture
def sse(client: httpx.Client) -> Callable[..., list[dict]]:
    """POSTs `body` streamed; its JSON events (a 200 event stream that ends with [DONE])."""

    def chunks(body: dict, path: str = "/v1/chat/completions") -> list[dict]:
        with client.stream("POST", path, json=body | {"stream": True}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [line.removeprefix("data: ") for line in r.iter_lines() if line]
        assert events[-1] == "[DONE]"
        return [json.loads(e) for e in events[:-1]]

    return chunks


@pytest.fixture
def faults(request: pytest.FixtureRequest, client: httpx.Client) -> Iterator[Callable[..., dict]]:
    """Sets faults on the module's sim for one test; the module's NO_FAULTS restored after."""

    def set_faults(**changes: object) -> dict:
        r = client.post("/sim/faults", json=changes)
        assert r.status_code == 200, r.text
        return r.json()

    yield set_faults
    client.post("/sim/faults", json=request.module.NO_FAULTS)
