"""`tune`'s trials: each candidate launched with an empty prefix cache, the job's next N prompts sent at once, its
greedy answers checked in round 1 as probe-kv does. Only the shipped profile's first trial writes into the store;
the others write into a copy taken before it (the same prompts), dropped once measured."""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.config.dataset import DatasetConfig
from gen_pipeline.errors import ConfigError, ServerError, first_known
from gen_pipeline.http import Http, open_http
from gen_pipeline.probe import core as PC
from gen_pipeline.probe import metrics as PM
from gen_pipeline.records import Prompt
from gen_pipeline.reports.status import read_status
from gen_pipeline.run.job import run_generate
from gen_pipeline.run.options import RunOptions
from gen_pipeline.server.handle import ServerHandle
from gen_pipeline.store.layout import dataset_folder
from gen_pipeline.store.shards import write_atomic
from gen_pipeline.store.telemetry import read_telemetry, runs_of
from gen_pipeline.tune.plan import Candidate, TuneOptions, TunePlan

NOISE_SHARE = 0.03  # one round: a candidate must beat the shipped profile by more than this (issue 34: 3 %)
REFUSED_LEVEL = "prefer-bf16"  # probe-kv's verdict past its caution thresholds (probe/metrics.py)
# what a tune run has measured (atomically after every trial), so a second run of the same plan does not redo it
STATE_NAME = "state.json"


@dataclass
class Outcome:
    candidate: Candidate
    tok_s: list[float] = field(default_factory=list)  # completion tokens / wall time, one per trial
    server_tok_s: list[float] = field(default_factory=list)  # the server's decode rate (median of its polls)
    check: str = "reference"  # the output check: probe-kv's figures on this candidate's greedy answers
    refused: bool = False

    @property
    def median(self) -> float:
        return statistics.median(self.tok_s) if self.tok_s else 0.0


@dataclass
class TuneResult:
    outcomes: list[Outcome]
    winner: Outcome
    noise: float
    kept: int  # samples the shipped profile's first trial wrote into the store


async def run_trials(cfg: DatasetConfig, tp: TunePlan, opts: TuneOptions,
                     say: Callable[[str], None] = print) -> TuneResult:
    """Every trial of `tp`; the outcomes and the winner. Raises ConfigError when the dataset has no prompt
    left, ServerError when a trial writes nothing."""
    work = dataset_folder(opts.output_root, cfg.name) / "tune"
    state = _open_state(cfg, tp, opts, work)
    outcomes = [Outcome(c) for c in (tp.shipped, *tp.candidates)]
    by_name = {o.candidate.name: o for o in outcomes}
    measured = {(t["round"], t["name"]) for t in state["trials"]}  # by an earlier run of this plan: not done again
    for t in state["trials"]:
        o = by_name[t["name"]]
        o.tok_s.append(t["tok_s"])
        o.server_tok_s += t["server_tok_s"]
        o.check, o.refused = (t["check"], t["refused"]) if t["round"] == 0 else (o.check, o.refused)
    if measured:
        say(f"  resuming: {len(measured)} trials of this plan measured before ({work / STATE_NAME})")
    probe = PC.ProbeOptions(output_root=opts.output_root, samples=opts.probe_prompts,
                            max_new_tokens=opts.probe_max_new_tokens)
    target = min(cfg.target_samples, state["seed_done"] + tp.prompts)
    async with open_http(cfg.generation, 2 * tp.prompts + 2 * probe.concurrency + 8) as http:
        trials = _Trials(http, cfg, replace(cfg, target_samples=target), probe, work, tp.shipped.name)
        trials.sides = load_sides(state["reference"], trials.prompts)
        try:
            for r in range(tp.rounds):
                order = outcomes[r % len(outcomes):] + outcomes[:r % len(outcomes)]  # round 0: shipped first
                for o in (o for o in order if not o.refused and (r, o.candidate.name) not in measured):
                    # into the store unless an interrupted shipped trial wrote some: then into a copy too, so it
                    # measures the same prompts as the others
                    into = opts.output_root if r == 0 and o is outcomes[0] and read_status(
                        opts.output_root, cfg.name, cfg.target_samples).done == state["seed_done"] \
                        else _scratch(work / "seed", work / "run")
                    line = await trials.run(o, r, into)
                    state["trials"].append({"round": r, "name": o.candidate.name, "tok_s": o.tok_s[-1],
                                            "server_tok_s": o.server_tok_s[-1:], "check": o.check,
                                            "refused": o.refused})
                    state["reference"] = dump_sides(trials.sides)
                    save_state(work, state)
                    say(line)  # once recorded: a run stopped after this line does not measure the trial again
        except BaseExceptionGroup as group:
            raise first_known(group) from None
    for done in ("seed", "run"):  # every trial measured: the copies are not needed again
        shutil.rmtree(work / done, ignore_errors=True)
    kept = read_status(opts.output_root, cfg.name, cfg.target_samples).done - state["seed_done"]
    return pick_winner(outcomes, kept)


