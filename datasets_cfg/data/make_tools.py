"""Writes tools.jsonl: the bundled tool-use (agentic) prompt set (messages schema), deterministic.

20 conversations in OpenAI's shape: a `tools` column (the function schemas, as JSON text: one Arrow type
whatever the schemas), assistant turns with `tool_calls` (arguments as JSON text) and `tool` turns with
the results; 2 or 3 tool turns each, some with two calls at once, some with a second user turn.
The user and tool turns end with the simulator's directives `[[call NAME {arguments}]]` (sglang_sim/tools.py):
the simulator then makes the calls the source made, so the source's tool results stay consistent and the
sample regenerates whole; in samples 7 and 15 the directive asks for other arguments than the source's
call, so they end at their first turn (meta.tool_divergence = 1, run/chat.py's policy).
Run: python make_tools.py
"""

import json
from pathlib import Path

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "units": {"type": "string", "enum": ["C", "F"]}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount between currencies.",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
            "required": ["amount", "from", "to"]}}},
]
CITIES = ["Paris", "Rome", "Oslo", "Lima", "Kyoto", "Cairo", "Quito", "Perth", "Dakar", "Tunis"]
CURRENCIES = [("EUR", "USD"), ("USD", "JPY"), ("GBP", "EUR"), ("NOK", "EUR")]
DIVERGING = {7, 15}


def directive(name: str, args: dict) -> str:
    return f"[[call {name} {json.dumps(args)}]]"


def result(i: int, k: int, value: dict, tail: str = "") -> dict:
    return {"role": "tool", "tool_call_id": f"call_{i}_{k}", "content": json.dumps(value) + tail}


def call(i: int, k: int, name: str, args: dict) -> dict:
    return {"id": f"call_{i}_{k}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def conversation(i: int) -> dict:
    city, other = CITIES[i % len(CITIES)], CITIES[(i + 3) % len(CITIES)]
    weather, time_ = {"city": city, "units": "C"}, {"city": city}
    asked = {"city": city, "units": "F"} if i in DIVERGING else weather
    msgs: list[dict] = [{"role": "system", "content": "You are a travel assistant. Use the tools when they help."}]
    ask = directive("get_weather", asked) + (" " + directive("get_time", time_) if i % 3 == 0 else "")
    msgs.append({"role": "user", "content": f"What's the weather in {city} right now? {ask}"})
    if i % 3 == 0:  # two calls at once, then the answer
        msgs.append({"role": "assistant", "content": "",
                     "tool_calls": [call(i, 0, "get_weather", weather), call(i, 1, "get_time", time_)]})
        msgs.append(result(i, 0, {"temp": 10 + i, "sky": "clear"}))
        msgs.append(result(i, 1, {"time": f"{8 + i % 12}:15"}))
        msgs.append({"role": "assistant", "content": f"It is {10 + i} degrees and clear in {city}."})
    else:  # one call, its result asks for the next
        msgs.append({"role": "assistant", "content": "", "tool_calls": [call(i, 0, "get_weather", weather)]})
        msgs.append(result(i, 0, {"temp": 10 + i, "sky": "rain"}, " " + directive("get_time", time_)))
        msgs.append({"role": "assistant", "content": "", "tool_calls": [call(i, 1, "get_time", time_)]})
        msgs.append(result(i, 1, {"time": f"{8 + i % 12}:40"}))
        msgs.append({"role": "assistant", "content": f"It is raining in {city}, {10 + i} degrees."})
    if i % 2 == 0:  # a second user turn with a third tool turn
        src, dst = CURRENCIES[i % len(CURRENCIES)]
        conv = {"amount": 100 + i, "from": src, "to": dst}
        msgs.append({"role": "user", "content": f"How much is {100 + i} {src} in {dst}? And then {other}? "
                                                f"{directive('convert_currency', conv)}"})
        msgs.append({"role": "assistant", "content": "", "tool_calls": [call(i, 2, "convert_currency", conv)]})
        msgs.append(result(i, 2, {"result": 1.1 * (100 + i)}))
        msgs.append({"role": "assistant", "content": f"That is about {1.1 * (100 + i):.2f} {dst}."})
    return {"id": f"t{i:02d}", "tools": json.dumps(TOOLS), "messages": msgs}


def main() -> None:
    out = Path(__file__).with_name("tools.jsonl")
    out.write_text("".join(json.dumps(conversation(i)) + "\n" for i in range(20)))


if __name__ == "__main__":
    main()
