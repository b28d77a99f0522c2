"""Reading answers, in this process or in reader processes. A streamed token costs Python CPU (HTTP events, JSON,
the loop detector: docs/measurements.md, "Client CPU"); past about a core the main process would bind the run.
Reader processes take that part: each owns an event loop, an HTTP pool and, per request, the read and the loop
detector. The main process keeps everything else (the fleet and its health, retries, the controller, the store):
one request goes out as a frame, one TurnResult or error comes back, with progress (for hang detection) between.

`fetch_turn` is the read itself; ChatClient calls it directly, or `Readers.fetch` sends it to a reader process
(reader_process.py), which calls it there. Either raises the same exceptions: chat.py maps them in one place.
A reader that dies takes nothing with it: its requests are sent again (no attempt spent) and it is replaced;
one dying again and again ends the run with a message. Readers run in their own session and ignore SIGINT/SIGTERM/
SIGHUP from their first line (the main process drains) and leave when their stdin closes, which a dead main process
does too.

Frames: 4-byte big-endian length, then orjson. Main → reader: {"op": "open", "id", "url", "body", "spec"},
{"op": "cancel", "id"}. Reader → main: {"ev": "head", "id"}, {"ev": "progress", "cpu_s", "reqs": [[id, tokens,
deltas], ...]} (every PROGRESS_EVERY_S while any answered), {"ev": "done", "id", "turn"}, {"ev": "error", "id",
"error"}."""

from __future__ import annotations

import itertools
import logging
import os
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, fields, replace
from typing import Any

import anyio
import orjson
from anyio.abc import Process, TaskGroup
from anyio.streams.buffered import BufferedByteReceiveStream

from gen_pipeline.errors import GenPipelineError, RequestError
from gen_pipeline.http import (
    BadBody,
    BadStatus,
    CannotConnect,
    ConnectionLost,
    Http,
    HttpError,
    NoAnswer,
    Reply,
    Stream,
)
from gen_pipeline.quality import LoopVerdict, RepetitionDetector
from gen_pipeline.quality.repetition import LoopReason
from gen_pipeline.run import wire
from gen_pipeline.run.answer import detect_loop
from gen_pipeline.run.wire import OtherModel, Retryable, TurnResult, TurnStream

log = logging.getLogger(__name__)
JOURNAL = logging.getLogger("gen_pipeline.journal.readers")  # run.log only (cli/logs.py)

PROGRESS_EVERY_S = 0.1  # a reader's progress frame (hang detection probes after a fifth of --hang-timeout-s)
AUTO_EVERY_S = 2.0  # --readers auto: the main process's CPU is read this often ...
AUTO_ADD_AT = 0.5  # ... and a reader added while it (or, with readers, their mean) used this share of a core
DEATHS_ALLOWED = 3  # readers that may die within DEATHS_WINDOW_S before the run ends
DEATHS_WINDOW_S = 60.0
STOP_WAIT_S = 2.0  # after its stdin closed, a reader gets this long to leave before it is killed
LENGTH = struct.Struct(">I")
_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)  # writing to a reader that left


@dataclass(frozen=True, slots=True)
class ReadSpec:
    """How a request's answer is read: the loop detector on, what the chunks must name, the cap, token ids."""

    detector: bool
    model: str
    max_tokens: int | None
    token_ids: bool

    def stream(self) -> TurnStream:
        return TurnStream(RepetitionDetector() if self.detector else None, self.model, self.max_tokens)


class Seen:
    """What a reader process said of an answer so far: chat.py's messages use it as they use a TurnStream's."""

    __slots__ = ("completion_tokens", "deltas")

    def __init__(self) -> None:
        self.completion_tokens = self.deltas = 0

    def seen(self) -> str:
        return wire.seen_text(self.deltas, self.completion_tokens)


class ReaderLost(Exception):
    """The reader process that held the request died: send it again (not an attempt: the server is fine)."""


async def fetch_turn(http: Http, url: str, body: bytes, reading: TurnStream, *, token_ids: bool,
                     on_head: Callable[[], None], answered: Callable[[], None]) -> TurnResult:
    """POST `body` and read the answer as it arrives, the detector fed (or a whole answer, the detector reading
    it). `on_head`: it answered with a 200; `answered`: progress (each event, the whole body)."""
    async with http.open_stream(url, body, bounded=True) as answer:
        # headers are no progress: SGLang sends them before any token, a stuck scheduler too (server/hang.py)
        on_head()
        return await _read(answer, reading, token_ids=token_ids, answered=answered)


