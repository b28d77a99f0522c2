"""The simulator's HTTP front: a Starlette app with SGLang's routes and JSON shapes
(python/sglang/srt/entrypoints/http_server.py, v1_loads.py), admin routes of our own under
/sim/, and an `X-Sim-Time` header (simulated seconds) on every response."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import os
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from sglang_sim import generation
from sglang_sim.cli import server_args_dict
from sglang_sim.engine import Engine, FinishedRequest
from sglang_sim.faults import Fault, FaultSettings, decide, health_ok
from sglang_sim.loop import EngineLoop
from sglang_sim.metrics import SimCollector, make_registry, render
from sglang_sim.spec import Speculation

log = logging.getLogger("sglang_sim")
SIM_VERSION = "0.5.6+sim"  # the SGLang API generation it mimics, marked as the simulator
LOOPS_KEPT = 10_000  # looping turns kept in /sim/stats "loops"
CRASH_LINE = "RuntimeError: CUDA error: an illegal memory access was encountered (simulated crash, --sim-crash-after)"


class SimServer:
    """Process-wide state: the flags, the engine loop, the faults and their counters."""

    def __init__(self, ns: argparse.Namespace, engine: Engine, info: dict[str, Any]) -> None:
        self.ns = ns
        self.info = info
        self.loop = EngineLoop(engine, time_scale=ns.time_scale, decode_log_interval=ns.decode_log_interval)
        self.faults: FaultSettings = ns.faults
        self.loop.set_hung(self.faults.scheduler_hung)
        self.started_real = time.monotonic()
        self.ready_real: float | None = None
        self.seq = 0
        self.completed = 0
        self.last_completed_sim_s: float | None = None  # the simulated time of the latest whole response
        self.fault_counts: dict[str, int] = {f.value: 0 for f in Fault}
        # degenerate outputs written (sglang_sim/degenerate.py): loop_<kind>, leak_<kind>, marker_only
        self.output_fault_counts: collections.Counter[str] = collections.Counter()
        # chat requests finished, by first / later turn: requests, prompt and cached tokens, and (later
        # turns) how many found the previous turn's whole prompt cached (/sim/stats "turns")
        self.turn_counts: collections.Counter[str] = collections.Counter()
        # looping turns: rid -> (kind, the loop's first token) while running; once ended, what was decoded
        # (the last LOOPS_KEPT in /sim/stats "loops": how far past its start a client's abort stopped it)
        self.looping: dict[str, tuple[str, int]] = {}
        self.loops_ended: collections.deque[dict[str, Any]] = collections.deque(maxlen=LOOPS_KEPT)
        self.loop.on_finished = self._finished
        # chat requests per sampling asked ({temperature, top_p, reasoning_effort, chat_template_kwargs} as sorted
        # JSON): what a client's per-sample sampling (a sampling mix) really sent
        self.chat_sampling: collections.Counter[str] = collections.Counter()
        self.spec = Speculation(ns)
        self.registry = make_registry(SimCollector(ns.served_model_name, self._metrics_snapshot))

    def _finished(self, fin: FinishedRequest) -> None:
        looped = self.looping.pop(fin.rid, None)
        if looped is not None:
            self.loops_ended.append({"rid": fin.rid, "kind": looped[0], "loop_start": looped[1],
                                     "decoded": fin.completion_tokens, "finish_reason": fin.finish_reason})

    def next_fault(self) -> Fault:
        self.seq += 1
        fault = decide(self.faults, self.seq)
        self.fault_counts[fault.value] += 1
        return fault

    def count_turn(self, user_turns: int, previous_prompt_tokens: int, fin: FinishedRequest) -> None:
        """One chat request finished (aborted ones are not counted)."""
        if fin.finish_reason not in ("stop", "length"):
            return
        which = "later" if user_turns >= 2 else "first"
        c = self.turn_counts
        c[f"{which}_turns"] += 1
        c[f"{which}_prompt_tokens"] += fin.prompt_tokens
        c[f"{which}_cached_tokens"] += fin.cached_tokens
        if which == "later":
            c["later_prefix_hits"] += previous_prompt_tokens > 0 and fin.cached_tokens >= previous_prompt_tokens

    def request_completed(self) -> None:
        """Called once a whole response was sent; crash_after exits the process here."""
        self.completed += 1
        self.last_completed_sim_s = self.loop.now_s()
        if self.faults.crash_after and self.completed >= self.faults.crash_after:
            log.error(CRASH_LINE)
            logging.shutdown()
            sys.stderr.flush()
            os._exit(1)

    def healthy(self) -> bool:
        if self.ready_real is None:
            return False
        return health_ok(self.faults, time.monotonic() - self.ready_real)

    def load(self) -> dict[str, Any]:
        """One dp rank's /v1/loads entry (the sim models a single rank)."""
        loads = dict(self.loop.engine.loads())
        loads.setdefault("dp_rank", 0)
        loads["timestamp"] = time.time()
        loads.setdefault("max_total_num_tokens", self.info["max_total_num_tokens"])
        loads.setdefault("max_running_requests", self.loop.engine.max_running_requests)
        loads.setdefault("gen_throughput", round(self.loop.stats.last_gen_throughput, 2))
        loads.setdefault("queues", {"waiting": loads.get("num_waiting_reqs", 0), "grammar": 0, "paused": 0,
                                    "retracted": 0})
        return loads

    def _metrics_snapshot(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Each rank's /v1/loads entry plus the scheduler gauges /metrics has and /v1/loads has not."""
        engine = self.loop.engine
        load = self.load()
        # SGLang sets the gauge from the PrefillAdder at each prefill stats log (metrics_reporter.py:553)
        gauges = {"new_token_ratio": engine.reported_new_token_ratio, "num_paused_reqs": load["queues"]["paused"],
                  "num_retracted_reqs": load["queues"]["retracted"],
                  "is_cuda_graph": int(self.loop.stats.last_cuda_graph), **self.spec.gauges()}
        return [load | gauges], engine.counters()

    async def run_startup(self) -> None:
        await asyncio.sleep(self.ns.sim_startup_s)
        self.ready_real = time.monotonic()
        log.info("The server is fired up and ready to roll!")


def _sim(request: Request) -> SimServer:
    return request.app.state.sim


async def health(request: Request) -> Response:
    sim = _sim(request)
    if sim.faults.scheduler_hung and sim.healthy():  # SGLang waits this long for scheduler output, then 503
        await asyncio.sleep(sim.faults.health_check_timeout_s)
        return Response(status_code=503)
    return Response(status_code=200 if sim.healthy() else 503)


async def server_info(request: Request) -> Response:
    sim = _sim(request)
    engine = sim.loop.engine
    state = {
        "effective_max_running_requests_per_dp": engine.max_running_requests,
        "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": sim.info["max_total_num_tokens"],
                         "graph": 0.0},
        "last_gen_throughput": round(sim.loop.stats.last_gen_throughput, 2),
        "new_token_ratio": engine.new_token_ratio,
        "dp_rank": 0,
    }
    body = server_args_dict(sim.ns) | {
        "max_total_num_tokens": sim.info["max_total_num_tokens"],
        "max_req_input_len": sim.info["max_req_input_len"],
        "internal_states": [state],
        "version": SIM_VERSION,
        "sim_time_s": sim.loop.now_s(),
        "sim_hicache_tokens": sim.info["hicache_tokens"],
        "cuda_graph_config": cuda_graph_config(sim.info["cuda_graph_max_bs"]),
    }
    return JSONResponse(body)


