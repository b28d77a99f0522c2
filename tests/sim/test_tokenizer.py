"""The sim's tokenizer, chat template and output lengths: pure, property-tested."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_sim.lengths import cap_length, draw_length, request_seed
from sglang_sim.tokenizer import decode, decode_output, draw_output_ids, encode, render_chat


@given(st.text(max_size=200))
@settings(max_examples=60)
def test_encode_is_lossless(text: str) -> None:
    ids = encode(text)
    assert decode(ids) == text
    assert encode(decode(ids)) == ids


@given(st.integers(min_value=0, max_value=2**63), st.integers(min_value=0, max_value=300))
@settings(max_examples=30)
def test_drawn_outputs_retokenize_to_themselves(seed: int, n: int) -> None:
    ids = draw_output_ids(seed, n)
    assert len(ids) == n
    assert encode(decode_output(ids)) == ids
    assert decode_output(ids) == decode(ids)
    assert draw_output_ids(seed, n) == ids


def test_english_costs_a_bit_over_one_token_per_word_and_turns_prefix_each_other() -> None:
    text = "The quick brown fox jumps over the lazy dog while the radix cache keeps shared prefixes."
    # 16 words -> 16 pieces, + "shared" and "prefixes" split after 5 letters, + "."
    assert len(encode(text)) == 19
    assert encode("hello world") == encode("hello") + encode(" world")
    first = [{"role": "user", "content": "Hi there"}]
    p1, out = encode(render_chat(first)), draw_output_ids(42, 50)
    history = first + [{"role": "assistant", "content": decode_output(out)}, {"role": "user", "content": "More"}]
    assert encode(render_chat(history))[: len(p1) + len(out)] == p1 + out
    # output lengths are seeded and capped
    seed = request_seed(0, "prompt", {"temperature": 0.7})
    assert seed == request_seed(0, "prompt", {"temperature": 0.7})
    assert seed != request_seed(1, "prompt", {"temperature": 0.7})
    assert seed != request_seed(0, "prompt", {"temperature": 0.8})
    draws = [draw_length(request_seed(0, str(i), {}), 1000.0, 0.5) for i in range(2000)]
    assert 930 < sum(draws) / len(draws) < 1070
    assert draw_length(seed, 300.0, 0.0) == 300
    assert cap_length(500, 400) == (400, "length")
    assert cap_length(400, 400) == (400, "stop")


@given(st.lists(st.tuples(st.sampled_from(["user", "assistant"]), st.text(max_size=40)), min_size=1, max_size=5))
@settings(max_examples=40)
def test_chat_prefix_renders_to_a_token_prefix(turns: list[tuple[str, str]]) -> None:
    messages = [{"role": r, "content": c} for r, c in turns]
    full = encode(render_chat(messages + [{"role": "user", "content": "next"}]))
    prefix = encode(render_chat(messages, add_generation_prompt=False))
    assert full[: len(prefix)] == prefix
