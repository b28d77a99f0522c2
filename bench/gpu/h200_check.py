"""The GPU check (issue 9): real SGLang on a CUDA machine, driven by gen_pipeline, one results file.

    python -m bench.gpu.h200_check --work DIR PHASE [PHASE ...]     (bench/gpu/run_h200.sh runs it)

Phases, in order: setup (configs + prompts), serve (start the bf16 server of profile "h200" with the
launcher's command builder, detached), sweep (fixed windows on it, attach mode), adaptive, regimes
(issue 19: short and long outputs, interleaved clients, three rounds, traces.json), ceiling (issue 34:
gen_pipeline against SGLang's bench_serving and offline engine on the regimes' prompts), kill
(kill -9 twice + resume), unserve, launch (full launcher, fp8_e4m3 KV profile), frontend (a launched
--server-profile, then `diagnose`: the telemetry's front_end_cpu and the rules it names), starved
(--max-total-tokens 20000: fixed 256 and adaptive), probe (issue 16: bf16 and fp8 servers side by
side, `gen-pipeline probe-kv`), tune (issue 34: `gen-pipeline tune`, bench/gpu/tune_check.py),
summary. Results accumulate in DIR/results.json across calls, so the
phases can be split over several commands. `--sim` runs every phase against the simulator.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from bench.gpu import ceiling, regimes, runs, servers, tokenids, tune_check
from bench.gpu.setup import DATASET, PROMPTS, SHORT_DATASET, SPEC_DATASET, SPEC_STEPS, write_configs
from gen_pipeline.server.load import metric_values
from gen_pipeline.store.telemetry import read_telemetry

FIXED_WINDOWS = (32, 64, 128, 256)
PHASES = ("setup", "serve", "sweep", "adaptive", "regimes", "ceiling", "tokenids", "kill", "unserve", "launch",
          "frontend", "spec", "starved", "probe", "tune", "summary")


class Check:
    def __init__(self, work: Path, sim: bool, prompts: int, deadline: float, kill_after_s: float = 8.0):
        self.work, self.sim, self.prompts, self.deadline = work, sim, prompts, deadline
        self.kill_after_s = kill_after_s
        self.cfg, self.logs, self.out = work / "cfg", work / "logs", work / "out"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.path = work / "results.json"
        self.results = json.loads(self.path.read_text()) if self.path.exists() else {}

    def save(self) -> None:
        self.path.write_text(json.dumps(self.results, indent=1) + "\n")

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def log(self, msg: str) -> None:
        print(f"[h200_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    # ---- servers kept across phases (and across calls: their pid/url live in results.json)
    def server(self, key: str) -> servers.Server | None:
        d = self.results.get("servers", {}).get(key)
        if not d or not servers.alive(d["pid"]):
            return None
        return servers.Server(d["name"], d["url"], d["pid"], Path(d["log"]), d.get("ready_s", 0.0))

    def keep(self, key: str, s: servers.Server | None) -> None:
        self.results.setdefault("servers", {})[key] = s.to_dict() if s else None
        self.save()

    def ensure(self, key: str, profile: str) -> servers.Server:
        s = self.server(key)
        if s is None:
            self.log(f"starting {profile}")
            s = servers.start(self.cfg, profile, self.logs)
            self.log(f"{profile} ready after {s.ready_s:.0f} s at {s.url}")
            self.keep(key, s)
        return s

    def leftovers(self) -> list[str]:
        """Server processes of ours still alive (their command line names our model)."""
        return servers.leftover_processes((self.results.get("model_path") or str(self.work / "model"),))

    # ---- phases
    def setup(self) -> None:
        model = str(self.work / "model") if not self.sim else "sim/h200-random-1.2b"
        write_configs(self.work, model, sim=self.sim, time_scale=self.results.get("time_scale", 1.0),
                      prompts=self.prompts)
        self.results.update({"prompts": self.prompts, "sim": self.sim, "dataset": DATASET, "model_path": model,
                             "date": time.strftime("%Y-%m-%d", time.gmtime())})
        for key, folder in (("model", "model"), ("small_model", "model-small")):
            if (info := self.work / folder / "bench_model.json").exists():
                self.results[key] = json.loads(info.read_text())
        self.save()

    def serve(self) -> None:
        s = self.ensure("main", "h200")
        self.results["serve"] = {"ready_s": round(s.ready_s, 1), "capacity": capacity_line(s.log)}
        self.save()

    def measured(self, name: str, s: servers.Server, *args: str, expected: int | None = None,
                 watch: bool = True) -> dict:
        """One attach-mode run into a fresh output folder, cache flushed first; its figures."""
        out = self.out / name
        servers.flush_cache(s)
        poller = MetricsPoller(s.url) if watch else None
        run = runs.run_cli(name, runs.cli_argv(self.cfg, out, "--server-url", s.url, *args), self.logs)
        figures = runs.read_outputs(out / DATASET)
        row = {"rc": run.rc, "dispatch_s": round(run.dispatch_s, 2), "wall_s": round(run.wall_s, 1),
               **figures, "tok_s": round(figures["completion_tokens"] / max(run.dispatch_s, 1e-6), 1),
               "controller": run.controller_figures()}
        if poller:
            row["server_metrics"] = poller.stop()
        if expected is not None and figures["rows"] != expected:
            row["warning"] = f"{figures['rows']} rows, expected {expected}"
        self.log(f"{name}: {row['rows']} rows, {row['tok_s']:.0f} tok/s in {row['dispatch_s']:.1f} s (rc {run.rc})")
        return row

    def sweep(self) -> None:
        s = self.ensure("main", "h200")
        res = self.results.setdefault("sweep", {})
        for n in (*FIXED_WINDOWS, self.prompts):
            key = "all" if n == self.prompts else str(n)
            if key not in res:
                res[key] = self.measured(f"fixed-{key}", s, "--window", str(n), expected=self.prompts)
                self.save()
        self.results["lengths"] = runs.lengths(self.out / "fixed-128" / DATASET)  # replayed by bench/sim_vs_real.py
        self.save()

    def adaptive(self, count: int = 4, min_left_s: float = 60.0) -> None:
        s = self.ensure("main", "h200")
        res = self.results.setdefault("adaptive", [])
        while len(res) < count and (len(res) < 3 or self.left_s() > min_left_s):
            res.append(self.measured(f"adaptive-{len(res) + 1}", s, expected=self.prompts))
            self.save()

    def regimes(self) -> None:
        """Issue 19: short and long outputs, fixed / all at once / adaptive interleaved, three rounds,
        per-second traces (bench/gpu/regimes.py); resumable across calls within --budget-s."""
        regimes.run_phase(self, getattr(self, "rounds", regimes.ROUNDS))

    def ceiling(self) -> None:
        """Issue 34: gen_pipeline against SGLang's own HTTP client at full rate and its offline engine on the
        regimes' server, prompts and sampling, interleaved rounds (bench/gpu/ceiling.py); resumable."""
        ceiling.run_phase(self, getattr(self, "rounds", ceiling.ROUNDS))

    def tokenids(self) -> None:
        """Issue 21: SGLang's own prompt/output token ids against the rendered tokens path
        (bench/gpu/tokenids.py)."""
        tokenids.run_phase(self)

    def kill(self) -> None:
        s = self.ensure("main", "h200")
        out, name = self.out / "kill", "kill"
        argv = runs.cli_argv(self.cfg, out, "--server-url", s.url)
        servers.flush_cache(s)
        attempts = []
        for i in (1, 2):
            r = runs.run_cli(f"{name}-{i}", argv, self.logs, kill_after_s=self.kill_after_s)
            attempts.append({"killed": r.killed, "rc": r.rc, "rows_after": runs.read_outputs(out / DATASET)["rows"]})
        r = runs.run_cli(f"{name}-resume", argv, self.logs)
        expected = {f"p{i:05d}" for i in range(self.prompts)}
        figures = runs.read_outputs(out / DATASET, expected)
        self.results["kill"] = {"attempts": attempts, "resume_rc": r.rc, **figures,
                                "validate": runs.validate(self.cfg, out), "summary": r.lines[-1][1] if r.lines else ""}
        self.log(f"kill: {figures['rows']} rows, {figures['duplicates']} duplicates, {figures['missing']} missing")
        self.save()

    def unserve(self) -> None:
        for key in list(self.results.get("servers", {})):
            s = self.server(key)
            if s is not None:
                servers.stop(s)
            self.keep(key, None)

    def launch(self, limit: int = 600) -> None:
        out = self.out / "launch"
        r = runs.run_cli("launch", runs.cli_argv(self.cfg, out, "--server", "h200-fp8", "--limit", str(limit)),
                         self.logs)
        time.sleep(2.0)
        log = out / DATASET / "server.log"
        figures = runs.read_outputs(out / DATASET)
        ready = [ln for _, ln in r.lines if ln.startswith("SGLang ready after")]
        self.results["launch"] = {
            "rc": r.rc, "rows": figures["rows"], "limit": limit, "duplicates": figures["duplicates"],
            "ready_line": ready[0] if ready else None, "ready_s": r.controller_figures()["ready_s_reported"],
            "capacity_logged": capacity_line(log), "fp8_warning": grep(log, "scaling factors"),
            "leftover_processes": self.leftovers(), "gpu_apps": gpu_apps(),
            "summary": r.lines[-1][1] if r.lines else ""}
        self.log(f"launch: {self.results['launch']['ready_line']}; rows {figures['rows']}/{limit}")
        self.save()

    def frontend(self, limit: int = 1500) -> None:
        """diagnose's front_end_bound on a server the CLI launches (--server-profile; h200-small-i1: the small
        model at --stream-interval 1, where SGLang's front end bound the H100; h200-small-i1-tw4: the same with 4
        tokenizer workers): `limit` short prompts, then `diagnose`; the telemetry's front_end_cpu figures and
        the rules it names, under results["frontend"][profile]."""
        out = self.out / f"frontend-{self.server_profile}"
        r = runs.run_cli("frontend", runs.cli_argv(self.cfg, out, "--server", self.server_profile, "--limit",
                                                   str(limit), dataset=SHORT_DATASET), self.logs)
        d = subprocess.run([os.environ.get("BENCH_PYTHON", sys.executable), "-m", "gen_pipeline", "diagnose",
                            "--dataset", SHORT_DATASET, "--output-dir", str(out), "--config-dir", str(self.cfg)],
                           capture_output=True, text=True, timeout=120)
        rows = read_telemetry(out / SHORT_DATASET)
        self.results.setdefault("frontend", {})[self.server_profile] = {
            "rc": r.rc, "profile": self.server_profile, "limit": limit, "diagnose_rc": d.returncode,
            "diagnose": d.stdout.splitlines(), "rules": [ln.split(":")[0] for ln in d.stdout.splitlines()[1:]
                                                          if ln and not ln.startswith(" ")],
            "front_end_cpu": [row.get("front_end_cpu") for row in rows], "front_end_meter": "busiest",
            "client_cpu": [row.get("client_cpu") for row in rows], "gen_tok_s": [row.get("gen_tok_s") for row in rows],
            "summary": r.lines[-1][1] if r.lines else ""}
        rules = self.results["frontend"][self.server_profile]["rules"]
        self.log(f"frontend {self.server_profile}: rc {r.rc}; diagnose names {', '.join(rules) or 'nothing'}")
        self.save()

    def spec(self) -> None:
        """Issue 34: speculative decoding through the launcher (profile h200-spec: STANDALONE, the target as its
        own draft, greedy whole answers): each turn's acceptance as written, and what `status --json` says."""
        out = self.out / "spec"
        r = runs.run_cli("spec", runs.cli_argv(self.cfg, out, "--server", "h200-spec", dataset=SPEC_DATASET),
                         self.logs)
        turns = [t for row in runs.sample_rows(out / SPEC_DATASET) for t in row["meta"]["per_turn"]]
        accept = [t["spec_accept_length"] for t in turns if "spec_accept_length" in t]
        status = subprocess.run([os.environ.get("BENCH_PYTHON", sys.executable), "-m", "gen_pipeline", "status",
                                 "--json", "--output-dir", str(out), "--config-dir", str(self.cfg)],
                                capture_output=True, text=True, timeout=120)
        try:
            shown = json.loads(status.stdout)["datasets"][SPEC_DATASET].get("spec_acceptance")
        except (ValueError, KeyError, TypeError):
            shown = {"status_rc": status.returncode, "stderr": status.stderr[-500:]}
        log = out / SPEC_DATASET / "server.log"
        self.results["spec"] = {
            "rc": r.rc, "rows": len(turns), "turns_with_acceptance": len(accept), "expected_accept_length":
            SPEC_STEPS + 1, "accept_length_median": statistics.median(accept) if accept else None,
            "accept_length_min": min(accept, default=None), "accept_length_max": max(accept, default=None),
            "verify_ct_total": sum(t.get("spec_verify_ct", 0) for t in turns),
            "completion_tokens_total": sum(t["completion_tokens"] for t in turns), "status_spec_acceptance": shown,
            "ready_line": next((ln for _, ln in r.lines if ln.startswith("SGLang ready after")), None),
            "server_log_accept": grep(log, "accept len", limit=3), "summary": r.lines[-1][1] if r.lines else "",
            "leftover_processes": self.leftovers()}
        self.log(f"spec: rc {r.rc}, {len(accept)}/{len(turns)} turns with an acceptance, median "
                 f"{self.results['spec']['accept_length_median']}, status: {shown}")
        self.save()

    def starved(self, limit: int = 1000) -> None:
        """--max-total-tokens 20000: fixed 256 and adaptive; if SGLang retracted nothing, once more with
        its optimistic admission (--schedule-conservativeness 0.3), fixed 256 only."""
        res = self.results.setdefault("starved", {})
        for profile, clients in (("h200-starved", ("fixed-256", "adaptive")), ("h200-starved-eager", ("fixed-256",))):
            if profile != "h200-starved" and any(retracted(v) for v in res.values() if isinstance(v, dict)):
                break
            if self.left_s() < 90:
                self.log(f"skipping {profile}: {self.left_s():.0f} s left")
                break
            s = self.ensure(profile, profile)
            res.setdefault(f"{profile} capacity", capacity_line(s.log))
            for client in clients:
                key = client if profile == "h200-starved" else f"eager {client}"
                if key not in res and self.left_s() > 45:
                    args = ("--window", "256") if client == "fixed-256" else ()
                    res[key] = self.measured(f"starved-{key.replace(' ', '-')}", s, *args, "--limit", str(limit))
                    self.save()
            res[f"{profile} retract_log_lines"] = grep(s.log, "Retract")
            servers.stop(s)
            self.keep(profile, None)
            self.save()

    def probe(self, samples: int = 200) -> None:
        if not probe_available():
            self.results["probe"] = {"skipped": "gen-pipeline has no probe-kv subcommand in this checkout"}
            self.save()
            return
        pair = self._start_pair(("probe-bf16", "probe-fp8"))
        for key, s in zip(("probe-bf16", "probe-fp8"), pair, strict=False):
            self.keep(key, s)
        self.results["probe"] = {**self._probe_kv("probe", samples, pair[0].url, pair[1].url),
                                 "ready_s": [round(s.ready_s, 1) for s in pair],
                                 "fp8_warning": grep(pair[1].log, "scaling factors")}
        self.save()
        if self.left_s() > 120:  # the noise floor: the bf16 server against itself
            self.results["probe_floor"] = self._probe_kv("probe-floor", samples, pair[0].url, pair[0].url,
                                                         "--allow-same-kv")
            self.save()
        for key, s in zip(("probe-bf16", "probe-fp8"), pair, strict=False):
            servers.stop(s)
            self.keep(key, None)

    def tune(self) -> None:
        """Issue 34: `gen-pipeline tune` over --levers on the short regime's prompts (--tune-prompts a trial),
        --rounds rounds on --server-profile; judged by tune_check.verdict. Goes on from tune's state file."""
        out, profile = self.out / "tune", self.server_profile
        model = None if self.sim else Path(self.results.get("model_path") or self.work / "model")
        argv = tune_check.tune_argv(self.cfg, out, SHORT_DATASET, profile, self.levers, self.rounds,
                                    self.tune_prompts, model)
        rc, lines = tune_check.run_until(argv, self.logs / "cli-tune.log", self.left_s, self.log,
                                         lambda: tune_check.trials_left(tune_check.read_state(out, SHORT_DATASET)))
        state = tune_check.read_state(out, SHORT_DATASET)
        v = tune_check.verdict(state) if state else {"rounds": 0}
        written = sorted((out / SHORT_DATASET / "tune").glob("*-tuned.toml"))
        self.results["tune"] = {"rc": rc, "command": " ".join(argv[1:]), "profile": profile, "levers": self.levers,
                                "prompts": self.tune_prompts, "plan": lines[:12], "table": lines[-12:],
                                "written": written[0].read_text() if written and rc == 0 else None,
                                "trials": state["trials"] if state else [], "verdict": v}
        self.log(tune_check.summary_line(v) if state else f"tune: rc {rc}, no state written")
        self.save()

    def _probe_kv(self, name: str, samples: int, ref_url: str, cmp_url: str, *more: str) -> dict:
        out = self.out / name
        argv = [os.environ.get("BENCH_PYTHON", sys.executable), "-m", "gen_pipeline", "probe-kv", "--dataset",
                str(self.cfg / f"{DATASET}.toml"), "--config-dir", str(self.cfg), "--output-dir", str(out),
                "--samples", str(samples), "--server-url", ref_url, "--compare-url", cmp_url, *more]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=max(60, self.left_s() - 30))
        (self.logs / f"cli-{name}.log").write_text(" ".join(argv) + "\n" + p.stdout + p.stderr)
        reports = {str(f.relative_to(out)): json.loads(f.read_text()) for f in sorted(out.rglob("probe*.json"))}
        self.log(f"{name}: rc {p.returncode}")
        return {"rc": p.returncode, "command": " ".join(argv[1:]), "reports": reports,
                "stdout_tail": (p.stdout + p.stderr).strip().splitlines()[-15:]}

    def _start_pair(self, profiles: tuple[str, str]) -> list[servers.Server]:
        """Both at once (half the wait); one that fails to start beside the other is started again alone."""
        started = time.monotonic()
        spawned = [servers.spawn(self.cfg, p, self.logs) for p in profiles]
        ready = []
        for s in spawned:
            try:
                ready.append(servers.wait_ready(s, started))
            except RuntimeError as e:
                self.log(f"{s.name} did not start beside the other ({str(e)[:200]}); again, alone")
                servers.stop(s)
                ready.append(servers.start(self.cfg, s.name, self.logs))
        return ready

    def summary(self) -> None:
        self.results["summary"] = summarize(self.results)
        self.results["leftover_at_end"] = self.leftovers()
        self.save()
        print(json.dumps(self.results["summary"], indent=1), flush=True)