async def _read(answer: Stream, reading: TurnStream, *, token_ids: bool, answered: Callable[[], None]) -> TurnResult:
    detector = reading.detector
    if not answer.is_event_stream:
        body = await answer.read()
        answered()
        turn = wire.parse_response(body, token_ids=token_ids, model=reading.model, max_tokens=reading.max_tokens,
                                   content_type=answer.content_type)
        verdict = detect_loop(turn, detector) if detector is not None else None
        return replace(turn, loop=verdict) if verdict is not None else turn
    verdict = None
    async for data in answer.events():
        answered()  # progress: not hung (server/hang.py)
        verdict = reading.feed_data(data)
        if reading.done:
            await answer.drain()  # the connection is kept for the next request
            break
        if verdict is not None:
            break  # leaving the block closes the stream: the server aborts the request
    aborted = verdict is not None
    if not aborted and reading.finish_reason is not None:
        verdict = reading.detect_end()  # the deltas not read yet, the held-back last word
    return reading.result(loop=verdict, aborted=aborted)


# ---------------------------------------------------------------------------------------------- the frames' codec

def frame(message: dict[str, Any]) -> bytes:
    data = orjson.dumps(message)
    return LENGTH.pack(len(data)) + data


def turn_to_wire(turn: TurnResult) -> dict[str, Any]:
    d = {f.name: getattr(turn, f.name) for f in fields(TurnResult)}
    if turn.loop is not None:
        d["loop"] = {f.name: getattr(turn.loop, f.name) for f in fields(LoopVerdict)}
    return d


def turn_from_wire(d: dict[str, Any]) -> TurnResult:
    loop = d.get("loop")
    if loop is not None:
        d = {**d, "loop": LoopVerdict(**{**loop, "reason": LoopReason(loop["reason"])})}
    return TurnResult(**{**d, "spec": tuple(d["spec"])})


_HTTP_KINDS: dict[str, type[HttpError]] = {c.kind: c for c in (HttpError, CannotConnect, NoAnswer, ConnectionLost,
                                                                BadBody)}


def error_to_wire(e: BaseException) -> dict[str, Any]:
    """An exception a read raises, as a frame's "error" (anything unexpected: "crash", with its traceback)."""
    if isinstance(e, Retryable):
        return {"type": "retryable", "reason": e.reason, "detail": str(e)}
    if isinstance(e, RequestError):
        return {"type": "request", "message": str(e), "reason": e.reason, "retryable": e.retryable}
    if isinstance(e, OtherModel):
        return {"type": "other_model", "served": e.served}
    if isinstance(e, BadStatus):
        r = e.reply
        return {"type": "status", "url": r.url, "status": r.status, "content_type": r.content_type,
                "body": r.body.decode("latin-1"), "reason": r.reason}
    if isinstance(e, HttpError) and type(e) in _HTTP_KINDS.values():
        return {"type": "http", "kind": e.kind, "url": e.url, "message": str(e), "why": e.why}
    return {"type": "crash", "text": "".join(traceback.format_exception(e)).rstrip()}


def error_from_wire(d: dict[str, Any], pid: int) -> Exception:
    kind = d["type"]
    if kind == "retryable":
        return Retryable(d["reason"], d["detail"])
    if kind == "request":
        return RequestError(d["message"], reason=d["reason"], retryable=d["retryable"])
    if kind == "other_model":
        return OtherModel(d["served"])
    if kind == "status":
        reply = Reply(d["url"], d["status"], d["content_type"], d["body"].encode("latin-1"), d["reason"])
        return BadStatus(d["url"], reply)
    if kind == "http":
        return _HTTP_KINDS[d["kind"]](d["url"], d["message"], d["why"])
    return RuntimeError(f"reader process {pid} failed reading an answer:\n{d['text']}")


# ------------------------------------------------------------------------------------------ the main process's side

class _Waiter:
    __slots__ = ("answered", "done", "on_head", "reply", "seen")

    def __init__(self, seen: Seen, on_head: Callable[[], None], answered: Callable[[], None]) -> None:
        self.seen, self.on_head, self.answered = seen, on_head, answered
        self.done = anyio.Event()
        self.reply: dict[str, Any] | None = None  # the "done" or "error" frame; None: the reader died


class _Reader:
    """One reader process, its requests in flight and its CPU as it last said."""

    def __init__(self, process: Process) -> None:
        self.process, self.pid = process, process.pid
        self.pending: dict[int, _Waiter] = {}
        self.lock = anyio.Lock()  # one frame written at a time
        self.cpu_s = 0.0
        self.closing = False
        self.left = anyio.Event()  # its stdout ended
        self.reaped = False  # its exit status read and its pipes closed

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        async with self.lock:
            await self.process.stdin.send(frame(message))


