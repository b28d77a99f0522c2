"""The store on real files: exact counts, torn tails, the atomic manifest, sidecars, locks, drift, disk
faults, and a Hypothesis crash/resume invariant."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import FP, FullDisk, crash, dead_pid, make, sample, shard_ids, write

import gen_pipeline.store.lock as lock_mod
import gen_pipeline.store.manifest as manifest_mod
import gen_pipeline.store.shards as shards_mod
from gen_pipeline.config.dataset import fingerprint_digest
from gen_pipeline.display import display_path
from gen_pipeline.errors import ConfigDriftError, DiskError, LockedError, StoreError
from gen_pipeline.records import Failure, Reject


def test_writes_exactly_up_to_target_and_refuses_duplicates_whatever_the_target(tmp_path):
    with make(tmp_path, target=10) as s:
        assert s.open().done == 0
        assert s.write_samples([sample(i) for i in range(6)]) == 6
        assert s.write_samples([sample(5), sample(6), sample(6), sample(7)]) == 2
        assert s.write_samples([sample(i) for i in range(8, 20)]) == 2
        assert (s.done, s.remaining) == (10, 0)
        assert s.write_samples([sample(50)]) == 0
    assert shard_ids(tmp_path / "B2") == [f"B2-{i}" for i in range(10)]
    run = orjson.loads((tmp_path / "B2" / "manifest.json").read_bytes())["runs"][0]
    assert (run["samples_written"], run["duplicates_skipped"], run["over_target_skipped"]) == (10, 2, 11)
    assert run["ended_at"] is not None
    with make(tmp_path, target=8) as s:  # the target may change between runs: lower, then higher
        assert (s.open().done, s.remaining) == (10, 0)
        assert s.write_samples([sample(90)]) == 0
    with make(tmp_path, target=12) as s:
        s.open()
        assert s.write_samples([sample(i) for i in range(14)]) == 2


def test_rotation_writes_sidecars_and_manifest_records(tmp_path):
    with make(tmp_path) as s:
        s.open()
        s.write_samples([sample(i, truncated=i == 1) for i in range(9)])
    folder = tmp_path / "B2"
    assert sorted(p.name for p in folder.iterdir()) == [
        "fingerprint.json", "manifest.json", "shard-00000.ids", "shard-00000.jsonl", "shard-00001.ids",
        "shard-00001.jsonl", "shard-00002.jsonl"]
    head, body = (folder / "shard-00001.ids").read_bytes().split(b"\n", 1)
    assert body == b'"B2-4"\n"B2-5"\n"B2-6"\n"B2-7"\n'
    assert orjson.loads(head) == {"shard": "shard-00001.jsonl", "bytes": (folder / "shard-00001.jsonl").stat().st_size,
                                  "samples": 4, "ids_sha256": hashlib.sha256(body).hexdigest()[:16]}
    assert orjson.loads((folder / "fingerprint.json").read_bytes()) == {"fingerprint": FP,
                                                                       "digest": fingerprint_digest(FP)}
    m = orjson.loads((folder / "manifest.json").read_bytes())
    assert m["sealed"][0] == {"name": "shard-00000.jsonl", "samples": 4,
                              "bytes": (folder / "shard-00000.jsonl").stat().st_size,
                              "prompt_tokens": 40, "completion_tokens": 80, "truncated": 1}
    assert m["open"] == {"name": "shard-00002.jsonl", "committed_bytes": (folder / "shard-00002.jsonl").stat().st_size,
                         "committed_samples": 1, "prompt_tokens": 10, "completion_tokens": 20, "truncated": 0}
    assert m["fingerprint"] == FP and len(m["fingerprint_digest"]) == 16


@pytest.mark.parametrize("tail", [sample(6).to_json()[:25], b'{"id": "B2-6", "conv\n'], ids=["torn", "unparseable"])
def test_a_torn_or_unparseable_last_line_is_cut(tmp_path, tail):
    write(tmp_path, range(6))
    shard = tmp_path / "B2" / "shard-00001.jsonl"
    good = shard.read_bytes()
    shard.write_bytes(good + tail)
    with make(tmp_path) as s:
        state = s.open()
        assert (state.done, state.repaired_bytes) == (6, len(tail))
        assert state.notes == [f"cut {len(tail)} bytes (a torn or invalid last line) from shard-00001.jsonl"]
        assert shard.read_bytes() == good
        assert s.write_samples([sample(6)]) == 1
    assert shard_ids(tmp_path / "B2") == [f"B2-{i}" for i in range(7)]


def test_corruption_mid_file_is_an_error_naming_file_and_line(tmp_path):
    write(tmp_path, range(3))
    shard = tmp_path / "B2" / "shard-00000.jsonl"
    lines = shard.read_bytes().split(b"\n")
    lines[1] = b"garbage"
    shard.write_bytes(b"\n".join(lines))
    with pytest.raises(StoreError) as e:
        make(tmp_path).open()
    assert str(e.value) == (
        f"{display_path(shard)} line 2 is not valid JSON, and it is not "
        "the last line, so this is not a torn write: the file is damaged. Fix or delete that line (its "
        "sample will be generated again), or move the file away, then run again.")
    assert not (tmp_path / "B2" / ".lock").exists()  # the failed open released the lock


def test_manifest_replace_is_atomic(tmp_path, monkeypatch):
    with make(tmp_path) as s:
        s.open()
        s.write_samples([sample(0)])
    folder = tmp_path / "B2"
    before = (folder / "manifest.json").read_bytes()

    def crash_before_rename(src, dst):
        raise KeyboardInterrupt  # the process dies between the tmp write and the rename

    monkeypatch.setattr(manifest_mod.os, "replace", crash_before_rename)
    s = make(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        s.open()
    assert (folder / "manifest.json").read_bytes() == before
    monkeypatch.undo()
    (folder / "manifest.json.tmp-4242").write_bytes(b'{"half": ')  # what a real crash leaves
    with make(tmp_path) as s:
        state = s.open()
        assert state.done == 1
        assert "removed a manifest tmp file left by a crash (the manifest itself is intact)" in state.notes
    assert sorted(p.name for p in folder.glob("manifest*")) == ["manifest.json"]


def test_resume_reads_sidecars_not_sealed_shards(tmp_path, monkeypatch):
    """A missing or wrong sidecar: test_damaged_state's test_a_sidecar_that_does_not_match_its_shard_..."""
    write(tmp_path, range(10))
    scanned: list[int] = []
    real_scan = shards_mod.scan_bytes
    monkeypatch.setattr(shards_mod, "scan_bytes", lambda data: scanned.append(len(data)) or real_scan(data))
    with make(tmp_path) as s:
        assert s.open().done == 10
    assert scanned == [(tmp_path / "B2" / "shard-00002.jsonl").stat().st_size]  # only the open shard


