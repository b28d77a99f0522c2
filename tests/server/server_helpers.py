"""Helpers for the server tests: a sim profile with test-sized timings, process-group checks."""

from __future__ import annotations

import os

from gen_pipeline.config.server import ServerProfile
from gen_pipeline.server import load_server_profile

SIM_ARGS = ["--sim-profile", "fast", "--time-scale", "20", "--sim-startup-s", "0.2",
            "--max-total-tokens", "20000"]


def sim_profile(*extra: str, **overrides) -> ServerProfile:
    """The shipped sim profile with quick health checks and extra sim flags appended."""
    base = {"extra_args": SIM_ARGS + list(extra), "health_interval_s": 0.2, "unhealthy_after": 3,
            "restart_backoff_s": 0.1, "stop_grace_s": 3, "startup_timeout_s": 20}
    return load_server_profile("sim", overrides={**base, **overrides})


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False
