"""The `tokens` export's rendered rows are what the target saw and produced: each row against an independent
render (apply_chat_template, the turn written out by hand per template) with the chat_template_kwargs its
requests sent; a turn cut at max_new_tokens ends where the model stopped."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from datasets import load_dataset
from export_helpers import export_here, write_store
from servers import sim_in_thread
from template_tokenizers import END_OF_TURN, KINDS

from gen_pipeline.cli import main
from gen_pipeline.export.render import load_renderer
from gen_pipeline.export.tokens import TokenRowBuilder
from gen_pipeline.records import Sample
from sglang_sim.responses import EOS_TOKEN_ID

from pipeline_helpers import SIM_FAST, make_rows, read_samples, write_dataset

OFF = '{"enable_thinking":false,"thinking":false}'  # what reasoning = "disable" sends (run/chat.py)
MIX = """chat_template_kwargs = { thinking = true, enable_thinking = true }
[[sampling.mix]]
share = 0.5
[[sampling.mix]]
share = 0.5
chat_template_kwargs = { thinking = false, enable_thinking = false }
"""


@pytest.fixture(scope="module")
def sim():
    with sim_in_thread([*SIM_FAST, "--reasoning-parser", "kimi_k2", "--sim-seed", "3"], ready_timeout_s=30) as s:
        yield s


def _generate(sim, folder: Path, name: str, *, reasoning: str = "keep", sampling: str = "",
              output: str = "") -> Path:
    toml = write_dataset(folder, name=name, target=24, rows=make_rows(24), max_new_tokens=120,
                         extra='on_loop = "off"')
    text = toml.read_text().replace('reasoning = "keep"', f'reasoning = "{reasoning}"')
    text = text.replace("top_p = 0.95\n", "top_p = 0.95\n" + sampling).replace("[output]\n", "[output]\n" + output)
    toml.write_text(text)
    out = folder / "out"
    assert main(["generate", "--dataset", str(toml), "--server-url", sim.url, "--output-dir", str(out),
                 "--progress", "quiet"]) == 0
    return out


@pytest.fixture(scope="module")
def disabled(sim, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _generate(sim, tmp_path_factory.mktemp("disabled"), "D", reasoning="disable")


@pytest.fixture(scope="module")
def mixed(sim, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _generate(sim, tmp_path_factory.mktemp("mixed"), "M", sampling=MIX)


def expected_turn(kind: str, prompt: str, turn: dict, cut: bool) -> str:
    """What the model wrote after `prompt`, written out per template: its reasoning in its think block
    (opened by the prompt or not), its answer, the template's end of turn unless the turn was cut."""
    r, c = turn.get("reasoning_content") or "", turn["content"]
    if kind == "kimi":
        text = (r + "</think>" if prompt.endswith("<think>") else "") + c
    elif kind == "qwen3":
        text = c if prompt.endswith("</think>\n\n") else f"<think>\n{r}\n</think>\n\n{c}"
    else:
        text = (f"<think>{r}</think>" if r else "") + c
    return text if cut else text + END_OF_TURN[kind]


def independent_rows(tokenizer_path: Path, kind: str, samples: list[dict]) -> dict[str, tuple[list, list]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_path), local_files_only=True)
    rows = {}
    for s in samples:
        kwargs = orjson.loads(s["meta"]["chat_template_kwargs"])
        history: list[dict] = []
        k = 0
        for m in s["conversations"]:
            msg = {key: m[key] for key in ("role", "content", "reasoning_content") if key in m}
            if m["role"] == "assistant":
                prompt = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True, **kwargs)
                cut = s["meta"]["per_turn"][k]["finish_reason"] != "stop"
                output = expected_turn(kind, prompt, msg, cut)
                if kind == "qwen3" and not cut:  # this template renders the last turn whole: the same text
                    assert tok.apply_chat_template([*history, msg], tokenize=False, **kwargs) == prompt + output
                p, o = (tok(text, add_special_tokens=False)["input_ids"] for text in (prompt, output))
                rows[f"{s['id']}#turn{k}"] = (p + o, [0] * len(p) + [1] * len(o))
                k += 1
            history.append(msg)
    return rows


def _export_tokens(root: Path, name: str, out: Path, tokenizer: Path | None, *extra: str) -> list[dict]:
    flags = ["--tokenizer", str(tokenizer)] if tokenizer else []
    assert export_here(root, "--dataset", name, "--format", "tokens", "--out", out, "--force", *flags, *extra) == 0
    return [orjson.loads(line) for line in out.read_bytes().splitlines()]


def _mismatches(rows: list[dict], expected: dict[str, tuple[list, list]]) -> list[str]:
    assert sorted(r["id"] for r in rows) == sorted(expected)
    return [r["id"] for r in rows if (r["input_ids"], r["loss_mask"]) != expected[r["id"]]]


NOT_USED = ('  note: tokens: --template-kwargs {"thinking":true} was not used: every rendered sample recorded the '
            "chat_template_kwargs its requests sent (meta.chat_template_kwargs) and is rendered with them")
