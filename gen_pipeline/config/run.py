"""`generate`'s options that a flag sets, declared once: each field carries its flag, range, unit, help
and default. The CLI builds its flags from these (cli/parser.py); server.toml's `[run]` table takes the
same names (the flag wins); RunOptions (run/options.py) is these plus what no flag sets.

    [run]                 # datasets_cfg/server.toml: settings of every generate job
    server_wait_s = 900   # = --server-wait-s 900
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from gen_pipeline.config.schema import check_table, flag

ROUTINGS = ("affinity", "free-kv")  # server/fleet.py: how several attached servers share the requests


@dataclass(frozen=True)
class RunFlags:
    model: Annotated[str, flag("--model", help="model id for requests (default: from the profile or /v1/models)")] = ""
    limit: Annotated[int | None, flag("--limit", ge=1, help="stop after this many new samples in this run")] = None
    window: Annotated[int | None, flag(
        "--window", ge=0, help="fixed concurrency instead of the adaptive controller; 0 = adaptive, as in a "
                               "dataset TOML (default: the datasets' generation.window)")] = None
    poll_interval_s: Annotated[float, flag(
        "--poll-interval-s", ge=0.05, le=60, unit="seconds",
        help="seconds between load polls: the controller's input, a telemetry row each")] = 1.0
    drain_grace_s: Annotated[float, flag(
        "--drain-grace-s", ge=0, unit="seconds",
        help="on SIGINT/SIGTERM, seconds to let in-flight requests finish")] = 30.0
    server_wait_s: Annotated[float, flag(
        "--server-wait-s", ge=0, unit="seconds",
        help="attached servers: when none answers (a restart), pause and wait this long for one to come back "
             "before giving up (an SGLang restart takes 60-90 s)")] = 600.0
    health_interval_s: Annotated[float, flag(
        "--health-interval-s", ge=0.05, le=60, unit="seconds",
        help="attached servers: seconds between /health checks of each")] = 5.0
    hang_timeout_s: Annotated[float, flag(
        "--hang-timeout-s", ge=0.1, unit="seconds",
        help="attached servers: one with requests in flight that makes no progress (no stream bytes, no answer, "
             "no /health 200) this long and does not answer GET /v1/models is hung: taken out, its requests "
             "re-sent to the others; a server that answers is only busy")] = 5.0
    readers: Annotated[int | None, flag(
        "--readers", ge=0, le=64,
        help="processes that read the answers (HTTP, JSON, the loop detector) beside the main process, for a "
             "client past one core: 0 = none; default: chosen as the run goes, one more each time the main "
             "process (then the readers, on average) used half a core over 2 s, up to half the cores")] = None
    proceed_anyway: Annotated[bool, flag(
        "--proceed-anyway", help="launch even when the source check fails (most rows rejected, too few valid "
                                 "rows)")] = False
    gpus_per_server: Annotated[int | None, flag(
        "--gpus-per-server", ge=1, help="GPUs each server holds, for the GPU-hours status and the report show "
                                        "(default: the server's tp_size × dp_size from /get_server_info; "
                                        "unknown when it has none)")] = None
    routing: Annotated[str, flag(
        "--routing", choices=ROUTINGS,
        help="with several --server-url servers (no router): affinity sends a sample's later turns to the "
             "server that ran its previous turn (its prefix is cached there) unless that server is out or has "
             "much less free KV than the best; free-kv sends every request to the server with the most free "
             "KV")] = "affinity"


def run_table(table: Any, where: str) -> dict[str, Any]:
    """server.toml's `[run]` table → {option: value} of the keys it sets; raises ConfigError naming the
    key (unknown, wrong type, out of range)."""
    return check_table(RunFlags, table, where)