def test_sealed_shard_that_grew_is_rescanned(tmp_path):
    write(tmp_path, range(5))
    shard0 = tmp_path / "B2" / "shard-00000.jsonl"
    size = shard0.stat().st_size
    with open(shard0, "ab") as f:
        f.write(sample(99).to_json())
    with make(tmp_path) as s:
        state = s.open()
        assert state.done == 6 and "B2-99" in state.done_ids
        assert state.notes == [f"re-scanned shard-00000.jsonl: its size ({shard0.stat().st_size} bytes) differs "
                               f"from the manifest's ({size})"]


@pytest.mark.parametrize("next_shard_created", [True, False])
def test_crash_between_sealing_and_manifest_commit(tmp_path, next_shard_created):
    """Either way shard 0 is full at the next start: it is sealed then (its sidecar written anew)."""
    folder = tmp_path / "B2"
    s = make(tmp_path, fsync_every=100)
    s.open()
    s.write_samples([sample(i) for i in range(3)])
    s.commit()
    old_manifest = (folder / "manifest.json").read_bytes()
    s.write_samples([sample(3)])  # fills shard 0: sidecar, shard 1 created, manifest committed
    crash(s)
    (folder / "manifest.json").write_bytes(old_manifest)  # ... but that commit never landed
    if not next_shard_created:  # and shard 0's sidecar not written either
        (folder / "shard-00001.jsonl").unlink()
        (folder / "shard-00000.ids").unlink()
    with make(tmp_path) as s2:  # the dead run's lock is taken over
        state = s2.open()
        hms = datetime.fromisoformat("2026-01-01T11:02:03+00:00").astimezone().strftime("%H:%M:%S")
        assert state.notes[0] == f"took over the lock of a run that is gone (pid {dead_pid()}, started {hms})"
        assert orjson.loads((folder / ".lock").read_bytes())["pid"] == os.getpid()
        assert sorted(state.done_ids) == [f"B2-{i}" for i in range(4)]
        assert s2.write_samples([sample(4)]) == 1
    assert (folder / "shard-00000.ids").exists() and not (folder / ".lock").exists()
    m = orjson.loads((folder / "manifest.json").read_bytes())
    assert [(e["name"], e["samples"]) for e in m["sealed"]] == [("shard-00000.jsonl", 4)]
    assert (m["open"]["name"], m["open"]["committed_samples"]) == ("shard-00001.jsonl", 1)
    assert shard_ids(folder) == [f"B2-{i}" for i in range(5)]


