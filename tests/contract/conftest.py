"""The contract suite (make contract): SGLang's own code checks what gen_pipeline and the simulator say and
send; only in the contract venv (tests/conftest.py skips this folder elsewhere)."""

import pytest
from sglang_contract import PIN, SGLANG, installed_version


def pytest_report_header(config: pytest.Config) -> str:
    return f"contract: sglang {installed_version()} from {SGLANG} (pin {PIN})"


@pytest.fixture(scope="session")
def sim():
    """One simulator for the suite: metrics on, a reasoning parser, a KV pool small enough that a
    flood of requests retracts (so the retraction counter exists, as on SGLang after one)."""
    import functools

    import anyio
    import httpx

    from sglang_sim.testing import start_sim

    args = ["--max-total-tokens", "3000", "--enable-metrics", "--reasoning-parser", "kimi_k2",
            "--time-scale", "4", "--sim-output-mean", "200", "--sim-output-spread", "0.1",
            "--schedule-conservativeness", "0.3", "--log-level", "warning"]

    async def flood(url: str) -> None:
        async with httpx.AsyncClient(timeout=60) as http, anyio.create_task_group() as tg:
            for i in range(40):
                body = {"text": f"flood {i} " + "word " * 40, "sampling_params": {"max_new_tokens": 300}}
                tg.start_soon(functools.partial(http.post, url + "/generate", json=body))

    with start_sim(args, ready_timeout_s=30) as server:
        anyio.run(flood, server.url)
        yield server
