"""`[output] token_ids = true`: the server's token ids on every assistant turn, kept out of the history sent
back, and the `tokens` export built from them."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest
from servers import sim_in_thread

from gen_pipeline.config.dataset import load_dataset_config
from gen_pipeline.errors import ConfigError
from sglang_sim.tokenizer import decode, encode, render_chat

from pipeline_helpers import SIM_FAST, make_rows, read_samples, run_cli, write_dataset

ROWS = 12


@pytest.fixture(scope="module")
def sim():
    with sim_in_thread([*SIM_FAST, "--reasoning-parser", "kimi_k2", "--sim-seed", "7"], ready_timeout_s=30) as s:
        yield s


def _dataset(folder: Path, extra_output: str = "token_ids = true", on_loop: str = "retry") -> Path:
    toml = write_dataset(folder, target=ROWS, max_new_tokens=400, rows=make_rows(ROWS), extra=f'on_loop = "{on_loop}"')
    toml.write_text(toml.read_text().replace("[output]\n", f"[output]\n{extra_output}\n"))
    return toml


def test_the_sim_refuses_token_ids_on_a_stream_as_sglang_does(sim) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True, "return_token_ids": True}
    r = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 400
    assert r.json()["message"] == ("return_token_ids is not supported with streaming on /v1/chat/completions. "
                                   "Please set stream=false when using return_token_ids=true.")
    whole = httpx.post(sim.url + "/v1/chat/completions", json={**body, "stream": False}, timeout=10).json()
    choice = whole["choices"][0]
    assert choice["prompt_token_ids"] == encode(render_chat(body["messages"]))
    assert len(choice["token_ids"]) == whole["usage"]["completion_tokens"]


def test_rows_carry_the_servers_ids_and_the_tokens_export_uses_them(sim, tmp_path) -> None:
    toml, out = _dataset(tmp_path / "ds"), tmp_path / "out"
    r = run_cli("generate", "--dataset", toml, "--server-url", sim.url, "--output-dir", out, "--progress", "quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    samples = read_samples(out)
    assert len(samples) == ROWS
    turns = 0
    for s in samples:
        history = []
        for m in s["conversations"]:
            if m["role"] != "assistant":
                history.append({"role": m["role"], "content": m["content"]})
                continue
            turns += 1
            # exactly the prompt the server rendered: the history as sent (no ids in it)
            assert m["prompt_token_ids"] == encode(render_chat(history))
            text = decode(m["token_ids"])
            assert m["content"] in text and m["reasoning_content"] in text
            history.append({"role": "assistant", "content": m["content"], "reasoning_content": m["reasoning_content"]})
    assert turns == sum(s["meta"]["turns"] for s in samples) > ROWS  # multi-turn rows too
    v = run_cli("validate", "--dataset", toml, "--output-dir", out)
    assert v.returncode == 0, v.stdout + v.stderr
    export = tmp_path / "tokens.jsonl"
    e = run_cli("export", "--output-dir", out, "--dataset", "T", "--format", "tokens", "--out", export)
    assert e.returncode == 0, e.stdout + e.stderr
    rows = [orjson.loads(x) for x in export.read_bytes().splitlines()]
    assert len(rows) == turns and {r["ids_from"] for r in rows} == {"server"}
    by_id = {s["id"]: s for s in samples}
    for row in rows:
        sample_id, k = row["id"].split("#turn")
        m = [t for t in by_id[sample_id]["conversations"] if t["role"] == "assistant"][int(k)]
        assert row["input_ids"] == m["prompt_token_ids"] + m["token_ids"]
        assert row["loss_mask"] == [0] * len(m["prompt_token_ids"]) + [1] * len(m["token_ids"])


def test_token_ids_with_on_loop_keep_is_refused(tmp_path) -> None:
    toml = _dataset(tmp_path / "ds", on_loop="keep")
    with pytest.raises(ConfigError) as e:
        load_dataset_config(toml)
    assert str(e.value) == (f"{toml}: generation.on_loop = \"keep\" cuts a looping turn's text where the loop began, "
                            "which the server's token ids (output.token_ids = true) cannot follow: the ids would hold "
                            "the loop the text does not. Set on_loop = \"retry\" or \"drop\", or token_ids = false.")
