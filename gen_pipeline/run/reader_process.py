"""A reader process: readers.reader_argv runs this module as __main__, its argument
'{"connect_timeout_s": .., "max_connections": ..}'. It reads "open"/"cancel" frames on stdin, reads each answer with
readers.fetch_turn and writes its frames on stdout; it leaves when stdin closes (its requests' streams closed: the
server aborts them)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from typing import Any

import anyio
import orjson

from gen_pipeline.config.dataset import GenerationConfig
from gen_pipeline.http import open_http
from gen_pipeline.run.readers import LENGTH, PROGRESS_EVERY_S, ReadSpec, error_to_wire, fetch_turn, frame, turn_to_wire
from gen_pipeline.run.wire import TurnStream


class _Server:
    def __init__(self, out: asyncio.StreamWriter) -> None:
        self.out = out
        self.scopes: dict[int, anyio.CancelScope] = {}
        self.reading: dict[int, TurnStream] = {}
        self.progressed: set[int] = set()

    def write(self, message: dict[str, Any]) -> None:
        self.out.write(frame(message))

    async def serve(self, http: Any, rid: int, url: str, body: bytes, spec: ReadSpec) -> None:
        reading = self.reading[rid] = spec.stream()
        with anyio.CancelScope() as scope:
            self.scopes[rid] = scope
            try:
                turn = await fetch_turn(http, url, body, reading, token_ids=spec.token_ids,
                                        on_head=lambda: self.write({"ev": "head", "id": rid}),
                                        answered=lambda: self.progressed.add(rid))
                self.write({"ev": "done", "id": rid, "turn": turn_to_wire(turn)})
            except Exception as e:
                self.write({"ev": "error", "id": rid, "error": error_to_wire(e)})
            finally:
                self.scopes.pop(rid, None)
                self.reading.pop(rid, None)
                self.progressed.discard(rid)

    async def report(self) -> None:
        """Every PROGRESS_EVERY_S: the requests that made progress (tokens, deltas so far) and this CPU."""
        while True:
            await anyio.sleep(PROGRESS_EVERY_S)
            reqs = [[rid, r.completion_tokens, r.deltas] for rid in self.progressed
                    if (r := self.reading.get(rid)) is not None]
            self.progressed.clear()
            self.write({"ev": "progress", "cpu_s": time.process_time(), "reqs": reqs})
            await self.out.drain()


async def _main(settings: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader(limit=2**26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout.buffer)
    out = asyncio.StreamWriter(transport, protocol, None, loop)
    server = _Server(out)
    generation = GenerationConfig(connect_timeout_s=settings["connect_timeout_s"])
    async with open_http(generation, settings["max_connections"]) as http, anyio.create_task_group() as tg:
        tg.start_soon(server.report)
        while True:
            try:
                n = LENGTH.unpack(await stdin.readexactly(LENGTH.size))[0]
                m = orjson.loads(await stdin.readexactly(n))
            except asyncio.IncompleteReadError:
                break  # stdin closed: the main process is done (or gone)
            if m["op"] == "open":
                detector, model, max_tokens, token_ids = m["spec"]
                tg.start_soon(server.serve, http, m["id"], m["url"], m["body"].encode(),
                              ReadSpec(detector, model, max_tokens, token_ids))
            elif (scope := server.scopes.get(m["id"])) is not None:  # "cancel"
                scope.cancel()
        tg.cancel_scope.cancel()
    server.write({"ev": "progress", "cpu_s": time.process_time(), "reqs": []})  # the last word: its CPU
    with contextlib.suppress(OSError):
        await out.drain()


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # readers.reader_argv did first; run directly too
        signal.signal(sig, signal.SIG_IGN)  # the main process drains, then closes our stdin
    anyio.run(_main, orjson.loads(sys.argv[1]))


if __name__ == "__main__":
    main()
