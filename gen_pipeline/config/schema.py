"""TOML tables → frozen config dataclasses, type-checked by strict pydantic (its structured errors map to
our wording; strict refuses "0.7" for a number) from the dataclass's annotations. Options that CLI flags
set declare their ranges once, on their fields (`flag`), checked by `check_flags`."""

from __future__ import annotations

import difflib
import functools
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields, make_dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic.fields import FieldInfo

from gen_pipeline.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def type_name(v: Any) -> str:
    return {str: "a string", bool: "a boolean", int: "an integer", float: "a number",
            list: "a list", dict: "a table"}.get(type(v), type(v).__name__)


def unknown_key(where: str, key: str, known: list[str], *, top_level: bool = False) -> ConfigError:
    """`where` + key: unknown key, with the closest known key when one is close."""
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" Did you mean {close[0]}?" if close else ""
    here = "Known top-level keys" if top_level else "Known keys here"
    return ConfigError(f"{where}{key}: unknown key. {here}: {', '.join(sorted(known))}.{hint} "
                       "Check the spelling or remove it.")


def _listify(v: Any) -> Any:
    """A lone string where a list of strings goes is a list of one; lists become tuples."""
    if isinstance(v, str):
        return (v,)
    return tuple(v) if isinstance(v, list) else v


@functools.cache
def _model(cls: type[DataclassInstance]) -> type[BaseModel]:
    """A strict pydantic model with the dataclass's fields, types and defaults (extra keys forbidden)."""
    hints = typing.get_type_hints(cls)
    spec: dict[str, Any] = {}
    for f in fields(cls):
        tp = hints[f.name]
        if typing.get_origin(tp) is tuple:
            tp = Annotated[tp, BeforeValidator(_listify)]
        default = {"default": f.default} if f.default is not MISSING else {}
        if f.default_factory is not MISSING:
            default = {"default_factory": f.default_factory}
        # Fields are named k_<key> with the key as alias: a key like "schema" would shadow BaseModel's.
        spec[f"k_{f.name}"] = (tp, Field(alias=f.name, **default))
    return create_model(f"{cls.__name__}Schema", __config__=ConfigDict(strict=True, extra="forbid"), **spec)


def build_section(cls: type[T], table: Any, where: str, *, key_where: Callable[[str], str] | None = None) -> T:
    """Instantiate config dataclass `cls` from a TOML table; raises ConfigError naming the key, prefixed
    by `where` ("datasets_cfg/B2.toml: sampling.") or by `key_where(key)` when given (a key an inherited
    table wrote is named where it is written)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where.rstrip('.')} must be a table ([section]), got {type_name(table)}.")
    try:
        values = _model(cls).model_validate(table)
    except ValidationError as e:
        raise _message(cls, table, key_where or (lambda key: where), e) from None
    return cls(**{f.name: getattr(values, f"k_{f.name}") for f in fields(cls)})


def _message(cls: type, table: dict[str, Any], where_of: Callable[[str], str], exc: ValidationError) -> ConfigError:
    """Our wording for the first error, in the table's key order."""
    order = {k: i for i, k in enumerate(table)}
    err = min(exc.errors(), key=lambda e: order.get(str(e["loc"][0]) if e["loc"] else "", -1))
    key = str(err["loc"][0])
    where = where_of(key)
    if err["type"] == "extra_forbidden":
        return unknown_key(where, key, [f.name for f in fields(cls)])
    value, kind, loc = table[key], err["type"], f"{where}{key}"
    hint = " Remove the quotes." if isinstance(value, str) else ""
    tp = typing.get_type_hints(cls)[key]
    if typing.get_origin(tp) is tuple:
        return ConfigError(f"{loc} = {value!r} must be a list of strings.")
    if kind == "literal_error":
        choices = next((typing.get_args(a) for a in _union_args(tp) if typing.get_origin(a) is Literal), ())
        return ConfigError(f"{loc} = {value!r} is not one of {', '.join(repr(c) for c in choices)}.")
    got = f"(got {type_name(value)})"
    must = {"float_type": f"must be a number {got}.{hint}", "finite_number": f"must be a number {got}.{hint}",
            "int_type": f"must be an integer {got}.{hint}", "int_from_float": f"must be an integer {got}.{hint}",
            "bool_type": f"must be true or false {got}.", "string_type": f"must be a string {got}. Put it in quotes.",
            "dict_type": f"must be a table ({key} = {{ name = value }})."}.get(kind, f"is not valid: {err['msg']}.")
    return ConfigError(f"{loc} = {value!r} {must}")


def _union_args(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, type(int | str)) else (tp,)


# ---------------------------------------------------------------- options set by CLI flags


