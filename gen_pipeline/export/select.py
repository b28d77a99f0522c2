"""What an export takes: filters, the --mix of datasets, the train/validation split, the order; pure
functions over sample rows. Every choice is a hash of the sample id, never of the input order, so an
export is the same whatever order the shards were read in, and a sample keeps its side of the split.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from gen_pipeline.config.schema import check_flags, flag
from gen_pipeline.errors import ConfigError

SHARE_TOLERANCE = 1e-6  # shares typed as decimals (0.3 + 0.2 + 0.5) do not add up exactly


def id_hash(text: str) -> float:
    """A stable number in [0, 1) for a string (the same on every machine and Python run)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") / 2.0**64


def seeded_key(seed: int, sample_id: str) -> float:
    """Sort key of a seeded shuffle: sorting by it is a permutation that depends on seed and id only."""
    return id_hash(f"{seed}\x00{sample_id}")


@dataclass(frozen=True)
class Filters:
    """--drop-truncated and --min-completion-tokens N (0 = no minimum)."""

    drop_truncated: bool = False
    min_completion_tokens: Annotated[int, flag("--min-completion-tokens", ge=0)] = 0

    def __post_init__(self) -> None:
        check_flags(self)

    def reason(self, row: dict[str, Any]) -> str | None:
        """Why `row` is dropped ("truncated", "short", "malformed"), or None to keep it."""
        convs = row.get("conversations")
        if not isinstance(convs, list) or not convs or not all(isinstance(m, dict) for m in convs):
            return "malformed"
        meta = row["meta"] if isinstance(row.get("meta"), dict) else {}
        if self.drop_truncated and meta.get("finish_reason") == "length":
            return "truncated"
        tokens = meta.get("completion_tokens")
        if self.min_completion_tokens and (not isinstance(tokens, int) or tokens < self.min_completion_tokens):
            return "short"
        return None


DROP_REASONS = {"truncated": "truncated (finish_reason length)", "malformed": "no conversations list",
                "duplicate": "with an id already exported: a damaged line, see `gen-pipeline validate`"}


def dropped_text(dropped: Counter[str], filters: Filters) -> str:
    """"3 truncated (finish_reason length), 2 under 40 completion tokens": the dropped samples by reason."""
    text = {**DROP_REASONS, "short": f"under {filters.min_completion_tokens} completion tokens"}
    return ", ".join(f"{n:,} {text[r]}" for r, n in sorted(dropped.items()))


@dataclass(frozen=True)
class Mix:
    """--mix B1=0.3,B2=0.7 (shares of the output, summing to 1) or B1=1000,B2=500 (sample counts)."""

    kind: str  # "share" | "count"
    parts: dict[str, float]

    @property
    def datasets(self) -> list[str]:
        return list(self.parts)


def parse_mix(spec: str) -> Mix:
    """Parse --mix; raises ConfigError that quotes the part that is wrong."""
    parts: dict[str, float] = {}
    kinds = set()
    for item in (p.strip() for p in spec.split(",")):
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name or not value:
            raise ConfigError(f"--mix {spec!r}: {item!r} must be DATASET=SHARE or DATASET=COUNT "
                              "(e.g. --mix B1=0.3,B2=0.7 or --mix B1=1000,B2=500).")
        if name in parts:
            raise ConfigError(f"--mix {spec!r}: {name} appears twice.")
        try:
            number = int(value) if value.isdigit() else float(value)
        except ValueError:
            raise ConfigError(f"--mix {spec!r}: {name}={value} is not a number.") from None
        if not math.isfinite(number) or number <= 0:
            raise ConfigError(f"--mix {spec!r}: {name}={value} must be above 0 (leave a dataset out instead).")
        kinds.add("count" if isinstance(number, int) else "share")
        parts[name] = number
    if len(kinds) > 1:
        raise ConfigError(f"--mix {spec!r} mixes shares and counts: give every dataset a share "
                          "(0.3, summing to 1) or every dataset a sample count (1000).")
    mix = Mix(kinds.pop(), parts)
    total = sum(parts.values())
    if mix.kind == "share" and abs(total - 1.0) > SHARE_TOLERANCE:
        raise ConfigError(f"--mix {spec!r}: the shares sum to {total:g}, not 1. Make them add up to 1 "
                          "(e.g. B1=0.6,B2=0.4), or give sample counts instead (B1=1000,B2=500).")
    return mix


