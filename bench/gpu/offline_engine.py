"""SGLang's offline engine for the ceiling phase (issue 34): `sglang.Engine`, no HTTP, SGLang's own batching.

    python -m bench.gpu.offline_engine FLAGS_JSON           (bench/gpu/ceiling.py starts it; GPU only)

FLAGS_JSON: the server profile's `sglang.launch_server` flags (gen_pipeline.server.command.build_command),
parsed by SGLang's own ServerArgs parser as `python -m sglang.bench_offline_throughput` parses them, so the
engine runs with the server's exact settings. One engine serves every offline run of a phase call (its
start, ~1 min, is paid once): each line on stdin is a JSON job {"prompts": FILE of token-id lists,
"sampling": SGLang sampling params, "result": FILE}; the engine's prefix cache is flushed, then all prompts go
in one `Engine.generate` call, timed as bench_offline_throughput's throughput_test_once times it
(perf_counter around generate), and the result is written to "result" (output_throughput = completion
tokens / that time). A job with "warmup": true warms up as bench_offline_throughput does (the first 16
prompts, 16 new tokens; the driver sends it once, before the first measured job, so its decode lines stay
out of that job's); {"quit": true} shuts the engine down.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

WARMUP_PROMPTS, WARMUP_TOKENS = 16, 16


def run_job(engine: Any, job: dict) -> dict:
    input_ids = json.loads(Path(job["prompts"]).read_text())
    sampling = [dict(job["sampling"]) for _ in input_ids]
    engine.flush_cache()
    started = time.perf_counter()
    outputs = engine.generate(input_ids=input_ids, sampling_params=sampling)
    latency = time.perf_counter() - started
    completion = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    info = engine.get_server_info()
    return {"completed": len(outputs), "duration": latency, "total_output_tokens": completion,
            "total_input_tokens": sum(len(p) for p in input_ids), "output_throughput": completion / latency,
            "request_throughput": len(outputs) / latency,
            "finish_reasons": _count(str((o["meta_info"].get("finish_reason") or {}).get("type")) for o in outputs),
            "last_gen_throughput": info["internal_states"][0].get("last_gen_throughput")}


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def main(argv: list[str] | None = None) -> int:
    flags = json.loads((argv or sys.argv[1:])[0])
    from sglang.srt.entrypoints.engine import Engine as SGLangEngine  # as bench_offline_throughput imports it
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    server_args = ServerArgs.from_cli_args(parser.parse_args(flags))
    started = time.monotonic()
    engine = SGLangEngine(**dataclasses.asdict(server_args))
    print(f"ceiling-offline: engine ready after {time.monotonic() - started:.1f} s", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        if job.get("quit"):
            break
        try:
            if job.get("warmup"):
                ids = json.loads(Path(job["prompts"]).read_text())[:WARMUP_PROMPTS]
                warm = {**job["sampling"], "max_new_tokens": WARMUP_TOKENS, "min_new_tokens": 0}
                engine.generate(input_ids=ids, sampling_params=[dict(warm) for _ in ids])
                result = {"warmed": len(ids)}
            else:
                result = run_job(engine, job)
        except Exception as e:  # the driver records it and goes on with the other clients
            result = {"error": f"{type(e).__name__}: {e}"[:2000]}
        Path(job["result"]).parent.mkdir(parents=True, exist_ok=True)
        Path(job["result"]).write_text(json.dumps(result) + "\n")
        print(f"ceiling-offline: {job['result']} written", flush=True)
    engine.shutdown()
    return 0


# ---- the driver's side (bench/gpu/ceiling.py), in the check's own process

START_S = 150.0  # an engine start before one was measured (weights, CUDA graphs; the server's took 80-175 s)
READY = "ceiling-offline: engine ready"


def engine_flags(launch_argv: list[str]) -> list[str]:
    """The server's flags from its `python -m sglang.launch_server ...` command, for ServerArgs; metrics off
    (no HTTP server to export them)."""
    module = launch_argv.index("-m") + 2
    return [a for a in launch_argv[module:] if a != "--enable-metrics"]


@dataclasses.dataclass
class Engine:
    proc: Any
    log: Path
    ready_s: float = 0.0
    warmed: bool = False

    @classmethod
    def start(cls, cfg_dir: Path, profile_name: str, log_dir: Path, timeout_s: float = 900.0) -> Engine:
        """The engine with the profile's server flags, its output in LOG_DIR/offline-engine.log; waits until
        it is ready (RuntimeError with the log's tail if it exits or times out)."""
        import os
        import subprocess

        from bench.gpu import servers
        from gen_pipeline.config.server import load_server_profile
        from gen_pipeline.server.command import build_command, build_env

        profile = load_server_profile(profile_name, cfg_dir / "server.toml")
        python = os.environ.get("BENCH_PYTHON", sys.executable)
        flags = engine_flags(build_command(profile, port=servers.free_port(), python=python))
        argv = [python, "-m", "bench.gpu.offline_engine", json.dumps(flags)]
        log = log_dir / "offline-engine.log"
        start = log.stat().st_size if log.exists() else 0
        with open(log, "ab") as f:
            f.write(("$ " + " ".join(argv) + "\n").encode())
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=f, stderr=subprocess.STDOUT,
                                    env=build_env(profile), start_new_session=True)
        engine = cls(proc, log)
        started = time.monotonic()
        while READY not in _read_from(log, start):
            if proc.poll() is not None or time.monotonic() - started > timeout_s:
                engine.stop()
                raise RuntimeError(f"the offline engine {'exited' if proc.returncode is not None else 'timed out'} "
                                   f"before it was ready; last lines of {log}:\n{servers.tail(log)}")
            time.sleep(1.0)
        engine.ready_s = time.monotonic() - started
        return engine

    def run(self, ids: Path, sampling: dict, result: Path, timeout_s: float = 900.0,
            warmup: bool = False) -> tuple[dict, float]:
        """One job (see the module docstring): its result and wall seconds; `warmup`: the warm-up instead."""
        result.unlink(missing_ok=True)
        started = time.monotonic()
        job = {"prompts": str(ids), "sampling": sampling, "result": str(result), "warmup": warmup}
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as e:  # it exited: a broken pipe
            return {"error": f"the offline engine took no job ({e}); see {self.log}"}, 0.0
        while not (result.exists() and result.read_text().endswith("\n")):
            if self.proc.poll() is not None:
                return {"error": f"the offline engine exited (rc {self.proc.returncode}); see {self.log}"}, 0.0
            if time.monotonic() - started > timeout_s:
                return {"error": f"no result after {timeout_s:.0f} s; see {self.log}"}, timeout_s
            time.sleep(0.2)
        return json.loads(result.read_text()), time.monotonic() - started

    def stop(self, grace_s: float = 60.0) -> None:
        """Ask it to shut down (Engine.shutdown frees the GPU), then the process group as the servers are."""
        from bench.gpu import servers

        try:
            if self.proc.poll() is None:
                self.proc.stdin.write(b'{"quit": true}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=grace_s)
        except Exception:  # a broken pipe or a timeout: the process group goes below
            pass
        servers.stop(servers.Server("offline-engine", "", self.proc.pid, self.log), grace_s=20.0)
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)


def _read_from(path: Path, start: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(start)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
