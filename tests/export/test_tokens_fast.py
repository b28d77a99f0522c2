"""The fast rendered `tokens` rows equal the plain path (apply_chat_template on each turn alone, then the
tokenizer: tokens.slow_turn_ids) id for id, on hostile text and several pre-tokenizers; and its fallbacks."""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from export_helpers import jsonl, write_store

from gen_pipeline.export import core, encode, tokens
from gen_pipeline.export.direct import DirectTemplate
from gen_pipeline.export.encode import SPLIT_REGEXES, TextEncoder
from gen_pipeline.export.render import Renderer, load_renderer
from gen_pipeline.export.select import ValSplit, validation_ids
from gen_pipeline.export.tokens import TokenRowBuilder, sent_message, slow_turn_ids
from gen_pipeline.records import Sample

from pipeline_helpers import chat_template, tokenizer_specials

WORDS = ["the", "of", "answer", "Reasoning", "x", "don't", "it's", "I'M", "we'll", "12345", "3.14", "1,000", "-",
         "...", "(a)", "[b]", "{c}", "e.g.,", "naïve", "café", "e\u0301tude", "ﬁne", "日本語の文", "한국어",
         "\u1100\u1161\u11a8", "😀", "Ω≈", "ß", "İstanbul", "مرحبا", "שלום", "ÅÄÖ", "x\u0308", "\u00a0nbsp",
         "supercalifragilisticexpialidocious", "https://example.com/a/very/long/path?q=1&r=2", "fifteen_bytes_a",
         "sixteen_bytes_ab", "<|im_end|>", "<think>", "</think>", "<|im_start|>user", "'s", "'", "\"quoted\"",
         "tab\there", "a\x0bb", "del\x7f", "nul\x00x", "ＡＢＣ"]
SEPARATORS = [" "] * 12 + ["  ", "   ", "\n", "\n ", " \n", "\n\n", "\t", " \t ", "\r\n", "\u3000", "\u00a0 ", ""]


def _text(rng: random.Random, words: int) -> str:
    out = [rng.choice(["", " ", "\n", "  "]) if rng.random() < 0.2 else ""]
    for _ in range(words):
        out += [rng.choice(WORDS), rng.choice(SEPARATORS)]
    return "".join(out) + rng.choice(["", " ", "\n", ".", "  "])


def _samples(seed: int, n: int) -> list[dict[str, Any]]:
    """Conversations of 1-4 assistant turns: a system prompt or not, tool messages, reasoning or not."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        convs: list[dict[str, Any]] = [{"role": "system", "content": _text(rng, 6)}] if i % 3 == 0 else []
        for k in range(1 + i % 4):
            convs.append({"role": "user", "content": _text(rng, rng.randint(0, 30))})
            if rng.random() < 0.2:
                convs.append({"role": "tool", "content": _text(rng, 5)})
            turn = {"role": "assistant", "content": _text(rng, rng.randint(0, 40))}
            if (i + k) % 3:
                turn["reasoning_content"] = _text(rng, rng.randint(1, 60))
            convs.append(turn)
        out.append({"id": f"s{i}", "dataset": "t", "conversations": convs, "meta": {}})
    return out


def _plain(renderer: Renderer, samples: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
    out = []
    for s in samples:
        history: list[dict[str, Any]] = []
        for m in s["conversations"]:
            if m["role"] == "assistant":
                out.append(slow_turn_ids(renderer, history, sent_message(m)))
            history.append(sent_message(m))
    return out


def _rows_equal_plain(tokenizer: Path, seed: int, n: int, **kwargs: Any) -> tuple[TokenRowBuilder, int]:
    """The rows of n samples of _samples(seed), built by a new TokenRowBuilder: each equal to the plain
    path; (the builder, how many rows)."""
    renderer, samples = load_renderer(str(tokenizer), **kwargs), _samples(seed, n)
    builder = TokenRowBuilder(renderer)
    rows, plain = builder.rows(samples), _plain(renderer, samples)
    assert len(rows) == len(plain) > len(samples)
    for row, (ids, mask) in zip(rows, plain, strict=True):
        assert row["input_ids"].dtype == np.int32 and row["loss_mask"].dtype == np.int8
        assert (row["input_ids"].tolist(), row["loss_mask"].tolist()) == (ids, mask), row["id"]
    return builder, len(rows)


def _export_equals_plain(tmp_path: Path, tokenizer: Path, seed: int, n: int, **opts: Any) -> Any:
    """Store n samples of _samples(seed), export them as tokens rows (through core.run_export) and check every
    row, train and validation, against the plain path; the export's summary."""
    samples = _samples(seed, n)
    write_store(tmp_path / "out", "t", [Sample(s["id"], "t", s["conversations"], {}) for s in samples])
    summary = core.run_export(core.ExportOptions(output_root=tmp_path / "out", datasets=("t",), format="tokens",
                                                 out=tmp_path / "e.jsonl", tokenizer=str(tokenizer), **opts))
    rows = {r["id"]: r for p in (tmp_path / "e.jsonl", tmp_path / "e.val.ndjson") if p.exists() for r in jsonl(p)}
    ids = [f"s{i}#turn{k}" for i in range(n) for k in range(1 + i % 4)]
    assert sorted(rows) == sorted(ids)
    assert [(rows[i]["input_ids"], rows[i]["loss_mask"]) for i in ids] == _plain(load_renderer(str(tokenizer)), samples)
    return summary


