"""Telling a hung server from a busy one (pure; fleet_watch.py sends the probes). SGLang 0.5.17 (http_server.py)
answers /health 200 only once the scheduler emitted a token; /v1/models and a stream's headers come from the HTTP
process alone. With requests in flight and no progress for `hang_after_s`, a server is hung when a /v1/models probe
sent in that silence went unanswered (stopped or frozen) or /health is not 200 (a stuck scheduler)."""

from __future__ import annotations

from gen_pipeline.config.run import RunFlags

HANG_AFTER_S = RunFlags.hang_timeout_s  # the default --hang-timeout-s (config/run.py)
PROBE_TIMEOUT_S = 3.0  # a GET /v1/models gets this long at most (less when hang_after_s is short)
PROBE_EVERY_S = 1.0  # while a server stays silent and answers its probes, one probe a second
ALIVE_PATH = "/v1/models"


class HangWatch:
    """Liveness probes of silent servers and the frozen-server verdict, per URL."""

    def __init__(self, hang_after_s: float = HANG_AFTER_S) -> None:
        self.hang_after_s = hang_after_s
        self.probe_after_s = hang_after_s / 5  # a silence worth asking about
        self.probe_timeout_s = min(PROBE_TIMEOUT_S, 0.6 * hang_after_s)
        self._pending: set[str] = set()
        self._next_s: dict[str, float] = {}
        self._unanswered: dict[str, tuple[float, str]] = {}  # url → (sent_s, why) of its unanswered latest probe

    def due(self, url: str, now_s: float, silent_s: float, in_flight: int) -> bool:
        """Probe `url` now? (in flight, silent long enough, none pending, not within PROBE_EVERY_S of the last)."""
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
        self._unanswered[url] = (sent_s, why)

    def frozen(self, url: str, now_s: float, silent_s: float, in_flight: int) -> str | None:
        """Why `url` counts as stopped or frozen now (module doc), or None."""
        probe = self._unanswered.get(url)
        if in_flight == 0 or silent_s < self.hang_after_s or probe is None:
            return None
        sent_s, why = probe
        return None if sent_s < now_s - silent_s else why  # sent before the silence began: progress came since

    def forget(self, url: str) -> None:
        """`url` was taken out: its probes start over once it is back."""
        self._unanswered.pop(url, None)
        self._next_s.pop(url, None)
