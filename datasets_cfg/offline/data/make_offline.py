"""Writes the offline job's four sources: small local files in the schemas of the reference job's hub sources.

Each file holds 40 rows shaped like its hub dataset's rows (same columns, same turn format), written by
this script (no hub text): the TOMLs next to the folder read them with the same schema/field/id settings
as datasets_cfg/B1.toml ... B7.toml read the hub. Run: python make_offline.py (deterministic).

- B1.jsonl: ShareGPT (Aeala/ShareGPT_Vicuna_unfiltered): id, conversations [{from: human|gpt, value}];
  multi-turn, one row opening with the model's turn and one with an empty turn (the dump has both: rejected).
- B2.jsonl: reasoning (open-r1/OpenR1-Math-220k): problem, solution, answer, uuid, problem_type, source.
- B6.jsonl: UltraChat (HuggingFaceH4/ultrachat_200k): prompt, prompt_id (sha256 of the prompt), messages
  [{role, content}]; multi-turn.
- B7.jsonl: Magpie (Magpie-Align/Magpie-Pro-300K-Filtered): uuid, instruction, response, conversations
  [{from: human|gpt, value}], task_category.
"""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from pathlib import Path
from typing import Any

ROWS = 40
TOPICS = ["binary search", "TCP slow start", "photosynthesis", "the Roman republic", "KV caches", "SQL joins",
          "speculative decoding", "Rust ownership", "black holes", "compound interest", "hash tables",
          "plate tectonics", "public-key cryptography", "garbage collection", "Bayes' theorem", "the water cycle"]
ASKS = ["How does {t} work?", "Explain {t} to a new engineer.", "What are common mistakes with {t}?",
        "Give me a short example of {t}.", "Why does {t} matter?"]
FOLLOW = ["Can you make it shorter?", "Give a concrete example.", "What would an expert add?", "And the downside?"]
SOURCE_ANSWER = "(the source's answer: replaced by the target model's)"


def sharegpt(i: int, rng: random.Random) -> dict[str, Any]:
    turns = []
    for k in range(1 + i % 3):  # 1-3 user turns
        ask = ASKS[(i + k) % len(ASKS)].format(t=TOPICS[i % len(TOPICS)]) if k == 0 else rng.choice(FOLLOW)
        turns += [{"from": "human", "value": f"{ask} (#{i})" if k == 0 else ask},
                  {"from": "gpt", "value": SOURCE_ANSWER}]
    return {"id": f"sg{i:03d}_0", "conversations": turns}


def divisors(n: int) -> int:
    return sum(1 for d in range(1, n + 1) if n % d == 0)


def reasoning(i: int, rng: random.Random) -> dict[str, Any]:
    a, b, c = rng.randint(2, 40), rng.randint(2, 40), rng.randint(2, 9)
    kinds = [(f"Find all real x with {a}x + {b} = {c}x + {a * b}.", "Algebra", f"{(a * b - b) / (a - c):g}"
              if a != c else "none"),
             (f"How many positive divisors does {a * b * c} have?", "Number Theory", str(divisors(a * b * c))),
             (f"A box holds {a} red and {b} blue balls. Two are drawn without replacement. What is the "
              "probability that both are red?", "Combinatorics", f"{a * (a - 1)}/{(a + b) * (a + b - 1)}")]
    problem, kind, answer = kinds[i % len(kinds)]
    return {"problem": f"{problem} (#{i})", "solution": SOURCE_ANSWER, "answer": answer,
            "problem_type": kind, "question_type": "math-word-problem", "source": "offline",
            "uuid": str(uuid.UUID(int=rng.getrandbits(128), version=4))}


def ultrachat(i: int, rng: random.Random) -> dict[str, Any]:
    prompt = f"{ASKS[i % len(ASKS)].format(t=TOPICS[(i * 7) % len(TOPICS)])} (#{i})"
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": SOURCE_ANSWER}]
    for _ in range(i % 3):  # 1-3 user turns
        messages += [{"role": "user", "content": rng.choice(FOLLOW)}, {"role": "assistant", "content": SOURCE_ANSWER}]
    return {"prompt": prompt, "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(), "messages": messages}


def magpie(i: int, rng: random.Random) -> dict[str, Any]:
    instruction = f"{ASKS[(i + 2) % len(ASKS)].format(t=TOPICS[(i * 3) % len(TOPICS)])} (#{i})"
    return {"uuid": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "instruction": instruction,
            "response": SOURCE_ANSWER, "task_category": rng.choice(["Information seeking", "Coding & Debugging"]),
            "conversations": [{"from": "human", "value": instruction}, {"from": "gpt", "value": SOURCE_ANSWER}]}


# ShareGPT dump rows the pipeline rejects (counted, with the reason): the model speaks first; an empty turn
B1_INVALID = [{"id": "sg_bad_0", "conversations": [{"from": "gpt", "value": "Hello! How can I help?"}]},
              {"id": "sg_bad_1", "conversations": [{"from": "human", "value": ""}]}]


def main() -> None:
    rng = random.Random(11)
    here = Path(__file__).parent
    b1 = [sharegpt(i, rng) for i in range(ROWS - len(B1_INVALID))]
    b1[7:7] = B1_INVALID[:1]
    b1[23:23] = B1_INVALID[1:]
    files = {"B1": b1, "B2": [reasoning(i, rng) for i in range(ROWS)],
             "B6": [ultrachat(i, rng) for i in range(ROWS)], "B7": [magpie(i, rng) for i in range(ROWS)]}
    for name, rows in files.items():
        (here / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


if __name__ == "__main__":
    main()
