"""probe-kv end to end over real simulator processes (known injected rates), its bad-input messages,
the simulator's logprob shapes (SGLang 0.5.17's meta_info) and the pure estimators."""

from __future__ import annotations

import contextlib
import json
import math

import httpx
import pytest
from servers import sim_in_thread

from gen_pipeline.probe import metrics as PM
from gen_pipeline.probe.sglang import echoes, prompt_ids
from tests.pipeline_helpers import SIM_FAST, run_cli

from mock_http import mock_http

RATE = 0.02
# 30 prompts x <= 96 tokens ~ 2,800 positions: the binomial sd of the measured rate is ~0.27 points,
# so 1 point is ~4 sd.
TOLERANCE = 0.01


def _report(out) -> dict:
    return json.loads((out / "demo" / "probe-kv.json").read_text())


@pytest.fixture(scope="module")
def bf16():
    with sim_in_thread([*SIM_FAST, "--kv-cache-dtype", "bf16"]) as sim:
        yield sim


def _record_launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Wrap probe-kv's run_server: (start|stopped, role) in the order they happen."""
    from gen_pipeline.probe import core

    events: list[tuple[str, str]] = []
    real = core.run_server

    async def recording(profile, *, log_dir, **kw):
        events.append(("start", log_dir.name))
        try:
            await real(profile, log_dir=log_dir, **kw)
        finally:
            events.append(("stopped", log_dir.name))  # run_server returns once the process group is gone

    monkeypatch.setattr(core, "run_server", recording)
    return events


def test_probe_recovers_injected_rate_through_launched_profiles_one_after_the_other(tmp_path, monkeypatch):
    """Two copies of the target model do not fit one node: the compare server starts only after the
    reference server stopped."""
    events = _record_launches(monkeypatch)
    r = run_cli("probe-kv", "--dataset", "demo", "--server", "sim-bf16", "--compare", "sim-fp8",
                "--samples", "30", "--max-new-tokens", "96", "--output-dir", tmp_path, timeout_s=240)
    assert r.returncode == 0, r.stderr + r.stdout
    assert r.stdout.splitlines()[0] == (  # sim-fp8 sets --sim-kv-perturb in its extra_args
        "warning: profiles sim-bf16 and sim-fp8 also differ in extra_args; capacity and speed keys do not change the "
        "numbers, attention or model keys (extra_args, model_path) would.")
    assert events == [("start", "reference"), ("stopped", "reference"), ("start", "compare"), ("stopped", "compare")]
    rep = _report(tmp_path)
    agg = rep["aggregate"]
    assert agg["prompts"] == 30 and len(rep["per_prompt"]) == 30 and rep["failed_prompts"] == []
    assert agg["positions"] == sum(p["ref_tokens"] for p in rep["per_prompt"]) > 2000
    assert abs(agg["top1_change_share"] - RATE) <= TOLERANCE, agg
    assert agg["exact_match_share"] < 1.0 and agg["first_divergence"]["diverged_prompts"] > 0
    assert 0 < agg["abs_dlogprob_mean"] < 0.2 and agg["kl_mean"] > 0
    assert rep["servers"]["reference"]["kv_cache_dtype"] == "bf16"
    assert rep["servers"]["compare"]["kv_cache_dtype"] == "fp8_e4m3"
    assert rep["verdict_line"] in r.stdout and "fp8_e4m3 KV changes top-1 on" in rep["verdict_line"]
    # the ids are the first 30 valid prompts of the source, in order
    assert [p["id"] for p in rep["per_prompt"]][:3] == ["demo-0000", "demo-0001", "demo-0002"]
    assert not (tmp_path / "demo" / "probe-kv.json.tmp").exists()