class Readers:
    """The reader processes of a run, made by `open_readers`: a fixed count, or chosen from the main process's
    CPU (none until it used AUTO_ADD_AT of a core over AUTO_EVERY_S, then one more each time they did)."""

    def __init__(self, *, connect_timeout_s: float, max_connections: int, cap: int | None = None) -> None:
        self.cap = cap if cap is not None else auto_cap()
        self._argv = reader_argv(connect_timeout_s, max_connections)
        self.live: list[_Reader] = []  # those requests may go to
        self._started: list[_Reader] = []  # every one, until reaped
        self._ids = itertools.count(1)
        self._deaths: list[float] = []
        self._tg: TaskGroup | None = None
        self.started = 0  # processes started (replacements included)
        self.cpu_s = 0.0  # the CPU of the readers that left or died (as each last said)
        self.closed = False

    @property
    def active(self) -> bool:
        return bool(self.live)

    async def fetch(self, url: str, body: bytes, spec: ReadSpec, seen: Seen, *, on_head: Callable[[], None],
                    answered: Callable[[], None]) -> TurnResult:
        """As fetch_turn, in the reader with the fewest requests; raises ReaderLost if that reader dies."""
        reader = min(self.live, key=lambda r: len(r.pending))
        rid = next(self._ids)
        waiter = reader.pending[rid] = _Waiter(seen, on_head, answered)
        try:
            await reader.send({"op": "open", "id": rid, "url": url, "body": body.decode(),
                               "spec": [spec.detector, spec.model, spec.max_tokens, spec.token_ids]})
            await waiter.done.wait()
        except anyio.get_cancelled_exc_class():
            if not waiter.done.is_set() and not reader.closing:  # a timeout, a take-out, a hard stop
                with anyio.CancelScope(shield=True), anyio.move_on_after(1), suppress(*_GONE):
                    await reader.send({"op": "cancel", "id": rid})  # it closes the stream: the server aborts
            raise
        except _GONE:
            if reader in self.live:  # not picked again before its listener sees it end
                self.live.remove(reader)
            raise ReaderLost(f"reader process {reader.pid} is gone") from None
        finally:
            reader.pending.pop(rid, None)
        reply = waiter.reply
        if reply is None:
            raise ReaderLost(f"reader process {reader.pid} died")
        if reply["ev"] == "done":
            return turn_from_wire(reply["turn"])
        raise error_from_wire(reply["error"], reader.pid)

    async def _start(self, why: str) -> None:
        assert self._tg is not None
        if self.closed:
            return
        # its own session: a terminal's Ctrl-C (sent to the foreground group) is the main process's to handle
        process = await anyio.open_process(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=None, start_new_session=True)
        reader = _Reader(process)
        self.live.append(reader)
        self._started.append(reader)
        self.started += 1
        JOURNAL.info("reader process %d started (%d running): %s", reader.pid, len(self.live), why)
        self._tg.start_soon(self._listen, reader)

    async def _listen(self, reader: _Reader) -> None:
        """The reader's frames, until its stdout ends (it left or died)."""
        assert reader.process.stdout is not None
        stream = BufferedByteReceiveStream(reader.process.stdout)
        try:
            while True:
                n = LENGTH.unpack(await stream.receive_exactly(LENGTH.size))[0]
                self._on_frame(reader, orjson.loads(await stream.receive_exactly(n)))
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        self.cpu_s += reader.cpu_s
        reader.left.set()
        await self._lost(reader)

    def _on_frame(self, reader: _Reader, m: dict[str, Any]) -> None:
        ev = m["ev"]
        if ev == "progress":
            reader.cpu_s = m["cpu_s"]
            for rid, tokens, deltas in m["reqs"]:
                if (w := reader.pending.get(rid)) is not None:
                    w.seen.completion_tokens, w.seen.deltas = tokens, deltas
                    w.answered()
            return
        w = reader.pending.get(m["id"])
        if w is None:
            return  # cancelled meanwhile
        if ev == "head":
            w.on_head()
        else:
            if ev == "done":
                w.answered()
            w.reply = m
            w.done.set()

    async def _lost(self, reader: _Reader) -> None:
        """Its stdout ended: it left (closing) or died. A death's requests go again; the reader is replaced."""
        if reader in self.live:
            self.live.remove(reader)
        lost = len(reader.pending)
        for w in reader.pending.values():
            w.done.set()  # reply None: ReaderLost
        if reader.closing or self.closed:
            return
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(STOP_WAIT_S):  # its stdout ended: it is leaving (else it is killed)
                await reader.process.wait()
            if reader.process.returncode is None:
                reader.process.kill()
            code = await reader.process.wait()
            await reader.process.aclose()  # its pipes' transports closed too
            reader.reaped = True
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < DEATHS_WINDOW_S] + [now]
        how = f"exit code {code}" if code >= 0 else f"signal {-code}"
        if len(self._deaths) > DEATHS_ALLOWED:
            raise ReadersFailed(f"reader processes died {len(self._deaths)} times within {DEATHS_WINDOW_S:g} s "
                                f"(the latest, pid {reader.pid}: {how}); its error is above. Run with --readers 0 "
                                "to read the answers in the main process.")
        log.warning("reader process %d died (%s); %d of its requests are sent again, and a new reader takes its "
                    "place", reader.pid, how, lost)
        await self._start(f"replacing reader {reader.pid}")

    async def _autoscale(self) -> None:
        """--readers auto: one reader more each time the main process (then the readers, on average) used
        AUTO_ADD_AT of a core over AUTO_EVERY_S, up to `cap`."""
        cpu, wall = time.process_time(), time.monotonic()
        readers_cpu = {r.pid: r.cpu_s for r in self.live}
        while True:
            await anyio.sleep(AUTO_EVERY_S)
            now_cpu, now = time.process_time(), time.monotonic()
            span = max(now - wall, 1e-3)
            main_share = (now_cpu - cpu) / span
            shares = [(r.cpu_s - readers_cpu[r.pid]) / span for r in self.live if r.pid in readers_cpu]
            cpu, wall = now_cpu, now
            readers_cpu = {r.pid: r.cpu_s for r in self.live}
            why = more_readers(main_share, shares, len(self.live), self.cap)
            if why:
                await self._start(why)

    async def aclose(self) -> None:
        """Close every reader's stdin (they leave); kill one still there after STOP_WAIT_S."""
        self.live = []
        readers = [r for r in self._started if not r.reaped]
        for r in readers:
            r.closing = True
            if r.process.stdin is not None:
                with anyio.CancelScope(shield=True):
                    with suppress(OSError, anyio.BrokenResourceError):
                        await r.process.stdin.aclose()
        for r in readers:
            with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_WAIT_S) as waited:
                await r.process.wait()
                await r.left.wait()  # its listener read the last frame and the end of its stdout
            with anyio.CancelScope(shield=True):
                if waited.cancelled_caught:
                    r.process.kill()
                await r.process.aclose()  # waits for it; its pipes' transports closed too
                r.reaped = True