def test_a_requeued_slurm_job_takes_over_its_own_lock_from_another_host(tmp_path, monkeypatch):
    """A lock of another host on a shared filesystem is refused, saying what to do. A requeued job (same SLURM_JOB_ID,
    SLURM_RESTART_COUNT + 1) may run on another node: the lock's job id and restart count say its writer's run ended.
    Another job, or the same run, is refused."""
    monkeypatch.setattr(lock_mod, "shared_filesystem", lambda folder: True)
    folder = tmp_path / "B2"
    folder.mkdir()
    started = "2026-03-01T11:02:03+00:00"
    hms = datetime.fromisoformat(started).astimezone().strftime("%H:%M:%S")
    where = display_path(folder)
    lock = {"pid": 4242, "host": "node-7", "started_at": started}
    (folder / ".lock").write_bytes(orjson.dumps(lock))
    with pytest.raises(LockedError) as e:  # outside a SLURM job: no scancel/squeue to suggest
        make(tmp_path).open()
    assert str(e.value) == (f"{where} is being written by a run on host node-7 (pid 4242, started {hms}); this host "
                            "cannot tell whether it still runs. Wait for it or stop it there; if it is gone, delete "
                            f"{where}/.lock.")
    (folder / ".lock").write_bytes(orjson.dumps(lock | {"slurm_job_id": "66", "slurm_restart": 0}))
    refused = (f"{where} is being written by a run on host node-7 (pid 4242, SLURM job 66, started {hms}); this "
               "host cannot tell whether it still runs. Wait for it or stop it there (scancel 66); if it is gone "
               f"(squeue -j 66 shows nothing), delete {where}/.lock.")
    for env in (("", ""), ("67", "1"), ("66", "")):  # "": unset
        for k, v in zip(("SLURM_JOB_ID", "SLURM_RESTART_COUNT"), env, strict=True):
            monkeypatch.setenv(k, v)
        with pytest.raises(LockedError) as e:
            make(tmp_path).open()
        assert str(e.value) == refused, env
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with make(tmp_path) as s:
        state = s.open()
        assert state.notes[0] == (f"took over the lock of SLURM job 66's previous run (pid 4242 on node-7, started "
                                  f"{hms}): the job was requeued")
        assert orjson.loads((folder / ".lock").read_bytes()) | {"started_at": "t"} == {
            "pid": os.getpid(), "host": socket.gethostname(), "started_at": "t", "slurm_job_id": "66",
            "slurm_restart": 1}


@pytest.mark.parametrize("lost", [(), ("manifest.json",), ("manifest.json", "fingerprint.json")])
def test_config_drift_is_refused_naming_each_key_whatever_files_were_lost(tmp_path, lost):
    write(tmp_path, range(6))
    folder = tmp_path / "B2"
    for name in lost:
        (folder / name).unlink()
    with pytest.raises(ConfigDriftError) as e:  # with both files gone the settings are read from the rows
        make(tmp_path, fingerprint={**FP, "model": "m2", "sampling": {**FP["sampling"], "temperature": 1.0}}).open()
    where = display_path(folder)
    assert str(e.value) == (
        f"{where} was written with a different config (2 settings differ):\n"
        f"  model: 'm' in {where}, 'm2' now\n"
        f"  sampling.temperature: 0.7 in {where}, 1.0 now\n"
        "Resuming would mix samples made two ways in one dataset. Restore the old settings to resume, "
        "or write to a new output folder or dataset name." + (
            "\n(Its manifest.json and fingerprint.json are gone: the settings were read from the rows, "
            "shard-00000.jsonl line 1.)" if len(lost) == 2 else ""))
    assert not (folder / ".lock").exists()
    assert shard_ids(folder) == [f"B2-{i}" for i in range(6)]
    with make(tmp_path) as s:  # the same config resumes
        assert s.open().done == 6


def test_config_may_change_while_no_sample_exists(tmp_path):
    with make(tmp_path) as s:  # e.g. a first run that died on a wrong source path
        s.open()
    changed = {**FP, "model": "m2"}
    with make(tmp_path, fingerprint=changed) as s:
        state = s.open()
        s.write_samples([sample(1)])
    assert state.notes == ["the config changed before any sample was written; the new one is recorded"]
    assert orjson.loads((tmp_path / "B2" / "manifest.json").read_bytes())["fingerprint"]["model"] == "m2"
    with pytest.raises(ConfigDriftError):
        make(tmp_path).open()


def test_enospc_stops_the_run_keeps_committed_data_and_resume_completes(tmp_path):
    one = len(sample(0).to_json())
    s = make(tmp_path, target=20, file_opener=FullDisk(budget=7 * one))
    s.open()
    assert s.write_samples([sample(i) for i in range(5)]) == 5
    with pytest.raises(DiskError) as e:
        s.write_samples([sample(i) for i in range(5, 10)])
    shard = tmp_path / "B2" / "shard-00001.jsonl"
    assert str(e.value) == (f"Writing {display_path(shard)} failed: No space left on device. 5 samples are "
                            "committed and safe; free space and run the same command to resume.")
    assert shard.read_bytes() == sample(4).to_json()  # the half line was cut back
    with pytest.raises(StoreError, match="stopped after a failed write"):
        s.write_samples([sample(11)])
    s.close()
    assert not (tmp_path / "B2" / ".lock").exists()
    with make(tmp_path, target=20) as s2:
        assert s2.open().done == 5
        assert s2.write_samples([sample(i) for i in range(30)]) == 15
    ids = shard_ids(tmp_path / "B2")
    assert ids == [f"B2-{i}" for i in range(20)]


