"""`python -m sglang_sim --port P [SGLang flags] [--sim-* flags]`: run the simulator."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

try:
    import uvicorn
except ImportError:  # the simulator's HTTP front is an extra of gen-pipeline
    sys.exit("The SGLang simulator needs starlette and uvicorn: pip install -e '.[sim]' (make installs them).")

from sglang_sim.app import SimServer, build_app
from sglang_sim.cli import parse_args
from sglang_sim.loop import build_engine

log = logging.getLogger("sglang_sim")


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit code (argparse exits 2 on a bad flag)."""
    ns = parse_args(argv)
    # SGLang's log format (python/sglang/srt/utils.py configure_logger): "[time] message".
    logging.basicConfig(level=ns.log_level.upper(), format="[%(asctime)s] %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", stream=sys.stdout, force=True)
    log.info("SGLang simulator (not SGLang): profile=%s, time_scale=%g", ns.sim_profile, ns.time_scale)
    try:
        engine, info = build_engine(ns)
    except ValueError as e:
        log.error("Invalid server arguments: %s", e)
        return 1
    # The capacity line of scheduler.py (launcher and users grep it).
    log.info("max_total_num_tokens=%d, chunked_prefill_size=%d, max_prefill_tokens=%d, max_running_requests=%d, "
             "context_len=%d, available_gpu_mem=%.2f GB", info["max_total_num_tokens"], info["chunked_prefill_size"],
             info["max_prefill_tokens"], info["max_running_requests"], info["context_len"], 3.5)
    for line in ns.sim_startup_log:
        log.warning("%s", line)
    if ns.sim_fail_startup:
        log.error("%s", ns.sim_fail_startup)
        return 1
    server = SimServer(ns, engine, info)
    if ns.sim_ignore_sigterm:  # uvicorn installs its own handler for the signals it lists: take SIGTERM out
        import signal

        from uvicorn import server as uvicorn_server
        uvicorn_server.HANDLED_SIGNALS = (signal.SIGINT,)  # type: ignore[assignment]
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    uvicorn.run(build_app(server), host=ns.host, port=ns.port, log_level=ns.log_level_http or "warning",
                access_log=ns.log_level_http is not None, timeout_keep_alive=5, lifespan="on")
    return 0


if __name__ == "__main__":
    sys.exit(main())