class ReadersFailed(GenPipelineError):
    """Reader processes kept dying."""


# A reader ignores SIGINT/SIGTERM/SIGHUP before it imports anything: a signal while it starts (a second of
# imports) would otherwise end it with a KeyboardInterrupt traceback on the user's terminal.
_BOOT = ("import signal, sys, runpy\n"
         "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): signal.signal(s, signal.SIG_IGN)\n"
         "runpy.run_module('gen_pipeline.run.reader_process', run_name='__main__', alter_sys=True)")


def reader_argv(connect_timeout_s: float, max_connections: int) -> list[str]:
    """The command of a reader process (reader_process.py)."""
    settings = {"connect_timeout_s": connect_timeout_s, "max_connections": max_connections}
    return [sys.executable, "-c", _BOOT, orjson.dumps(settings).decode()]


def more_readers(main_share: float, reader_shares: list[float], running: int, cap: int) -> str:
    """Why to start one reader more (--readers auto), or "" : the CPU shares of a core over the last span."""
    if running >= cap:
        return ""
    if running == 0:
        if main_share >= AUTO_ADD_AT:
            return f"the main process used {main_share:.2f} of a core over {AUTO_EVERY_S:g} s"
        return ""
    n = len(reader_shares)
    if n and (mean := sum(reader_shares) / n) >= AUTO_ADD_AT:
        return f"the {n} reader{'s' if n > 1 else ''} used {mean:.2f} of a core each over {AUTO_EVERY_S:g} s"
    return ""


def auto_cap() -> int:
    """At most half the cores this process may run on (SGLang's own processes need the rest), 1 to 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 2
    return max(1, min(8, cores // 2))


@asynccontextmanager
async def open_readers(count: int | None, *, connect_timeout_s: float,
                       max_connections: int) -> AsyncIterator[Readers]:
    """Readers for a run: `count` started now (0: none, answers read in this process), None: auto."""
    readers = Readers(connect_timeout_s=connect_timeout_s, max_connections=max_connections)
    cpu_at_start = time.process_time()
    async with anyio.create_task_group() as tg:
        readers._tg = tg
        try:
            for i in range(count or 0):
                await readers._start(f"--readers {count}" if i == 0 else f"--readers {count} ({i + 1})")
            if count is None:
                tg.start_soon(readers._autoscale)
            yield readers
        finally:
            readers.closed = True  # no reader started from now on (the autoscaler, a replacement)
            await readers.aclose()  # their last frames (CPU) read, then their stdout ends
            tg.cancel_scope.cancel()
            if readers.started:
                JOURNAL.info("reader processes: %d started; CPU while reading: main process %.2f s, readers %.2f s",
                             readers.started, time.process_time() - cpu_at_start, readers.cpu_s)
