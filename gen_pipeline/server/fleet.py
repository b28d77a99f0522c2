"""Fleet (pure policy): which of several directly attached servers gets the next request, and which are out.
Affinity (the default routing): a sample's later turn goes back to the server holding its previous turn's prefix
while that one is within AFFINITY_MARGIN of the best by free KV; otherwise it goes by free KV and the sample follows."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from gen_pipeline.config.run import ROUTINGS
from gen_pipeline.records import LoadSnapshot

DEFAULT_TOKENS_PER_REQUEST = 1024.0  # until the caller knows better (the controller's estimate)
# How far below the best server's free KV (as a share of the previous server's capacity) a later turn
# still goes back to its previous server. Only 0.25 was measured (docs/measurements.md, "affinity"): most
# of the turns it moved had their prefix evicted while they waited, which a wider margin would not bring back.
AFFINITY_MARGIN = 0.25
AFFINITY_SLACK_REQUESTS = 2  # without token figures: in flight at most (1 + margin) x the least + this


@dataclass
class _Server:
    url: str
    up: bool = True
    total_tokens: int | None = None  # KV capacity (from the capacity probe)
    used_tokens: int | None = None  # at the last poll
    in_flight: int = 0  # ours, now
    in_flight_at_poll: int = 0
    failures: int = 0  # consecutive connection errors
    # consecutive failed health checks: only progress or /health 200 restarts it, not an answer's headers (a
    # stuck scheduler's HTTP side still sends those, so counted together they never reached fail_after)
    health_failures: int = 0
    backoff_s: float = 0.0
    next_probe_s: float = 0.0
    last_answer_s: float | None = None  # its last progress: stream bytes, an answer, /health 200


class Fleet:
    """The servers of a direct (no router) attach; `pick` never returns None (all down: the next to probe)."""

    def __init__(self, urls: list[str], *, fail_after: int = 3, probe_initial_s: float = 1.0,
                 probe_max_s: float = 30.0, tokens_per_request: float = DEFAULT_TOKENS_PER_REQUEST,
                 routing: str = "affinity", affinity_margin: float = AFFINITY_MARGIN):
        if not urls:
            raise ValueError("a fleet needs at least one URL")
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)} (got {routing!r})")
        self._servers = {u: _Server(u) for u in urls}
        self.routing, self.affinity_margin = routing, affinity_margin
        self._last: dict[Hashable, str] = {}  # sample in flight → the server that ran its latest turn
        self.stayed = 0  # later turns sent back to their previous server
        self.moved = 0  # later turns sent elsewhere (their server was down or overloaded)
        self.fail_after = fail_after
        self.probe_initial_s, self.probe_max_s = probe_initial_s, probe_max_s
        self.tokens_per_request = tokens_per_request
        self.version = 0  # bumped whenever a server goes out or comes back (capacity must be re-summed)
        self.taken_out = 0  # how many times a server was taken out (for the summary)
        # called with a URL taken out as hung: the clients cancel their requests to it and re-send them (run/chat.py)
        self.on_taken_out: list[Callable[[str], None]] = []
        self.why: dict[str, str] = {}  # url → why it last failed to answer (a log line's words)
        self.refused: dict[str, str] = {}  # url → the other model it serves now: out for good (`refuse`)

    @property
    def urls(self) -> list[str]:
        return list(self._servers)

    @property
    def up_urls(self) -> list[str]:
        return [s.url for s in self._servers.values() if s.up]

    @property
    def down_urls(self) -> list[str]:
        """The servers out that may come back (not refused)."""
        return [s.url for s in self._servers.values() if not s.up and s.url not in self.refused]

    def is_up(self, url: str) -> bool:
        return self._servers[url].up

    # ------------------------------------------------------------ the choice
    def pick(self, sample: Hashable | None = None) -> str:
        """`sample`'s previous server when affinity keeps it, else the up server with the most free KV (at the
        last poll, less what was sent since; all known), else the fewest in flight. Remembered until sample_ended."""
        up = [s for s in self._servers.values() if s.up]
        if not up:  # none up: the one probed back first (its request waits for it; affinity follows it)
            url = min(self._servers.values(), key=lambda s: (s.url in self.refused, s.next_probe_s)).url
            if sample is not None and self.routing == "affinity":
                self._last[sample] = url
            return url
        known = all(s.total_tokens is not None and s.used_tokens is not None for s in up)
        # max/min keep the first of equals: list order breaks ties
        best = max(up, key=self._free_tokens) if known else min(up, key=lambda s: s.in_flight)
        if sample is None or self.routing != "affinity":
            return best.url
        chosen, previous = best, self._last.get(sample)
        if previous is not None:
            s = self._servers[previous]
            if s.up and (s is best or self._near_best(s, best, known)):
                chosen = s
            self.stayed += chosen is s
            self.moved += chosen is not s
        self._last[sample] = chosen.url
        return chosen.url

    def _near_best(self, s: _Server, best: _Server, known: bool) -> bool:
        """Whether `s` is loaded little enough more than `best` for a later turn to stay on it."""
        if known:
            assert s.total_tokens is not None
            return self._free_tokens(s) >= self._free_tokens(best) - self.affinity_margin * s.total_tokens
        return s.in_flight <= (1 + self.affinity_margin) * best.in_flight + AFFINITY_SLACK_REQUESTS

    def sample_ended(self, sample: Hashable) -> None:
        """The sample is written, failed or cancelled: forget its server."""
        self._last.pop(sample, None)

    @property
    def samples_tracked(self) -> int:
        """Samples whose server is remembered (those in flight under affinity)."""
        return len(self._last)

    def free_tokens(self, url: str) -> float | None:
        s = self._servers[url]
        return None if s.total_tokens is None or s.used_tokens is None else self._free_tokens(s)

    def _free_tokens(self, s: _Server) -> float:
        assert s.total_tokens is not None and s.used_tokens is not None
        sent_since_poll = max(0, s.in_flight - s.in_flight_at_poll)
        return s.total_tokens - s.used_tokens - sent_since_poll * self.tokens_per_request

    def started(self, url: str) -> None:
        self._servers[url].in_flight += 1

    def finished(self, url: str) -> None:
        s = self._servers[url]
        s.in_flight = max(0, s.in_flight - 1)

    # ------------------------------------------------------------ what the poll and the probes say
    def set_capacity(self, url: str, total_tokens: int | None) -> None:
        self._servers[url].total_tokens = total_tokens or None

    def update(self, loads: dict[str, LoadSnapshot | None], now_s: float | None = None) -> None:
        """One load poll: KV in use per server (None: that server did not answer; its figure is dropped).
        Not progress (`answered`): SGLang's HTTP process answers /v1/loads from a snapshot, scheduler or not."""
        for url, snap in loads.items():
            if (s := self._servers.get(url)) is not None:
                s.used_tokens = snap.used_tokens if snap is not None else None
                s.in_flight_at_poll = s.in_flight

    def in_flight(self, url: str) -> int:
        return self._servers[url].in_flight

    def answered(self, url: str, now_s: float) -> None:
        """It made progress (a request's stream bytes or answer, /health 200): it is not hung, and its count of
        failed health checks restarts."""
        s = self._servers[url]
        s.last_answer_s = now_s
        s.health_failures = 0

    def silent_s(self, url: str, now_s: float) -> float:
        """Seconds since its last progress (0 before its first was awaited)."""
        last = self._servers[url].last_answer_s
        return 0.0 if last is None else max(0.0, now_s - last)

    def succeeded(self, url: str, now_s: float | None = None) -> None:
        """A request or health check answered (`now_s`: with progress then, see answered): the connection-
        failure count restarts, and a down server is back, unless failed health checks took it out and no
        progress (a /health 200 is one) has come since: a stuck scheduler still sends headers."""
        s = self._servers[url]
        s.failures = 0
        if now_s is not None:
            self.answered(url, now_s)
        if not s.up and s.health_failures < self.fail_after:
            self.mark_up(url)

    def failed(self, url: str, now_s: float, *, health: bool = False) -> bool:
        """A connection error, or with `health` a failed health check; True when this one took the server
        out (fail_after of either kind in a row)."""
        s = self._servers[url]
        s.health_failures += health
        s.failures += not health
        if s.up and max(s.failures, s.health_failures) >= self.fail_after:
            self.mark_down(url, now_s)
            return True
        return False

    def mark_down(self, url: str, now_s: float, *, cancel: bool = False) -> None:
        """Take `url` out; `cancel`: its requests in flight will never be answered (hung), the clients
        cancel and re-send them (on_taken_out). Without it they end by themselves: a dead server's
        connections are cut, a refused one had none."""
        s = self._servers[url]
        if s.up:
            s.up, s.used_tokens, s.backoff_s = False, None, self.probe_initial_s
            s.next_probe_s = now_s + s.backoff_s
            self.version += 1
            self.taken_out += 1
            if cancel:
                self.cancel_sent(url)

    def cancel_sent(self, url: str) -> None:
        """The clients cancel their requests in flight to `url` and send them again (on_taken_out), whether
        or not it is up."""
        for cancel_sent in list(self.on_taken_out):
            cancel_sent(url)

    def refuse(self, url: str, served: str, model: str, now_s: float) -> str | None:
        """`url` serves `served`, not the run's `model`: out for good (never probed or marked back up), its
        requests in flight cancelled and re-sent. The log line to say so the first time, else None."""
        if url in self.refused:
            return None
        self.refused[url] = served
        self.mark_down(url, now_s, cancel=True)
        return (f"stopped sending to {url}: it now serves {served!r}, not {model!r} (restarted with another "
                f"model?); {len(self.up_urls)} of {len(self._servers)} servers left")

    def refusal(self, model: str) -> str | None:
        """The run's error once every server serves another model than `model`, else None."""
        if len(self.refused) < len(self._servers):
            return None
        said = ", ".join(f"{url} now serves {served!r}" for url, served in self.refused.items())
        return (f"No server serves {model!r} any more ({said}): restarted with another model? Nothing written is "
                f"lost and nothing the other model answered was written: serve {model!r} there again and run "
                "the same command to resume.")

    def mark_up(self, url: str) -> None:
        s = self._servers[url]
        if not s.up and url not in self.refused:
            s.up, s.failures, s.health_failures, s.backoff_s, s.last_answer_s = True, 0, 0, 0.0, None
            self.version += 1

    def due_probes(self, now_s: float) -> list[str]:
        """Down servers whose backoff has run out: probe these now."""
        return [url for url in self.down_urls if now_s >= self._servers[url].next_probe_s]

    def probe_failed(self, url: str, now_s: float) -> None:
        """A down server still does not answer: wait twice as long (up to probe_max_s) before the next probe."""
        s = self._servers[url]
        s.backoff_s = min(self.probe_max_s, max(self.probe_initial_s, 2 * s.backoff_s))
        s.next_probe_s = now_s + s.backoff_s