def flag(name: str, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
         lt: float | None = None, unit: str = "", help: str = "", choices: tuple[str, ...] = ()) -> Any:
    """An option that a CLI flag sets, declared on the options' dataclass field: its flag, range, unit,
    help and choices (`limit: Annotated[int | None, flag("--limit", ge=1, help=...)] = None`);
    `check_flags` enforces it, and cli/parser.py builds the flag from it."""
    return Field(ge=ge, gt=gt, le=le, lt=lt, title=name, description=unit,
                 json_schema_extra={"help": help, "choices": list(choices)})


@dataclass(frozen=True)
class Flag:
    """One declared option (`flag`), as the CLI parser needs it."""

    field: str
    name: str  # "--limit"
    type: type  # int, float, str or bool
    default: Any
    help: str
    choices: tuple[str, ...]


def declared_flags(cls: type[DataclassInstance]) -> list[Flag]:
    """The options of `cls` that flags set, in field order."""
    plain = typing.get_type_hints(cls)
    defaults = {f.name: f.default for f in fields(cls)}
    out = []
    for name, (_adapter, info) in _flag_fields(cls).items():
        tp = next(a for a in _union_args(plain[name]) if a is not type(None))
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        out.append(Flag(name, str(info.title), tp, defaults[name], str(extra.get("help", "")),
                        tuple(typing.cast(list[str], extra.get("choices", [])))))
    return out


def check_flags(options: DataclassInstance) -> None:
    """Raise ConfigError naming the flag (as the user types it) of the first field of `options` out of
    its declared range or choices; called by the options' __post_init__, so the CLI and a library caller
    get the same refusal with the same message."""
    for name, (adapter, info) in _flag_fields(type(options)).items():
        problem = _flag_problem(adapter, info, getattr(options, name), str(info.title))
        if problem:
            raise ConfigError(problem)


def check_table(cls: type[DataclassInstance], table: Any, where: str) -> dict[str, Any]:
    """A TOML table that sets options of `cls` by their field names (the flags' names with "_") →
    {name: value} of the keys it sets; ConfigError naming the key (unknown, wrong type, out of range)."""
    values = build_section(_optional(cls), table, where)
    flags = _flag_fields(cls)
    out = {key: getattr(values, key) for key in table}
    for key, value in out.items():
        problem = _flag_problem(*flags[key], value, f"{where}{key} =")
        if problem:
            raise ConfigError(problem)
    return out


@functools.cache
def _optional(cls: type[DataclassInstance]) -> type[DataclassInstance]:
    """`cls`'s flag fields as a dataclass whose every field may be left out (None)."""
    hints = typing.get_type_hints(cls)
    return make_dataclass(f"{cls.__name__}Table", [(n, hints[n] | None, None) for n in _flag_fields(cls)],
                          frozen=True)


def _flag_problem(adapter: TypeAdapter[Any], info: FieldInfo, value: Any, label: str) -> str:
    try:
        adapter.validate_python(value)
    except ValidationError:
        return _range_message(info, value, label)
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    choices = typing.cast(list[str], extra.get("choices", []))
    if choices and value not in choices:
        return f"{label} {value} is not one of: {', '.join(choices)}."
    return ""


@functools.cache
def _flag_fields(cls: type[DataclassInstance]) -> dict[str, tuple[TypeAdapter[Any], FieldInfo]]:
    hints = typing.get_type_hints(cls, include_extras=True)
    out: dict[str, tuple[TypeAdapter[Any], FieldInfo]] = {}
    for f in fields(cls):
        info = next((m for m in getattr(hints[f.name], "__metadata__", ()) if isinstance(m, FieldInfo)), None)
        if info is not None and info.title:
            out[f.name] = (TypeAdapter(hints[f.name]), info)
    return out


def _range_message(info: FieldInfo, value: Any, label: str) -> str:
    """`--poll-interval-s 0.01 must be between 0.05 and 60 seconds.`, `--limit 0 must be at least 1.`"""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"{label} {value!r} must be a number."
    bounds = {type(m).__name__: getattr(m, type(m).__name__.lower(), None) for m in info.metadata}
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    unit = f" {info.description}" if info.description else ""
    if bounds.get("Ge") is not None and bounds.get("Le") is not None:
        return f"{label} {shown} must be between {bounds['Ge']:g} and {bounds['Le']:g}{unit}."
    words = {"Ge": "at least", "Gt": "above", "Le": "at most", "Lt": "below"}
    parts = [f"{words[k]} {bounds[k]:g}" for k in ("Ge", "Gt", "Le", "Lt") if bounds.get(k) is not None]
    return f"{label} {shown} must be {' and '.join(parts)}{unit}."
