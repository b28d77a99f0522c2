"""Job benchmark (issue 10): the 88K job as four single-dataset runs, each with a server start, against
the one-command job through one server lifetime.

The reference mix (B1 30K, B2 18K, B6 20K, B7 20K; length profiles of bench/jobs.py) with the counts
divided by --scale (default 10), seed hardware profile, fp8 KV 376K tokens, in simulated time
(bench/engine_run.py: the production Window, Dispatcher and Controller against the simulator's Engine):
(a) four sequential runs (engine_run's single-dataset path), each paying a server start; (b) the job:
one Window, one Dispatcher per dataset, dispatch.produce_in_order (sequential, overlapped), the
controller's per-dataset length estimates; (c) the same job interleaved (all producers at once).

Server start: --startup-s (default 600 s). SGLang PR #27139 (sgl-project/sglang, 2026) measures a
restart of a large model (weights, distributed init, CUDA graphs, JIT warm-up) at 3-6+ minutes,
Qwen3-235B FP8 about 6.5 minutes on 4 GPUs; Kimi-K2.5's checkpoint is 594 GB, 2.5x that: 10 minutes
is the low side for it.

Figures: makespan (startups included); GPU idle share = time with fewer running requests than 0.9 x
the steady state (startups are idle); the ideal = one startup + the job's tokens divided by the
server's saturated decode rate. Both per dataset from a saturated run: every request of the dataset
sent at once (the server's own admission fills it), over the middle 20-80% of that run: the median
running count (the steady state) and the decode tokens per second (the saturated rate). A mix in
flight: each running request takes 1/steady of its dataset's share.

`python -m bench.job_bench [--scale N] [--startup-s S] [--quick]`; --quick writes nothing.
"""

from __future__ import annotations

import argparse
import math
import time

import anyio

from bench.engine_run import _all_blocked, _drain, _EngineRun
from bench.jobs import LENGTH_PROFILES, POLL_S, SERVER_CONFIGS, Job, ServerConfig, snapshot
from bench.report import md_table, write_section
from gen_pipeline.controller import Controller
from gen_pipeline.records import Capacity, Prompt, Reject, Sample
from gen_pipeline.run.dispatch import Dispatcher, Item, Window, produce_in_order
from gen_pipeline.run.stats import RunStats

REFERENCE = {"B1": 30_000, "B2": 18_000, "B6": 20_000, "B7": 20_000}
SERVER = "376K"
SEED = 1
STEADY = (0.2, 0.8)  # the part of a single run where the server is saturated (no ramp, no tail)
IDLE_BELOW = 0.9  # a poll is idle below this share of the steady running count


class _Feed:
    def __init__(self, name: str, total: int) -> None:
        self._batch: list[Prompt] | None = [Prompt(f"{name}-{i}", ({"role": "user", "content": "x"},))
                                            for i in range(total)]

    async def next_batch(self) -> list[Prompt]:
        batch, self._batch = self._batch or [], None
        return batch

    def take_rejects(self) -> list[Reject]:
        return []


