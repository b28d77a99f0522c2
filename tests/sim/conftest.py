"""One sim process per test module; a module sets `SIM_ARGS = [...]` for its `sim` fixture's flags."""

from __future__ import annotations

from collections.abc import Iterator

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
