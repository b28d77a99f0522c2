"""Answers read in reader processes (run/readers.py), over real TCP and real reader subprocesses: the same
TurnResults and the same errors, word for word, as read in this process; a loop aborted from the reader; a run
with readers writes exactly its target; with no --readers, one is started when the main process's CPU says so."""

from __future__ import annotations

import os
import re
import signal
import sys
from dataclasses import replace

import anyio
import httpx
import pytest
from servers import sim_in_thread

from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
from gen_pipeline.errors import RequestError, ServerError
from gen_pipeline.http import open_http
from gen_pipeline.quality import LoopVerdict
from gen_pipeline.quality.repetition import LoopReason
from gen_pipeline.run import chat, readers
from gen_pipeline.run.chat import ChatClient
from gen_pipeline.run.readers import more_readers, open_readers, turn_from_wire, turn_to_wire
from gen_pipeline.run.wire import ClientSettings, TurnResult
from gen_pipeline.server.fleet import Fleet
from sglang_sim.testing import start_sim

from pipeline_helpers import SIM_FAST, assert_exact, run_cli, write_dataset

FAST = ["--sim-profile", "fast", "--time-scale", "1000", "--sim-startup-s", "0", "--served-model-name", "m"]
STARTED = re.compile(r"reader process (\d+) started \((\d+) running\): (.*)")


def settings(max_new_tokens: int = 48, **gen) -> ClientSettings:
    g = GenerationConfig(**{"max_attempts": 1, "connect_timeout_s": 2.0, "request_timeout_s": 10.0,
                            "retry_initial_wait_s": 0.001, "retry_max_wait_s": 0.002, **gen})
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, seed=7)
    return ClientSettings(model="m", backend="sim", sampling=sampling, generation=g)


async def outcome(urls: list[str], n_readers: int, prompt: str = "hello", fleet: Fleet | None = None,
                  max_new_tokens: int = 48, **gen) -> tuple[TurnResult | BaseException, Fleet]:
    """One turn, in this process (n_readers 0) or in reader processes: its TurnResult or the error it raised."""
    s = settings(max_new_tokens, **gen)
    fleet = fleet or Fleet(urls, fail_after=2)
    g = s.generation
    async with open_http(g, 8) as http, open_readers(n_readers, connect_timeout_s=g.connect_timeout_s,
                                                      max_connections=8) as pool:
        assert len(pool.live) == n_readers
        try:
            return await ChatClient(http, urls, s, readers=pool, fleet=fleet).complete(
                [{"role": "user", "content": prompt}]), fleet
        except (RequestError, ServerError) as e:
            return e, fleet


def same(a: TurnResult | BaseException, b: TurnResult | BaseException) -> tuple:
    """What a user or the store sees of an outcome (a request id is the server's, new each time)."""
    if isinstance(a, TurnResult):
        return ("turn", replace(a, rid=""))
    return (type(a).__name__, str(a), getattr(a, "reason", None), getattr(a, "attempts", None))


@pytest.fixture(scope="module")
def sim():
    with start_sim(FAST) as s:
        yield s


async def test_a_reader_process_reads_the_same_answers_as_this_one(sim, monkeypatch) -> None:
    here = [await outcome([sim.url], 0, f"prompt {i}") for i in range(4)]

    def not_here(*a, **k):
        raise AssertionError("read in the main process")

    monkeypatch.setattr(chat, "fetch_turn", not_here)  # with readers, nothing is read here
    there = [await outcome([sim.url], 2, f"prompt {i}") for i in range(4)]
    assert [same(t, None) for t, _ in there] == [same(t, None) for t, _ in here]
    assert all(isinstance(t, TurnResult) and t.completion_tokens > 0 for t, _ in there)


