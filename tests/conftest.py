"""Shared fixtures. The Hugging Face hub is unreachable here: datasets runs offline on local files."""

from __future__ import annotations

import os
import tempfile

# Set before `datasets` is imported anywhere: offline, and a cache that does not pollute ~/.cache.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="gen-pipeline-hf-"))
# The suite may run inside an srun task or a torchrun job: the CLI subprocesses must not become ranks.
from pipeline_helpers import LAUNCHER_VARS  # after the environment above

for _var in LAUNCHER_VARS:
    os.environ.pop(_var, None)

import logging

import pytest
from hypothesis import settings
from servers import shared_sim  # noqa: F401  (a fixture: tests/servers.py)

# No per-example wall-clock deadline (Hypothesis' default is 200 ms): a loaded machine is not a failure.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

# tests/contract runs SGLang's own code in its own venv (`make contract`), not in `make test`.
collect_ignore = [] if os.environ.get("GEN_PIPELINE_CONTRACT") == "1" else ["contract"]


# Files whose every test has a real process as its subject (signals, SIGKILL, servers that die or freeze,
# the router, the launcher's supervision): the `e2e` marker, `make e2e`. Single tests elsewhere carry @pytest.mark.e2e.
E2E_FILES = ("e2e/", "server/test_outage.py", "server/test_scale_out.py",
             "server/test_supervisor.py")  # the launcher's server processes: crashes, SIGTERM ignored, restarts
_TESTS = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        rel = os.path.relpath(str(item.path), _TESTS).replace(os.sep, "/")
        if rel.startswith(E2E_FILES):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


@pytest.fixture
def events():
    """The messages of the run's events (records of the gen_pipeline logger), in order."""
    got: list[str] = []
    logger, handler = logging.getLogger("gen_pipeline"), _Collect(got)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield got
    logger.removeHandler(handler)
    logger.setLevel(level)
