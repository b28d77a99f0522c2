"""The shipped server profiles' environment fits the reference node (PCIe, no NVLink)."""

import tomllib

import pytest

from gen_pipeline.config.server import DEFAULT_SERVER_CONFIG, load_server_profile
from gen_pipeline.server.command import build_env

PROFILES = sorted(tomllib.loads(DEFAULT_SERVER_CONFIG.read_text())["profile"])


@pytest.mark.parametrize("name", PROFILES)
def test_no_profile_enables_nvls(name):
    env = build_env(load_server_profile(name), base={})
    assert env.get("NCCL_NVLS_ENABLE", "0") == "0", f"profile {name!r} enables NVLS multicast"


def test_tuned_turns_nvls_off_explicitly():
    # Off even where NCCL would pick it by itself (NVSwitch hosts the profile may be copied to).
    assert load_server_profile("tuned").env["NCCL_NVLS_ENABLE"] == "0"
