"""`status` figures read from outputs/ only: a live run, a dead one with a torn tail, the states."""

from __future__ import annotations

import os

import pytest

from gen_pipeline.records import Failure, Reject, Sample
from gen_pipeline.reports.status import format_status, read_status, status_all
from gen_pipeline.store.dataset_store import DatasetStore
from tests.store.store_helpers import crash, dead_pid

FP = {"model": "m", "truncated": "keep"}


def sample(i: int, *, truncated: bool = False) -> Sample:
    return Sample(f"B2-{i}", "B2", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                  {"finish_reason": "length" if truncated else "stop", "prompt_tokens": 100, "completion_tokens": 1000})


def make(root, **kw) -> DatasetStore:
    return DatasetStore(root, "B2", **({"fingerprint": FP, "target": 20, "shard_max_samples": 4,
                                        "fsync_every": 100} | kw))


def test_status_of_a_live_run(tmp_path):
    with make(tmp_path) as s:
        s.open()
        s.write_samples([sample(i, truncated=i % 5 == 0) for i in range(10)])  # 2 sealed + 2 in the open shard
        s.write_failures([Failure("B2-50", "B2", "timeout", "x"), Failure("B2-3", "B2", "timeout", "x")])
        s.commit({"samples_per_s": 2.5, "tokens_per_s": 2750.0, "in_flight": 40, "updated_at": "2026-01-01T00:00:00"})
        s.write_samples([sample(10)])  # flushed, not yet committed: status sees it too
        st = read_status(tmp_path, "B2", 20)
    assert (st.done, st.target, st.shards) == (11, 20, 3)
    assert (st.prompt_tokens, st.completion_tokens, st.truncated) == (1100, 11000, 2)
    assert st.state == f"running (pid {os.getpid()})"
    assert (st.samples_per_s, st.tokens_per_s, st.updated_at) == (2.5, 2750.0, "2026-01-01T00:00:00")
    assert st.eta_s == 9 / 2.5
    assert (st.errors_last_run, st.errors_unresolved) == (2, 1)  # B2-3 has a sample since


@pytest.mark.e2e  # the process is the subject: make e2e
def test_status_of_a_dead_run_with_a_torn_tail(tmp_path):
    s = make(tmp_path)
    s.open()
    s.write_samples([sample(i) for i in range(6)])
    crash(s)  # the process dies: no close(), the lock file stays, its flock goes with the process
    with open(tmp_path / "B2" / "shard-00001.jsonl", "ab") as f:
        f.write(sample(6).to_json()[:30])
    st = read_status(tmp_path, "B2", None)
    assert (st.done, st.target, st.shards, st.corrupt_lines) == (6, 20, 2, 0)
    assert st.state == f"died (pid {dead_pid()} gone)"
    assert (tmp_path / "B2" / ".lock").exists()  # status only reads


def test_states_rejects_and_totals(tmp_path):
    assert read_status(tmp_path, "B2", 20).state == "not started"
    with make(tmp_path, target=4) as s:
        s.open()
        s.write_samples([sample(i) for i in range(2)])
        s.write_rejects([Reject("B2", 1, "empty_content"), Reject("B2", 2, "roles_not_alternating")])
    assert read_status(tmp_path, "B2", 4).state == "stopped"
    with make(tmp_path, target=4) as s:
        s.open()
        s.write_samples([sample(i) for i in range(4)])
        s.write_rejects([Reject("B2", 1, "empty_content"), Reject("B2", 2, "roles_not_alternating")])
    st = read_status(tmp_path, "B2", 4)
    assert (st.state, st.done, st.runs, st.eta_s) == ("finished", 4, 2, 0.0)
    assert (st.rejects, st.rejects_by_reason) == (2, {"empty_content": 1, "roles_not_alternating": 1})
    report = status_all(tmp_path, {"B1": 30000, "B2": 18000, "B6": 20000, "B7": 20000, "demo": 50},
                        total_of=["B1", "B2", "B6", "B7"])
    d = report.to_dict()
    assert d["total"] == {"done": 4, "target": 88000}
    assert {k: (v["done"], v["target"]) for k, v in d["datasets"].items()} == {
        "B1": (0, 30000), "B2": (4, 18000), "B6": (0, 20000), "B7": (0, 20000), "demo": (0, 50)}
    lines = format_status(report).splitlines()
    assert lines[0].split() == ["dataset", "done/target", "%", "shards", "prompt", "tok", "compl", "tok", "trunc",
                                "errors", "rejects", "state", "samples/s", "tok/s", "ETA"]
    assert lines[3].split()[:10] == ["B2", "4/18,000", "0.0%", "2", "400", "4.0k", "0.0%", "0", "2", "stopped"]
    assert lines[-1].split() == ["total", "4/88,000", "0.0%"]


def test_unknown_folders_are_listed_and_a_dataset_without_config_counts_its_recorded_target(tmp_path):
    with DatasetStore(tmp_path, "X9", fingerprint=FP, target=3) as s:
        s.open()
        s.write_samples([sample(0)])
    report = status_all(tmp_path, {"B2": 10})
    assert [(d.dataset, d.done, d.target) for d in report.datasets] == [("B2", 0, 10), ("X9", 1, 3)]
    assert (report.total_done, report.total_target) == (0, 10)
    with make(tmp_path, target=20) as s:  # `status --dataset B2` with outputs/B2 but no B2.toml: target None
        s.open()
        s.write_samples([sample(i) for i in range(3)])
    report = status_all(tmp_path, {"B2": None}, total_of=["B2"])
    assert [(d.dataset, d.done, d.target) for d in report.datasets] == [("B2", 3, 20), ("X9", 1, 3)]
    assert (report.total_done, report.total_target) == (3, 20)
