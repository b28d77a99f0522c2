"""The streamed path alone, paced by a server that costs ~nothing: client CPU per 1K tokens, in-process.

bench/client_cpu.py measures the whole CLI against the simulator, whose pacing wavers with the load on a
shared machine (a late simulator writes several events at once, and the client reads them in one go: a
cheaper run). Here a replay server (a subprocess: pure asyncio, pre-rendered chunks, one write each, a
fixed gap) streams SGLang-shaped chat chunks of `interval` tokens to `streams` concurrent requests, and the
client reads them as run/chat.py does (Http.open_stream, TurnStream with the loop detector); CPU is this
process's (time.process_time) over the reading only. For A/B work on the per-event path.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import orjson

REPO = Path(__file__).resolve().parent.parent
_SYLLABLES = ["ka", "lo", "mi", "re", "tu", "va", "ze", "po", "ni", "da", "he", "gu", "so", "fe", "bi"]


def render_stream(tokens: int, interval: int, seed: int) -> list[bytes]:
    """One answer's SSE events as HTTP/1.1 chunks, SGLang 0.5.17's shape with continuous usage."""
    rng = random.Random(seed)
    base = {"id": f"r{seed}", "object": "chat.completion.chunk", "created": 1, "model": "replay"}

    def chunk(delta: dict[str, Any], finish: str | None, done: int | None) -> bytes:
        body: dict[str, Any] = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                      "finish_reason": finish, "matched_stop": None}]}
        if done is not None:
            body["usage"] = {"prompt_tokens": 15, "total_tokens": 15 + done, "completion_tokens": done,
                             "prompt_tokens_details": None, "reasoning_tokens": 0}
        return _http_chunk(b"data: " + orjson.dumps(body) + b"\n\n")

    out = [chunk({"role": "assistant", "content": ""}, None, None)]
    for at in range(interval, tokens + interval, interval):
        n = min(at, tokens) - (at - interval)
        words = " " + " ".join(rng.choice(_SYLLABLES) + rng.choice(_SYLLABLES) for _ in range(n))
        out.append(chunk({"reasoning_content": None, "content": words}, None, min(at, tokens)))
    out.append(chunk({}, "length", tokens))
    out.append(_http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return out


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _serve(port: int, tokens: int, interval: int, gap_s: float) -> None:
    streams = [render_stream(tokens, interval, seed) for seed in range(64)]
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
            b"connection: keep-alive\r\n\r\n")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        try:
            while True:
                headers = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in headers.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                writer.write(head)
                for piece in streams[served % len(streams)]:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(gap_s)
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


async def _read_all(url: str, streams: int, requests: int, tokens: int, detect_every: int) -> int:
    from gen_pipeline.config.dataset import GenerationConfig
    from gen_pipeline.http import open_http
    from gen_pipeline.quality import RepetitionDetector
    from gen_pipeline.run.wire import TurnStream

    body = orjson.dumps({"model": "replay", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    seen = 0

    async def one_stream() -> None:
        nonlocal seen
        for _ in range(requests):
            reading = TurnStream(RepetitionDetector(), "replay", tokens, detect_every=detect_every)
            async with http.open_stream(f"{url}/v1/chat/completions", body, bounded=True) as answer:
                async for data in answer.events():  # as run/chat.py _read
                    time.monotonic()  # fleet.answered's clock read
                    verdict = reading.feed_data(data)
                    if reading.done or verdict is not None:
                        break
            reading.detect_end()
            seen += reading.result().completion_tokens

    async with open_http(GenerationConfig(), streams) as http, anyio.create_task_group() as tg:
        for _ in range(streams):
            tg.start_soon(one_stream)
    return seen


def measure(interval: int, *, streams: int = 32, requests: int = 10, tokens: int = 300,
            token_gap_s: float = 0.0025, detect_every: int | None = None) -> dict[str, Any]:
    """Client CPU per 1K tokens over `streams` × `requests` answers of `tokens` tokens, a chunk of
    `interval` tokens every `interval` × `token_gap_s` per stream; the detector reads every `detect_every`
    tokens (None: the product's DETECT_EVERY_TOKENS)."""
    from gen_pipeline.run.wire import DETECT_EVERY_TOKENS

    gap_s = interval * token_gap_s
    from sglang_sim.testing import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "bench.stream_replay", "--serve", str(port), "--tokens",
                               str(tokens), "--interval", str(interval), "--gap-s", str(gap_s)],
                              cwd=REPO, stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        cpu, wall = time.process_time(), time.monotonic()
        seen = anyio.run(_read_all, f"http://127.0.0.1:{port}", streams, requests, tokens,
                         detect_every or DETECT_EVERY_TOKENS)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    finally:
        server.terminate()
        server.wait()
    return {"interval": interval, "detect_every": detect_every or DETECT_EVERY_TOKENS, "tokens": seen,
            "cpu_s": round(cpu, 3), "wall_s": round(wall, 2),
            "ms_per_1k_tokens": round(1e6 * cpu / seen, 2)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.stream_replay", description=__doc__.splitlines()[0])
    ap.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--interval", type=int, nargs="+", default=[8, 1])
    ap.add_argument("--gap-s", type=float, default=0.0025, help="per token")
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--detect-every", type=int, nargs="+", default=[0], help="tokens (0: the product's)")
    args = ap.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args.serve, args.tokens, args.interval[0], args.gap_s))
        return
    for rep in range(args.repeats):
        for interval in args.interval:
            for every in args.detect_every:  # alternating: the variants see the same load
                print(rep, measure(interval, requests=args.requests, tokens=args.tokens, token_gap_s=args.gap_s,
                                   detect_every=every or None), flush=True)


if __name__ == "__main__":
    main()
