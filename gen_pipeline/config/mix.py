"""A sampling mix: per-sample variants of a dataset's [sampling] ([[sampling.mix]] tables: a share and the
[sampling] keys it changes, docs/datasets.md). A variant only changes keys the base sets: one Arrow schema.

The draw (Fibonacci hashing): a sample's u in [0, 1) is its source row k times the golden ratio, mod 1, shifted
by the seed; its variant is the first whose cumulative share exceeds u. So it depends only on the seed and the
row (never the run, rank, resume or retry), and any N consecutive rows get each share within about log(N)/N. A
prompt without a source row is placed by a hash of (seed, its id). Pure.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from gen_pipeline.config.sampling import SamplingConfig
from gen_pipeline.config.schema import build_section, type_name, unknown_key
from gen_pipeline.errors import ConfigError

MIX_KEYS = ("mix", "mix_seed")  # [sampling] keys of the mix itself (not sent to the server)
SHARE_SUM_TOLERANCE = 1e-6  # shares written as decimals (0.1 + 0.2 + 0.7) sum to 1 only within rounding
_SPAN = 1 << 64
_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / φ, odd: k · _GOLDEN mod 2**64 visits [0, 2**64) evenly (Knuth, TAOCP 6.4)


@dataclass(frozen=True, eq=False)
class MixVariant:
    share: float
    overrides: dict[str, Any]  # the keys it names, as the base's type holds them (chat_template_kwargs: its own keys)
    sampling: SamplingConfig  # the base with the overrides applied: what its samples are sent and record


@dataclass(frozen=True, eq=False)
class SamplingMix:
    """The declared variants (module doc) and the seed of the draw."""

    variants: tuple[MixVariant, ...]
    seed: int = 0
    _edges: tuple[int, ...] = field(init=False, repr=False)  # where each variant but the last ends in [0, 2**64)
    _offset: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        total = sum(v.share for v in self.variants)  # 1 within SHARE_SUM_TOLERANCE: normalised exactly here
        edges, acc = [], 0.0
        for v in self.variants[:-1]:
            acc += v.share
            edges.append(min(_SPAN, round(acc / total * _SPAN)))
        object.__setattr__(self, "_edges", tuple(edges))
        object.__setattr__(self, "_offset", _hash64(f"gen_pipeline sampling mix {self.seed}"))

    def pick(self, sample_id: str, source_index: int = -1) -> int:
        """The variant (its index) of the sample with this id at this source position (-1: none)."""
        if source_index >= 0:
            u = (self._offset + source_index * _GOLDEN) % _SPAN
        else:
            u = _hash64(f"{self.seed}\0{sample_id}")
        return bisect_right(self._edges, u)

    def fingerprint(self) -> dict[str, Any]:
        """What the resume fingerprint holds: a changed share, key or seed is named by its path
        (sampling_mix.1.temperature)."""
        out: dict[str, Any] = {"seed": self.seed}
        for i, v in enumerate(self.variants):
            out[str(i)] = {"share": v.share, **v.overrides}
        return out

    def describe(self, index: int) -> str:
        """What variant `index` changes: "temperature 0.0, chat_template_kwargs.thinking false"."""
        return describe_overrides(self.variants[index].overrides)


def describe_overrides(overrides: dict[str, Any]) -> str:
    parts = []
    for key, value in overrides.items():
        items = value.items() if isinstance(value, dict) else [("", value)]
        parts += [f"{key}{'.' + k if k else ''} {_show(v)}" for k, v in items]
    return ", ".join(parts) or "the base [sampling]"


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


# ---------------------------------------------------------------- from TOML


def build_mix(table: dict[str, Any], base: SamplingConfig, where: str,
              check: Callable[[SamplingConfig, str], None]) -> SamplingMix | None:
    """The mix a [sampling] `table` declares (None: no [[sampling.mix]]), over the validated `base`;
    `check` validates each variant's sampling (the ranges); raises ConfigError naming file and key."""
    raw, seed = table.get("mix"), table.get("mix_seed", 0)
    if raw is None:
        if "mix_seed" in table:
            raise ConfigError(f"{where}mix_seed is set but there is no [[sampling.mix]]: declare the variants, "
                              "or remove mix_seed.")
        return None
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"{where}mix_seed = {seed!r} must be an integer (got {type_name(seed)}).")
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ConfigError(f"{where}mix must be an array of tables: one [[sampling.mix]] per variant, each with "
                          "a share and the [sampling] keys it changes.")
    if len(raw) < 2:
        raise ConfigError(f"{where}mix has {len(raw)} variant: a mix needs at least two [[sampling.mix]] tables "
                          "(for one, set its keys in [sampling] and remove the mix).")
    variants = tuple(_variant(t, base, f"{where}mix[{i}].", check) for i, t in enumerate(raw))
    total = sum(v.share for v in variants)
    if abs(total - 1.0) > SHARE_SUM_TOLERANCE:
        raise ConfigError(f"{where}mix: the shares sum to {total:g} ({' + '.join(f'{v.share:g}' for v in variants)}); "
                          "they must sum to 1.")
    return SamplingMix(variants, seed)


