"""Phase `tokenids` (issue 21): real SGLang's own prompt and output token ids against the tokens export's
rendered path. Multi-turn conversations are run turn by turn against the `h200` server with
`return_prompt_token_ids` / `return_token_ids` (SGLang 0.5.13+, entrypoints/openai/protocol.py), each
turn's answer fed back as history; then gen_pipeline.export.template_check.compare_server_ids renders
every turn with the model's own tokenizer and chat template (what `export --format tokens` does without
recorded ids) and counts the turns whose prompt ids equal the server's and whose output ids are a prefix
of the rendered turn. Results under results.json["tokenids"].
"""

from __future__ import annotations

import random
from typing import Any

import httpx

from gen_pipeline.export.render import load_renderer
from gen_pipeline.export.template_check import compare_server_ids

WORDS = ("the model reads a long question about queues caches and tokens then answers in short plain "
         "sentences with numbers lists and code where a draft head learns to predict the next word").split()


def _user_text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 60))).capitalize() + "?"


def run_phase(check: Any, conversations: int = 24, turns: int = 3) -> None:
    s = check.ensure("main", "h200")
    rng = random.Random(21)
    samples: list[dict[str, Any]] = []
    missing = 0
    with httpx.Client(timeout=120.0) as client:
        model = client.get(f"{s.url}/v1/models").json()["data"][0]["id"]
        for i in range(conversations):
            messages: list[dict[str, Any]] = []
            conv: list[dict[str, Any]] = []
            for _ in range(turns):
                user = {"role": "user", "content": _user_text(rng)}
                messages.append(user)
                conv.append(user)
                body = {"model": model, "messages": messages, "max_tokens": 48, "temperature": 0.8,
                        "return_prompt_token_ids": True, "return_token_ids": True}
                choice = client.post(f"{s.url}/v1/chat/completions", json=body).json()["choices"][0]
                answer = {"role": "assistant", "content": choice["message"].get("content") or ""}
                messages.append(answer)
                ids = {k: choice.get(k) for k in ("prompt_token_ids", "token_ids")}
                if not all(isinstance(v, list) for v in ids.values()):
                    missing += 1
                conv.append({**answer, **{k: v for k, v in ids.items() if isinstance(v, list)}})
            samples.append({"id": f"tok-{i}", "conversations": conv})
    renderer = load_renderer(str(check.results.get("model_path") or check.work / "model"))
    agreement = compare_server_ids(samples, renderer)
    row = {"conversations": conversations, "turns": agreement.turns, "prompt_equal": agreement.prompt_equal,
           "output_prefix": agreement.output_prefix, "turns_without_ids": missing,
           "first_mismatch": agreement.first_mismatch, "line": agreement.format()}
    check.results["tokenids"] = row
    check.save()
    check.log(f"tokenids: {row['line']} ({missing} turns without ids)")
