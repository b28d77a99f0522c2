"""Telling a hung server from a busy one: pure policy (no I/O, no async library); fleet_watch.py sends
the probes and acts on the verdicts.

What SGLang answers, and when (read in 0.5.17: srt/entrypoints/http_server.py, tokenizer_manager.py):
- GET /health (= /health_generate) is 503 while starting or shutting down; otherwise it submits a
  one-token request and answers 200 once the scheduler has emitted anything, 503 after
  SGLANG_HEALTH_CHECK_TIMEOUT (20 s) without. So 200 means the scheduler made progress; a live server
  inside a long prefill leaves it unanswered for seconds.
- GET /v1/models and /v1/loads, and a stream's headers, come from the HTTP process alone: they say the
  process answers, not that the scheduler works. A stopped process (SIGSTOP, a frozen host) answers nothing.

Progress is a stream's events, a whole answer, /health 200 (Fleet.answered); liveness is GET /v1/models.
A server with requests in flight is hung, taken out and its requests re-sent, when:
- stopped or frozen: no progress for `hang_after_s` and a /v1/models probe sent after the silence
  began got no answer within `probe_timeout_s` (about 5 s at the defaults);
- stuck scheduler (an NCCL hang): /health not 200 with no progress for `hang_after_s` (20-25 s: until
  SGLang says 503 it looks like a long prefill).
Busy or slow (progress, or /v1/models answers) is never taken out. A server taken out otherwise keeps its
requests in flight; those with no progress for `hang_after_s` are re-sent too (a partition).
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