def _byte_level_tokenizer(folder: Path, split: str | None) -> Path:
    """A byte-level BPE like bench/chat_templates.py's, ChatML template: NFC and a Split regex (then ByteLevel
    without its own) as Qwen2/Qwen3 and Llama 3 tokenizers have them; no `split`: ByteLevel with a prefix space."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    else:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(3)
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=tokenizer_specials(), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_text(rng, 40) for _ in range(1_500)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = chat_template("qwen3")
    fast.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """name → a tokenizer folder: "qwen2" / "llama3" (their Split regex + NFC), "prefix" (ByteLevel with a
    prefix space); each built once, when first asked for."""
    return functools.cache(lambda name: _byte_level_tokenizer(tmp_path_factory.mktemp(name), SPLIT_REGEXES.get(name)))


@pytest.mark.parametrize("kind", ["kimi", "qwen3", "chatml", *sorted(SPLIT_REGEXES)])
def test_fast_rows_equal_the_plain_path_on_each_template(tokenizers: dict[str, Path], byte_level: Any,
                                                         kind: str) -> None:
    """Each template; and the qwen2 and llama3 Split regexes with NFC: chunked too."""
    builder, compared = _rows_equal_plain(tokenizers[kind] if kind in tokenizers else byte_level(kind), len(kind), 90)
    assert compared >= 200 and builder.renderer is not None
    assert builder.encoder is not None and builder.encoder.chunked  # the fast ways, not a fallback
    assert builder.renderer._direct and not builder.renderer.direct_why
    assert builder.stats["turns_rendered"] == compared and builder.stats["spot_checks"] == 1
    assert builder.encoder.stats["texts_chunked"] == 2 * compared and builder.encoder.stats["texts_whole"] == 0
    assert not builder.mismatch and builder.notes() == []


def test_reasoning_kept_or_not_the_template_kwargs_and_many_batches(tokenizers: dict[str, Path],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Kimi with thinking off in the generation prompt (--template-kwargs); small batches, groups and
    slot table (the chunk table's collisions, restarts and the concatenation of groups)."""
    monkeypatch.setattr(tokens, "BATCH_TURNS", 7)
    monkeypatch.setattr(encode, "GROUP_BYTES", 300)
    monkeypatch.setattr(encode, "SLOT_BITS", 3)
    monkeypatch.setattr(encode, "MAX_CHUNKS", 400)
    builder, compared = _rows_equal_plain(tokenizers["kimi"], 9, 60, kwargs={"thinking": False})
    assert compared > 100
    assert builder.encoder is not None and builder.encoder.chunked
    assert builder.stats["spot_checks"] == 1


def test_the_encoder_equals_the_tokenizer_text_by_text(tokenizers: dict[str, Path], byte_level: Any) -> None:
    """Edge texts straight through TextEncoder: empty, spaces only, chunks of 15 and 16 bytes, a
    chunk that is only special tokens, one text over many groups."""
    rng = random.Random(11)
    texts = ["", " ", "  ", "a", " a", "a ", "fifteen_bytes_a fifteen_bytes_a", "sixteen_bytes_ab sixteen_bytes_ab",
             "<|im_end|><|im_start|>", "x <|im_end|> y", "\n \n ", "é é", "e\u0301 e\u0301"]
    texts += [_text(rng, rng.randint(0, 50)) for _ in range(300)] + [_text(rng, 3_000)]
    for folder in (tokenizers["qwen3"], byte_level("qwen2"), byte_level("llama3")):
        renderer = load_renderer(str(folder))
        encoder = TextEncoder(renderer.tokenizer)
        for _ in range(2):  # cold, then every chunk known
            ids, starts = encoder.encode(texts)
            assert [ids[a:b].tolist() for a, b in zip(starts[:-1], starts[1:], strict=True)] == \
                [renderer.encode(t) for t in texts]