class _MultiRun:
    """Several datasets through one engine: the production Window shared by one Dispatcher each."""

    def __init__(self, jobs: dict[str, Job], server: ServerConfig, interleave: bool, mix: bool = True) -> None:
        self.jobs, self.engine, self.interleave = jobs, server.engine(), interleave
        self.window = Window(clock=self._now)
        capacity = Capacity(self.engine.config.max_total_num_tokens, self.engine.max_running_requests, source="sim")
        first = next(iter(jobs.values()))
        ctl = Controller(capacity, initial_tokens_per_request=first.initial_tokens_per_request())
        for name, job in jobs.items():
            if mix:  # per-dataset length estimates (else: one rolling estimate over every completion)
                ctl.add_kind(name, job.initial_tokens_per_request())
        self.window.controller = ctl
        self.dispatchers = [Dispatcher(len(job.lengths), self.window, RunStats(self._now), name)
                            for name, job in jobs.items()]
        self.window.members = self.dispatchers
        self._waiting: dict[str, tuple[anyio.Event, list]] = {}
        self.polls: list[tuple[float, int, dict[str, int]]] = []  # (t, running, in flight per dataset)
        self.tokens = 0

    def _now(self) -> float:
        return self.engine.now_s

    def _regenerate(self, name: str, offset: int):
        job = self.jobs[name]

        async def regenerate(prompt: Prompt) -> Sample:
            index = int(prompt.id.rsplit("-", 1)[1])
            p, o, reason = job.lengths[index]
            rid, base = prompt.id, (offset + index + 1) << 20  # unique tokens: no prefix sharing
            done, box = anyio.Event(), []
            self._waiting[rid] = (done, box)
            self.engine.add_request(rid, range(base, base + p), range(base + p, base + p + o), reason,
                                    max_new_tokens=job.profile.max_new_tokens)
            await done.wait()
            f = box[0]
            self.window.observe_completion(f.prompt_tokens, f.completion_tokens, f.e2e_latency_s, name)
            self.tokens += f.completion_tokens
            return Sample(prompt.id, name, [], {"completion_tokens": f.completion_tokens})
        return regenerate

    def _in_flight(self) -> int:
        return sum(d.in_flight for d in self.dispatchers)

    async def drive(self) -> None:
        engine, next_poll_s, changed = self.engine, POLL_S, True
        while True:
            if changed:
                await _all_blocked()
            result = engine.step()
            if result.dt_s == 0 and not result.finished:
                if self._in_flight() == 0:
                    await anyio.sleep_forever()
                raise RuntimeError(f"engine idle with {self._in_flight()} in flight")
            for f in result.finished:
                done, box = self._waiting.pop(f.rid)
                box.append(f)
                done.set()
            changed = bool(result.finished)
            while engine.now_s >= next_poll_s:
                snap = snapshot(engine)
                self.polls.append((snap.t_s, snap.running, {d.name: d.in_flight for d in self.dispatchers}))
                self.window.observe_load(snap)
                self.window.retune(0)
                next_poll_s += POLL_S
                changed = True

    async def main(self) -> None:
        offsets = {name: k * 1_000_000 for k, name in enumerate(self.jobs)}
        sends = []

        def launch(d: Dispatcher):
            send, recv = anyio.create_memory_object_stream[Item](math.inf)
            sends.append(recv)
            tg.start_soon(_drain, recv)
            return self._regenerate(d.name, offsets[d.name]), send, _Feed(d.name, len(self.jobs[d.name].lengths))

        async with anyio.create_task_group() as tg:
            tg.start_soon(self.drive)
            async with anyio.create_task_group() as requests:
                if self.interleave:  # (c): every producer at once; the product starts each after the last
                    for d in self.dispatchers:
                        requests.start_soon(d.produce, requests, *launch(d))
                else:
                    await produce_in_order(requests, self.dispatchers, launch)
            tg.cancel_scope.cancel()


def _recorded(job: Job, server: ServerConfig, fixed: int | None) -> tuple[_EngineRun, list[tuple[float, int, int]]]:
    """One dataset alone through engine_run's single-dataset path; every poll's (t, running, decode tokens)."""
    r = _EngineRun(job, server, fixed)
    polls: list[tuple[float, int, int]] = []
    observe = r.window.observe_load

    def record(snap):
        polls.append((snap.t_s, snap.running, r.engine.counters()["decode_tokens_total"]))
        observe(snap)
    r.window.observe_load = record  # type: ignore[method-assign]
    anyio.run(r.main)
    assert r.dispatcher.ok == len(job.lengths)
    return r, polls


def _saturated(job: Job, server: ServerConfig) -> tuple[int, float]:
    """The server saturated by this dataset (every request sent at once, its own admission decides):
    (median running, decode tokens/s) over the middle of the run."""
    r, polls = _recorded(job, server, len(job.lengths))
    lo, hi = STEADY[0] * r.engine.now_s, STEADY[1] * r.engine.now_s
    mid = [p for p in polls if lo <= p[0] <= hi]
    return _median([p[1] for p in mid]), (mid[-1][2] - mid[0][2]) / (mid[-1][0] - mid[0][0])


def _single(job: Job, server: ServerConfig, steady_running: int) -> dict:
    """One dataset alone with the controller (the production single path)."""
    r, polls = _recorded(job, server, None)
    idle_polls = sum(1 for _, running, _ in polls if running < IDLE_BELOW * steady_running)
    return {"makespan_s": r.engine.now_s, "tokens": r.tokens, "idle_s": idle_polls * POLL_S,
            "retractions": r.engine.counters()["num_retracted_requests_total"]}