def test_a_server_that_does_not_say_its_kv_dtype_is_warned_and_rate_zero_is_exact(tmp_path, bf16, monkeypatch):
    from gen_pipeline.probe import core

    real = core.open_server

    @contextlib.asynccontextmanager
    async def unsaid(where, role, log_dir, http):
        async with real(where, role, log_dir, http) as h:
            if role == "reference":
                del h.info["kv_cache_dtype"]  # an SGLang whose /server_info does not have it
            yield h

    monkeypatch.setattr(core, "open_server", unsaid)
    r = run_cli("probe-kv", "--dataset", "demo", "--server-url", bf16.url, "--compare-url", bf16.url, "--allow-same-kv",
                "--samples", "8", "--max-new-tokens", "40", "--tf-chunk", "0", "--output-dir", tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    assert f"warning: cannot tell the KV dtype of {bf16.url} (no kv_cache_dtype in /server_info)." in \
        r.stdout.splitlines()
    rep = _report(tmp_path)
    agg = rep["aggregate"]
    assert [rep["servers"][k]["kv_cache_dtype"] for k in ("reference", "compare")] == [None, "bf16"]
    assert agg["exact_match_share"] == 1.0 and agg["first_divergence"]["diverged_prompts"] == 0
    assert agg["top1_agreement_share"] == 1.0 and agg["abs_dlogprob_mean"] == 0.0 and agg["kl_mean"] < 1e-12
    assert "bf16 KV changes top-1 on 0.00 %" in r.stdout and "fine for training data" in r.stdout


@pytest.mark.parametrize("args, message", [
    (("--server-url", "http://127.0.0.1:9", "--compare-url", "http://127.0.0.1:19"), "Cannot reach http://127.0.0.1:9: "
     "Connection refused. Check SERVER_URL and that the server is running (and listening on that host and port)."),
    (("--server-url", "http://127.0.0.1:9"), "probe-kv needs a compare server: add --compare-url URL (a second server "
     "that differs only in KV dtype, e.g. fp8_e4m3) or --compare PROFILE to launch one."),
    (("--server-url", "http://127.0.0.1:9/v1", "--compare-url", "http://127.0.0.1:9"), "--server-url and "
     "--compare-url are the same server (http://127.0.0.1:9); give two servers that differ in KV dtype (or add "
     "--allow-same-kv for a noise-floor run against itself)."),
    (("--samples", "0"), "--samples 0 must be at least 1."),
    (("--top-k", "0"), "--top-k 0 must be at least 1."),
    (("--tf-chunk", "-1"), "--tf-chunk -1 must be at least 0."),
    (("--server", "sim-bf16", "--compare", "sim-bf16"), "Both servers use KV dtype bf16 (datasets_cfg/server.toml "
     "[profile.sim-bf16] and [profile.sim-bf16]). probe-kv compares two KV dtypes (e.g. --server baseline --compare "
     "tuned, or bf16 and fp8_e4m3 servers with --server-url/--compare-url). To measure the noise floor of two equal "
     "servers on purpose, add --allow-same-kv."),
])
def test_bad_flags_are_refused_by_name_before_anything_launches(tmp_path, monkeypatch, args: tuple[str, ...],
                                                                message: str) -> None:
    events = _record_launches(monkeypatch)
    r = run_cli("probe-kv", "--dataset", "demo", *args, "--output-dir", tmp_path)
    rc = 3 if message.startswith("Cannot reach") else 2
    assert (r.returncode, r.stderr, events) == (rc, f"error: {message}\n", [])
    assert not (tmp_path / "demo" / "probe-kv.json").exists()


def test_same_kv_dtype_refused_then_allowed_as_noise_floor(tmp_path, bf16):
    with sim_in_thread([*SIM_FAST, "--kv-cache-dtype", "bfloat16"]) as b:
        args = ("probe-kv", "--dataset", "demo", "--server-url", bf16.url, "--compare-url", b.url, "--samples", "4",
                "--max-new-tokens", "16", "--output-dir", tmp_path)
        r = run_cli(*args)
        assert r.returncode == 2
        assert ("error: Both servers use KV dtype bf16; probe-kv compares two KV dtypes (e.g. --server baseline "
                "--compare tuned, or bf16 and fp8_e4m3 servers with --server-url/--compare-url). To measure the "
                "noise floor of two equal servers on purpose, add --allow-same-kv.") in r.stderr
        assert not (tmp_path / "demo" / "probe-kv.json").exists()
        r = run_cli(*args, "--allow-same-kv")
        assert r.returncode == 0, r.stderr
        assert _report(tmp_path)["aggregate"]["top1_agreement_share"] == 1.0


def test_sim_generate_logprob_shapes_match_sglang(bf16):
    with httpx.Client(timeout=30) as c:
        tok = c.post(bf16.url + "/tokenize", json={"messages": [{"role": "user", "content": "Hi there"}]}).json()
        assert set(tok) == {"tokens", "count", "max_model_len"} and tok["count"] == len(tok["tokens"])
        ids = tok["tokens"]
        body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 6},
                "return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": len(ids) - 2,
                "return_text_in_logprobs": True}
        out = c.post(bf16.url + "/generate", json=body).json()
        meta = out["meta_info"]
        assert [e[1] for e in meta["output_token_logprobs"]] == out["output_ids"] and len(out["output_ids"]) == 6
        assert [e[1] for e in meta["input_token_logprobs"]] == ids[-2:]
        assert meta["input_token_logprobs"][0][0] is None and meta["input_top_logprobs"][0] is None
        assert all(len(t) == 3 and t[0][0] >= t[1][0] >= t[2][0] for t in meta["output_top_logprobs"])
        assert all(isinstance(e[2], str) for e in meta["output_token_logprobs"])
        # greedy: every output token is the top-1 of its position
        assert [t[0][1] for t in meta["output_top_logprobs"]] == out["output_ids"]
        bad = c.post(bf16.url + "/generate", json={**body, "logprob_start_len": len(ids) + 1})
        assert bad.status_code == 400 and "is higher than the number of input tokens" in bad.json()["message"]


