"""The sim with a draft (--speculative-*) as SGLang 0.5.17 answers: the acceptance in meta_info when asked
(tokenizer_manager.py _calculate_spec_decoding_metrics), its refusal on a stream, /get_server_info, the gauge."""

from __future__ import annotations

import httpx
from servers import sim_in_thread

from gen_pipeline.server.load import metric_values

from pipeline_helpers import SIM_FAST

DRAFT = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "sim/draft",
         "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def test_a_draft_running_sim_reports_acceptance_as_sglang_does_and_no_draft_none() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, "return_meta_info": True}
    with sim_in_thread([*SIM_FAST, "--enable-metrics", *DRAFT, "--sim-accept-length", "3"]) as sim:
        def post(b: dict) -> httpx.Response:
            return httpx.post(sim.url + "/v1/chat/completions", json=b, timeout=10)

        answers = [post(body).json() for _ in range(2)]
        refused = post({**body, "stream": True})
        plain = post({**body, "return_meta_info": False}).json()
        info = httpx.get(sim.url + "/get_server_info").json()
        gauges = metric_values(httpx.get(sim.url + "/metrics").text)
    meta, again = (a["choices"][0]["meta_info"] for a in answers)
    spec = {k: v for k, v in meta.items() if k.startswith("spec_")}
    assert spec == {k: v for k, v in again.items() if k.startswith("spec_")}  # seeded by the prompt: repeats
    tokens, verify_ct = answers[0]["usage"]["completion_tokens"], meta["spec_verify_ct"]
    assert meta["completion_tokens"] == tokens and meta["spec_accept_length"] == tokens / verify_ct
    assert meta["spec_num_proposed_drafts"] == verify_ct * 3  # verify steps x (draft tokens - 1)
    assert meta["spec_num_correct_drafts"] == tokens - verify_ct  # each step: its accepted drafts + 1 bonus
    assert meta["spec_accept_rate"] == (tokens - verify_ct) / (verify_ct * 3)
    assert "meta_info" not in plain["choices"][0]
    assert refused.status_code == 400  # a ValueError in _convert_to_internal_request: serving_base.py's 400
    assert refused.json() == {"object": "error", "type": "BadRequest", "param": None, "code": 400, "message":
                              "return_meta_info is not supported with streaming. Please set stream=false when "
                              "using return_meta_info=true."}
    assert {k: info[k] for k in ("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
                                 "speculative_eagle_topk", "speculative_num_draft_tokens")} == {
        "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "sim/draft", "speculative_num_steps": 3,
        "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    # the gauge pools the three answered, alike (the refused one decoded nothing)
    assert plain["usage"]["completion_tokens"] == tokens and 1.0 <= meta["spec_accept_length"] <= 4.0
    assert gauges["sglang:spec_accept_length"][""] == tokens / verify_ct
    assert gauges["sglang:spec_accept_rate"][""] == meta["spec_accept_rate"]
    with sim_in_thread(SIM_FAST) as sim:  # no draft, no acceptance
        meta = httpx.post(sim.url + "/v1/chat/completions", json={**body, "max_tokens": 16},
                          timeout=10).json()["choices"][0]["meta_info"]
        info = httpx.get(sim.url + "/get_server_info").json()
    assert not any(k.startswith("spec_") for k in meta) and info["speculative_algorithm"] is None
