"""Sampling keys beyond temperature/top_p: validated from TOML, sent in every request, recorded in
meta.sampling (through the simulator, and a changed key refused on resume: test_sampling_mix.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest

from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
from gen_pipeline.errors import ConfigError
from gen_pipeline.records import Prompt, Sample
from gen_pipeline.run.chat import ChatClient
from gen_pipeline.run.wire import ClientSettings, build_request
from tests.config.test_config import load

from mock_http import mock_http

STREAM = {"include_usage": True, "continuous_usage_stats": True}  # every turn is streamed

ALL_KEYS = """[sampling]
max_new_tokens = 64
temperature = 0.6
top_p = 0.9
top_k = 20
min_p = 0.05
repetition_penalty = 1.05
presence_penalty = 0.5
frequency_penalty = -0.25
stop = ["</answer>", "STOP"]
seed = 1234
chat_template_kwargs = { enable_thinking = true }
[sampling.extra_body]
min_tokens = 2
skip_special_tokens = false
"""
EXPECTED_BODY = {"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.05, "presence_penalty": 0.5,
                 "frequency_penalty": -0.25, "stop": ["</answer>", "STOP"], "seed": 1234, "min_tokens": 2,
                 "skip_special_tokens": False, "chat_template_kwargs": {"enable_thinking": True}}


async def test_every_key_is_in_the_request_body_and_meta(tmp_path: Path) -> None:
    sampling = load(tmp_path, ALL_KEYS).sampling
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(orjson.loads(request.content))
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
                                         "usage": {"prompt_tokens": 3, "completion_tokens": 1}})

    settings = ClientSettings(model="m", backend="sim", sampling=sampling, generation=GenerationConfig())
    async with mock_http(handler) as http:
        sample = await ChatClient(http, ["http://s"], settings).regenerate(
            Prompt("T-1", ({"role": "user", "content": "q"},)), "T")
    assert isinstance(sample, Sample)
    assert seen[0] == {"model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": 64,
                       "temperature": 0.6, "top_p": 0.9, "stream": True, "stream_options": STREAM, **EXPECTED_BODY}
    assert sample.meta["sampling"] == {
        "max_new_tokens": 64, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.05,
        "presence_penalty": 0.5, "frequency_penalty": -0.25, "stop": ("</answer>", "STOP"), "seed": 1234,
        "chat_template_kwargs": {"enable_thinking": True},
        "extra_body": {"min_tokens": 2, "skip_special_tokens": False}}


def test_unset_keys_are_not_sent_and_disable_merges_chat_template_kwargs(tmp_path: Path) -> None:
    plain = build_request([{"role": "user", "content": "q"}],
                          ClientSettings("m", "sim", SamplingConfig(), GenerationConfig(reasoning="disable")))
    assert plain == {"model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": 2048,
                     "temperature": 0.7, "top_p": 0.95, "stream": True, "stream_options": STREAM,
                     "chat_template_kwargs": {"thinking": False, "enable_thinking": False}}
    s = SamplingConfig(extra_body={"chat_template_kwargs": {"custom": 1}})
    body = build_request([], ClientSettings("m", "sim", s, GenerationConfig(reasoning="disable")))
    assert body["chat_template_kwargs"] == {"custom": 1, "thinking": False, "enable_thinking": False}
    assert s.extra_body == {"chat_template_kwargs": {"custom": 1}}  # the config is not changed


@pytest.mark.parametrize("sampling, message", [
    # SGLang 0.5.17 SamplingParams.verify (python/sglang/srt/sampling/sampling_params.py)
    *[(f"[sampling]\ntemperature = {v}\n", f"sampling.temperature = {shown} must be a finite number of at least 0 "
       "(0 = greedy).") for v, shown in (("-1", "-1.0"), ("inf", "inf"), ("nan", "nan"))],
    ("[sampling]\ntop_p = 2\n", "sampling.top_p = 2.0 must be above 0 and at most 1."),
    ("[sampling]\ntop_p = 0\n", "sampling.top_p = 0.0 must be above 0 and at most 1."),
    ("[sampling]\nmin_p = -0.1\n", "sampling.min_p = -0.1 must be between 0 and 1."),
    ("[sampling]\nrepetition_penalty = 2.5\n",
     "sampling.repetition_penalty = 2.5 must be above 0 and at most 2 (1 = no penalty)."),
    ("[sampling]\nfrequency_penalty = nan\n", "sampling.frequency_penalty = nan must be between -2 and 2."),
    ("[sampling]\ntop_k = 0\n", "sampling.top_k = 0 must be -1 (no top-k) or at least 1."),
    ("[sampling]\ntop_k = 2.5\n", "sampling.top_k = 2.5 must be an integer (got a number)."),
    ("[sampling]\nmin_p = 1.5\n", "sampling.min_p = 1.5 must be between 0 and 1."),
    ("[sampling]\nrepetition_penalty = 0\n",
     "sampling.repetition_penalty = 0.0 must be above 0 and at most 2 (1 = no penalty)."),
    ("[sampling]\npresence_penalty = -3\n", "sampling.presence_penalty = -3.0 must be between -2 and 2."),
    ("[sampling]\nfrequency_penalty = \"1\"\n",
     "sampling.frequency_penalty = '1' must be a number (got a string). Remove the quotes."),
    ("[sampling]\nstop = [\"a\", 3]\n", "sampling.stop = ['a', 3] must be a list of strings."),
    ("[sampling]\nstop = [\"\"]\n", "sampling.stop = [''] must not contain an empty string."),
    ("[sampling]\nseed = true\n", "sampling.seed = True must be an integer (got a boolean)."),
    ("[sampling]\nextra_body = 3\n", "sampling.extra_body = 3 must be a table (extra_body = { name = value })."),
    ("[sampling.extra_body]\ntemperature = 0.1\n",
     "sampling.extra_body.temperature: set it as sampling.temperature instead."),
    ("[sampling.extra_body]\nmessages = []\n", "sampling.extra_body.messages: the pipeline sets messages itself. "
                                                "Remove it."),
    ("[sampling]\ntopk = 5\n", "sampling.topk: unknown key. Known keys here: chat_template_kwargs, extra_body, "
                               "frequency_penalty, max_new_tokens, min_p, mix, mix_seed, presence_penalty, "
                               "reasoning_effort, repetition_penalty, seed, stop, temperature, top_k, top_p. "
                               "Did you mean top_k? Check the spelling or remove it."),
    ("[sampling.extra_body]\nchat_template_kwargs = { thinking = true }\n",
     "sampling.extra_body.chat_template_kwargs: set it as sampling.chat_template_kwargs instead."),
])
def test_bad_sampling_values_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sampling: str,
                                       message: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        load(tmp_path, sampling)
    assert str(e.value) == f"X.toml: {message}"


def test_a_lone_stop_string_is_a_list_of_one_and_the_edges_sglang_accepts_pass(tmp_path: Path) -> None:
    assert load(tmp_path, '[sampling]\nstop = "END"\n').sampling.stop == ("END",)
    for line in ("temperature = 0", "top_p = 1", "min_p = 0", "repetition_penalty = 2", "presence_penalty = -2",
                 "temperature = 100"):
        key, value = line.split(" = ")
        assert getattr(load(tmp_path, f"[sampling]\n{line}\n").sampling, key) == float(value)
