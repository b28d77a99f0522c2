"""Offline tokenizers with the chat templates of three kinds of target, for `check-template`, the
`tokens` export and their tests and benchmark (the hub is unreachable here).

Each is a small byte-level BPE (the `tokenizers` library, as bench/gpu/make_model.py builds one)
saved with `save_pretrained`, so `AutoTokenizer.from_pretrained(folder)` loads it like a real
target's. The templates are written from the public descriptions of each family, not copied:

    chatml  plain ChatML: <|im_start|>role\\n...<|im_end|>\\n; no reasoning field at all.
    qwen3   Qwen3-style: an assistant turn after the last user message renders
            <think>\\nREASONING\\n</think>\\n\\n before its content; earlier turns render the content
            only; `enable_thinking=False` puts an empty think block in the generation prompt.
    kimi    Kimi-K2.5-style: <|im_user|>user<|im_middle|>...<|im_end|>; every assistant message
            in the messages (the last too, when the conversation ends with one) renders an empty
            <think></think> before its content; the generation prompt opens <think> (thinking on).

`python -m bench.chat_templates OUT` writes the three folders under OUT.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
           "<|im_middle|>", "<think>", "</think>"]
VOCAB_SIZE = 600

# No whitespace control ({%- -%}) anywhere: the newlines below are part of the rendered text.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN3 = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% if loop.index0 > ns.last_user and m.get('reasoning_content') %}"
    "<think>\n{{ m['reasoning_content'].strip('\n') }}\n</think>\n\n{% endif %}"
    "{{ m['content'].lstrip('\n') }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
KIMI = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|im_assistant|>assistant<|im_middle|><think></think>{{ m['content'] }}<|im_end|>"
    "{% elif m['role'] == 'system' %}<|im_system|>system<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{% else %}<|im_user|>user<|im_middle|>{{ m['content'] }}<|im_end|>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>"
    "{% if thinking is defined and thinking is false %}<think></think>{% else %}<think>{% endif %}{% endif %}"
)
TEMPLATES = {"chatml": CHATML, "qwen3": QWEN3, "kimi": KIMI}
EOS = {"chatml": "<|im_end|>", "qwen3": "<|im_end|>", "kimi": "<|im_end|>"}


def _corpus(seed: int) -> list[str]:
    """Syllable text like the simulator's answers, so the merges are those of the demo's text."""
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghklmnprstvz" for b in "aeiou"] + ["the", "of", "and", "to", "in"]
    return [" ".join("".join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(rng.randint(10, 60)))
            + rng.choice([".", "?", "!"]) for _ in range(2_000)]


def build_tokenizer(out: Path, kind: str, seed: int = 0, *, corpus: list[str] | None = None,
                    vocab_size: int = VOCAB_SIZE) -> Path:
    """Train the byte-level BPE (on `corpus`, default: syllable text like the simulator's) and save it
    with the `kind` chat template in `out`; returns `out`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(seed) if corpus is None else corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS[kind], pad_token="<|endoftext|>",
                                   model_max_length=32_768)
    fast.chat_template = TEMPLATES[kind]
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return out


def build_all(root: Path) -> dict[str, Path]:
    return {kind: build_tokenizer(root / kind, kind) for kind in TEMPLATES}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    args = p.parse_args(argv)
    for kind, path in build_all(args.out).items():
        print(f"{kind}: {path}")


if __name__ == "__main__":
    main()
