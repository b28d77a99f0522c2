"""Telling a hung server from a busy one: pure policy (no I/O, no async library); fleet_watch.py sends
the probes and acts on the verdicts.

What SGLang answers, and when (read in SGLang 0.5.17, the pinned version: srt/entrypoints/http_server.py,
srt/managers/tokenizer_manager.py, srt/managers/load_snapshot.py):
- GET /health and GET /health_generate are one handler, in the HTTP (tokenizer manager) process. It
  answers 503 at once while the server starts or shuts down. Otherwise (SGLANG_ENABLE_HEALTH_ENDPOINT_
  GENERATION, on by default) it submits a one-token generate request, then checks once a second whether
  the tokenizer manager has received anything from the scheduler since the check began: 200 as soon as
  it has (a busy server: at the first check, ~1 s; a server inside one long forward pass with nothing
  else to emit, a long prefill: once that pass ends), 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) when
  it has not (a stuck scheduler: an NCCL hang). With that variable off, /health is 200 at once from the
  HTTP process alone. So /health 200 means the scheduler made progress; it is not an instant liveness
  check, and a live server in a long prefill leaves it unanswered for seconds.
- GET /v1/models is answered by the HTTP process alone (the served name and context length): within
  milliseconds however busy the scheduler is. A stopped process (SIGSTOP, a frozen host) answers nothing:
  the kernel still accepts the TCP connection, nothing reads it.
- GET /v1/loads reads a shared-memory snapshot the scheduler writes: the HTTP process answers it alone
  too, so a load answer says nothing about the scheduler's progress.

- A streamed request's headers come from the HTTP process before any token (a stuck scheduler still
  accepts requests and answers their headers); only its events carry the scheduler's work.

Progress (the scheduler works) is therefore: events of a request's stream, a whole answer, /health 200
(Fleet.answered; headers, refusals and load answers do not count). Liveness (the process answers) is
GET /v1/models. A server with requests in flight is hung, taken out and its requests re-sent to the
live servers:
- stopped or frozen: no progress for `hang_after_s` and a GET /v1/models sent after the silence began got
  no answer within `probe_timeout_s` (connect or read timeout). With the defaults (5 s; probes from 1 s of
  silence, 3 s each) about 5 s after the server stopped.
- stuck scheduler (the HTTP process answers): /health not 200 (SGLang's own 503 after 20 s, or no answer
  within the check timeout) with no progress for `hang_after_s` (fleet_watch.py `_check_one`): about
  20-25 s, since until SGLang says 503 it looks like a long prefill.
- busy or slow: progress, or /v1/models answers: never taken out for it, however long its silence.
A server taken out otherwise (failed checks, connection errors) keeps its requests in flight, since a
dead server's connections are cut; those that make no progress for `hang_after_s` are re-sent too
(a partition: new connections time out, the open ones stall).
"""

from __future__ import annotations

from dataclasses import dataclass

from gen_pipeline.config.run import RunFlags

HANG_AFTER_S = RunFlags.hang_timeout_s  # the default --hang-timeout-s (config/run.py)
PROBE_TIMEOUT_S = 3.0  # a GET /v1/models gets this long at most (less when hang_after_s is short)
PROBE_EVERY_S = 1.0  # while a server stays silent and answers its probes, one probe a second
ALIVE_PATH = "/v1/models"


@dataclass
class _Probe:
    sent_s: float
    why: str  # what the unanswered one got ("no answer within ...", "Connection refused")


class HangWatch:
    """Liveness probes of silent servers and the frozen-server verdict, per URL."""

    def __init__(self, hang_after_s: float = HANG_AFTER_S) -> None:
        self.hang_after_s = hang_after_s
        self.probe_after_s = hang_after_s / 5  # a silence worth asking about
        self.probe_timeout_s = min(PROBE_TIMEOUT_S, 0.6 * hang_after_s)
        self._pending: set[str] = set()
        self._next_s: dict[str, float] = {}
        self._unanswered: dict[str, _Probe] = {}  # the latest probe got no answer

    def due(self, url: str, now_s: float, silent_s: float, in_flight: int) -> bool:
        """Send `url` a liveness probe now? (requests in flight, silent long enough, none pending, and
        not within PROBE_EVERY_S of the last one)."""
        return (in_flight > 0 and silent_s >= self.probe_after_s and url not in self._pending
                and now_s >= self._next_s.get(url, 0.0))

    def sent(self, url: str, now_s: float) -> None:
        self._pending.add(url)
        self._next_s[url] = now_s + PROBE_EVERY_S

    def answered(self, url: str) -> None:
        """The probe got an answer (any status): the process is alive."""
        self._pending.discard(url)
        self._unanswered.pop(url, None)

    def unanswered(self, url: str, sent_s: float, why: str) -> None:
        self._pending.discard(url)
        self._unanswered[url] = _Probe(sent_s, why)

    def frozen(self, url: str, now_s: float, silent_s: float, in_flight: int) -> str | None:
        """Why `url` counts as stopped or frozen now (module doc), or None."""
        probe = self._unanswered.get(url)
        if in_flight == 0 or silent_s < self.hang_after_s or probe is None:
            return None
        if probe.sent_s < now_s - silent_s:  # sent before the silence began: progress came since
            return None
        return probe.why

    def forget(self, url: str) -> None:
        """`url` was taken out: its probes start over once it is back."""
        self._unanswered.pop(url, None)
        self._next_s.pop(url, None)