def _variant(table: dict[str, Any], base: SamplingConfig, where: str,
             check: Callable[[SamplingConfig, str], None]) -> MixVariant:
    share = _share(table, where)
    names = [f.name for f in fields(base) if f.name != "extra_body"]
    overrides = {k: v for k, v in table.items() if k != "share"}
    for key in overrides:
        if key == "extra_body":
            raise ConfigError(f"{where}extra_body: a variant cannot change extra_body (every variant sends it "
                              "verbatim); set it in [sampling.extra_body], or use a key a variant may change.")
        if key not in names:
            raise unknown_key(where, key, ["share", *names])
    merged = {k: getattr(base, k) for k in names if k not in overrides}
    merged.update(extra_body=base.extra_body, **overrides)
    if isinstance(merged.get("stop"), tuple):
        merged["stop"] = list(merged["stop"])  # the base's value, back in TOML's form for the strict schema
    kwargs = overrides.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise ConfigError(f"{where}chat_template_kwargs = {kwargs!r} must be a table "
                              "(chat_template_kwargs = { thinking = false }).")
        _check_template_kwargs(kwargs, base.chat_template_kwargs, where)
        merged["chat_template_kwargs"] = {**base.chat_template_kwargs, **kwargs}
    sampling = build_section(type(base), merged, where)
    check(sampling, where)
    recorded, base_recorded = sampling.as_dict(), base.as_dict()
    for key in overrides:
        if key in recorded and key not in base_recorded:
            raise ConfigError(_unset_message(where, key, key, overrides[key]))
        if key in base_recorded and key not in recorded:
            raise ConfigError(f"{where}{key} = {overrides[key]!r} would unset {key}, which [sampling] sets: every "
                              "sample records the same keys. Give it a value (or remove it from this variant).")
    return MixVariant(share, {k: _stored(getattr(sampling, k), k, kwargs) for k in overrides}, sampling)


def _share(table: dict[str, Any], where: str) -> float:
    if "share" not in table:
        raise ConfigError(f"{where.rstrip('.')} has no share: give each [[sampling.mix]] its share of the samples "
                          "(share = 0.25).")
    share = table["share"]
    if isinstance(share, bool) or not isinstance(share, (int, float)):
        hint = " Remove the quotes." if isinstance(share, str) else ""
        raise ConfigError(f"{where}share = {share!r} must be a number (got {type_name(share)}).{hint}")
    if not 0 < share <= 1:
        raise ConfigError(f"{where}share = {share} must be above 0 and at most 1 (its fraction of the samples).")
    return float(share)


def _check_template_kwargs(kwargs: dict[str, Any], base: dict[str, Any], where: str) -> None:
    for k, v in kwargs.items():
        if k not in base:
            raise ConfigError(_unset_message(where, f"chat_template_kwargs.{k}", "chat_template_kwargs", {k: v}))
        if type(v) is not type(base[k]):
            raise ConfigError(f"{where}chat_template_kwargs.{k} = {v!r} must be {type_name(base[k])} like "
                              f"sampling.chat_template_kwargs.{k} ({base[k]!r}): every sample records one type.")


def _unset_message(where: str, name: str, key: str, value: Any) -> str:
    example = (f"sampling.chat_template_kwargs = {{ {next(iter(value))} = ... }}" if isinstance(value, dict)
               else f"sampling.{key} = ...")
    return (f"{where}{name}: [sampling] does not set {name}, so the other variants would not send it and their "
            f"samples would record other keys. Set it in [sampling] too ({example}: what the other variants "
            "send).")


def _stored(value: Any, key: str, kwargs: dict[str, Any] | None) -> Any:
    if key == "chat_template_kwargs":
        return {k: value[k] for k in kwargs or {}}  # its own keys: the rest is the base's
    return list(value) if isinstance(value, tuple) else value


# ---------------------------------------------------------------- from a recorded fingerprint


def recorded_sampling(fp: dict[str, Any], variant: int) -> dict[str, Any] | None:
    """meta.sampling of the rows of `variant` under fingerprint `fp` (DatasetConfig.fingerprint): the base's
    keys with the variant's overrides; None when `fp` has no such variant (variant 0 of no mix: the base)."""
    base, mix = fp.get("sampling"), fp.get("sampling_mix")
    if not isinstance(base, dict) or not isinstance(mix, dict):
        return dict(base) if isinstance(base, dict) and variant == 0 else None
    overrides = mix.get(str(variant))
    if not isinstance(overrides, dict):
        return None
    return {**base, **{k: {**(base.get(k) or {}), **v} if k == "chat_template_kwargs" and isinstance(v, dict) else v
                       for k, v in overrides.items() if k != "share"}}


def declared_mix(fp: dict[str, Any]) -> list[tuple[float, str]]:
    """[(share, what it changes)] of each variant of the mix `fp` records; [] without one."""
    mix = fp.get("sampling_mix")
    if not isinstance(mix, dict):
        return []
    out = []
    for i in range(len(mix)):
        v = mix.get(str(i))
        if not isinstance(v, dict):
            break
        share = v.get("share")
        out.append((float(share) if isinstance(share, (int, float)) else 0.0,
                    describe_overrides({k: x for k, x in v.items() if k != "share"})))
    return out


def produced_shares(declared: list[tuple[float, str]], counts: dict[str, int]) -> list[str]:
    """One line per variant: "variant 0 (temperature 0.0): 251 samples, 50.2% (declared 50.0%)"; [] without
    a declared mix. `counts`: samples per meta.sampling_variant ("0": n)."""
    if not declared:
        return []
    total = sum(counts.values())
    out = []
    for i, (share, what) in enumerate(declared):
        n = counts.get(str(i), 0)
        got = f"{100 * n / total:.1f}%" if total else "-"
        out.append(f"variant {i} ({what}): {n:,} samples, {got} (declared {100 * share:.1f}%)")
    stray = sorted(set(counts) - {str(i) for i in range(len(declared))})
    out += [f"variant {k} (not in the declared mix): {counts[k]:,} samples" for k in stray]
    return out


def declared_lines(mix: SamplingMix) -> list[str]:
    """One line per declared variant: "variant 0: 50.0%, temperature 0.0"."""
    return [f"variant {i}: {100 * v.share:.1f}%, {mix.describe(i)}" for i, v in enumerate(mix.variants)]
