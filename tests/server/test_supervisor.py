"""run_server against the real simulator process: start, capacity, crash + restart, give up,
start-up failures, cancellation leaving no process behind."""

from __future__ import annotations

import logging
import re
from functools import partial

import anyio
import pytest

from gen_pipeline.errors import ServerError, ServerStartupError
from gen_pipeline.http import Http
from gen_pipeline.server import run_server
from gen_pipeline.server import supervisor as supervisor_mod

from server_helpers import group_gone, sim_profile, started


async def chat(http: Http, url: str) -> None:
    r = await http.post_json(url + "/v1/chat/completions", {
        "model": "x", "max_tokens": 8, "messages": [{"role": "user", "content": "hello there"}]}, timeout_s=30)
    assert r.status == 200, r.text


async def until(predicate, timeout_s: float = 20.0) -> None:
    with anyio.fail_after(timeout_s):
        while not predicate():
            await anyio.sleep(0.05)


@pytest.fixture
def spawned(monkeypatch) -> list[int]:
    """pids of every server process run_server starts in the test."""
    pids: list[int] = []
    original = supervisor_mod.ServerProcess.start

    async def recording_start(*args, **kwargs):
        proc = await original(*args, **kwargs)
        pids.append(proc.pid)
        return proc
    monkeypatch.setattr(supervisor_mod.ServerProcess, "start", recording_start)
    return pids


async def test_start_reads_capacity_then_cancel_stops_the_group(tmp_path, http, spawned, events):
    (tmp_path / "server.log").write_text("previous run\n")
    async with started(run_server, sim_profile(), log_dir=tmp_path, http=http) as handle:
        assert handle.capacity.max_total_num_tokens == 20_000
        assert handle.capacity.source == "server_info"
        assert handle.summary_line().startswith("Kimi-K2.5 tp=8 kv=fp8_e4m3 20,000 KV tokens, max running ")
        assert handle.summary_line().endswith(", hicache 48 GB")
        assert handle.model == "moonshotai/Kimi-K2.5" and handle.restarts == 0
        await handle.wait_ready()
        await chat(http, handle.base_urls[0])
    assert spawned == [handle.pid]
    assert group_gone(handle.pid)
    assert (tmp_path / "server.log.1").read_text() == "previous run\n"
    assert "--sim-profile fast" in (tmp_path / "server.log").read_text().splitlines()[0]
    assert not any(e.startswith("warning") for e in events), events


async def test_crash_mid_traffic_restarts_and_is_ready_again(tmp_path, http, spawned, events):
    profile = sim_profile("--sim-crash-after", "2")
    async with started(run_server, profile, log_dir=tmp_path, http=http) as handle:
        first_pid = handle.pid
        url = handle.base_urls[0]
        await chat(http, url)
        await chat(http, url)  # the sim exits(1) right after this one
        await until(lambda: handle.restarts == 1 and handle.ready)
        await handle.wait_ready()
        assert handle.pid != first_pid and group_gone(first_pid)
        assert handle.base_urls == [url] and handle.capacity.max_total_num_tokens == 20_000
        await chat(http, url)
    assert len(spawned) == 2 and group_gone(spawned[1])
    assert "SGLang exited with code 1; dispatch paused" in " ".join(events)
    assert any(e.startswith("SGLang is back (restart 1)") for e in events)


async def test_gives_up_after_max_restarts(tmp_path, http, spawned):
    profile = sim_profile("--sim-crash-after", "1", max_restarts=1)
    handle_box = []
    with pytest.raises((ServerError, BaseExceptionGroup)) as e:
        async with started(run_server, profile, log_dir=tmp_path, http=http) as handle:
            handle_box.append(handle)
            await chat(http, handle.base_urls[0])
            await until(lambda: handle.restarts == 1 and handle.ready)
            await chat(http, handle.base_urls[0])
            await anyio.sleep_forever()  # run_server raises and cancels this
    expected = (f"SGLang crashed 2 times (last exit code 1); giving up. The run is resumable: fix the cause "
                f"(see {tmp_path / 'server.log'}) and run the same command.")
    assert type(_only(e.value)) is ServerError and str(_only(e.value)) == expected
    with pytest.raises(ServerError) as waited:
        await handle_box[0].wait_ready()
    assert str(waited.value) == expected
    assert len(spawned) == 2 and all(group_gone(p) for p in spawned)


