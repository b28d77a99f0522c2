"""SGLang, imported for the contract suite (the pinned release, in the venv `make contract`
builds), and the helpers its tests share. See shim.py for the one stub."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import warnings
from pathlib import Path

import shim

shim.install()
with warnings.catch_warnings():  # SGLang warns at import about what this CPU machine lacks
    warnings.simplefilter("ignore")
    import sglang.srt.server_args as server_args

PIN = re.search(r"^sglang==(\S+)", (Path(__file__).parent / "requirements.txt").read_text(), re.M).group(1)
SGLANG = Path(server_args.__file__).parents[1]  # the installed package: sglang/


class ParseError(Exception):
    """argparse's complaint, raised instead of exiting."""


class RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise ParseError(message)


class ParsedArgs(server_args.ServerArgs):
    """ServerArgs without __post_init__, which needs an accelerator (device and memory probe)
    and the model's config from the hub; from_cli_args' own field mapping still runs."""

    def __post_init__(self) -> None:
        pass


def sglang_parser() -> RaisingParser:
    parser = RaisingParser(prog="sglang serve", allow_abbrev=False)
    server_args.ServerArgs.add_cli_args(parser)
    return parser


def installed_version() -> str:
    return importlib.metadata.version("sglang")


def source(relative: str) -> str:
    """Text of one module of the installed SGLang ("srt/managers/scheduler.py")."""
    return (SGLANG / relative).read_text()