def _median(values: list[int]) -> int:
    return sorted(values)[len(values) // 2]


def _occupancy(running: int, in_flight: dict[str, int], steady: dict[str, int]) -> float:
    """Share of the server's steady capacity in use: a request of dataset k takes 1/steady_k of it,
    and the running requests are of the datasets in flight in their proportions."""
    total = sum(in_flight.values())
    if not total:
        return 0.0
    return running * sum(n / total / steady[k] for k, n in in_flight.items())


def _job(jobs: dict[str, Job], server: ServerConfig, steady: dict[str, int], interleave: bool,
         mix: bool = True) -> dict:
    r = _MultiRun(jobs, server, interleave, mix)
    anyio.run(r.main)
    assert [d.ok for d in r.dispatchers] == [len(j.lengths) for j in jobs.values()], "not exact"
    idle = sum(1 for _, running, flight in r.polls if _occupancy(running, flight, steady) < IDLE_BELOW)
    return {"makespan_s": r.engine.now_s, "tokens": r.tokens, "idle_s": idle * POLL_S,
            "retractions": r.engine.counters()["num_retracted_requests_total"]}


def run_bench(scale: int, startup_s: float) -> dict:
    server = SERVER_CONFIGS[SERVER]
    counts = {name: max(1, n // scale) for name, n in REFERENCE.items()}
    jobs = {name: Job.sample(LENGTH_PROFILES[name], n, SEED) for name, n in counts.items()}
    saturated = {name: _saturated(job, server) for name, job in jobs.items()}
    steady = {name: sat[0] for name, sat in saturated.items()}
    singles = {name: _single(job, server, steady[name]) for name, job in jobs.items()}
    for name, (running, rate) in saturated.items():
        singles[name].update(steady_running=running, saturated_tok_s=rate)
    a_gen = sum(s["makespan_s"] for s in singles.values())
    a = {"makespan_s": a_gen + len(jobs) * startup_s, "generation_s": a_gen,
         "idle_s": sum(s["idle_s"] for s in singles.values()) + len(jobs) * startup_s,
         "tokens": sum(s["tokens"] for s in singles.values())}
    ideal_gen = sum(s["tokens"] / s["saturated_tok_s"] for s in singles.values())
    out = {"scale": scale, "counts": counts, "startup_s": startup_s, "server": SERVER, "singles": singles,
           "a_sequential_runs": a, "ideal_generation_s": ideal_gen, "ideal_makespan_s": ideal_gen + startup_s}
    for key, interleave, mix in (("b_job", False, True), ("c_job_interleaved", True, True),
                                 ("d_job_one_estimate", False, False)):
        j = _job(jobs, server, steady, interleave, mix)
        j["generation_s"] = j["makespan_s"]
        j["makespan_s"] += startup_s
        j["idle_s"] += startup_s
        j["over_a"] = j["makespan_s"] / a["makespan_s"]
        j["over_ideal"] = j["makespan_s"] / out["ideal_makespan_s"]
        out[key] = j
    for key in ("a_sequential_runs", "b_job", "c_job_interleaved", "d_job_one_estimate"):
        out[key]["idle_share"] = out[key]["idle_s"] / out[key]["makespan_s"]
    b = out["b_job"]
    full_b = scale * b["generation_s"]
    full_a = full_b + (a_gen - b["generation_s"]) + len(jobs) * startup_s
    out["projection_full_scale"] = {"a_s": full_a, "b_s": full_b + startup_s, "ratio": (full_b + startup_s) / full_a}
    out["checks"] = {"b_le_0.9_a": b["over_a"] <= 0.9, "b_within_3pct_of_ideal": b["over_ideal"] <= 1.03}
    return out


def markdown(r: dict, elapsed_s: float, command: str) -> str:
    a, b, c, d = r["a_sequential_runs"], r["b_job"], r["c_job_interleaved"], r["d_job_one_estimate"]
    counts = ", ".join(f"{k} {v:,}" for k, v in r["counts"].items())
    rows = [[label, f"{x['makespan_s']:,.0f}", f"{x['generation_s']:,.0f}", f"{x['idle_share']:.1%}",
             f"{x['makespan_s'] / a['makespan_s']:.3f}", f"{x['makespan_s'] / r['ideal_makespan_s']:.3f}",
             f"{x.get('retractions', sum(s['retractions'] for s in r['singles'].values())):,}"]
            for label, x in (("(a) four runs, a server start each", a), ("(b) one job, sequential overlapped", b),
                             ("(c) one job, interleaved", c),
                             ("(d) = (b) with one length estimate for all datasets", d))]
    singles = [[n, f"{s['makespan_s']:,.0f}", f"{s['tokens']:,}", f"{s['saturated_tok_s']:,.0f}",
                s["steady_running"], f"{s['idle_s']:,.0f}"] for n, s in r["singles"].items()]
    checks = " ".join(("ok:" if v else "FAIL:") + k for k, v in r["checks"].items())
    p = r["projection_full_scale"]
    return (f"## Job: four datasets through one server lifetime (`python -m bench job`, simulated seconds)\n\n"
            f"`{command}` (wall {elapsed_s:.0f} s). The 88K reference mix divided by {r['scale']}: {counts}; "
            f"seed hardware profile, fp8_e4m3 KV {r['server']}, num_continuous_decode_steps 4; a server start "
            f"costs {r['startup_s']:.0f} s (SGLang PR #27139: 3-6+ min for large models, Qwen3-235B FP8 ~6.5 "
            f"min; Kimi-K2.5 is 2.5x that checkpoint). Idle = fewer running requests than "
            f"{IDLE_BELOW:.0%} of the steady state (per dataset: the median running count of the middle of a run "
            "that sends all its requests at once; a mix: in proportion to what is in flight); starts count as idle. "
            f"Ideal = one start + each dataset's tokens / its saturated decode rate (the decode tokens/s of that run) "
            "= "
            f"{r['ideal_makespan_s']:,.0f} s. Checks: {checks}.\n\n"
            + md_table(["run", "makespan s", "generation s", "GPU idle share", "/ (a)", "/ ideal", "retractions"],
                       rows)
            + f"\n\nAt full scale (x{r['scale']}) the starts weigh less. Projection (not a run): the job's generation "
            f"time x{r['scale']}, plus for (a) what its drains cost here "
            f"({a['generation_s'] - b['generation_s']:,.0f} s, "
            f"which does not grow with the counts) and {len(r['counts'])} starts: (a) {p['a_s']:,.0f} s, (b) "
            f"{p['b_s']:,.0f} s, ratio {p['ratio']:.3f}."
            + "\n\nWhere (b) is idle after its start: its first ramp (the controller's first wave of B1), B2's "
            "running count wavering around 0.9 of its steady state, and the B2 to B6 handover, where the server "
            "itself queues B6 requests (its admission reserves for the long B2 requests still decoding; the window "
            "is not the limit there); the makespan stays close to the ideal because the decode rate in those "
            "stretches is near saturation. Sequential and interleaved orders end within 1 %; sequential is the "
            "default (each dataset finishes, commits and unlocks before the next, and a kill leaves later "
            "datasets untouched). (d) shows what the per-dataset length estimates add over one rolling "
            "estimate: the live KV-per-request floor and the retraction guard already catch most of a "
            "B1 to B2 switch."
            + "\n\nSingle-dataset runs (the production single path):\n\n"
            + md_table(["dataset", "makespan s", "completion tokens", "saturated tok/s", "steady running",
                        "idle s"], singles))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=10, help="divide the reference counts by this (default 10)")
    parser.add_argument("--startup-s", type=float, default=600.0, help="one server start (default 600 s)")
    parser.add_argument("--quick", action="store_true", help="scale 200, nothing written")
    args = parser.parse_args(argv)
    scale = 200 if args.quick else args.scale
    started = time.monotonic()
    r = run_bench(scale, args.startup_s)
    elapsed = time.monotonic() - started
    flags = "" if (scale, args.startup_s) == (10, 600.0) else f" --scale {scale} --startup-s {args.startup_s:g}"
    text = markdown(r, elapsed, f"python -m bench job{flags}" if not flags else f"python -m bench.job_bench{flags}")
    print(text)
    if not args.quick:
        r["wall_s"] = round(elapsed, 1)
        write_section("job" if not flags else f"job_scale{scale}", r, text)
    return r


if __name__ == "__main__":
    main()