def test_estimators():
    assert PM.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert PM.first_divergence([1, 2, 3], [1, 5, 3]) == 1 and PM.first_divergence([1, 2], [1, 2, 3]) == 2
    p = [(math.log(0.6), 1), (math.log(0.3), 2)]
    assert PM.kl_topk(p, p) == pytest.approx(0.0, abs=1e-15)
    q = [(math.log(0.3), 1), (math.log(0.6), 2)]
    expect = 0.6 * math.log(2) + 0.3 * math.log(0.5)  # tail buckets are equal (0.1 each)
    assert PM.kl_topk(p, q) == pytest.approx(expect)
    ref = [PM.Position(1, -0.1, ((-0.1, 1), (-2.5, 2))), PM.Position(2, -0.2, ((-0.2, 2), (-1.9, 1)))]
    cmp = [PM.Position(1, -0.3, ((-0.3, 1), (-1.5, 2))), PM.Position(2, -1.0, ((-0.7, 1), (-1.0, 2)))]
    r = PM.compare_prompt("x", 5, [1, 2], [1, 3], ref, cmp)
    assert (r.exact_match, r.first_divergence, r.positions, r.top1_agree) == (False, 1, 2, 1)
    assert r.abs_dlogprob_mean == pytest.approx(0.5) and r.abs_dlogprob_max == pytest.approx(0.8)
    agg = PM.aggregate([r])
    assert agg["top1_change_share"] == 0.5 and agg["first_divergence"]["histogram"]["1-9"] == 1
    assert PM.percentile([1, 2, 3, 4], 50) == 2 and PM.percentile(list(range(1, 101)), 99) == 99
    level, line = PM.verdict({"top1_change_share": 0.004, "kl_mean": 0.001, "positions": 1000}, "fp8_e4m3")
    assert level == "fine" and line.startswith("fp8_e4m3 KV changes top-1 on 0.40 % of 1,000 positions")
    assert PM.verdict({"top1_change_share": 0.02, "kl_mean": 0.001, "positions": 10})[0] == "caution"
    assert PM.verdict({"top1_change_share": 0.001, "kl_mean": 0.2, "positions": 10})[0] == "prefer-bf16"
    # SGLang 0.5.17 echoes input ids >= vocab_size - 1 as 0; a misaligned echo is still refused
    assert echoes([5, 319, 7], [5, 0, 7])
    assert not echoes([5, 319, 7], [319, 7, 8]) and not echoes([5, 6], [5, 6, 7])


async def test_non_sglang_server_is_refused_with_what_to_use(tmp_path):
    from gen_pipeline.errors import ServerError, first_known
    from gen_pipeline.probe.core import open_server

    def openai_only(request: httpx.Request) -> httpx.Response:  # a vLLM-like server: /v1/models, nothing native
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m", "object": "model"}]})
        return httpx.Response(404, json={"detail": "Not Found"})

    with pytest.raises(BaseExceptionGroup) as e:
        async with mock_http(openai_only) as http, open_server("http://other:8000", "compare", tmp_path, http):
            pass
    assert isinstance(error := first_known(e.value), ServerError) and str(error) == (
        "The compare server http://other:8000 is not SGLang (it has no /server_info; looks like openai). probe-kv "
        "needs SGLang's native /generate with input_ids, return_logprob and logprob_start_len; run it against two "
        "SGLang servers. (vLLM's /v1/completions with token-id prompts, logprobs and prompt_logprobs could serve, but "
        "is not implemented.)")


async def test_prompt_ids_fall_back_to_chat_completions_without_tokenize():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        if request.url.path == "/tokenize":
            return httpx.Response(404, json={"detail": "Not Found"})
        return httpx.Response(200, json={"choices": [{"index": 0, "prompt_token_ids": [5, 6, 7]}]})

    async with mock_http(handler) as http:
        assert await prompt_ids(http, "http://x", "m", [{"role": "user", "content": "hi"}], None) == [5, 6, 7]
    assert seen[0] == ("/tokenize", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert seen[1] == ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                "max_tokens": 1, "temperature": 0.0, "return_prompt_token_ids": True})


def test_kl_estimate_stays_below_true_kl_on_sim_distributions():
    import random

    from sglang_sim import logprob_model as M
    rng = random.Random(7)
    ratios = []
    for _ in range(300):
        h = rng.getrandbits(64)
        p, q = M.distribution(h, 0.0), M.distribution(h, 0.3)
        q_lp = dict(zip(q.ids, q.logprobs, strict=True))  # same candidates; the uniform tail is equal in both
        true = sum(math.exp(lp) * (lp - q_lp[t]) for lp, t in zip(p.logprobs, p.ids, strict=True))
        est = PM.kl_topk(p.top(5), q.top(5))
        assert est <= true + 1e-12
        ratios.append(est / true)
    assert 0.8 < sorted(ratios)[len(ratios) // 2] <= 1.0  # a useful bound, not a vacuous one
