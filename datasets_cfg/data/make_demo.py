"""Writes demo.jsonl: the bundled demo prompt set (messages schema), deterministic.

300 conversations: single-turn questions, some with a system prompt, some multi-turn (the
assistant turns are placeholders: the pipeline regenerates every one), and 6 deliberately
invalid rows so a demo run shows what a rejected row looks like. Run: python make_demo.py
"""

import json
import random
from pathlib import Path

TOPICS = ["binary search", "TCP congestion control", "photosynthesis", "the French revolution", "KV caches",
          "speculative decoding", "Rust ownership", "SQL joins", "black holes", "compound interest",
          "the Krebs cycle", "gradient descent", "hash tables", "the Roman republic", "plate tectonics",
          "public-key cryptography", "garbage collection", "Bayes' theorem", "the water cycle", "transformers"]
FORMS = ["Explain {t} to a new engineer.", "Write a short poem about {t}.",
         "What are three common misconceptions about {t}?", "Give a step-by-step example of {t}.",
         "Compare {t} with a related idea and say when each applies.", "Summarise {t} in five bullet points."]
FOLLOW = ["Can you make it shorter?", "Now give a concrete example.", "What would an expert add?",
          "Turn that into a quiz question."]
SYSTEMS = ["You are a concise assistant.", "You are a patient teacher who uses analogies.",
           "Answer as a senior software engineer."]


def conversation(rng: random.Random, i: int) -> dict:
    topic = TOPICS[i % len(TOPICS)]
    msgs = []
    if i % 4 == 1:
        msgs.append({"role": "system", "content": rng.choice(SYSTEMS)})
    msgs.append({"role": "user", "content": FORMS[(i // len(TOPICS)) % len(FORMS)].format(t=topic) + f" (#{i})"})
    for _ in range(i % 3 if i % 5 == 0 else 0):  # every 5th row: up to 3 user turns
        msgs.append({"role": "assistant", "content": "(source answer, replaced by the target model)"})
        msgs.append({"role": "user", "content": rng.choice(FOLLOW)})
    return {"id": f"{i:04d}", "messages": msgs}


INVALID = [
    {"id": "bad-empty", "messages": [{"role": "user", "content": "   "}]},
    {"id": "bad-roles", "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]},
    {"id": "bad-type", "messages": [{"role": "user", "content": 42}]},
    {"id": "bad-missing", "messages": [{"role": "user"}]},
    {"id": "bad-assistant-first", "messages": [{"role": "assistant", "content": "I start"}]},
    {"id": "bad-not-list", "messages": "just a string"},
]


def main() -> None:
    rng = random.Random(7)
    rows = [conversation(rng, i) for i in range(300)]
    for k, bad in enumerate(INVALID):
        rows.insert(37 * (k + 1), bad)
    out = Path(__file__).with_name("demo.jsonl")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
