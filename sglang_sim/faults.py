"""Fault injection for the simulator: settings, and seeded per-request decisions.

Pure: no I/O, no clock. Each generation request gets a sequence number (1, 2, ...) and
`decide(settings, seq)` picks at most one fault for it from a Random seeded by
(settings.seed, seq), so a given request sequence always sees the same faults. What the model
writes (loop, leak, marker-only) is decided by `decide_output(settings, request_seed)` instead,
from the request itself: the same prompt and sampling degenerate the same way in any arrival
order, and a retry with another `seed` sampling parameter draws anew.
Keys (CLI `--sim-<key>` with '-' for '_', and the JSON of GET/POST /sim/faults):

    crash_after              exit(1) right after the Nth completed request (0 = off)
    error_rate, error_status answer error_status (500 or 503) to that fraction of requests
    429_rate                 answer 429 Too Many Requests
    stall_rate, stall_s      hold the response stall_s real seconds before answering
    cut_rate                 send the headers and part of the body, then close the connection
    bad_json_rate            200 with a body that is not valid JSON
    wrong_content_type_rate  200 with an HTML page (text/html), as a misrouted proxy would
    no_usage_rate            a normal answer without `usage` (no usage chunk when streaming)
    empty_turn_rate          the model ends its turn at once: EOS first, empty content (a random-
                             weight model did this on real SGLang, issue 9)
    loop_rate                the turn falls into a loop (a word, a paragraph, a numbered list that
                             keeps counting, a thinking step re-derived) and runs to max_tokens
    leak_rate                reasoning leaks into `content` (chat only, with separate reasoning): cut
                             at max_tokens inside the thinking and returned as content with no
                             reasoning_content (a parser that missed the end marker), or the turn's
                             think markers left in content
    marker_only_rate         the answer is think markers only ("</think>", "<think>\n\n</think>", ...)
    health_503_after_s, health_503_for_s   /health answers 503 in that real-time window after ready
    never_healthy            /health never answers 200
    scheduler_hung           the scheduler stops (an NCCL hang): no step, no stream byte; /health answers
                             503 after health_check_timeout_s, as SGLang's does when no scheduler output
                             came (SGLANG_HEALTH_CHECK_TIMEOUT, 20 s); /v1/models and /v1/loads still answer
                             (SGLang's HTTP process answers them alone). Set mid-run with POST /sim/faults.
    health_check_timeout_s   see scheduler_hung
"""

from __future__ import annotations

import enum
import hashlib
import random
from dataclasses import asdict, dataclass, fields, replace
from typing import Any


class Fault(enum.Enum):
    NONE = "none"
    ERROR = "error"
    TOO_MANY = "429"
    STALL = "stall"
    CUT = "cut"
    BAD_JSON = "bad_json"
    WRONG_CONTENT_TYPE = "wrong_content_type"
    NO_USAGE = "no_usage"
    EMPTY_TURN = "empty_turn"


class OutputFault(enum.Enum):
    NONE = "none"
    LOOP = "loop"
    LEAK = "leak"
    MARKER_ONLY = "marker_only"


_JSON_TO_FIELD = {"429_rate": "too_many_rate"}
_FIELD_TO_JSON = {v: k for k, v in _JSON_TO_FIELD.items()}
# Order in which the rates share the unit interval (fixed: it is part of the seeded contract).
_RATE_ORDER = (
    ("error_rate", Fault.ERROR),
    ("too_many_rate", Fault.TOO_MANY),
    ("stall_rate", Fault.STALL),
    ("cut_rate", Fault.CUT),
    ("bad_json_rate", Fault.BAD_JSON),
    ("wrong_content_type_rate", Fault.WRONG_CONTENT_TYPE),
    ("no_usage_rate", Fault.NO_USAGE),
    ("empty_turn_rate", Fault.EMPTY_TURN),
)
_OUTPUT_RATE_ORDER = (
    ("loop_rate", OutputFault.LOOP),
    ("leak_rate", OutputFault.LEAK),
    ("marker_only_rate", OutputFault.MARKER_ONLY),
)


