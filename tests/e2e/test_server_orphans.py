"""A launched server deaf to SIGTERM does not outlive a SIGKILLed orchestrator (the parent watch), and a rerun
starts no second server beside one an earlier run left. Real processes."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import orjson
import pytest

from gen_pipeline.config.dataset import GenerationConfig
from gen_pipeline.errors import ServerStartupError
from gen_pipeline.http import open_http
from gen_pipeline.server import load_server_profile, run_server
from gen_pipeline.server.leftover import RECORD_NAME, ServerRecord, group_alive, process_started, stop_leftover
from sglang_sim.testing import free_port

from pipeline_helpers import _shard_lines, assert_exact, run_cli, sim_profile, start_cli, wait_lines, write_dataset


def stubborn_config(tmp_path: Path, *, stop_grace_s: float, port: int = 0) -> Path:
    """A profile `stubborn`: the simulator, deaf to SIGTERM."""
    args = ["--sim-profile", "fast", "--time-scale", "1", "--sim-output-mean", "160", "--sim-ignore-sigterm"]
    return sim_profile(tmp_path, "stubborn", args, stop_grace_s=stop_grace_s, port=port)


def members(pgid: int) -> list[int]:
    """The pids of group `pgid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[2]) == pgid:
                found.append(int(entry.name))
    return found


def sigkill_mid_run(tmp_path: Path, cfg: Path, toml: Path | str, out: Path) -> tuple[int, list[int]]:
    """Launch `stubborn`, wait for samples of T, SIGKILL the CLI while its server is stopped (SIGSTOP, then
    SIGCONT); returns the server's group and its pids."""
    log = tmp_path / "cli.log"
    proc = start_cli("generate", "--dataset", toml, "--server", "stubborn", "--config-dir", cfg, "--output-dir", out,
                     "--progress", "log", log=log)
    wait_lines(out / "T", 5, proc, 120)
    pgid = orjson.loads((out / "T" / RECORD_NAME).read_bytes())["pid"]
    pids = members(pgid)
    assert pids, pgid
    os.killpg(pgid, signal.SIGSTOP)  # the server frozen: however late the kill lands, the run cannot end first
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the CLI only: the server is in its own session
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        os.killpg(pgid, signal.SIGCONT)
    return pgid, pids


def rerun_stops_the_survivor(cfg: Path, dataset: Path | str, server: str, out: Path, pgid: int,
                             pids: list[int]) -> str:
    """The rerun: exit 0, the survivor stopped (named by its pid) before its own server starts; its output."""
    r = run_cli("generate", "--dataset", dataset, "--server", server, "--config-dir", cfg, "--output-dir", out,
                "--progress", "log")
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-3000:]
    assert f"stopped the server pid {pgid} an earlier run left behind" in text, text[-3000:]
    assert text.index(f"stopped the server pid {pgid}") < text.index("starting SGLang")
    assert not group_alive(pgid) and all(not Path(f"/proc/{pid}").exists() for pid in pids)
    return text


def test_server_deaf_to_sigterm_is_killed_after_the_grace_when_the_cli_is_sigkilled(tmp_path: Path) -> None:
    cfg = stubborn_config(tmp_path, stop_grace_s=1)
    toml = write_dataset(tmp_path / "ds", target=300, rows=[*map(_row, range(340))])
    out = tmp_path / "out"
    pgid, pids = sigkill_mid_run(tmp_path, cfg, toml, out)
    killed_s = time.monotonic()
    time.sleep(0.5)  # within the grace: SIGTERM was sent and ignored, the simulator is still up
    assert group_alive(pgid), "the server must get its grace (stop_grace_s = 1) before SIGKILL"
    while group_alive(pgid) and time.monotonic() - killed_s < 20:
        time.sleep(0.05)
    assert not group_alive(pgid), f"the server group {pgid} ({members(pgid)}) outlived the CLI"
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids)
    assert "Shutting down" not in (out / "T" / "server.log").read_text()  # it never obeyed SIGTERM: SIGKILL did it


def test_rerun_stops_the_server_an_earlier_run_left_before_starting_its_own(tmp_path: Path) -> None:
    """The survivor: the CLI SIGKILLed while its watch gives the server 60 s of grace. The rerun (the
    same port: a second server beside it could not even bind) stops it first, naming its pid, then runs."""
    port = free_port()
    cfg = stubborn_config(tmp_path, stop_grace_s=60, port=port)
    toml = write_dataset(tmp_path / "ds", target=40, rows=[*map(_row, range(60))])
    out = tmp_path / "out"
    pgid, pids = sigkill_mid_run(tmp_path, cfg, toml, out)
    assert group_alive(pgid)
    shutil.rmtree(cfg)
    cfg = stubborn_config(tmp_path, stop_grace_s=1, port=port)  # the rerun's own grace, then SIGKILL
    text = rerun_stops_the_survivor(cfg, toml, "stubborn", out, pgid, pids)
    assert (f"a server an earlier run started (pid {pgid}, http://127.0.0.1:{port}) is still running since that run "
            "was killed: stopping it before starting a new one (SIGTERM, SIGKILL after 1 s)") in text, text[-3000:]
    assert not (out / "T" / RECORD_NAME).exists()  # the rerun's own server was stopped and forgotten
    assert_exact(out, 40)


def _row(i: int) -> dict:
    return {"id": f"r{i}", "messages": [{"role": "user", "content": f"Question number {i}: tell me more."}]}


def test_rerun_with_another_first_dataset_finds_the_server_the_job_left(tmp_path: Path) -> None:
    """A job T,U killed (its server recorded in T's folder, the job's first), rerun as U,T: the record in
    T's folder is read all the same, the survivor stopped before the new server starts."""
    cfg = stubborn_config(tmp_path, stop_grace_s=60)
    targets = {"T": 30, "U": 200}  # U's many answers keep the job running while the kill lands, on a busy machine
    for name, target in targets.items():
        write_dataset(cfg, name=name, target=target, rows=[*map(_row, range(target + 10))])
    out = tmp_path / "out"
    pgid, pids = sigkill_mid_run(tmp_path, cfg, "T,U", out)
    assert _shard_lines(out / "U") < targets["U"]  # the kill landed mid-job: a finished job needs no server
    with open(cfg / "server.toml", "a") as f:  # the rerun: the same server, its own 1 s grace
        f.write("\n[profile.stubborn2]\ninherits = \"stubborn\"\nstop_grace_s = 1\n")
    rerun_stops_the_survivor(cfg, "U,T", "stubborn2", out, pgid, pids)
    assert_exact(out, targets["T"], "T")
    assert_exact(out, targets["U"], "U")


def test_fixed_port_held_by_another_process_is_refused_before_launching(tmp_path: Path) -> None:
    """Not ours (no record): refused with the port and what to edit; nothing is started."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        profile = load_server_profile("sim", overrides={"port": port})

        async def start() -> None:
            async with open_http(GenerationConfig(), 4) as http:
                await run_server(profile, log_dir=tmp_path, http=http)

        with pytest.raises(ServerStartupError) as e:
            anyio.run(start)
    assert str(e.value) == (f"Port {port} on 127.0.0.1 is already in use by another process (not a server this job "
                            f"started). Stop it, or set port = 0 in {profile.where} (a free port is then picked).")
    assert not (tmp_path / "server.log").exists()


def test_server_of_a_run_still_alive_is_refused_with_both_pids(tmp_path: Path) -> None:
    """The recorded server's gen-pipeline is alive (here: a stand-in process recorded as its owner):
    not orphaned, so not ours to stop; the message names both pids and what to do."""
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wait_s = time.monotonic() + 10
        while (process_started(server.pid) is None or process_started(owner.pid) is None) and time.monotonic() < wait_s:
            time.sleep(0.01)
        rec = ServerRecord(server.pid, process_started(server.pid), "http://127.0.0.1:30000", owner.pid,
                           process_started(owner.pid))
        (tmp_path / RECORD_NAME).write_text(orjson.dumps(rec.__dict__).decode())
        with pytest.raises(ServerStartupError) as e:
            anyio.run(stop_leftover, tmp_path, 1.0)
        assert str(e.value) == (
            f"The server pid {server.pid} (http://127.0.0.1:30000) recorded in {tmp_path / RECORD_NAME} is still run "
            f"by gen-pipeline pid {owner.pid}. Stop that run first (kill {owner.pid}: it stops its server), or wait "
            "for it to end, then run the same command again.")
        assert server.poll() is None  # untouched
    finally:
        for p in (server, owner):
            p.kill()
            p.wait()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_parent_watch_ends_the_way_its_server_did(sig: signal.Signals) -> None:
    """SGLang kills its own tree with SIGKILL when a child fails (kill_process_tree): the watch must die the same
    way, not trace back on a signal it cannot reset (SIGKILL has no handler: EINVAL, seen on the H100)."""
    from gen_pipeline.server.parent_watch import SCRIPT
    p = subprocess.run([sys.executable, "-I", SCRIPT, str(os.getpid()), "5", "sh", "-c", f"kill -{int(sig)} $$"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == -sig and p.stderr == "", (p.returncode, p.stderr)
