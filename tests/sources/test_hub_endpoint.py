"""A mistyped HF_ENDPOINT is a reason the hub cannot be used, said in words, never a traceback."""

from __future__ import annotations

import pytest

from gen_pipeline.sources import hub

PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy",
           "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


@pytest.mark.parametrize("endpoint", ["https://example.invalid:abc", "https://example.invalid:99999"])
def test_an_endpoint_with_a_bad_port_is_named(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    for var in PROXIES:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    assert hub.offline_reason(timeout_s=0.1) == (
        f"HF_ENDPOINT={endpoint!r} has no valid port: give a number from 1 to 65535, or none")