@dataclass(frozen=True)
class FaultSettings:
    """What to break and how often (see the module docstring for each key)."""

    crash_after: int = 0
    error_rate: float = 0.0
    error_status: int = 500
    too_many_rate: float = 0.0
    stall_rate: float = 0.0
    stall_s: float = 600.0
    cut_rate: float = 0.0
    bad_json_rate: float = 0.0
    wrong_content_type_rate: float = 0.0
    no_usage_rate: float = 0.0
    empty_turn_rate: float = 0.0
    loop_rate: float = 0.0
    leak_rate: float = 0.0
    marker_only_rate: float = 0.0
    health_503_after_s: float = 0.0
    health_503_for_s: float = 0.0
    never_healthy: bool = False
    scheduler_hung: bool = False
    health_check_timeout_s: float = 20.0
    seed: int = 0

    def __post_init__(self) -> None:
        validate(self)

    def to_json(self) -> dict[str, Any]:
        return {_FIELD_TO_JSON.get(k, k): v for k, v in asdict(self).items()}

    def updated(self, changes: dict[str, Any]) -> FaultSettings:
        """A copy with `changes` (JSON keys) applied. Raises ValueError naming a bad key or value."""
        known = {f.name: f.type for f in fields(self)}
        kwargs: dict[str, Any] = {}
        for key, value in changes.items():
            name = _JSON_TO_FIELD.get(key, key)
            if name not in known:
                raise ValueError(f"unknown fault key {key!r}; known keys: {sorted(self.to_json())}")
            kwargs[name] = _coerce(key, value, type(getattr(self, name)))
        return replace(self, **kwargs)


def _coerce(key: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"fault {key} must be true or false (got {value!r})")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"fault {key} must be a number (got {value!r})")
    if kind is int and value != int(value):
        raise ValueError(f"fault {key} must be an integer (got {value!r})")
    return kind(value)


def validate(s: FaultSettings) -> None:
    """Raises ValueError when a rate is outside [0, 1], the rates sum past 1, or a value is bad."""
    total = 0.0
    for name, _ in _RATE_ORDER:
        rate = getattr(s, name)
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"fault {_FIELD_TO_JSON.get(name, name)} must be within [0, 1] (got {rate})")
        total += rate
    if total > 1.0 + 1e-9:
        raise ValueError(f"fault rates sum to {total:.3f}; at most one fault hits a request, keep the sum <= 1")
    output = 0.0
    for name, _ in _OUTPUT_RATE_ORDER:
        rate = getattr(s, name)
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"fault {name} must be within [0, 1] (got {rate})")
        output += rate
    if output > 1.0 + 1e-9:
        raise ValueError(f"loop_rate + leak_rate + marker_only_rate = {output:.3f}; keep the sum <= 1")
    if s.error_status not in (500, 502, 503, 504):
        raise ValueError(f"fault error_status must be 500, 502, 503 or 504 (got {s.error_status})")
    for name in ("crash_after", "stall_s", "health_503_after_s", "health_503_for_s", "health_check_timeout_s"):
        if getattr(s, name) < 0:
            raise ValueError(f"fault {name} must be >= 0 (got {getattr(s, name)})")


def decide(settings: FaultSettings, seq: int) -> Fault:
    """The fault (or Fault.NONE) for the `seq`-th generation request; deterministic."""
    digest = hashlib.blake2b(f"{settings.seed}:{seq}".encode(), digest_size=8).digest()
    u = random.Random(int.from_bytes(digest, "big")).random()
    edge = 0.0
    for name, fault in _RATE_ORDER:
        edge += getattr(settings, name)
        if u < edge:
            return fault
    return Fault.NONE


def decide_output(settings: FaultSettings, request_seed: int) -> OutputFault:
    """What the model writes for the request with this seed (sglang_sim/lengths.py request_seed)."""
    u = random.Random(f"{settings.seed}:output:{request_seed}").random()
    edge = 0.0
    for name, fault in _OUTPUT_RATE_ORDER:
        edge += getattr(settings, name)
        if u < edge:
            return fault
    return OutputFault.NONE


def health_ok(settings: FaultSettings, since_ready_s: float) -> bool:
    """Whether /health answers 200 `since_ready_s` real seconds after the server became ready."""
    if settings.never_healthy:
        return False
    start = settings.health_503_after_s
    return not (settings.health_503_for_s > 0 and start <= since_ready_s < start + settings.health_503_for_s)
