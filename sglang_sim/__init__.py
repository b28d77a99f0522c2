"""The SGLang simulator: a stand-in server that speaks SGLang's HTTP API over real TCP,
backed by a discrete-time model of SGLang's scheduler. It is NOT SGLang: it exists so the
tests, the demo and the benchmarks run without a GPU.

    python -m sglang_sim --port 30000 [SGLang flags] [--sim-* flags]

Modules: cli (flags), app + generation + transport (HTTP front), loop (engine task and
pacing), engine (+ engine_request, kv_pool, engine_stats) + radix + profiles (the model), tokenizer,
lengths, faults, metrics, responses (JSON shapes), testing (start_sim for tests).
"""

from sglang_sim.faults import Fault, FaultSettings
from sglang_sim.testing import SimProcess, start_sim

__all__ = ["Fault", "FaultSettings", "SimProcess", "start_sim"]