def cuda_graph_config(max_bs: int) -> dict[str, Any]:
    """SGLang 0.5.17's resolved `cuda_graph_config` as /server_info dumps it (dataclasses.asdict of
    model_executor/cuda_graph_config.py CudaGraphConfig): the decode ceiling is `decode.max_bs`."""
    decode = ({"backend": "full", "max_bs": max_bs, "bs": capture_batch_sizes(max_bs)} if max_bs > 0
              else {"backend": "disabled", "max_bs": None, "bs": None})
    return {"decode": decode | {"tc_compiler": "eager"},
            "prefill": {"backend": "breakable", "max_bs": 8192, "bs": None, "tc_compiler": "eager"}}


def capture_batch_sizes(max_bs: int) -> list[int]:
    """server_args.py _generate_decode_cuda_graph_batch_sizes (no speculative decoding, padding on)."""
    bs = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    return [b for b in bs if b <= max_bs]


async def model_info(request: Request) -> Response:
    ns = _sim(request).ns
    return JSONResponse({
        "model_path": ns.model_path, "tokenizer_path": ns.tokenizer_path or ns.model_path,
        "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
        "has_image_understanding": False, "has_audio_understanding": False,
        "model_type": "sim", "architectures": ["SimForCausalLM"],
    })


async def models(request: Request) -> Response:
    sim = _sim(request)
    name = sim.ns.served_model_name
    return JSONResponse({"object": "list", "data": [{
        "id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang", "root": name,
        "parent": None, "max_model_len": sim.info["context_len"]}]})


async def loads(request: Request) -> Response:
    sim = _sim(request)
    rank = request.query_params.get("dp_rank")
    if rank is not None and rank != "0":
        return generation.error_response(f"dp_rank {rank} out of range [0, 1)", 400)
    return JSONResponse({
        "timestamp": datetime.now(UTC).isoformat(), "version": SIM_VERSION,
        "accelerator": "simulated", "num_accelerators": sim.ns.tp_size, "loads": [sim.load()]})