class MetricsPoller:
    """Polls /metrics once a second in a thread: running/queued medians and the largest retraction,
    KV and ratio figures the server showed during a run."""

    NAMES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_retracted_reqs",
             "sglang:num_retracted_requests_total", "sglang:num_paused_reqs", "sglang:token_usage",
             "sglang:new_token_ratio", "sglang:gen_throughput")

    def __init__(self, url: str):
        self.url, self.series, self._stop = url, {}, threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                values = metric_values(httpx.get(self.url + "/metrics", timeout=5.0).text)
                for name in self.NAMES:
                    if name in values:
                        self.series.setdefault(name, []).append(sum(values[name].values()))
            except httpx.HTTPError:
                pass
            self._stop.wait(1.0)

    def stop(self) -> dict:
        self._stop.set()
        self._t.join(timeout=10)
        out = {f"max {k}": round(max(v), 4) for k, v in sorted(self.series.items())}
        for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput"):
            if self.series.get(name):
                out[f"median {name}"] = round(statistics.median(self.series[name]), 1)
        out["samples"] = max((len(v) for v in self.series.values()), default=0)
        return out


def summarize(r: dict) -> dict:
    sweep = {k: v["tok_s"] for k, v in r.get("sweep", {}).items()}
    adaptive = [a["tok_s"] for a in r.get("adaptive", [])]
    out: dict = {"fixed_tok_s": sweep, "adaptive_tok_s": adaptive}
    if sweep and adaptive:
        best = max(sweep, key=sweep.get)
        out.update(best_fixed=best, adaptive_median=statistics.median(adaptive),
                   adaptive_over_best_fixed=round(statistics.median(adaptive) / sweep[best], 3))
    k = r.get("kill")
    if k:
        out["kill"] = {x: k.get(x) for x in ("rows", "duplicates", "missing", "unparseable", "empty_assistant_turns")}
    st = r.get("starved", {})
    out["retraction"] = {name: {"controller_saw": run["controller"]["retracted_max"],
                                "server_counter_max": (run.get("server_metrics") or {}).get(
                                    "max sglang:num_retracted_requests_total")}
                         for name, run in st.items() if isinstance(run, dict) and "controller" in run}
    if r.get("launch"):
        out["launch_ready_s"] = r["launch"].get("ready_s")
    if r.get("regimes"):
        out["regimes"] = regimes.summarize_regimes(r["regimes"]["runs"])
    if r.get("ceiling", {}).get("runs"):
        out["ceiling"] = ceiling.headline(ceiling.summarize_ceiling(r["ceiling"]["runs"]))
    return out


