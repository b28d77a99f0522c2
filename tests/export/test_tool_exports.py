"""Tool-use conversations end to end on the simulator: the bundled set regenerates exactly with the target's
calls, and every export format carries tools and calls the way its trainer reads them."""

from __future__ import annotations

import importlib
import importlib.util
import json
import warnings
from collections import Counter
from pathlib import Path

import pytest
from datasets import load_dataset, load_from_disk
from export_helpers import export, fail, jsonl, specforge_payloads

from pipeline_helpers import chat_tokenizers, read_samples, run_cli

# A Qwen2.5-style tool template on ChatML markers: the tools in the system turn, each call as
# <tool_call>{"name", "arguments"}</tool_call> in the assistant turn, tool results as user turns.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n"
    "{% endif %}# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
    "{%- elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}{%- if m['role'] == 'system' %}"
    "{%- elif m['role'] == 'assistant' %}<|im_start|>assistant\n{{ m['content'] }}"
    "{%- for c in m['tool_calls'] or [] %}<tool_call>\n{\"name\": \"{{ c['function']['name'] }}\", \"arguments\": "
    "{% if c['function']['arguments'] is string %}{{ c['function']['arguments'] }}"
    "{% else %}{{ c['function']['arguments'] | tojson }}{% endif %}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("outputs")
    r = run_cli("generate", "--dataset", "tools", "--server", "sim-tools", "--output-dir", root, "--progress", "quiet")
    assert r.returncode == 0, r.stderr + r.stdout
    return root


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = chat_tokenizers(tmp_path_factory.mktemp("tokenizers"))["chatml"]
    (folder / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    return folder


def test_the_tool_use_set_regenerates_with_the_targets_calls(outputs: Path) -> None:
    samples = read_samples(outputs, "tools")
    assert len(samples) == 20 and Counter(s["id"] for s in samples).most_common(1)[0][1] == 1
    diverged = {s["id"]: s["meta"]["tool_divergence"] for s in samples if s["meta"]["tool_divergence"]}
    assert diverged == {"tools-t07": 1, "tools-t15": 1}  # the two whose directive differs from the source's call
    calls = 0
    for s in samples:
        assert json.loads(s["meta"]["tools"])[0]["function"]["name"] == "get_weather"
        msgs, per_turn = s["conversations"], s["meta"]["per_turn"]
        assistants = [m for m in msgs if m["role"] == "assistant"]
        assert len(assistants) == len(per_turn) == s["meta"]["turns"]
        for m, t in zip(assistants, per_turn, strict=True):
            if m.get("tool_calls"):  # a call is an answer: content empty, finish_reason tool_calls, not empty_turn
                calls += len(m["tool_calls"])
                assert (m["content"], t["finish_reason"], t["empty"]) == ("", "tool_calls", 0)
                assert all(c["id"].startswith(f"functions.{c['function']['name']}:") for c in m["tool_calls"])
        for k, m in enumerate(msgs):  # each result answers the regenerated call before it, by its id
            if m["role"] == "tool":
                before = next(x for x in reversed(msgs[:k]) if x["role"] == "assistant")
                assert m["tool_call_id"] in {c["id"] for c in before["tool_calls"]}
        if s["id"] not in diverged:
            assert msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls")
    # make_tools.py: 2 calls in each sample's first user turn, 1 more after the second user turn of the 10 even
    # ones; t07 and t15 end after their first turn (1 and 2 calls); t02's answer after its second call hits
    # max_new_tokens (seeded), which ends that sample before its third call
    assert calls == 18 * 2 + 10 + 1 + 2 - 1
    assert [t["finish_reason"] for t in next(s for s in samples if s["id"] == "tools-t02")["meta"]["per_turn"]] == [
        "tool_calls", "tool_calls", "length"]


def test_specforge_rows_carry_tools_and_train_the_calls(outputs: Path, tokenizer: Path, tmp_path: Path) -> None:
    """SpecForge's own preprocessing (GeneralParser: needs torch, so it runs in the contract venv, which has
    it: ~/.cache/gen-pipeline/venv-contract/bin/python -m pytest tests/export/test_tool_exports.py)."""
    pytest.importorskip("torch")
    from specforge.data.preprocessing import preprocess_conversations
    from specforge.data.template import ChatTemplate
    from transformers import AutoTokenizer

    out = tmp_path / "sf.jsonl"
    export(outputs, "--dataset", "tools", "--format", "specforge", "--out", out)
    ds = load_dataset("json", data_files=str(out), split="train")
    assert len(ds) == 20 and set(ds.column_names) == {"id", "conversations", "tools", "status"}
    tok = AutoTokenizer.from_pretrained(tokenizer)
    template = ChatTemplate(assistant_header="<|im_start|>assistant\n", user_header="<|im_start|>user\n",
                            end_of_turn_token="<|im_end|>")  # this template writes no newline after it
    tools = [json.loads(t) for t in ds["tools"]]
    with warnings.catch_warnings():  # its notes on every row (the data's system prompt is used)
        warnings.simplefilter("ignore")
        got = preprocess_conversations(tok, ds["conversations"], template, max_length=100_000, tools=tools)
    assert len(got["input_ids"]) == 20
    for ids, mask, row in zip(got["input_ids"], got["loss_mask"], ds, strict=True):
        ids, mask = ids[0].tolist(), mask[0].tolist()
        trained = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
        prompt = tok.decode(ids)
        assert "# Tools" in prompt and "get_weather" in prompt.split("# Tools")[1]
        for m in row["conversations"]:
            for c in m.get("tool_calls") or []:
                args = json.dumps(json.loads(c["function"]["arguments"]))
                assert f'<tool_call>\n{{"name": "{c["function"]["name"]}", "arguments": {args}}}' in trained
            if m["role"] == "tool":
                assert m["content"] not in trained  # results are the prompt's, never trained


def test_speculators_and_hf_keep_tools_and_calls(outputs: Path, tmp_path: Path) -> None:
    samples = {s["id"]: s for s in read_samples(outputs, "tools")}
    out = tmp_path / "sp.jsonl"
    export(outputs, "--dataset", "tools", "--format", "speculators", "--out", out)
    for row in jsonl(out):
        assert row["tools"] == samples[row["id"]]["meta"]["tools"]
        assert row["conversations"] == samples[row["id"]]["conversations"]
    # speculators 0.9.0's own reading where it is installed (the contract venv; not an extra of this project):
    # the tools parsed, the calls and ids kept
    spec = None
    if importlib.util.find_spec("speculators") is not None:
        with warnings.catch_warnings():  # torch's deprecation notes on import
            warnings.simplefilter("ignore")
            spec = importlib.import_module("speculators.data_generation.preprocessing")
    for k, row in enumerate(jsonl(out) if spec is not None else []):
        assert spec._parse_conv_tools(row["tools"], k) == json.loads(samples[row["id"]]["meta"]["tools"])
        normal = spec._normalize_conversation(row["conversations"])
        assert [(m["role"], m.get("tool_calls"), m.get("tool_call_id")) for m in normal] == [
            (m["role"], m.get("tool_calls"), m.get("tool_call_id")) for m in row["conversations"]]
    hf = tmp_path / "hf"
    export(outputs, "--dataset", "tools", "--format", "hf", "--out", hf)
    ds = load_from_disk(str(hf))["train"]
    for row in ds:
        s = samples[row["id"]]
        assert row["tools"] == s["meta"]["tools"] and row["meta"]["tool_divergence"] == s["meta"]["tool_divergence"]
        for got, m in zip(row["conversations"], s["conversations"], strict=True):
            assert (json.loads(got["tool_calls"]) if got["tool_calls"] else None) == m.get("tool_calls")
            assert got["tool_call_id"] == m.get("tool_call_id")


def test_tokens_rows_render_with_the_tools_and_train_the_calls(outputs: Path, tokenizer: Path,
                                                               tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    out = tmp_path / "tokens.jsonl"
    export(outputs, "--dataset", "tools", "--format", "tokens", "--out", out, "--tokenizer", tokenizer, "--keep-meta")
    rows = jsonl(out)
    samples = {s["id"]: s for s in read_samples(outputs, "tools")}
    assert len(rows) == sum(s["meta"]["turns"] for s in samples.values())
    assert specforge_payloads(out) == [{"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in rows]
    tok = AutoTokenizer.from_pretrained(tokenizer)
    call_rows = 0
    for row in rows:
        sample_id, k = row["meta"]["source_id"], row["meta"]["assistant_turn_index"]
        s = samples[sample_id]
        tools = json.loads(s["meta"]["tools"])
        msgs = [{key: v for key, v in m.items() if key != "reasoning_content"} for m in s["conversations"]]
        at = [i for i, m in enumerate(msgs) if m["role"] == "assistant"][k]
        # an independent render: the template with the sample's tools, the history, then this turn
        prompt = tok.apply_chat_template(msgs[:at], tools=tools, tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(msgs[:at + 1], tools=tools, tokenize=False)
        out_text = full[len(prompt):]
        if s["conversations"][at].get("reasoning_content"):  # this template renders none: the model's think block
            out_text = f"<think>{s['conversations'][at]['reasoning_content']}</think>{out_text}"
        if s["meta"]["per_turn"][k]["finish_reason"] == "length":  # a cut turn ends where the model stopped
            out_text = out_text.removesuffix("\n").removesuffix("<|im_end|>")
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        o = tok(out_text, add_special_tokens=False)["input_ids"]
        assert (row["input_ids"], row["loss_mask"]) == (p + o, [0] * len(p) + [1] * len(o)), row["id"]
        if msgs[at].get("tool_calls"):
            call_rows += 1
            assert "<tool_call>" in tok.decode(o) and msgs[at]["tool_calls"][0]["function"]["name"] in tok.decode(o)
    assert call_rows == sum(1 for s in samples.values() for m in s["conversations"] if m.get("tool_calls"))


def test_validate_takes_tool_turns_as_they_are(outputs: Path) -> None:
    # tool-call turns have empty content and tool turns break user/assistant alternation: neither is a problem
    r = run_cli("validate", "--dataset", "tools", "--output-dir", outputs)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[0].endswith("tools: 20 rows in 1 shards: OK (1 truncated, policy keep)")


def test_whole_answers_with_server_ids_store_the_calls_and_their_tokens(tmp_path: Path) -> None:
    """[output] token_ids: turns come whole (message.tool_calls), and the tokens rows are the server's ids,
    the call's text (what the model wrote before the parser took it out) under the loss mask."""
    import shutil

    from sglang_sim.tokenizer import decode

    repo = Path(__file__).resolve().parents[2] / "datasets_cfg"
    cfg = tmp_path / "cfg"
    (cfg / "data").mkdir(parents=True)
    shutil.copy(repo / "data" / "tools.jsonl", cfg / "data")
    shutil.copy(repo / "server.toml", cfg)
    (cfg / "tools.toml").write_text((repo / "tools.toml").read_text() + "token_ids = true\n")
    out = tmp_path / "out"
    r = run_cli("generate", "--dataset", "tools", "--config-dir", cfg, "--server", "sim-tools", "--output-dir", out,
                "--progress", "quiet")
    assert r.returncode == 0, r.stderr
    samples = {s["id"]: s for s in read_samples(out, "tools")}
    assert len(samples) == 20 and {k for k, s in samples.items() if s["meta"]["tool_divergence"]} == {
        "tools-t07", "tools-t15"}
    rows = tmp_path / "tokens.jsonl"
    export(out, "--dataset", "tools", "--format", "tokens", "--out", rows, "--config-dir", cfg, "--keep-meta")
    for row in jsonl(rows):
        turn = [m for m in samples[row["meta"]["source_id"]]["conversations"]
                if m["role"] == "assistant"][row["meta"]["assistant_turn_index"]]
        trained = decode([i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m])
        assert row["ids_from"] == "server"
        for c in turn.get("tool_calls") or []:
            assert f'{{"name": "{c["function"]["name"]}", "arguments": {c["function"]["arguments"]}}}' in trained


def test_harmony_refuses_tool_use_rows_instead_of_losing_the_calls(outputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "h.jsonl"
    code, err = fail(outputs, "--dataset", "tools", "--format", "specforge", "--harmony", "--no-status", "--out", out)
    assert code == 2 and not out.exists() and err.startswith("error: sample tools-t")
    assert "is a tool-use conversation, and --harmony writes only the analysis and final channels" in err