@pytest.mark.parametrize("case", ["black hole", "silent", "refused", "other model", "HTTP 500"])
async def test_every_error_reads_the_same_through_a_reader(case, sim, black_hole, silent_server, refused) -> None:
    """The error a user reads in errors.jsonl, and what the fleet did, are the same with the read in a reader:
    two connect timeouts take a black hole out (the third attempt goes to the simulator); a request timeout
    cancels the reader's read from the main process."""
    extra = {"other model": ["--served-model-name", "other"], "HTTP 500": ["--sim-error-rate", "1.0", *FAST[-2:]]}
    with start_sim([*FAST[:-2], *extra[case]]) if case in extra else _no_sim() as other:
        urls, gen = {"black hole": ([black_hole, sim.url], {"connect_timeout_s": 0.3, "max_attempts": 3}),
                     "silent": ([silent_server], {"request_timeout_s": 0.3, "max_attempts": 2}),
                     "refused": ([refused], {}), "other model": ([other and other.url], {}),
                     "HTTP 500": ([other and other.url], {})}[case]
        here, fleet_here = await outcome(urls, 0, **gen)
        there, fleet_there = await outcome(urls, 1, **gen)
    assert same(there, None) == same(here, None)
    assert (fleet_there.up_urls, fleet_there.taken_out) == (fleet_here.up_urls, fleet_here.taken_out)
    if case == "black hole":
        assert isinstance(there, TurnResult) and fleet_there.down_urls == [black_hole]
    else:
        assert isinstance(here, RequestError | ServerError), here
    if case == "silent":
        assert str(there) == "gave up after 2 attempts: no answer within the request timeout (0.3 s)"


class _no_sim:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


async def test_a_loop_is_aborted_from_the_reader() -> None:
    """Every answer loops: the reader closes the stream at the verdict and the simulator stops decoding it."""
    args = [*FAST[:2], "--time-scale", "2", *FAST[4:], "--sim-loop-rate", "1.0", "--sim-seed", "3"]
    with start_sim(args) as s:
        turn, _ = await outcome([s.url], 1, on_loop="keep", max_new_tokens=4096)
        async with httpx.AsyncClient() as client:
            loops = (await client.get(s.url + "/sim/stats", timeout=5)).json()["loops"]
    assert isinstance(turn, TurnResult), turn
    assert turn.aborted and turn.loop is not None and turn.finish_reason == "loop"
    [ended] = [x for x in loops if x["rid"] == turn.rid]
    assert ended["finish_reason"] == "abort"
    assert ended["loop_start"] < turn.completion_tokens <= ended["decoded"]