def _open_state(cfg: DatasetConfig, tp: TunePlan, opts: TuneOptions, work: Path) -> dict[str, Any]:
    """This plan's state from an earlier run (STATE_NAME: the trials measured, seed_done, the shipped profile's
    greedy answers), or a fresh one with the store copied to seed/. ConfigError when the dataset is at its target."""
    key = {"shipped": tp.shipped.name, "candidates": [c.name for c in tp.candidates], "prompts": tp.prompts,
           "rounds": tp.rounds, "probe_prompts": opts.probe_prompts, "probe_max_new_tokens": opts.probe_max_new_tokens}
    try:
        state = orjson.loads((work / STATE_NAME).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        state = None
    if isinstance(state, dict) and state.get("key") == orjson.loads(orjson.dumps(key)):  # not another plan's
        return state
    before = read_status(opts.output_root, cfg.name, cfg.target_samples)
    if before.done >= cfg.target_samples:
        raise ConfigError(f"tune: {cfg.name} is already at its target ({before.done:,} samples); tune measures on "
                          "the job's next prompts, so there is nothing left to measure on.")
    for stale in ("seed", "run"):
        shutil.rmtree(work / stale, ignore_errors=True)
    src = dataset_folder(opts.output_root, cfg.name)
    if src.is_dir():  # the store as it is before the first trial: every trial then does the same prompts
        shutil.copytree(src, work / "seed" / cfg.name, ignore=shutil.ignore_patterns(".lock", "tune"))
    state = {"key": key, "seed_done": before.done, "trials": [], "reference": []}
    save_state(work, state)
    return state


def save_state(folder: Path, state: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / STATE_NAME, orjson.dumps(state, option=orjson.OPT_INDENT_2))


def dump_sides(sides: list[PC.RefSide]) -> list[dict[str, Any]]:
    def pos(ps: list[PM.Position]) -> list[Any]:
        return [[p.token, p.logprob, [list(t) for t in p.top]] for p in ps]
    return [{"id": s.prompt.id, "ids": s.ids, "free": pos(s.free), "forced": pos(s.forced)} for s in sides]


def load_sides(rows: list[dict[str, Any]], prompts: list[Prompt]) -> list[PC.RefSide]:
    """dump_sides' rows back, each with its prompt of `prompts` (the probe's, loaded again by id)."""
    by_id = {p.id: p for p in prompts}

    def pos(rows: list[Any]) -> list[PM.Position]:
        return [PM.Position(t, lp, tuple((float(a), int(b)) for a, b in top)) for t, lp, top in rows]
    return [PC.RefSide(by_id[r["id"]], r["ids"], pos(r["free"]), pos(r["forced"])) for r in rows if r["id"] in by_id]


class _Trials:
    """What every trial shares: the HTTP session, the trial's dataset config (its target: the next N
    prompts), the probe settings and prompts, the shipped profile's greedy answers once it has run."""

    def __init__(self, http: Http, cfg: DatasetConfig, trial_cfg: DatasetConfig, probe: PC.ProbeOptions, work: Path,
                 shipped: str) -> None:
        self.http, self.cfg, self.trial_cfg, self.probe, self.work, self.shipped = (
            http, cfg, trial_cfg, probe, work, shipped)
        self.prompts = PC.load_prompts(cfg, probe.samples)  # also loads the source before the first trial's clock
        self.sides: list[PC.RefSide] = []

    async def run(self, o: Outcome, r: int, root: Path) -> str:
        """One candidate's trial in round r: launch, flush, generate, measure; round 0 also checks its answers.
        Returns the trial's line."""
        c, name = o.candidate, self.cfg.name
        async with PC.open_server(c.profile, c.name, self.work / "logs" / c.name, self.http) as h:
            url = h.base_urls[0]
            await self.http.post_json(url + "/flush_cache", {})  # SGLang's: the prefix cache empty for each trial
            tokens0 = read_status(root, name, None).completion_tokens
            started = time.monotonic()
            summary = await run_generate(self.trial_cfg, RunOptions(output_root=root, server_urls=(url,),
                                                                     window=self.trial_cfg.target_samples))
            elapsed = time.monotonic() - started
            if summary.stopped_by in ("SIGINT", "SIGTERM", "SIGHUP"):  # the job drained on a signal: so does tune
                raise KeyboardInterrupt
            tokens = read_status(root, name, None).completion_tokens - tokens0
            if summary.written == 0 or tokens <= 0:
                raise ServerError(f"tune: the trial of {c.name} wrote no sample ({summary.line()}); see its server "
                                  f"log in {self.work / 'logs' / c.name}.")
            o.tok_s.append(tokens / elapsed)
            # the server's steady decode rate: the median of the gen_tok_s (SGLang's gen_throughput) its load polls
            # read over this run (telemetry.jsonl); none when no poll saw one
            runs = runs_of(read_telemetry(dataset_folder(root, name)))
            if rates := [x["gen_tok_s"] for x in (runs[-1] if runs else []) if x.get("gen_tok_s")]:
                o.server_tok_s.append(statistics.median(rates))
            if r == 0:
                await self._check(h, o)
        return (f"  round {r + 1}: {c.name}: {tokens:,} completion tokens in {elapsed:.1f} s = "
                f"{tokens / elapsed:,.0f} tok/s" + (f"; refused: {o.check}" if o.refused else ""))

    async def _check(self, h: ServerHandle, o: Outcome) -> None:
        """The shipped profile: its greedy answers (the reference). A candidate: probe-kv's comparison with
        them; refused past probe-kv's caution thresholds."""
        http, probe = self.http, self.probe
        if not self.sides:
            done, _ = await PC.each_prompt(self.prompts, [p.id for p in self.prompts], probe,
                                           lambda p: PC.reference_side(http, h, p, self.cfg, probe))
            if not done:
                raise ServerError(f"tune: the shipped profile {o.candidate.name} answered none of the probe prompts.")
            self.sides.extend(done)
            return
        results, _ = await PC.each_prompt(self.sides, [s.prompt.id for s in self.sides], probe,
                                          lambda side: PC.compare_side(http, h, side, probe))
        agg = PM.aggregate(results)
        level, _ = PM.verdict(agg)  # probe-kv's thresholds decide; the line names the candidate, not a KV dtype
        o.refused = level == REFUSED_LEVEL
        figures = (f"top-1 changes on {100 * agg['top1_change_share']:.2f} % of {agg['positions']:,} positions, "
                   f"mean KL >= {agg['kl_mean']:.4f} nats, {100 * agg['exact_match_share']:.0f} % of "
                   f"{agg['prompts']} greedy answers equal")
        o.check = (f"its answers differ from {self.shipped}'s: {figures} (probe-kv's limits: top-1 change <= "
                   f"{100 * PM.TOP1_CAUTION:g} %, mean KL <= {PM.KL_CAUTION:g} nats)" if o.refused
                   else f"{level}: {figures}")


def _scratch(seed: Path, root: Path) -> Path:
    """A fresh copy of the store as it was before the first trial (empty when there was none)."""
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(seed, root) if seed.is_dir() else root.mkdir(parents=True)
    return root


def pick_winner(outcomes: list[Outcome], kept: int) -> TuneResult:
    """The winner: the fastest accepted candidate when it beats the shipped profile by more than the noise
    (its own spread over rounds, at least NOISE_SHARE), else the shipped profile."""
    shipped = outcomes[0]
    spread = (max(shipped.tok_s) - min(shipped.tok_s)) / shipped.median if len(shipped.tok_s) > 1 else 0.0
    noise = max(NOISE_SHARE, spread)
    best = max((o for o in outcomes[1:] if not o.refused), key=lambda o: o.median, default=shipped)
    winner = best if best.median > shipped.median * (1 + noise) else shipped
    return TuneResult(outcomes, winner, noise, kept)