def retracted(run: dict) -> bool:
    """Did SGLang retract during this run (its counter or gauge), as the /metrics poller saw it?"""
    m = run.get("server_metrics") or {}
    return bool(m.get("max sglang:num_retracted_requests_total") or m.get("max sglang:num_retracted_reqs"))


def capacity_line(log: Path) -> str | None:
    hits = grep(log, "max_total_num_tokens=")
    return hits[-1] if hits else None


def grep(path: Path, needle: str, limit: int = 5) -> list[str]:
    try:
        lines = [ln.strip()[:300] for ln in path.read_text(errors="replace").splitlines() if needle in ln]
    except OSError:
        return []
    return lines[:limit] + ([f"... {len(lines)} lines in all"] if len(lines) > limit else [])


def gpu_apps() -> list[str] | None:
    try:
        p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        return [ln for ln in p.stdout.splitlines() if ln.strip()]
    except (OSError, subprocess.TimeoutExpired):
        return None


def probe_available() -> bool:
    from gen_pipeline import cli
    return "probe-kv" in cli.COMMANDS or "probe_kv" in cli.COMMANDS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("phases", nargs="+", choices=PHASES)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--sim", action="store_true", help="the simulator instead of SGLang (a dry run)")
    p.add_argument("--prompts", type=int, default=PROMPTS)
    p.add_argument("--time-scale", type=float, default=None, help="simulator speed-up (with --sim)")
    p.add_argument("--budget-s", type=float, default=570.0, help="optional runs are skipped past this")
    p.add_argument("--kill-after-s", type=float, default=8.0, help="kill phase: SIGKILL this long into a run")
    p.add_argument("--regimes", default="short,long",
                   help="regimes/ceiling: which regimes, in the order each round starts with (e.g. long,short)")
    p.add_argument("--rounds", type=int, default=regimes.ROUNDS, help="regimes/ceiling: interleaved rounds")
    p.add_argument("--short-prompts", type=int, default=regimes.SHORT_PROMPTS,
                   help=f"regimes/ceiling: prompts of a short-regime run (at most {regimes.SHORT_PROMPTS})")
    p.add_argument("--long-prompts", type=int, default=regimes.LONG_PROMPTS,
                   help=f"regimes/ceiling: prompts of a long-regime run (at most {regimes.LONG_PROMPTS_MAX})")
    p.add_argument("--server-profile", default="h200",
                   choices=("h200", "h200-ceiling", "h200-small", "h200-small-i1", "h200-small-i1-tw4",
                            "h200-small-fast"),
                   help="regimes/ceiling: the server.toml profile they run on (h200-ceiling: 120K fp8 KV tokens, "
                        "issue 34's short regime past the CUDA-graph ceiling; h200-small: the small, fast model; "
                        "-i1: the same at --stream-interval 1; -i1-tw4: and 4 tokenizer workers; -fast: 1,024 "
                        "running, 800K KV tokens, 4 tokenizer workers)")
    p.add_argument("--clients", default=None,
                   help="regimes phase: only these clients, comma-separated (fixed-128, fixed-40, all, adaptive); "
                        "ceiling phase: gen_pipeline, bench_serving, offline (each phase runs the ones it knows)")
    p.add_argument("--levers", default="cuda_graph_max_bs,tokenizer_worker_num",
                   help="tune phase: the levers gen-pipeline tune tries (comma-separated)")
    p.add_argument("--tune-prompts", type=int, default=1500, help="tune phase: prompts per trial")
    p.add_argument("--offline-alone", action="store_true",
                   help="ceiling phase: stop the server for each offline-engine run (first in each round) instead of "
                        "running the engine beside the idle server")
    args = p.parse_args(argv)
    clients = frozenset(c for c in args.clients.split(",") if c) if args.clients else None
    known = ({c for spec in regimes.REGIMES.values() for c in spec.clients} | set(ceiling.CLIENTS)
             | set(ceiling.EXTRA_CLIENTS))
    if clients is not None and not clients <= known:
        p.error(f"--clients: unknown {', '.join(sorted(clients - known))} (known: {', '.join(sorted(known))})")
    check = Check(args.work, args.sim, args.prompts, time.monotonic() + args.budget_s, args.kill_after_s)
    check.regimes_order = [r for r in args.regimes.split(",") if r]
    check.short_prompts = min(args.short_prompts, regimes.SHORT_PROMPTS)
    check.rounds = args.rounds
    check.long_prompts = min(args.long_prompts, regimes.LONG_PROMPTS_MAX)
    check.clients = clients
    check.server_profile = args.server_profile
    check.offline_alone = args.offline_alone
    check.levers, check.tune_prompts = args.levers, args.tune_prompts
    if args.time_scale:
        check.results["time_scale"] = args.time_scale
    for phase in args.phases:
        check.log(f"phase {phase} ({check.left_s():.0f} s left)")
        try:
            getattr(check, phase)()
        except Exception as e:  # record and go on: one failed phase must not lose the others' figures
            check.results.setdefault("errors", {})[phase] = f"{type(e).__name__}: {e}"[:2000]
            check.save()
            check.log(f"phase {phase} failed: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
