"""A random-weight Llama and an offline byte-level BPE tokenizer (with a chat template) for the GPU check.

No hub access on the GPU machine, so both are made here: `python -m bench.gpu.make_model OUT [--tiny]`.
The default is the 1.2B shape of issue 9 (hidden 2048, 24 layers, 16 heads, 4 KV heads). The
lm_head is scaled down so the next-token distribution is close to uniform over the ~320-token
vocabulary: EOS then comes with probability ~1/320 per token, so outputs are ~260 tokens on
average under a 512 cap with EOS honoured, a length profile that repeats from run to run.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

VOCAB_SIZE = 320
MAX_POSITIONS = 8192  # the long-output regime (issue 19): ~500 prompt + 4,096 new tokens
SPECIAL = ["<|bos|>", "<|eot|>", "<|start|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start|>{{ m['role'] }}\n{{ m['content'] }}<|eot|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)
WORDS = ("the of and to in is that for it as with was on be by at this are from or have an they which one "
         "you were her all she there would their we him been has when who will more no if out so said what "
         "up its about into than them can only other new some could time these two may then do first any my "
         "now such like our over man me even most made after also did many before must through back years "
         "where much your way well down should because each just those people how too little state good very "
         "make world still own see men work long get here between both life being under never day same another "
         "know while last might us great old year off come since against go came right used take three model "
         "token cache memory server request batch decode prefill window kernel tensor graph layer").split()
SHAPES = {  # name: (hidden, layers, heads, kv heads, intermediate)
    "1.2b": (2048, 24, 16, 4, 6144),
    "tiny": (64, 2, 4, 2, 128),
    # issue 34's small, fast model: a step short enough that the clients, not the GPU, set the pace
    "small": (512, 4, 4, 2, 1024),
}


def synthetic_text(rng: random.Random, n_words: int) -> str:
    """Word salad with sentence breaks: enough structure for BPE merges, nothing to learn."""
    words = [rng.choice(WORDS) for _ in range(n_words)]
    for i in range(0, n_words, rng.randint(6, 14)):
        words[i] = words[i].capitalize()
    return " ".join(words) + "."


def build_tokenizer(out: Path, seed: int = 0) -> int:
    """Train the byte-level BPE on synthetic text, save it with its chat template; returns the vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    corpus = [synthetic_text(rng, rng.randint(20, 80)) for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    # model_max_length: without it transformers records 1e30, which SGLang's /tokenize cannot
    # serialize (HTTP 500 "Integer exceeds 64-bit range", seen on the H200)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eot|>",
                                   pad_token="<|pad|>", model_max_length=MAX_POSITIONS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return len(fast)


def build_model(out: Path, vocab_size: int, shape: str, seed: int = 0) -> dict:
    """Random bf16 Llama on the GPU (CPU when there is none), saved as safetensors; returns its config."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(out)
    hidden, layers, heads, kv_heads, inter = SHAPES[shape]
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=inter,
                      max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=False, dtype="bfloat16",
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.05)  # near-uniform next token: see the module docstring
    model.save_pretrained(out)  # safetensors
    model.generation_config.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "max_positions": MAX_POSITIONS, "vocab_size": vocab_size, "hidden": hidden,
            "layers": layers, "heads": heads,
            "kv_heads": kv_heads, "intermediate": inter, "eos_token_id": tok.eos_token_id, "device": device}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--shape", choices=sorted(SHAPES), default="1.2b")
    p.add_argument("--tokenizer-only", action="store_true")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(args.out)
    info = {"vocab_size": vocab} if args.tokenizer_only else build_model(args.out, vocab, args.shape)
    (args.out / "bench_model.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info), flush=True)
    return info


if __name__ == "__main__":
    main()