def test_a_run_with_readers_writes_exactly_its_target(tmp_path) -> None:
    with sim_in_thread(SIM_FAST) as s:
        toml = write_dataset(tmp_path / "ds", target=40, rows=None)
        r = run_cli("generate", "--dataset", toml, "--server-url", s.url, "--output-dir", tmp_path / "out",
                    "--progress", "quiet", "--readers", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert_exact(tmp_path / "out", 40)
    log = (tmp_path / "out" / "T" / "run.log").read_text()
    started = STARTED.findall(log)
    assert [(n, why) for _, n, why in started] == [("1", "--readers 2"), ("2", "--readers 2 (2)")]
    # each reader's last frame says its CPU as it leaves: the run's record of where the client's CPU went
    cpu = re.search(r"reader processes: 2 started; CPU while reading: main process \d+\.\d\d s, readers "
                    r"(\d+\.\d\d) s", log)
    assert cpu is not None and float(cpu[1]) > 0, log


def test_with_no_readers_flag_one_starts_when_the_main_process_is_busy(tmp_path, monkeypatch) -> None:
    """The automatic choice, with its mark at 0 (any CPU counts) and a short span."""
    monkeypatch.setattr(readers, "AUTO_EVERY_S", 0.05)
    monkeypatch.setattr(readers, "AUTO_ADD_AT", 0.0)
    monkeypatch.setattr(readers, "auto_cap", lambda: 1)
    with sim_in_thread([*SIM_FAST[:2], "--time-scale", "1", *SIM_FAST[4:]]) as s:
        toml = write_dataset(tmp_path / "ds", target=12, rows=None)
        r = run_cli("generate", "--dataset", toml, "--server-url", s.url, "--output-dir", tmp_path / "out",
                    "--progress", "quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert_exact(tmp_path / "out", 12)
    started = STARTED.findall((tmp_path / "out" / "T" / "run.log").read_text())
    assert len(started) == 1 and started[0][1] == "1", started
    assert re.fullmatch(r"the main process used \d\.\d\d of a core over 0\.05 s", started[0][2]), started


def test_the_automatic_choice() -> None:
    assert more_readers(0.3, [], 0, 4) == ""
    assert more_readers(0.62, [], 0, 4) == "the main process used 0.62 of a core over 2 s"
    assert more_readers(0.9, [0.2, 0.3], 2, 4) == ""  # the readers have room: the main process's CPU is its own
    assert more_readers(0.1, [0.5, 0.7], 2, 4) == "the 2 readers used 0.60 of a core each over 2 s"
    assert more_readers(0.9, [0.9] * 4, 4, 4) == ""  # at the cap


def test_a_turn_crosses_the_process_boundary_whole() -> None:
    turn = TurnResult("a b", "think", "loop", 12, 40, reasoning_tokens=3, prompt_token_ids=[1, 2],
                      token_ids=[3, 4], loop=LoopVerdict(LoopReason.PERIOD, 30, 4, 2, 9), rid="r1", aborted=True,
                      leak="think_marker", tool_calls=[{"id": "c", "type": "function",
                                                        "function": {"name": "f", "arguments": "{}"}}],
                      spec=(2.5, 7))
    import orjson
    assert turn_from_wire(orjson.loads(orjson.dumps(turn_to_wire(turn)))) == turn


def test_readers_leave_when_the_pool_closes() -> None:
    async def main() -> list:
        async with open_readers(2, connect_timeout_s=1, max_connections=4) as pool:
            processes = [r.process for r in pool.live]
            assert all(p.returncode is None for p in processes)
        return [p.returncode for p in processes]

    assert anyio.run(main) == [0, 0]  # stdin closed: each left on its own, not killed


def test_readers_that_keep_dying_end_the_run_with_what_to_do(tmp_path, monkeypatch) -> None:
    """Each reader exits at once (as one whose interpreter cannot start would): replaced three times, then the
    run ends, exit code 1, with the message; run again as it says, the run writes exactly its target."""
    monkeypatch.setattr(readers, "reader_argv", lambda *a: [sys.executable, "-c", "raise SystemExit(3)"])
    # every answer stalls: those read meanwhile in this process (while no reader is up) never end the run first
    with sim_in_thread([*SIM_FAST, "--sim-stall-rate", "1.0"]) as s:
        toml = write_dataset(tmp_path / "ds", target=60, rows=None)
        r = run_cli("generate", "--dataset", toml, "--server-url", s.url, "--output-dir", tmp_path / "out",
                    "--progress", "quiet", "--readers", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    died = re.findall(r"reader process (\d+) died \(exit code 3\); \d+ of its requests are sent again, and a new "
                      r"reader takes its place", r.stdout)
    assert len(died) == 3, r.stdout
    assert re.search(r"reader processes died 4 times within 60 s \(the latest, pid \d+: exit code 3\); its error "
                     r"is above\. Run with --readers 0 to read the answers in the main process\.", r.stdout + r.stderr)
    # what to do, done: the run goes on from what was written, to exactly its target
    with sim_in_thread(SIM_FAST) as s:
        again = run_cli("generate", "--dataset", toml, "--server-url", s.url, "--output-dir", tmp_path / "out",
                        "--progress", "quiet", "--readers", "0")
    assert again.returncode == 0, again.stdout + again.stderr
    assert_exact(tmp_path / "out", 60)


def test_a_request_sent_to_a_reader_that_left_is_lost_there_and_that_reader_is_not_picked_again() -> None:
    """Its stdin already closed (it is leaving, its listener has not seen it end): the write fails at once,
    ReaderLost (chat.py sends the request again), and the next request cannot pick that reader."""
    async def main() -> tuple[str, list, int]:
        async with open_readers(1, connect_timeout_s=1, max_connections=4) as pool:
            [gone] = pool.live
            assert gone.process.stdin is not None
            await gone.process.stdin.aclose()
            with pytest.raises(readers.ReaderLost) as e:
                await pool.fetch("http://127.0.0.1:9/v1/chat/completions", b"{}",
                                 readers.ReadSpec(False, "m", 8, False), readers.Seen(),
                                 on_head=lambda: None, answered=lambda: None)
            return str(e.value), [r.pid for r in pool.live if r is gone], gone.pid

    message, still_there, pid = anyio.run(main)
    assert (message, still_there) == (f"reader process {pid} is gone", [])


async def test_every_poll_says_how_many_readers_read_the_answers(tmp_path) -> None:
    """The figure behind the progress line's "2 reader processes" (run/progress.py postfix)."""
    from gen_pipeline.config.dataset import load_dataset_config
    from gen_pipeline.run import RunOptions, run_generate

    cfg = load_dataset_config(write_dataset(tmp_path / "ds", target=40, max_new_tokens=64))
    polls: list = []
    with sim_in_thread([*SIM_FAST, "--time-scale", "1"], ready_timeout_s=30) as s:
        opts = RunOptions(output_root=tmp_path / "out", server_urls=(s.url,), poll_interval_s=0.05, readers=2,
                          load_observers=(polls.append,))
        summary = await run_generate(cfg, opts)
    during = [p.readers for p in polls if p.completions < 40]  # after the last answer they leave (0)
    assert summary.done == 40 and during and set(during) == {2}


async def test_a_timeout_mid_answer_counts_the_tokens_the_reader_had_seen() -> None:
    """The reader's progress frames carry each answer's tokens so far: the main process's timeout message says
    them, as it does when it reads the answer itself."""
    slow = [*FAST[:2], "--time-scale", "0.05", *FAST[4:]]  # ~a token per 10 ms: 1 s is mid-answer
    with start_sim(slow) as s:
        outcomes = [(await outcome([s.url], n, max_new_tokens=4096, request_timeout_s=1.0))[0] for n in (0, 1)]
    for e in outcomes:
        assert isinstance(e, RequestError) and e.reason == "timeout", e
        m = re.fullmatch(r"gave up after 1 attempt: no complete answer within the request timeout \(1 s; (\d+) "
                         r"tokens decoded\)", str(e))
        assert m is not None and int(m[1]) > 0, str(e)


def test_a_progress_frame_is_progress_for_each_request_it_names() -> None:
    """What hang detection (server/hang.py) sees of an answer read in a reader: each request a progress frame
    names counts as its server answering, with its tokens so far; a request already ended is skipped."""
    pool = readers.Readers(connect_timeout_s=1, max_connections=4)
    reader = readers._Reader.__new__(readers._Reader)
    reader.pending, reader.cpu_s = {}, 0.0
    answered: list[int] = []
    for rid in (1, 2):
        reader.pending[rid] = readers._Waiter(readers.Seen(), lambda: None, lambda rid=rid: answered.append(rid))
    pool._on_frame(reader, {"ev": "progress", "cpu_s": 1.5, "reqs": [[1, 40, 5], [2, 0, 0], [9, 3, 1]]})
    assert answered == [1, 2] and reader.cpu_s == 1.5
    assert [(w.seen.completion_tokens, w.seen.seen()) for w in reader.pending.values()] == [(40, " after 40 tokens"),
                                                                                           (0, "")]


def test_a_reader_is_out_of_the_terminals_reach_and_shrugs_off_stop_signals(sim) -> None:
    """Its own session (a terminal's Ctrl-C goes to the foreground group: the main process's to handle); and
    SIGINT, SIGTERM and SIGHUP sent to it, as a batch system may, end nothing: it leaves when the pool closes."""
    s = settings()

    async def main() -> tuple[int, int, list[TurnResult], int | None]:
        async with open_http(s.generation, 4) as http, open_readers(1, connect_timeout_s=1,
                                                                    max_connections=4) as pool:
            client = ChatClient(http, [sim.url], s, readers=pool)
            turns = [await client.complete([{"role": "user", "content": "before"}])]
            [reader] = pool.live
            sid = os.getsid(reader.pid)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                os.kill(reader.pid, sig)
            turns.append(await client.complete([{"role": "user", "content": "after"}]))
            assert pool.live == [reader]
            process = reader.process
        return sid, reader.pid, turns, process.returncode

    sid, pid, turns, code = anyio.run(main)
    assert sid == pid != os.getsid(0)  # a session of its own
    assert [t.completion_tokens > 0 for t in turns] == [True, True] and code == 0


def test_a_reader_that_cannot_start_leaves_its_own_error_and_no_process(monkeypatch) -> None:
    """The second of --readers 2 fails to start (no process slot left, say): its OSError is what the run sees, and
    the first reader is reaped, not left running."""
    real, started = anyio.open_process, []

    async def second_fails(*args, **kwargs):
        if started:
            raise OSError(11, "Resource temporarily unavailable")
        started.append(await real(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(anyio, "open_process", second_fails)

    async def main() -> None:
        async with open_readers(2, connect_timeout_s=1, max_connections=4):
            raise AssertionError("not reached")

    with pytest.raises(BaseException) as e:  # the task group's ExceptionGroup around it
        anyio.run(main)
    errors = e.value.exceptions if isinstance(e.value, BaseExceptionGroup) else [e.value]
    assert [str(x) for x in errors] == ["[Errno 11] Resource temporarily unavailable"]
    assert started[0].returncode == 0  # its stdin closed: it left