def _only(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        assert len(exc.exceptions) == 1
        exc = exc.exceptions[0]
    return exc


OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


@pytest.mark.parametrize(("extra", "overrides", "first", "lines"), [  # first: a pattern the message starts with
    (["--sim-fail-startup", OOM], {}, "SGLang .* Last lines of {log}:\n(.*\n)*.*" + re.escape(OOM), {-1: (
        "Lower mem_fraction_static in datasets_cfg/server.toml [profile.sim], now 0.9 (the reference job "
        "keeps ~3.5 GB free per GPU), or lower max_running_requests / context_length.")}),
    (["--sim-never-healthy"], {"startup_timeout_s": 1.5},
     r"SGLang did not answer /health within 1\.5 s; see {log}\. The server was stopped\.", {}),
    (["--no-such-flag", "1"], {},
     r"SGLang rejected its command line \([^\n]*error: unrecognized arguments: --no-such-flag 1",
     {-1: "The installed SGLang rejected a flag (--no-such-flag comes from extra_args) in datasets_cfg/server.toml "
          "[profile.sim]. Fix or remove that key (or upgrade SGLang), then run again."}),
    ([], {"command": ["{python}", "-c", "import sys; print('loading weights'); sys.exit(3)"]},
     r"SGLang exited with code 3 before /health answered \(",
     {-2: "  loading weights", -1: "Fix the cause shown above, then run the same command again."}),
], ids=["fatal-line", "never-healthy", "unknown-flag", "exit-code"])
async def test_a_failed_start_says_why_and_leaves_no_process(tmp_path, http, spawned, extra, overrides, first, lines):
    with anyio.fail_after(15), pytest.raises(ServerStartupError) as e:
        await run_server(sim_profile(*extra, **overrides), log_dir=tmp_path, http=http)
    msg = str(e.value)
    assert re.match(first.format(log=re.escape(str(tmp_path / "server.log"))), msg), msg
    assert {i: msg.splitlines()[i] for i in lines} == lines
    assert len(spawned) == 1 and group_gone(spawned[0])


async def test_unhealthy_server_is_restarted(tmp_path, http, spawned, events):
    profile = sim_profile("--sim-health-503-after-s", "0.5", "--sim-health-503-for-s", "60")
    async with started(run_server, profile, log_dir=tmp_path, http=http) as handle:
        await until(lambda: handle.restarts == 1)
    assert "SGLang failed 3 health checks in a row; dispatch paused" in " ".join(events)
    assert all(group_gone(p) for p in spawned)


async def test_sigterm_ignoring_server_is_killed(tmp_path, http, spawned):
    # A server that ignores SIGTERM is SIGKILLed after stop_grace_s.
    code = ("import signal, sys, time, http.server, threading\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200); self.end_headers(); self.wfile.write(b'{}')\n"
            "    def log_message(self, *a): pass\n"
            "http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()\n")
    profile = sim_profile(command=["{python}", "-c", code], stop_grace_s=0.5)
    async with started(run_server, profile, log_dir=tmp_path, http=http) as handle:
        assert handle.capacity.source == "unknown"
    assert group_gone(spawned[0])


async def test_cancel_during_startup_stops_the_group(tmp_path, http, spawned):
    profile = sim_profile(extra_args=["--sim-profile", "fast", "--sim-startup-s", "30"])
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(run_server, profile, log_dir=tmp_path, http=http))
            await until(lambda: len(spawned) == 1)  # started; /health stays 503 for 30 s
            scope.cancel()
    assert scope.cancelled_caught
    assert len(spawned) == 1 and group_gone(spawned[0])


FP8_WARNING = ("Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of 1.0. "
               "This may lead to less accurate results!")


async def test_start_up_warnings_are_surfaced_once_and_not_fatal(tmp_path, http, spawned, caplog):
    # SGLang 0.5.17 logs this with --kv-cache-dtype fp8_e4m3 (issue 9); once per TP rank, here twice.
    # The last capacity line (30,000) disagrees with /server_info (20,000): a warning, /server_info wins.
    caplog.set_level(logging.INFO, logger="gen_pipeline")
    profile = sim_profile("--sim-startup-log", FP8_WARNING, "--sim-startup-log", FP8_WARNING,
                          "--sim-startup-log", "max_total_num_tokens=30000, max_running_requests=64")
    async with started(run_server, profile, log_dir=tmp_path, http=http) as handle:
        await handle.wait_ready()
        assert handle.capacity.max_total_num_tokens == 20_000
    warnings = [r.getMessage() for r in caplog.records if "warning" in r.getMessage()[:15]]
    assert warnings == [
        "SGLang warning: fp8 KV cache without scaling factors (SGLang uses 1.0): the outputs may be less accurate; "
        f"compare against kv_cache_dtype = \"auto\" on a sample before a long run (log: {tmp_path / 'server.log'})",
        "warning: /server_info reports max_total_num_tokens=20,000 but the start-up log says 30,000; "
        "using /server_info."]


async def test_the_front_end_is_the_servers_own_process_and_its_tokenizer_workers_not_its_watcher(tmp_path):
    """front_end_pids(leader): the child parent_watch runs (SGLang's main process), then the processes of its
    group named as SGLang 0.5.17 names its --tokenizer-worker-num workers; a group with no child yet is an
    OSError (FrontEndMeter: no figure). process_cpu_s reads one of them, not the watcher."""
    import sys

    from gen_pipeline.run.stats import front_end_pids, process_cpu_s
    from gen_pipeline.server.process import ServerProcess

    worker = ("import pathlib, time\npathlib.Path('/proc/self/comm').write_text('sglang::tokenizer_worker:1')\n"
              "print('named', flush=True)\ntime.sleep(60)")
    other = "import time\ntime.sleep(60)"  # in the group, under another name: the scheduler, say
    main = (f"import os, subprocess, sys, time\nw = subprocess.Popen([sys.executable, '-c', {worker!r}])\n"
            f"o = subprocess.Popen([sys.executable, '-c', {other!r}])\n"
            "while time.process_time() < 0.5: pass\nprint('burned', os.getpid(), w.pid, flush=True)\ntime.sleep(60)")
    log = tmp_path / "server.log"
    proc = await ServerProcess.start([sys.executable, "-c", main], {}, log, stop_grace_s=1)
    try:
        def said(word: str) -> list[str]:  # line 1 echoes the command
            return [line for line in log.read_text().splitlines()[1:] if line.startswith(word)]

        await until(lambda: said("named") and said("burned"), 60)
        child, worker_pid = map(int, said("burned")[0].split()[1:])
        assert front_end_pids(proc.pid) == [child, worker_pid]
        assert process_cpu_s(child) >= 0.45  # the main process's 0.5 s in clock ticks; parent_watch only waits
    finally:
        await proc.stop(1)
    alone = await anyio.open_process(["sleep", "30"])  # no child
    try:
        with pytest.raises(OSError, match=f"server {alone.pid} has no child process"):
            front_end_pids(alone.pid)
    finally:
        alone.kill()
        await alone.aclose()
