"""The README's sbatch script under a real single-node SLURM (cluster.sh, `make slurm-test`): four array tasks
-> exactly the target, also after a rank is cancelled and requeued; another world size or array numbering is
refused. Only what a user sets at submission changes; every wait is on an event, never a sleep."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import orjson
import pytest

from gen_pipeline.store.ranks import owner_rank, rank_share
from sglang_sim.testing import start_sim

from pipeline_helpers import REPO, SIM_FAST, _shard_lines, make_rows, run_cli, wait_for, write_dataset

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

CLUSTER_SH = Path(__file__).with_name("cluster.sh")
SCRIPT = REPO / "examples" / "slurm" / "generate.sbatch"
W, TARGET = 4, 60  # shares 15 each; the 120 rows hash 34/25/31/30 to ranks 0..3
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED"}
ARRAY = "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT"


@pytest.fixture(scope="module")
def slurm_env(request):
    """The environment to submit with (SLURM_CONF of the test cluster); the cluster is stopped
    afterwards unless it was up before. cluster.sh's lines (install and start-up times) are shown."""
    mode = os.environ.get("GEN_PIPELINE_SLURM", "")
    if mode not in ("1", "require"):
        pytest.skip("the SLURM tests run under `make slurm-test` (it starts a single-node cluster, installing "
                    "slurm-wlm with apt-get when missing)")
    was_up = subprocess.run([CLUSTER_SH, "status"], capture_output=True).returncode == 0
    res = subprocess.run([CLUSTER_SH, "start"], capture_output=True, text=True, timeout=900)
    if res.returncode == 0:  # past the output capture: "installed ... in N s", "up in N s: ..."
        with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
            print("\n" + "\n".join(res.stderr.splitlines()[-2:]))
    if res.returncode != 0:
        reason = f"no SLURM test cluster: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res}"
        if mode == "require":
            pytest.fail(f"{reason}\n{res.stderr}")
        pytest.skip(reason)
    conf = subprocess.run([CLUSTER_SH, "env"], capture_output=True, text=True, check=True).stdout
    env = {**os.environ, "SLURM_CONF": conf.strip().removeprefix("export SLURM_CONF=")}
    yield env
    if not was_up:
        subprocess.run([CLUSTER_SH, "stop"], capture_output=True, timeout=120)


