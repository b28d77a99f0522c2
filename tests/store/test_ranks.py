"""Ranks of one dataset as real CLI processes over one simulator: their union is exactly the target, a killed
rank reruns alone to exact, layouts and world sizes are not mixed, status and validate read the ranks as one."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from store_helpers import shard_ids

from gen_pipeline.cli import main
from gen_pipeline.errors import ConfigError
from gen_pipeline.store.layout import iter_committed_samples
from gen_pipeline.store.ranks import RankSpec, owner_rank, rank_share, resolve_rank

from pipeline_helpers import (
    LAUNCHER_VARS,
    REPO,
    SAMPLE_KEYS,
    cli_cmd,
    kill_group,
    make_rows,
    run_cli,
    wait_for,
    write_dataset,
)
from user_docs import user_docs

AGO = r"(?:\d+s|\dm\d\ds) ago"  # a commit's age in the status duration format (5s, 1m05s)
W = 3
TARGET = 90  # shares 30/30/30; the 120 rows hash 37/45/38 to ranks 0/1/2


def _rank_args(toml: Path, url: str, out: Path, rank: int, world: int = W, *extra: str) -> tuple:
    return ("generate", "--dataset", toml, "--server-url", url, "--output-dir", out, "--progress", "log",
            "--rank", str(rank), "--world-size", str(world), *extra)


def _rank_ids(out: Path, rank: int, world: int = W) -> list[str]:
    return shard_ids(out / "T" / f"rank-{rank}-of-{world}")


def _assert_union_exact(out: Path) -> dict[int, list[str]]:
    per_rank = {r: _rank_ids(out, r) for r in range(W)}
    union = [i for ids in per_rank.values() for i in ids]
    assert [k for k, n in Counter(union).items() if n > 1] == []  # no duplicate, within or across ranks
    assert len(union) == TARGET
    for r, ids in per_rank.items():
        assert len(ids) == rank_share(TARGET, r, W) == 30
        assert {owner_rank(i, W) for i in ids} == {r}  # each rank wrote only the ids it owns
    return per_rank


def _status_lines(out: Path, cfg_dir: Path) -> list[str]:
    res = run_cli("status", "--output-dir", out, "--config-dir", cfg_dir)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def _ranks_block(lines: list[str]) -> list[str]:
    """status from its "T: N ranks" line on (the quality gate's note may come before it)."""
    return lines[next(i for i, line in enumerate(lines) if re.match(r"T: \d+ ranks", line)):]


def _rank_line(lines: list[str], rank: int, world: int = W) -> str:
    return next(line for line in lines if line.startswith(f"  rank-{rank}-of-{world}"))


# ---------------------------------------------------------------- the pure parts


def test_ownership_is_a_stable_hash_and_shares_sum_to_the_target():
    # pinned values: the same on every machine and in every process (blake2b, not hash())
    assert [owner_rank(f"T-r{i}", 3) for i in range(8)] == [0, 0, 2, 0, 0, 1, 1, 1]
    assert owner_rank("B2-abc", 4) == 2 and owner_rank("anything", 1) == 0
    for target, world in ((90, 3), (88_000, 7), (5, 8), (0, 2)):
        shares = [rank_share(target, r, world) for r in range(world)]
        assert sum(shares) == target and max(shares) - min(shares) <= (1 if target else 0)


def test_flags_win_then_slurm_then_torchrun_variables():
    both = {"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "RANK": "1", "WORLD_SIZE": "2"}
    assert resolve_rank(1, 3, both) == (RankSpec(1, 3, "--rank/--world-size"), [])
    spec, notes = resolve_rank(None, None, both)
    assert (spec.rank, spec.world) == (2, 4)
    assert notes == ["both SLURM_PROCID/SLURM_NTASKS (2 of 4) and RANK/WORLD_SIZE (1 of 2) are set; using "
                     "SLURM's (pass --rank/--world-size to choose)."]
    assert resolve_rank(None, None, {"RANK": "1", "WORLD_SIZE": "2"})[0] == RankSpec(1, 2, "RANK/WORLD_SIZE")
    assert resolve_rank(None, None, {})[0] == RankSpec(0, 1, "default")
    # one of the pair alone is a shell of SLURM's, not an srun task: salloc's (SLURM_NTASKS) or a batch
    # script's without --ntasks (SLURM_PROCID=0); both seen on slurm-wlm 22.05
    assert resolve_rank(None, None, {"SLURM_NTASKS": "4"})[0] == RankSpec(0, 1, "default")
    assert resolve_rank(None, None, {"SLURM_PROCID": "0"})[0] == RankSpec(0, 1, "default")


def _array(task: int, count: int, lo: int = 0, hi: int | None = None, **more: str) -> dict[str, str]:
    """What sbatch --array sets in an array task's batch shell (as seen on slurm-wlm 22.05: the shell
    has SLURM_PROCID=0 and, with --ntasks=1, SLURM_NTASKS=1 too)."""
    return {"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_COUNT": str(count), "SLURM_ARRAY_TASK_MIN": str(lo),
            "SLURM_ARRAY_TASK_MAX": str(count - 1 if hi is None else hi), "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
            **more}


def test_a_job_array_task_is_a_rank_and_srun_tasks_inside_it_split_it():
    array = "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT"
    assert resolve_rank(None, None, _array(2, 4)) == (RankSpec(2, 4, array), [])
    assert resolve_rank(None, None, _array(2, 4, SLURM_NTASKS="")) == (RankSpec(2, 4, array), [])  # no --ntasks
    # srun -n 3 in array task 2 of 4: task p of 3 is rank 2*3+p of 12
    spec, _ = resolve_rank(None, None, _array(2, 4, SLURM_PROCID="1", SLURM_NTASKS="3"))
    assert spec == RankSpec(7, 12, f"{array} and SLURM_PROCID/SLURM_NTASKS")
    assert resolve_rank(1, 2, _array(2, 4)) == (RankSpec(1, 2, "--rank/--world-size"), [])  # the flags win
    assert resolve_rank(None, None, _array(2, 4, RANK="0", WORLD_SIZE="4"))[1] == [
        f"both {array} (2 of 4) and RANK/WORLD_SIZE (0 of 4) are set; using SLURM's (pass --rank/--world-size to "
        "choose)."]
    # a %N throttle keeps the numbering; anything but 0..count-1 cannot say the world size
    assert resolve_rank(None, None, _array(3, 4))[0].rank == 3
    for env, numbered in ((_array(2, 1, 2, 2), "2-2 with 1 task (SLURM_ARRAY_TASK_MIN=2, SLURM_ARRAY_TASK_MAX=2, "
                                                "SLURM_ARRAY_TASK_COUNT=1)"),
                          (_array(3, 4, 1, 4), "1-4 with 4 tasks (SLURM_ARRAY_TASK_MIN=1, SLURM_ARRAY_TASK_MAX=4, "
                                               "SLURM_ARRAY_TASK_COUNT=4)")):
        with pytest.raises(ConfigError) as err:
            resolve_rank(None, None, env)
        assert str(err.value) == (
            f"This job array is numbered {numbered}, but ranks come from one array numbered 0 to W-1 (--array=0-3 for "
            "4 ranks; a %N throttle is fine): the world size is the array's task count. To rerun one rank, requeue "
            "its task (scontrol requeue <jobid>_<rank>) or run it with --rank R --world-size W.")
    with pytest.raises(ConfigError, match=r"^The environment sets SLURM_ARRAY_TASK_ID=1 but not SLURM_ARRAY_TASK_C"):
        resolve_rank(None, None, {"SLURM_ARRAY_TASK_ID": "1"})


def _start_env(args: tuple, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen(cli_cmd(*args), stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                env={**{k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}, **env})


def test_bad_rank_flags_and_variables_are_refused_by_name(tmp_path, monkeypatch, capsys):
    toml = write_dataset(tmp_path / "ds", rows=make_rows(20), target=10)
    out = tmp_path / "out"
    cases = [
        ({}, ("--rank", "3", "--world-size", "3"),
         "error: --rank 3 must be between 0 and 2: ranks are numbered 0 to --world-size - 1, and --world-size is 3."),
        ({}, ("--rank", "1"), "error: --rank needs --world-size too: pass both (e.g. --rank 1 --world-size 4), or "
                              "neither to read them from SLURM (a job array's or srun's task) or RANK/WORLD_SIZE."),
        ({"WORLD_SIZE": "2"}, (), "error: The environment sets WORLD_SIZE=2 but not RANK: set both (rank and world "
                                  "size), or pass --rank and --world-size, which win over the environment."),
        ({"RANK": "4", "WORLD_SIZE": "4"}, (), "error: RANK=4 must be between 0 and 3: ranks are numbered 0 to "
                                               "WORLD_SIZE - 1, and WORLD_SIZE is 4."),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "0"}, (), "error: SLURM_NTASKS=0 must be at least 1 (the number of "
                                                         "ranks sharing the dataset)."),
        ({"RANK": "one", "WORLD_SIZE": "4"}, (), "error: The environment variable RANK='one' is not an integer. Fix "
                                                 "or unset it, or pass --rank and --world-size, which win over the "
                                                 "environment."),
    ]
    for env, flags, message in cases:
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            code = main(["generate", "--dataset", str(toml), "--server-url", "http://127.0.0.1:9", "--output-dir",
                         str(out), *flags])
        assert (code, capsys.readouterr().err.strip()) == (2, message), (env, flags)
    assert not out.exists()  # nothing was written for a refused run


# ---------------------------------------------------------------- three ranks, one simulator


@pytest.mark.e2e  # the process is the subject: make e2e
def test_three_ranks_one_killed_and_rerun_make_exactly_the_target_then_status_validate_and_refusals(tmp_path, sim_url):
    toml = write_dataset(tmp_path / "ds", rows=make_rows(120, invalid=2), target=TARGET, shard_max_samples=7,
                         fsync_every=2)  # 2 empty-content rows
    out, cfg_dir = tmp_path / "out", tmp_path / "ds"
    # rank 0 from the flags, rank 1 from RANK/WORLD_SIZE (torchrun), rank 2 from SLURM_PROCID/SLURM_NTASKS (srun);
    # a window of 2 keeps each rank running for a few seconds, so the kill of rank 1 lands mid-run
    envs = [{}, {"RANK": "1", "WORLD_SIZE": "3"}, {"SLURM_PROCID": "2", "SLURM_NTASKS": "3"}]
    base = _rank_args(toml, sim_url, out, 0, W, "--window", "2")
    procs = [_start_env(base if r == 0 else base[:9] + base[13:], envs[r], tmp_path / f"rank{r}.log") for r in range(W)]
    victim = procs[1]
    wait_for(lambda: len(_rank_ids(out, 1)) >= 4 if (out / "T" / "rank-1-of-3").is_dir() else False, timeout_s=90,
             interval_s=0.01)
    kill_group(victim, signal.SIGKILL)
    assert victim.returncode == -signal.SIGKILL  # it died by the signal, not by finishing
    for p in (procs[0], procs[2]):
        p.wait(timeout=180)
    logs = [(tmp_path / f"rank{r}.log").read_text() for r in range(W)]
    assert [procs[0].returncode, procs[2].returncode] == [0, 0], logs
    sources = ["--rank/--world-size", "RANK/WORLD_SIZE", "SLURM_PROCID/SLURM_NTASKS"]
    for r in range(W):
        assert logs[r].splitlines()[0] == (f"T: rank {r} of 3 (from {sources[r]}), share 30 of 90, "
                                           f"writing {out}/T/rank-{r}-of-3/")
        assert r == 1 or re.search(rf"^T \(rank {r} of 3\): 30/30 samples \(100\.0%\), \+30 this run in \S+, 2 invalid "
                                   r"rows skipped; target reached\.$", logs[r], re.M), logs[r]
    short = len(set(_rank_ids(out, 1)))
    assert 4 <= short < 30, short  # the kill landed: rank 1 is short of its share
    assert [len(_rank_ids(out, r)) for r in (0, 2)] == [30, 30]

    lines = _status_lines(out, cfg_dir)
    assert re.search(rf"\s+{60 + short}/90\s+.*\s+stopped, 1 stale\s+", lines[2]), lines[2]
    assert _ranks_block(lines)[0] == "T: 3 ranks; stale: rank 1"
    assert re.fullmatch(rf"  rank-1-of-3  {short}/30\s+{100 * short / 30:.1f}%\s+died \(pid {victim.pid} gone\)\s+"
                        r"(?:\d+s|\dm\d\ds) ago\s+\S+\s+stale: run it", _rank_line(lines, 1)), lines
    assert re.fullmatch(r"  rank-0-of-3  30/30\s+100\.0%\s+finished\s+" + AGO + r"\s+\S+", _rank_line(lines, 0))
    js = orjson.loads(run_cli("status", "--json", "--output-dir", out, "--config-dir", cfg_dir).stdout)["datasets"]["T"]
    assert (js["done"], js["stale_ranks"]) == (60 + short, [1])

    # rerun rank 1 alone: it takes over its own lock and finishes its share; the others are untouched
    before = {r: (out / "T" / f"rank-{r}-of-3" / "manifest.json").read_bytes() for r in (0, 2)}
    res = run_cli(*_rank_args(toml, sim_url, out, 1))
    assert res.returncode == 0, res.stderr
    assert f"took over the lock of a run that is gone (pid {victim.pid}" in res.stdout
    assert re.search(rf"^T \(rank 1 of 3\): 30/30 samples \(100\.0%\), \+{30 - short} this run in \S+, 2 invalid rows "
                     r"skipped; target reached\.$", res.stdout, re.M), res.stdout
    assert {r: (out / "T" / f"rank-{r}-of-3" / "manifest.json").read_bytes() for r in (0, 2)} == before
    per_rank = _assert_union_exact(out)
    # the layout's reader (what export reads through) yields every rank's samples, each once
    read = list(iter_committed_samples(out / "T"))
    assert sorted(s["id"] for s in read) == sorted(i for ids in per_rank.values() for i in ids)
    assert {frozenset(s) for s in read} == {frozenset(SAMPLE_KEYS)}
    for r in range(W):
        part = out / "T" / f"rank-{r}-of-3"
        manifest = orjson.loads((part / "manifest.json").read_bytes())
        assert (manifest["rank"], manifest["world_size"], manifest["target"]) == (r, W, 30)
        assert not (part / ".lock").exists()
    assert not (out / "T" / "manifest.json").exists()  # no flat part next to the ranks

    lines = _status_lines(out, cfg_dir)
    assert re.fullmatch(r"T\s+90/90\s+100\.0%\s+15\s+\S+\s+\S+\s+\S+%\s+0\s+2\s+finished\s+\S+\s+\S+\s+done", lines[2])
    block = _ranks_block(lines)
    assert block[:2] == ["T: 3 ranks", "  rank         done/share  %       state     last commit  samples/s"]
    for r in range(W):
        assert re.fullmatch(rf"  rank-{r}-of-3  30/30       100\.0%  finished  {AGO}\s+[\d.]+k?", block[2 + r])
    js = orjson.loads(run_cli("status", "--json", "--output-dir", out, "--config-dir", cfg_dir).stdout)["datasets"]["T"]
    assert (js["done"], js["target"], js["world_size"], js["stale_ranks"], js["state"]) == (90, 90, 3, [], "finished")
    # every rank reads the whole source and records its 2 invalid rows; the dataset counts each row once
    assert (js["rejects"], js["rejects_by_reason"]) == (2, {"empty_content": 2})
    assert [r["rejects"] for r in js["ranks"]] == [2, 2, 2]
    assert [(r["dataset"], r["done"], r["target"], r["state"]) for r in js["ranks"]] == \
        [(f"T/rank-{r}-of-3", 30, 30, "finished") for r in range(W)]

    res = run_cli("validate", "--dataset", "T", "--output-dir", out, "--config-dir", cfg_dir)
    assert res.returncode == 0, res.stdout
    assert re.match(rf"{re.escape(str(out / 'T'))}: 90 rows in 15 shards of 3 ranks: OK \(\d+ truncated, "
                    r"policy keep\)(\n|$)", res.stdout)  # the quality gate's line may follow

    # a second world size over the same dataset is refused, and so is the one-run layout
    res = run_cli(*_rank_args(toml, sim_url, out, 0, 2))
    assert res.returncode == 4
    assert res.stderr.strip() == (
        f"error: {out / 'T'} was written with world size 3 (rank-0-of-3, rank-1-of-3, rank-2-of-3: 90 samples); "
        "this run is rank 0 of 2. Which rank owns a prompt depends on the world size, so changing it would redo or "
        "lose samples. Run every rank with --world-size 3 (ranks 0 to 2) to continue, or write to another "
        f"--output-dir or dataset name (or move {out / 'T'} away to start over).")
    res = run_cli("generate", "--dataset", toml, "--server-url", sim_url, "--output-dir", out)
    assert res.returncode == 4
    assert res.stderr.strip().startswith(f"error: {out / 'T'} was written with world size 3 (rank-0-of-3, "
                                         "rank-1-of-3, rank-2-of-3: 90 samples); this run has no rank (world size 1).")
    assert not (out / "T" / "rank-0-of-2").exists() and not (out / "T" / "manifest.json").exists()
    _assert_union_exact(out)  # the refused runs touched nothing

    # a rank rerun after the end has nothing to do
    res = run_cli(*_rank_args(toml, sim_url, out, 1))
    assert res.returncode == 0
    assert res.stdout.strip().endswith("T (rank 1 of 3): 30/30 samples (100.0%); the target is already reached, "
                                       "nothing to do.")

    # validate reads the ranks as one dataset: a sample copied into another rank's folder is caught twice
    first = (out / "T" / "rank-0-of-3" / "shard-00000.jsonl").read_bytes().splitlines(keepends=True)[0]
    sid = orjson.loads(first)["id"]
    with open(out / "T" / "rank-1-of-3" / "shard-00001.jsonl", "ab") as f:
        f.write(first)
    res = run_cli("validate", "--dataset", "T", "--output-dir", out, "--config-dir", cfg_dir)
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    assert re.fullmatch(rf"{re.escape(str(out / 'T'))}: 91 rows in 15 shards of 3 ranks: 2 problems \(\d+ truncated, "
                        r"policy keep\)", lines[0])
    assert sorted(line for line in lines[1:] if "quality gate" not in line) == sorted([
        "  duplicate_id: 1 (id already seen)",
        f"    rank-1-of-3/shard-00001.jsonl:8: id '{sid}' already at rank-0-of-3/shard-00000.jsonl:1",
        "  wrong_rank: 1 (a rank's folder holds a sample whose id hashes to another rank)",
        f"    rank-1-of-3/shard-00001.jsonl:8: id '{sid}' belongs to rank 0 of 3, not rank 1"])


def test_ranks_over_a_one_run_dataset_are_refused(tmp_path, sim_url):
    toml = write_dataset(tmp_path / "ds", rows=make_rows(40), target=30)
    out = tmp_path / "out"
    res = run_cli("generate", "--dataset", toml, "--server-url", sim_url, "--output-dir", out, "--limit", "4")
    assert res.returncode == 0, res.stderr
    res = run_cli(*_rank_args(toml, sim_url, out, 2))
    assert res.returncode == 4
    assert res.stderr.strip() == (
        f"error: {out / 'T'} holds a dataset written by one run without ranks (4 samples in its own shards); this "
        "run is rank 2 of 3. One dataset cannot mix the two layouts. Finish it without ranks (no --rank/--world-size, "
        "outside a SLURM job array or multi-task srun, RANK/WORLD_SIZE unset), or write to another --output-dir or "
        f"dataset name (or move {out / 'T'} away to start over).")
    assert sorted(p.name for p in (out / "T").iterdir() if p.is_dir()) == []


def test_a_rank_whose_slice_of_the_source_is_short_says_source_exhausted(tmp_path, sim_url):
    # 80 rows hash 23/15/25/17 to ranks 0..3 of 4; a target of 72 asks 18 of each
    toml = write_dataset(tmp_path / "ds", rows=make_rows(80), target=72)
    out, cfg_dir = tmp_path / "out", tmp_path / "ds"
    res = run_cli(*_rank_args(toml, sim_url, out, 1, 4))
    assert res.returncode == 5, res.stderr  # a source short of the (rank's) target: exit 5, as for one run
    assert res.stdout.splitlines()[0] == (f"T: rank 1 of 4 (from --rank/--world-size), share 18 of 72, "
                                          f"writing {out}/T/rank-1-of-4/")
    assert re.search(r"^T \(rank 1 of 4\): 15/18 samples \(83\.3%\), \+15 this run in \S+; source exhausted: no "
                     r"more prompts of the source hash to rank 1 of 4 \(3 short of its share; other ranks do not "
                     r"take over its prompts\)\.$", res.stdout, re.M), res.stdout
    lines = _status_lines(out, cfg_dir)
    assert _ranks_block(lines)[0] == "T: 4 ranks; stale: rank 0, 2, 3"  # never started: they need a run
    assert re.fullmatch(r"  rank-1-of-4  15/18\s+83\.3%\s+source exhausted\s+" + AGO + r"\s+\S+",
                        _rank_line(lines, 1, 4))
    assert re.fullmatch(r"  rank-0-of-4  0/18\s+0\.0%\s+not started\s+-\s+-\s+stale: run it", _rank_line(lines, 0, 4))


def test_a_rank_on_another_host_is_stale_once_its_manifest_stops_moving_and_ranks_share_the_config(tmp_path, sim_url):
    """The pid of a lock held on another host cannot be checked: its manifest's last commit tells. Another rank with
    a different config is refused."""
    toml = write_dataset(tmp_path / "ds", rows=make_rows(40), target=20)
    out, cfg_dir = tmp_path / "out", tmp_path / "ds"
    res = run_cli(*_rank_args(toml, sim_url, out, 0, 2, "--limit", "3"))
    assert res.returncode == 0, res.stderr
    part = out / "T" / "rank-0-of-2"
    (part / ".lock").write_bytes(orjson.dumps({"pid": 4242, "host": "node-7",
                                               "started_at": "2026-01-01T00:00:00+00:00"}))
    manifest = orjson.loads((part / "manifest.json").read_bytes())

    def rank0_line(age_s: int, **last_run: object) -> tuple[str, range]:
        """The rank's status line with its last commit `age_s` ago, and the ages status may show (the
        seconds status takes to answer count too: the bound is measured, not guessed)."""
        runs = manifest["runs"][:-1] + [{**manifest["runs"][-1], **last_run}]
        started = time.monotonic()
        updated_at = (datetime.now(UTC) - timedelta(seconds=age_s)).isoformat(timespec="seconds")
        (part / "manifest.json").write_bytes(orjson.dumps({**manifest, "updated_at": updated_at, "runs": runs}))
        line = _rank_line(_status_lines(out, cfg_dir), 0, 2)
        return line, range(age_s, age_s + math.ceil(time.monotonic() - started) + 2)

    def shown_age(line: str) -> int:
        m = re.search(r"  (?:(\d+)m)?(\d+)s ago  ", line)
        assert m is not None, line
        return 60 * int(m.group(1) or 0) + int(m.group(2))

    fresh, ages = rank0_line(3)
    assert re.fullmatch(r"  rank-0-of-2  3/10\s+30\.0%\s+running \(pid 4242 on node-7\)\s+\d+s ago\s+\S+", fresh)
    assert shown_age(fresh) in ages, (fresh, ages)
    old, ages = rank0_line(600)
    assert re.fullmatch(r"  rank-0-of-2  3/10\s+30\.0%\s+running \(pid 4242 on node-7\)\s+10m\d\ds ago\s+\S+\s+"
                        r"stale: run it", old), old
    assert shown_age(old) in ages, (old, ages)
    # a run that has written nothing yet may be loading the model: no commits for up to its startup timeout
    loading, ages = rank0_line(600, ended_at=None, samples_written=0)
    assert re.fullmatch(r"  rank-0-of-2  3/10\s+30\.0%\s+running \(pid 4242 on node-7\)\s+10m\d\ds ago\s+\S+", loading)
    assert shown_age(loading) in ages, (loading, ages)
    gone, _ = rank0_line(2400, ended_at=None, samples_written=0)
    assert gone.endswith("stale: run it"), gone

    toml.write_text(toml.read_text().replace("temperature = 0.7", "temperature = 0.9"))
    res = run_cli(*_rank_args(toml, sim_url, out, 1, 2))
    assert res.returncode == 4
    rank0 = out / "T" / "rank-0-of-2"
    assert res.stderr.strip() == (
        f"error: {rank0} was written with a different config (1 setting differs):\n"
        f"  sampling.temperature: 0.7 in {rank0}, 0.9 now\n"
        "Resuming would mix samples made two ways in one dataset. Restore the old setting to resume, or write to a "
        "new output folder or dataset name.")
    assert not (out / "T" / "rank-1-of-2").exists()  # the refused rank left nothing behind


def test_the_readme_shows_the_sbatch_script_that_make_slurm_test_runs():
    """tests/slurm/test_slurm.py submits examples/slurm/generate.sbatch; docs/fleets.md shows that file whole."""
    script = (REPO / "examples" / "slurm" / "generate.sbatch").read_text()
    assert f"```bash\n{script}```\n" in user_docs()
    assert os.access(REPO / "tests" / "slurm" / "cluster.sh", os.X_OK)