def mix_counts(mix: Mix, available: dict[str, int]) -> dict[str, int]:
    """Samples to take from each dataset. Shares: the largest output the datasets can fill in those
    proportions. Counts: as given; raises ConfigError when a dataset has fewer eligible samples."""
    if mix.kind == "count":
        short = [f"{d} asks for {int(n):,} but has {available[d]:,}" for d, n in mix.parts.items() if n > available[d]]
        if short:
            raise ConfigError(f"--mix: {'; '.join(short)} eligible samples (after filters). "
                              "Lower those counts or generate more.")
        return {d: int(n) for d, n in mix.parts.items()}
    total = min(available[d] / share for d, share in mix.parts.items())
    return {d: min(available[d], math.floor(share * total + 0.5)) for d, share in mix.parts.items()}


def take(rows: Sequence[dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    """`n` of `rows`, chosen by a seeded hash of the id (stable when rows are added or reordered)."""
    if n >= len(rows):
        return list(rows)
    return sorted(rows, key=lambda r: seeded_key(seed, r["id"]))[:n]


def covering(rows: Sequence[dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    """At least `n` of `rows` (all when fewer) covering every kind of conversation (its assistant turns and
    chat_template_kwargs), then the multi-turn ones, then single-turn ones, each group in a seeded order:
    a check of what a trainer trains never misses the few multi-turn samples by chance."""
    if n >= len(rows):
        return list(rows)
    ordered = sorted(rows, key=lambda r: seeded_key(seed, r["id"]))

    def multi(r: dict[str, Any]) -> bool:
        return sum(1 for m in r.get("conversations") or [] if m.get("role") == "assistant") > 1

    def kind(r: dict[str, Any]) -> tuple[bool, str]:
        meta = r.get("meta") if isinstance(r.get("meta"), dict) else {}
        return multi(r), str((meta or {}).get("chat_template_kwargs"))

    firsts = list({kind(r): r for r in reversed(ordered)}.values())  # the first of each kind
    chosen = {r["id"]: r for r in sorted(firsts, key=lambda r: not multi(r))}
    for r in [r for r in ordered if multi(r)] + [r for r in ordered if not multi(r)]:
        if len(chosen) >= n:
            break
        chosen.setdefault(r["id"], r)
    return list(chosen.values())


@dataclass(frozen=True)
class ValSplit:
    """--val-share 0.02 (a fraction of the samples, each decided by its id hash) or 500 (a count:
    the samples with the 500 lowest hashes). 0 = no validation split."""

    share: float = 0.0
    count: int = 0

    @property
    def enabled(self) -> bool:
        return bool(self.share or self.count)


def parse_val(spec: str | None) -> ValSplit:
    if spec is None or spec.strip() in ("", "0"):
        return ValSplit()
    value = spec.strip()
    try:
        if value.isdigit():
            return ValSplit(count=int(value))
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0.0 <= share < 1.0:
        raise ConfigError(f"--val-share {spec!r} must be a fraction below 1 (0.02 = 2% of the samples) "
                          "or a whole number of samples (500).")
    return ValSplit(share=share)


def validation_ids(ids: Iterable[str], split: ValSplit) -> set[str]:
    """The sample ids that go to validation. Decided per sample (source) id, so the turns of an
    expanded conversation never straddle the split; disjoint from train by construction."""
    if split.count:
        return set(sorted(set(ids), key=id_hash)[:split.count])
    if split.share:
        return {i for i in ids if id_hash(i) < split.share}
    return set()


@dataclass
class DatasetCounts:
    """Per dataset: committed samples, dropped ones by reason, eligible and taken."""

    dataset: str
    committed: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    taken: int = 0

    @property
    def eligible(self) -> int:
        return self.committed - sum(self.dropped.values())
