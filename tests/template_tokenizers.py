"""Offline tokenizers (a small byte-level BPE on syllable text) with the chat templates of
tests/data/chat_templates (chatml, qwen3, kimi), loadable by `AutoTokenizer.from_pretrained(folder)`."""

from __future__ import annotations

import random
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "data" / "chat_templates"
KINDS = ("chatml", "qwen3", "kimi")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
           "<|im_middle|>", "<think>", "</think>"]
END_OF_TURN = {"chatml": "<|im_end|>\n", "qwen3": "<|im_end|>\n", "kimi": "<|im_end|>"}


def _corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghklmnprstvz" for b in "aeiou"] + ["the", "of", "and", "to", "in"]
    return [" ".join("".join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(rng.randint(10, 60)))
            + rng.choice([".", "?", "!"]) for _ in range(2_000)]


def build_tokenizer(out: Path, kind: str, *, vocab_size: int = 600) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(0), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   model_max_length=32_768)
    fast.chat_template = (TEMPLATES / f"{kind}.jinja").read_text()
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return out


def build_all(root: Path) -> dict[str, Path]:
    return {kind: build_tokenizer(root / kind, kind) for kind in KINDS}