def test_a_tokenizer_whose_splits_are_not_known_is_tokenized_whole(byte_level: Any) -> None:
    """ByteLevel with a prefix space: each chunk would get one of its own; the fallback is counted."""
    builder, compared = _rows_equal_plain(byte_level("prefix"), 2, 30)
    assert builder.encoder is not None and not builder.encoder.chunked
    assert builder.encoder.why_whole == "a pre-tokenizer whose splits are not known here"
    assert builder.encoder.stats["texts_whole"] == 2 * compared and builder.encoder.stats["texts_chunked"] == 0
    assert builder.notes() == ["tokens: each rendered turn was tokenized whole (a pre-tokenizer whose splits are "
                               "not known here): exact, slower"]


def test_a_spot_check_that_differs_makes_every_row_the_plain_way(tokenizers: dict[str, Path],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong chunk id (what a wrong proof would give) is caught by the spot check of the first turn:
    the rows are then made with apply_chat_template and whole texts, equal to the plain path."""
    original = encode._Chunks.ids

    def wrong(self: Any, entry: Any, text_chunk: Any) -> Any:
        ids, starts = original(self, entry, text_chunk)
        return ids + 1, starts

    monkeypatch.setattr(encode._Chunks, "ids", wrong)
    builder, compared = _rows_equal_plain(tokenizers["chatml"], 4, 20)
    assert compared > 40
    assert builder.stats["spot_mismatches"] == 1 and builder.mismatch == "s0#turn0" and builder.exact
    assert builder.encoder is not None and builder.encoder.why_whole == "asked to be exact"
    assert builder.notes() == ["tokens: row s0#turn0 differed from the plain path (the template and the tokenizer on "
                               "each turn alone), so every row was made the plain way; please report it"]


def test_export_rebuilds_the_splits_made_before_a_spot_check_differed(tokenizers: dict[str, Path], tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The train split passes its spot checks; a wrong id from the 40th turn on (in the validation
    split, built second) makes the export build both splits again the plain way, and say so."""
    val = ValSplit(share=0.5)
    validation = validation_ids((f"s{i}" for i in range(40)), val)
    train_turns = sum(1 + i % 4 for i in range(40) if f"s{i}" not in validation)
    calls = {"turns": 0}
    original = encode._Chunks.ids

    def wrong_later(self: Any, entry: Any, text_chunk: Any) -> Any:
        ids, starts = original(self, entry, text_chunk)
        calls["turns"] += (len(starts) - 1) // 2
        return (ids + 1 if calls["turns"] > train_turns else ids), starts

    monkeypatch.setattr(encode._Chunks, "ids", wrong_later)
    monkeypatch.setattr(core, "check_reasoning", lambda *a, **k: ([], []))  # its own rows would count
    monkeypatch.setattr(tokens, "SPOT_EVERY", 1)
    monkeypatch.setattr(tokens, "BATCH_TURNS", 1)
    summary = _export_equals_plain(tmp_path, tokenizers["kimi"], 8, 40, val=val)
    assert summary.rows["train"] == train_turns and summary.rows["validation"] == 100 - train_turns
    assert any(n.startswith("tokens: row ") and n.endswith("made the plain way; please report it")
               for n in summary.notes)


def test_a_message_the_direct_template_was_not_probed_for_goes_through_apply_chat_template(
        tokenizers: dict[str, Path]) -> None:
    renderer = load_renderer(str(tokenizers["chatml"]))
    odd = [{"role": "user", "content": "hi", "name": "x"}]  # a key the probes do not cover
    plain = [{"role": "user", "content": "hello there"}]
    texts = renderer.turn_texts([(odd, {"role": "assistant", "content": "a"}),
                                 (plain, {"role": "assistant", "content": "b"})])
    assert renderer._direct and texts == [renderer.turn_text(odd, {"role": "assistant", "content": "a"}),
                                          renderer.turn_text(plain, {"role": "assistant", "content": "b"})]
    assert renderer._direct.render_many([odd, plain], generation_prompt=True) == [
        None, renderer.render(plain, generation_prompt=True)]
    # refused when apply_chat_template does not render it as probed
    source = renderer.tokenizer.get_chat_template()
    assert DirectTemplate.probe(lambda m, g: "no template call", source) == (
        None, "apply_chat_template does not render through one jinja2 template call")
    assert DirectTemplate.probe(lambda m, g: renderer._apply(m, g).upper(), source) == (
        None, "rendering the template directly differs from apply_chat_template")
    direct, why = DirectTemplate.probe(renderer._apply, source)
    assert direct is not None and why == ""


def test_the_export_writes_the_fast_rows_and_says_nothing_of_them(tokenizers: dict[str, Path], tmp_path: Path) -> None:
    summary = _export_equals_plain(tmp_path, tokenizers["qwen3"], 12, 30)
    assert summary.rows == {"train": 73} and [n for n in summary.notes if n.startswith("tokens:")] == []