async def get_load(request: Request) -> Response:
    load = _sim(request).load()
    return JSONResponse([{"dp_rank": 0, "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
                          "num_waiting_reqs": load["num_waiting_reqs"], "num_tokens": load["num_used_tokens"]}])


async def metrics(request: Request) -> Response:
    sim = _sim(request)
    if not sim.ns.enable_metrics:
        return PlainTextResponse("Not Found", status_code=404)
    return Response(render(sim.registry), media_type="text/plain; version=0.0.4; charset=utf-8")


async def flush_cache(request: Request) -> Response:
    loop = _sim(request).loop
    flush = getattr(loop.engine, "flush_cache", None)
    if loop.engine.idle and flush is not None and flush() is not False:
        return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)")
    return PlainTextResponse("Cache flush failed. There are running or waiting requests.", status_code=400)


async def abort_request(request: Request) -> Response:
    sim = _sim(request)
    try:
        body = await generation.json_body(request)
    except generation.BadRequest as e:
        return generation.error_response(str(e))
    if body.get("abort_all"):
        sim.loop.abort_all()
    elif isinstance(body.get("rid"), str):
        sim.loop.abort(body["rid"])
    return Response(status_code=200)


async def sim_faults(request: Request) -> Response:
    sim = _sim(request)
    if request.method == "POST":
        try:
            sim.faults = sim.faults.updated(await generation.json_body(request))
        except (generation.BadRequest, ValueError) as e:
            return generation.error_response(str(e))
        sim.loop.set_hung(sim.faults.scheduler_hung)
        log.info("Fault settings changed: %s", sim.faults.to_json())
    return JSONResponse(sim.faults.to_json())


async def sim_stats(request: Request) -> Response:
    sim = _sim(request)
    st = sim.loop.stats
    return JSONResponse({
        "sim_time_s": sim.loop.now_s(), "real_time_s": time.monotonic() - sim.started_real,
        # the clock of the health_503 window (None while starting)
        "since_ready_s": None if sim.ready_real is None else time.monotonic() - sim.ready_real,
        "time_scale": sim.ns.time_scale, "steps": st.steps, "busy_real_s": st.busy_real_s, "busy_sim_s": st.busy_sim_s,
        "max_step_real_s": st.max_step_real_s,
        "lag_events": st.lag_events, "lag_total_real_s": st.lag_total_real_s, "max_lag_real_s": st.max_lag_real_s,
        "retraction_events": st.retraction_events, "in_flight": sim.loop.in_flight,
        "requests_seen": sim.seq, "requests_completed": sim.completed, "faults": sim.fault_counts,
        "last_completed_sim_s": sim.last_completed_sim_s,
        "output_faults": dict(sim.output_fault_counts), "turns": dict(sim.turn_counts),
        "loops": list(sim.loops_ended),
        "chat_sampling": dict(sim.chat_sampling),
        "counters": sim.loop.engine.counters(), "load": sim.load(), "admissions": st.admissions,
    })


class SimTimeHeader:
    """ASGI middleware: adds "X-Sim-Time: <simulated seconds>" to every response."""

    def __init__(self, app: Any, sim: SimServer) -> None:
        self.app, self.sim = app, sim

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_header(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-sim-time", f"{self.sim.loop.now_s():.6f}".encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_header)


def build_app(sim: SimServer) -> Any:
    """The ASGI app; its lifespan runs the engine loop and the start-up timer."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks = [asyncio.ensure_future(sim.loop.run()), asyncio.ensure_future(sim.run_startup())]
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()

    get, post = ["GET"], ["POST"]
    routes = [
        Route("/health", health, methods=get), Route("/health_generate", health, methods=get),
        Route("/server_info", server_info, methods=get), Route("/get_server_info", server_info, methods=get),
        Route("/model_info", model_info, methods=get), Route("/get_model_info", model_info, methods=get),
        Route("/v1/models", models, methods=get),
        Route("/v1/chat/completions", generation.chat_completions, methods=post),
        Route("/generate", generation.generate, methods=post),
        Route("/tokenize", generation.tokenize, methods=post), Route("/v1/tokenize", generation.tokenize, methods=post),
        Route("/v1/loads", loads, methods=get), Route("/get_load", get_load, methods=get),
        Route("/metrics", metrics, methods=get),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
        Route("/abort_request", abort_request, methods=post),
        Route("/sim/faults", sim_faults, methods=["GET", "POST"]),
        Route("/sim/stats", sim_stats, methods=get),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.sim = sim
    return SimTimeHeader(app, sim)