def sbatch(env: dict[str, str], logs: Path, dataset: Path, args: str, *options: str) -> str:
    """Submit the docs' sbatch script (docs/fleets.md); returns the (array) job id."""
    res = subprocess.run(["sbatch", "--parsable", "--oversubscribe", f"--output={logs}/slurm-%A_%a.log", *options,
                          SCRIPT], cwd=REPO, env={**env, "DATASET": str(dataset), "GEN_PIPELINE_ARGS": args},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def slurm(env: dict[str, str], *cmd: str) -> str:
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, (cmd, res.stdout, res.stderr)
    return res.stdout


def array_tasks(env: dict[str, str], job: str) -> dict[int, dict[str, str]]:
    """{array index: its `scontrol show job` fields} for the tasks SLURM has split off (a pending
    remainder, ArrayTaskId=2-3, is not one yet)."""
    tasks = {}
    for line in slurm(env, "scontrol", "show", "job", "--oneliner", job).splitlines():
        fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if fields.get("ArrayTaskId", "").isdigit():
            tasks[int(fields["ArrayTaskId"])] = fields
    return tasks


def wait_tasks(env: dict[str, str], job: str, indices: range | list[int], *, timeout_s: float = 180,
               restarts: int = 0) -> dict[int, dict[str, str]]:
    """Until every listed task has ended (its final state, after `restarts` requeues); their fields."""
    def done() -> bool:
        tasks = array_tasks(env, job)
        return all(i in tasks and tasks[i]["JobState"] in FINAL and int(tasks[i]["Restarts"]) >= restarts
                   for i in indices)
    wait_for(done, timeout_s=timeout_s, interval_s=0.2)
    return array_tasks(env, job)


def task_log(logs: Path, job: str, index: int) -> str:
    return (logs / f"slurm-{job}_{index}.log").read_text()


def rank_dir(out: Path, rank: int, world: int = W) -> Path:
    return out / "T" / f"rank-{rank}-of-{world}"


def rank_ids(out: Path, rank: int) -> list[str]:
    return [orjson.loads(line)["id"] for shard in sorted(rank_dir(out, rank).glob("shard-*.jsonl"))
            for line in shard.read_bytes().splitlines()]


def assert_exact(out: Path, cfg: Path) -> None:
    """Exactly the target, no id twice, each rank its share of ids it owns; status and validate agree."""
    per_rank = {r: rank_ids(out, r) for r in range(W)}
    union = [i for ids in per_rank.values() for i in ids]
    assert [k for k, n in Counter(union).items() if n > 1] == []
    assert len(union) == TARGET
    for r, ids in per_rank.items():
        assert len(ids) == rank_share(TARGET, r, W) == 15
        assert {owner_rank(i, W) for i in ids} == {r}
    js = status_json(out, cfg)
    assert (js["done"], js["target"], js["world_size"], js["stale_ranks"], js["state"]) == (60, 60, 4, [], "finished")
    res = run_cli("validate", "--dataset", "T", "--output-dir", out, "--config-dir", cfg)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.match(rf"{re.escape(str(out / 'T'))}: 60 rows in \d+ shards of 4 ranks: OK \(\d+ truncated, "
                    r"policy keep\)(\n|$)", res.stdout), res.stdout  # the quality gate's line may follow


def status_json(out: Path, cfg: Path) -> dict:
    res = run_cli("status", "--json", "--output-dir", out, "--config-dir", cfg)
    assert res.returncode == 0, res.stderr
    return orjson.loads(res.stdout)["datasets"]["T"]


def first_line(out: Path, rank: int, world: int = W) -> str:
    return (f"T: rank {rank} of {world} (from {ARRAY}), share {rank_share(TARGET, rank, world)} of {TARGET}, "
            f"writing {rank_dir(out, rank, world)}/")


def test_the_readme_script_makes_exactly_the_target_on_four_ranks_and_refuses_another_world(tmp_path, slurm_env):
    toml = write_dataset(tmp_path / "ds", rows=make_rows(120), target=TARGET)
    out, cfg, logs = tmp_path / "out", tmp_path / "ds", tmp_path / "logs"
    logs.mkdir()
    args = f"--server sim --output-dir {out}"  # each rank starts its own simulator, as each node its SGLang
    job = sbatch(slurm_env, logs, toml, args)
    tasks = wait_tasks(slurm_env, job, range(W))
    assert {i: (t["JobState"], t["ExitCode"]) for i, t in tasks.items()} == {i: ("COMPLETED", "0:0") for i in range(W)}
    for r in range(W):
        log = task_log(logs, job, r)
        assert log.splitlines()[0] == first_line(out, r), log
        assert re.search(rf"^T \(rank {r} of 4\): 15/15 samples \(100\.0%\), \+15 this run in \S+; target reached\.$",
                         log, re.M), log
    assert_exact(out, cfg)
    before = {p: p.read_bytes() for p in sorted((out / "T").rglob("*")) if p.is_file()}

    # the same dataset submitted as two ranks: each task refuses, exit 4, and says what to do
    job2 = sbatch(slurm_env, logs, toml, args, "--array=0-1")
    tasks = wait_tasks(slurm_env, job2, range(2))
    assert {i: (t["JobState"], t["ExitCode"]) for i, t in tasks.items()} == {i: ("FAILED", "4:0") for i in range(2)}
    for r in range(2):
        assert task_log(logs, job2, r).splitlines() == [
            first_line(out, r, 2),
            f"error: {out / 'T'} was written with world size 4 (rank-0-of-4, rank-1-of-4, rank-2-of-4, rank-3-of-4: "
            f"60 samples); this run is rank {r} of 2 (from {ARRAY}). Which rank owns a prompt depends on the world "
            "size, so changing it would redo or lose samples. Submit the job array as --array=0-3 (world size 4) to "
            f"continue, or write to another --output-dir or dataset name (or move {out / 'T'} away to start over)."]

    # one index resubmitted alone (--array=2: SLURM says task 2 of a 1-task array) is no rank 2 of 4
    job3 = sbatch(slurm_env, logs, toml, args, "--array=2")
    assert (wait_tasks(slurm_env, job3, [2])[2]["ExitCode"]) == "2:0"
    assert task_log(logs, job3, 2).splitlines() == [
        "error: This job array is numbered 2-2 with 1 task (SLURM_ARRAY_TASK_MIN=2, SLURM_ARRAY_TASK_MAX=2, "
        "SLURM_ARRAY_TASK_COUNT=1), but ranks come from one array numbered 0 to W-1 (--array=0-3 for 4 ranks; a %N "
        "throttle is fine): the world size is the array's task count. To rerun one rank, requeue its task (scontrol "
        "requeue <jobid>_<rank>) or run it with --rank R --world-size W."]
    assert {p: p.read_bytes() for p in sorted((out / "T").rglob("*")) if p.is_file()} == before  # nothing touched


def test_srun_tasks_inside_array_tasks_split_each_rank(tmp_path, slurm_env):
    """The README's alternative to one task per array index: `srun` with n tasks in each of A array
    tasks; task p of array task a is rank a·n + p of A·n (SLURM_PROCID/SLURM_NTASKS as set by srun)."""
    toml = write_dataset(tmp_path / "ds", rows=make_rows(120), target=TARGET)
    out, cfg, logs = tmp_path / "out", tmp_path / "ds", tmp_path / "logs"
    logs.mkdir()
    cmd = f"srun .venv/bin/gen-pipeline generate --dataset {toml} --server sim --output-dir {out}"
    res = subprocess.run(["sbatch", "--parsable", "--oversubscribe", "--overcommit", "--array=0-1", "--ntasks=2",
                          f"--output={logs}/slurm-%A_%a.log", "--wrap", cmd], cwd=REPO, env=slurm_env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    tasks = wait_tasks(slurm_env, job, range(2))
    assert {i: (t["JobState"], t["ExitCode"]) for i, t in tasks.items()} == {i: ("COMPLETED", "0:0") for i in range(2)}
    for a in range(2):
        lines = task_log(logs, job, a).splitlines()
        for r in (2 * a, 2 * a + 1):
            assert (f"T: rank {r} of 4 (from {ARRAY} and SLURM_PROCID/SLURM_NTASKS), share 15 of 60, writing "
                    f"{rank_dir(out, r)}/") in lines, lines
    assert_exact(out, cfg)


@pytest.mark.parametrize("how", ["scancel", "scancel --batch --signal=KILL"])
def test_a_rank_cancelled_mid_run_then_requeued_ends_exact(tmp_path, slurm_env, how):
    """The simulator is SIGSTOPped while the victim is mid-run ("still running" by construction). A plain scancel
    (preemption, time limit) drains and commits; SIGKILL to the batch step alone (a node dying) leaves the lock
    and maybe a torn line. `scontrol requeue` runs the same array task again, which resumes its own part."""
    toml = write_dataset(tmp_path / "ds", rows=make_rows(120), target=TARGET, shard_max_samples=7, fsync_every=2)
    out, cfg, logs = tmp_path / "out", tmp_path / "ds", tmp_path / "logs"
    logs.mkdir()
    victim = 2
    with start_sim(SIM_FAST, ready_timeout_s=30) as sim:
        job = sbatch(slurm_env, logs, toml, f"--server-url {sim.url} --output-dir {out} --window 2")
        wait_for(lambda: _shard_lines(rank_dir(out, victim)) >= 3, timeout_s=120, interval_s=0.01)
        os.killpg(sim.process.pid, signal.SIGSTOP)  # no request completes from here on
        try:
            stopped_at = _shard_lines(rank_dir(out, victim))
            assert stopped_at < 13, stopped_at  # short of its share by more than the 2 in flight
            slurm(slurm_env, *how.split(), f"{job}_{victim}")
            if how == "scancel":  # the rank's own line: the signal reached it (it now waits for its 2 in flight)
                wait_for(lambda: "SIGTERM: no new requests" in task_log(logs, job, victim), timeout_s=60)
            else:
                wait_tasks(slurm_env, job, [victim], timeout_s=60)
        finally:
            os.killpg(sim.process.pid, signal.SIGCONT)
        tasks = wait_tasks(slurm_env, job, range(W))
        ended = {i: (t["JobState"], t["ExitCode"]) for i, t in tasks.items()}
        # a plain scancel: the job is cancelled (the rank exits 143); SIGKILL: the batch step died by signal 9
        assert ended == {0: ("COMPLETED", "0:0"), 1: ("COMPLETED", "0:0"), 3: ("COMPLETED", "0:0"),
                         2: ("CANCELLED", "143:0") if how == "scancel" else ("FAILED", "0:9")}, tasks
        short = len(set(rank_ids(out, victim)))
        assert short < 15  # the kill landed: the victim's part stopped short
        log = task_log(logs, job, victim)
        if how == "scancel":
            assert re.search(rf"^T \(rank 2 of 4\): {short}/15 samples \({100 * short / 15:.1f}%\), \+{short} this run "
                             r"in \S+; stopped \(SIGTERM\); run the same command to resume\.$", log, re.M), log
        js = status_json(out, cfg)
        assert (js["done"], js["stale_ranks"]) == (45 + short, [victim])

        slurm(slurm_env, "scontrol", "requeue", f"{job}_{victim}")
        task = wait_tasks(slurm_env, job, [victim], restarts=1)[victim]
        assert (task["JobState"], task["ExitCode"], task["Restarts"]) == ("COMPLETED", "0:0", "1")
    second = task_log(logs, job, victim).split(first_line(out, victim))[-1]  # --open-mode=append: both runs
    if how != "scancel":
        # the lock of the killed task: the same SLURM job requeued, or (without its job id) a run that is gone
        assert re.search(r"took over the lock of (SLURM job \d+'s previous run \(pid \d+ .*\): the job was requeued"
                         r"|a run that is gone \(pid \d+)", second), second
    assert re.search(rf"^T \(rank 2 of 4\): 15/15 samples \(100\.0%\), \+{15 - short} this run in \S+; target "
                     r"reached\.$", second, re.M), second
    assert_exact(out, cfg)