def test_failures_and_rejects_carry_the_run_number(tmp_path):
    for run in (1, 2):
        with make(tmp_path) as s:
            s.open()
            s.write_failures([Failure("B2-7", "B2", "http_400", "too long", retryable=False),
                              Failure("B2-8", "B2", "timeout", "read timeout")])
            s.write_rejects([Reject("B2", 3, "empty_content")] + [Reject("B2", 5, "bad_type")] * (run == 2))
            if run == 2:
                s.write_samples([sample(8)])
                assert s.final_failure_ids() == {"B2-7"}
    errors = [orjson.loads(x) for x in (tmp_path / "B2" / "errors.jsonl").read_bytes().splitlines()]
    assert [(e["id"], e["run"], e["retryable"]) for e in errors] == [
        ("B2-7", 1, False), ("B2-8", 1, True), ("B2-7", 2, False), ("B2-8", 2, True)]
    rejects = [orjson.loads(x) for x in (tmp_path / "B2" / "rejects.jsonl").read_bytes().splitlines()]
    assert rejects == [  # row 3 is met by both runs but recorded once
        {"dataset": "B2", "row": 3, "reason": "empty_content", "detail": "", "run": 1},
        {"dataset": "B2", "row": 5, "reason": "bad_type", "detail": "", "run": 2}]


# ---------------------------------------------------------------- crash/resume invariant

ops = st.lists(st.one_of(st.tuples(st.just("write"), st.integers(1, 6)), st.just(("commit", 0)),
                         st.tuples(st.just("crash"), st.integers(0, 10_000))), max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops)
def test_crash_resume_keeps_a_prefix_without_duplicates(sequence):
    root = Path(tempfile.mkdtemp())
    try:
        _run_ops(root, sequence)
    finally:
        shutil.rmtree(root)


def _run_ops(root: Path, sequence: list[tuple[str, int]]) -> None:
    folder = root / "B2"
    written: list[str] = []  # every id ever accepted, in order; a crash may lose an unsynced tail
    store = make(root, target=40, shard_max_samples=3, fsync_every=4)
    store.open()
    for op, arg in sequence:
        if op == "write":
            batch = [sample(len(written) + i) for i in range(arg)]
            n = store.write_samples(batch)
            written += [x.id for x in batch[:n]]
        elif op == "commit":
            store.commit()
        else:
            # Power loss: the open shard may lose anything past its committed (fsynced) length.
            m = store._manifest
            committed = m["open"]["committed_bytes"]
            durable = sum(e["samples"] for e in m["sealed"]) + m["open"]["committed_samples"]
            shard = folder / m["open"]["name"]
            crash(store)
            size = shard.stat().st_size if shard.exists() else 0
            if shard.exists() and size > committed:
                os.truncate(shard, committed + arg % (size - committed + 1))
            store = make(root, target=40, shard_max_samples=3, fsync_every=4)
            state = store.open()
            on_disk = shard_ids(folder)
            assert on_disk == written[: len(on_disk)] and len(on_disk) >= durable
            assert sorted(state.done_ids) == sorted(on_disk) and state.done == len(on_disk)
            written = on_disk
    store.close()
    assert shard_ids(folder) == written and len(set(written)) == len(written) <= 40


CHILD = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.store.store_helpers import make, sample
s = make(Path({root!r}), fsync_every=100)
s.open()
s.write_samples([sample(i) for i in range(6)])
os.write(s._files["shard-00001.jsonl"].fileno(), sample(6).to_json()[:40])  # a torn write in flight
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.e2e  # the process is the subject: make e2e
def test_real_sigkill_mid_write_then_resume(tmp_path):
    repo = str(Path(__file__).resolve().parents[2])
    p = subprocess.Popen([sys.executable, "-c", CHILD.format(repo=repo, root=str(tmp_path))], cwd=repo)
    assert p.wait(timeout=30) == -9
    with make(tmp_path) as s:
        state = s.open()
        assert (state.done, state.repaired_bytes) == (6, 40)
        assert state.notes[0].startswith(f"took over the lock of a run that is gone (pid {p.pid}, started ")
        assert state.notes[1] == "cut 40 bytes (a torn or invalid last line) from shard-00001.jsonl"
        assert s.write_samples([sample(i) for i in range(10)]) == 4
    assert shard_ids(tmp_path / "B2") == [f"B2-{i}" for i in range(10)]
