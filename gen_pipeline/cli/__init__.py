"""`gen-pipeline` (also `python -m gen_pipeline`): arguments → a library call → printed lines and an
exit code. The edge of the program: the only place that configures logging (cli/logs.py) and turns
the library's errors into messages.

    parser.py    the arguments (argparse)
    commands.py  one function per command: parse → call → print
    logs.py      console and run.log handlers; the datasets library kept quiet

A job (several datasets) exits with the worst of its datasets' codes (130/143 over 5 over 0); an error
ends the whole job with its code.

Exit codes: 0 ok, 1 validation found problems, 2 config/flag error (also: a missing source column, most
rows rejected), 3 server error, 4 store error (lock, config drift, disk), 5 the source has fewer valid rows
than the target (`check`/`generate` refused, or a run ended short of it), 130/143 interrupted by
SIGINT/SIGTERM (resumable).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

from gen_pipeline.cli.commands import COMMANDS
from gen_pipeline.cli.parser import build_parser
from gen_pipeline.display import write_line
from gen_pipeline.errors import GenPipelineError

__all__ = ["COMMANDS", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # the command line as typed (export's dataset card records it)
    try:
        return COMMANDS[args.command](args)
    except GenPipelineError as e:
        if args.debug:
            traceback.print_exc()
        write_line(f"error: {e}", sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        write_line("interrupted; run the same command to resume.", sys.stderr)
        return 130
    except BrokenPipeError:  # `gen-pipeline plan | head -1`: the reader left, having read what it wanted; no
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # error (nor 141, which a shell's
        return 0  # pipefail would take for one): stdout goes to /dev/null, so the exit's flush is quiet too


if __name__ == "__main__":
    sys.exit(main())