FILLED = ("  note: tokens: 24 rendered samples recorded no chat_template_kwargs (written before "
          'meta.chat_template_kwargs): rendered with --template-kwargs {"enable_thinking":false,"thinking":false}')


@pytest.fixture(scope="module")
def old(disabled: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The disabled store as written before meta.chat_template_kwargs."""
    return write_store(tmp_path_factory.mktemp("old"), "D", [
        Sample(s["id"], "D", s["conversations"], {k: v for k, v in s["meta"].items() if k != "chat_template_kwargs"})
        for s in read_samples(disabled, "D")])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("store, flags, note", [
    ("disabled", [], None),
    ("mixed", ["--template-kwargs", '{"thinking": true}'], NOT_USED),  # each row with its own: the flag not used
    ("old", ["--template-kwargs", OFF], FILLED)])  # no recorded kwargs: the flag fills them
def test_each_rendered_row_is_what_the_server_rendered_with_its_samples_kwargs(
        request: pytest.FixtureRequest, store: str, flags: list[str], note: str | None, tmp_path: Path,
        disabled: Path, built: dict[str, Path], kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A reasoning = "disable" store, one whose variants send their own chat_template_kwargs, and the first as
    written before they were recorded: each row rendered with what its requests sent, and the export says how."""
    root, name = request.getfixturevalue(store), "M" if store == "mixed" else "D"
    samples = read_samples(disabled if store == "old" else root, name)  # with the kwargs the requests sent
    kwargs = {s["meta"]["chat_template_kwargs"] for s in samples}
    if store == "mixed":
        assert kwargs == {OFF, '{"enable_thinking":true,"thinking":true}'}
        assert {bool(m.get("reasoning_content")) for s in samples for m in s["conversations"]
                if m["role"] == "assistant"} == {True, False}
    else:
        assert kwargs == {OFF} and any(s["meta"]["turns"] > 1 for s in samples)
        assert any(s["meta"]["finish_reason"] == "length" for s in samples)
    assert all(("chat_template_kwargs" in s["meta"]) == (store != "old") for s in read_samples(root, name))
    expected = independent_rows(built[kind], kind, samples)
    capsys.readouterr()
    assert _mismatches(_export_tokens(root, name, tmp_path / "t.jsonl", built[kind], *flags), expected) == []
    lines = capsys.readouterr().out.splitlines()
    assert [n for n in (NOT_USED, FILLED) if n in lines] == ([note] if note else [])


def test_mixed_kwargs_rows_load_in_datasets_with_one_schema(mixed: Path, tmp_path: Path) -> None:
    """meta.chat_template_kwargs is JSON text: one Arrow type whatever keys each variant sends."""
    out = tmp_path / "s.jsonl"
    assert export_here(mixed, "--dataset", "M", "--format", "specforge", "--out", out, "--keep-meta") == 0
    ds = load_dataset("json", data_files=str(out), split="train")
    assert ds.num_rows == 24 and len({m["chat_template_kwargs"] for m in ds["meta"]}) == 2


# ---------------------------------------------------------------- defect 2: reasoning placed by position


@pytest.mark.parametrize("kind", KINDS)
def test_reasoning_the_answer_repeats_is_kept(built: dict[str, Path], kind: str) -> None:
    renderer = load_renderer(str(built[kind]))
    user = {"role": "user", "content": "Say hello"}
    turn = {"role": "assistant", "content": "Hello there!", "reasoning_content": "Hello"}
    sample = {"id": "S-0", "conversations": [user, turn], "meta": {"finish_reason": "stop",
                                                                   "chat_template_kwargs": "{}"}}
    row = TokenRowBuilder(renderer).rows([sample])[0]
    trained = renderer.decode(row["input_ids"][row["loss_mask"].tolist().index(1):].tolist())
    prompt = renderer.render([user], generation_prompt=True)
    assert trained == expected_turn(kind, prompt, turn, cut=False)


# ---------------------------------------------------------------- defect 3: the end of a cut turn


def test_server_ids_end_with_the_stop_token_only_when_the_model_stopped(sim, tmp_path: Path) -> None:
    """The simulator returns the matched stop token in token_ids as SGLang 0.5.17 does (tokens.py); a turn cut
    at max_new_tokens ends without one, and so does its tokens row."""
    out = _generate(sim, tmp_path, "I", output="token_ids = true\n")
    samples = read_samples(out, "I")
    turns = [(t, m) for s in samples for t, m in zip(s["meta"]["per_turn"],
                                                     [m for m in s["conversations"] if m["role"] == "assistant"],
                                                     strict=True)]
    assert {(t["finish_reason"], m["token_ids"][-1] == EOS_TOKEN_ID) for t, m in turns} == {("stop", True),
                                                                                           ("length", False)}
    assert all(len(m["token_ids"]) == t["completion_tokens"] for t, m in turns)
    rows = _export_tokens(out, "I", tmp_path / "t.jsonl", None)
    by_id = {r["id"]: r for r in rows}
    for s in samples:
        for k, t in enumerate(s["meta"]["per_turn"]):
            assert (by_id[f"{s['id']}#turn{k}"]["input_ids"][-1] == EOS_TOKEN_ID) == (t["finish_reason"] == "stop")
