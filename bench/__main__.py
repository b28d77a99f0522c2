"""`make bench` = `python -m bench [NAME ...]`: runs the benchmarks in turn; each writes its own
section of bench/results.json and docs/measurements.md. Names: calibration, controller, controller_regimes,
overhead, http_client, client_cpu, resume_speed, sim_capacity, export, ranks, fleet, job, loops, affinity, gate, hang,
faults, sim_vs_real, first_overrun, gpu_h200
(default: all but faults, the long soak `make chaos` runs)."""

from __future__ import annotations

import importlib
import inspect
import sys
import time

BENCHES = {
    "calibration": "bench.calibrate",
    "controller": "bench.controller_bench",
    "controller_regimes": "bench.controller_regimes",
    "overhead": "bench.overhead",
    "http_client": "bench.http_client",
    "client_cpu": "bench.client_cpu",
    "resume_speed": "bench.resume_speed",
    "sim_capacity": "bench.sim_capacity",
    "faults": "bench.faults_soak",
    "export": "bench.export_speed",
    "sim_vs_real": "bench.sim_vs_real",
    "first_overrun": "bench.first_overrun",
    "gpu_h200": "bench.gpu.report",
    "ranks": "bench.ranks_bench",
    "fleet": "bench.fleet_scale",
    "job": "bench.job_bench",
    "loops": "bench.loops_bench",
    "affinity": "bench.affinity_bench",
    "gate": "bench.gate_bench",
    "hang": "bench.hang_bench",
    "kill_storm": "bench.kill_storm",
}
# soaks: minutes of SIGKILLs, run by name (python -m bench faults kill_storm)
DEFAULT = [n for n in BENCHES if n not in ("faults", "kill_storm")]


def main(argv: list[str]) -> int:
    names = argv or DEFAULT
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    for name in names:
        started = time.monotonic()
        print(f"== {name} ==", flush=True)
        main_fn = importlib.import_module(BENCHES[name]).main
        # benchmarks take their own flags when run alone (python -m bench.X --help); here, the defaults
        main_fn([]) if inspect.signature(main_fn).parameters else main_fn()
        print(f"== {name}: {time.monotonic() - started:.0f} s ==\n", flush=True)
    print("Results: docs/measurements.md, bench/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
