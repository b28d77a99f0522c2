"""`gen-pipeline` (also `python -m gen_pipeline`): arguments → a library call → printed lines and an exit
code; the only place that configures logging (cli/logs.py) and turns the library's errors into messages.

Exit codes: 0 ok, 1 validation found problems, 2 config/flag error (also: a missing source column, most rows
rejected), 3 server error, 4 store error (lock, config drift, disk), 5 the source has fewer valid rows than the
target (`check`/`generate` refused, or a run ended short of it), 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP
(resumable). A job exits with the worst of its datasets' codes (130/143 over 5 over 0); an error ends it all.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gen_pipeline.signals import hold_signals  # stdlib only: the package's imports (up to a second) come after

if TYPE_CHECKING:
    import argparse

__all__ = ["COMMANDS", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        with hold_signals(redeliver=True):  # before the imports: a signal to `generate` is never the default kill
            from gen_pipeline.cli.parser import build_parser

            argv = list(sys.argv[1:] if argv is None else argv)
            args = build_parser().parse_args(argv)
            args.argv = argv  # the command line as typed (export's dataset card records it)
            if args.command == "generate":  # it holds them for its whole run (run/shutdown.py)
                return _run(args)
        return _run(args)  # the others: Ctrl-C and SIGTERM do what they usually do (a held one is sent again)
    except KeyboardInterrupt:
        return _interrupted()


def _run(args: argparse.Namespace) -> int:
    from gen_pipeline.cli.commands import COMMANDS
    from gen_pipeline.display import reader_gone, write_line
    from gen_pipeline.errors import GenPipelineError

    try:
        return COMMANDS[args.command](args)
    except GenPipelineError as e:
        if args.debug:
            traceback.print_exc()
        write_line(f"error: {e}", sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return _interrupted()
    except OSError as e:  # `gen-pipeline plan | head -1`: the reader left, having read what it wanted; no
        if not reader_gone(e):  # error (nor 141, which a shell's pipefail would take for one): stdout goes
            raise  # to /dev/null, so the exit's flush is quiet too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _interrupted() -> int:
    from gen_pipeline.display import write_line

    write_line("interrupted; run the same command to resume.", sys.stderr)
    return 130


def __getattr__(name: str) -> Any:
    """COMMANDS and build_parser load on first use: main() holds the signals before it imports them."""
    if name not in ("COMMANDS", "build_parser"):
        raise AttributeError(f"module 'gen_pipeline.cli' has no attribute {name!r}")
    module = "commands" if name == "COMMANDS" else "parser"
    return getattr(importlib.import_module(f"gen_pipeline.cli.{module}"), name)


if __name__ == "__main__":
    sys.exit(main())
