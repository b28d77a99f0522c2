"""GPU-hours and the projected completion: the arithmetic over run records, and the lines status and the
report page print, whole."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from gen_pipeline import ConfigError, RunOptions
from gen_pipeline.records import Sample
from gen_pipeline.reports.gpu_hours import dataset_usage, format_usage, job_usage, project
from gen_pipeline.reports.page import render_html
from gen_pipeline.reports.status import format_status, run_wall_s, status_all
from gen_pipeline.server.handle import server_gpus
from gen_pipeline.store.dataset_store import DatasetStore

T0 = "2026-12-01T10:00:00+00:00"


def at(minutes: float) -> str:
    return datetime.fromtimestamp(datetime.fromisoformat(T0).timestamp() + 60 * minutes, UTC).isoformat()


def run(start: float, gen: float | None, end: float | None, samples: int, gpus: int | None = 8,
        how: str = "tp 8 × dp 1 × 1 server", **kw) -> dict:
    r = {"run": 1, "started_at": at(start), "ended_at": None if end is None else at(end), "updated_at": at(end or 0),
         "samples_written": samples, "gpus_how": how, **kw}
    if gen is not None:
        r["generating_at"] = at(gen)
    if gpus is not None:
        r["gpus"] = gpus
    return r


@pytest.mark.parametrize("info, servers, flag, expected", [
    ({"tp_size": 8, "dp_size": 1}, 1, None, (8, "tp 8 × dp 1 × 1 server")),
    ({"tp_size": 4, "dp_size": 2}, 3, None, (24, "tp 4 × dp 2 × 3 servers")),
    ({"tp_size": 2}, 2, None, (4, "tp 2 × dp 1 × 2 servers")),  # no dp_size: 1
    ({"tp_size": 8, "dp_size": 1}, 2, 4, (8, "--gpus-per-server 4 × 2 servers")),  # the flag wins
    ({}, 2, 8, (16, "--gpus-per-server 8 × 2 servers")),
    ({}, 1, None, (None, "unknown")),
    ({"tp_size": "8", "dp_size": True}, 1, None, (None, "unknown")),  # not whole numbers
])
def test_the_gpus_a_run_holds(info, servers, flag, expected):
    assert server_gpus(info, servers, flag) == expected


def test_gpus_per_server_is_checked_like_every_flag():
    with pytest.raises(ConfigError, match=r"^--gpus-per-server 0 must be at least 1\.$"):
        RunOptions(server_urls=("http://s:1",), gpus_per_server=0)
    assert RunOptions(server_urls=("http://s:1",), gpus_per_server=8).gpus_per_server == 8
    # generate --gpus-per-server → the run record: tests/server/test_scale_out.py (two simulators)


def test_a_datasets_gpu_hours_count_from_its_first_request():
    # run 1: the job started at 0 (model load), this dataset generated 10 → 70 min: 8 GPUs x 1 h, 1,000 samples;
    # run 2 (no generating_at: a manifest of an older run) 100 → 130 min at 16 GPUs: 8 GPU-h, 600 samples
    u = dataset_usage([run(0, 10, 70, 1_000), run(100, None, 130, 600, gpus=16, how="tp 8 × dp 1 × 2 servers")])
    assert (round(u.gpu_hours, 6), u.wall_s, u.samples, u.unknown_runs) == (16.0, 5400.0, 1_600, 0)
    assert format_usage("B1", u) == ("B1: 16.00 GPU-h over 1h30m for 1,600 samples = 10.00 GPU-h per 1,000 samples "
                                     "(tp 8 × dp 1 × 2 servers)")
    part = dataset_usage([run(0, 0, 60, 500), run(60, 60, 90, 100, gpus=None, how="unknown")])
    assert format_usage("B6", part) == ("B6: 8.00 GPU-h over 1h30m for 500 samples = 16.00 GPU-h per 1,000 samples "
                                        "(unknown); 1 run (30m00s) of unknown GPUs not counted")
    unknown = dataset_usage([run(0, 0, 45, 100, gpus=None, how="unknown")])
    assert format_usage("B7", unknown) == ("B7: GPU-hours unknown over 45m00s (the server reported no tp_size; "
                                           "pass --gpus-per-server N)")
    assert unknown.to_dict()["gpu_hours"] is None and unknown.per_1k is None


def test_the_jobs_gpu_hours_count_an_overlap_once_and_ranks_add_up():
    # one server: B1 0 → 60, B6's run began with the job at 0 and ended at 90 (it generated from 55): 90 min x 8
    # GPUs = 12 GPU-h, not 8 + 12; a second rank's server (its own lane) 0 → 30 min: + 4 GPU-h
    b1, b6 = run(0, 0, 60, 1_000), run(0, 55, 90, 500)
    other = run(0, 0, 30, 200)
    assert round(job_usage({"": [b1, b6]}).gpu_hours, 6) == 12.0
    u = job_usage({"rank-0-of-2": [b1, b6], "rank-1-of-2": [other]})
    assert (round(u.gpu_hours, 6), u.samples, u.wall_s) == (16.0, 1_700, 7200.0)
    # the datasets' own figures: B6 counts from its first request (35 min); the parts sum to 12.67 (their
    # 5-minute hand-over twice), not 8 + 12
    assert round(dataset_usage([b1]).gpu_hours + dataset_usage([b6]).gpu_hours, 2) == 12.67
    # runs that tie in time sort whether or not their GPUs are known: the job's "nothing to do" run of a dataset
    # records no GPUs in the same second as another run (this crashed status with "'<' not supported between
    # 'int' and 'NoneType'")
    u = job_usage({"": [run(0, 0, 60, 1_000), run(0, 0, 60, 0, gpus=None), run(0, 0, 60, 500, gpus=4)]})
    assert (round(u.gpu_hours, 6), u.samples, u.unknown_runs) == (0.0, 1_500, 1)


def test_the_projection_runs_the_unfinished_datasets_one_after_another():
    now = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
    # B1: 1,000 left at 2/s (500 s), B6 not started: 3,000 at the job's 1.5/s (2,000 s), B7 done
    p = project([(1_000, 2.0, None), (3_000, None, None), (0, 4.0, 0.0)], 1.5, live=True, now=now)
    assert p.line() == "job: projected completion 2026-12-02 09:41 UTC (in 41m40s at the measured rates)"
    assert p.to_dict() == {"remaining_s": 2500.0, "at": "2026-12-02T09:41:40+00:00", "live": True, "blocked": []}
    stopped = project([(1_000, 2.0, None)], None, live=False, now=now)
    assert stopped.line() == "job: 8m20s of generating left at the measured rates (no run is live)"
    unknown = project([(10, None, None)], None, live=True)
    assert unknown.line() == "job: projected completion unknown (no measured rate yet)"
    assert project([(0, None, 0.0)], None, live=False).line() == "job: every dataset is done"
    assert project([(5, 1.0, None), (3, 1.0, None)], 1.0, live=False, blocked=["B1", "B6"]).line() == (
        "job: no projected completion: B1, B6 cannot reach their target (source exhausted)")


def _sample(i: int) -> Sample:
    return Sample(f"B1-{i}", "B1", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                  {"finish_reason": "stop", "prompt_tokens": 10, "completion_tokens": 90})


def _dataset(root: Path, name: str, n: int, target: int, times: tuple[float, float, float] | None,
             info: dict | None = None) -> None:
    """A dataset of `n` samples whose one run recorded `info`'s server; its times set to (start, first
    request, end) minutes after T0 (None: as written now, still open)."""
    s = DatasetStore(root, name, fingerprint={"model": "m"}, target=target)
    s.open()
    if info is not None:
        gpus, how = server_gpus(info, 1)
        s.record_server(tp_size=info.get("tp_size"), dp_size=info.get("dp_size"), servers=1, gpus=gpus, how=how)
    s.record_generating()
    s.write_samples([Sample(f"{name}-{i}", name, _sample(i).conversations, _sample(i).meta) for i in range(n)])
    s.close({"samples_per_s": 0.5, "tokens_per_s": 50.0})
    if times is not None:
        path = root / name / "manifest.json"
        m = orjson.loads(path.read_bytes())
        m["runs"][-1].update(started_at=at(times[0]), generating_at=at(times[1]), ended_at=at(times[2]),
                             updated_at=at(times[2]))
        path.write_bytes(orjson.dumps(m))


def test_status_prints_the_gpu_hours_and_the_projection(tmp_path: Path) -> None:
    _dataset(tmp_path, "B1", 200, 200, (0, 5, 65), {"tp_size": 8, "dp_size": 1})  # done: 8 GPU-h
    _dataset(tmp_path, "B6", 100, 400, (0, 64, 94), {"tp_size": 8, "dp_size": 1})  # 300 left at 0.5/s
    m = orjson.loads((tmp_path / "B6" / "manifest.json").read_bytes())
    assert {k: m["runs"][0][k] for k in ("tp_size", "dp_size", "servers", "gpus", "gpus_how")} == {
        "tp_size": 8, "dp_size": 1, "servers": 1, "gpus": 8, "gpus_how": "tp 8 × dp 1 × 1 server"}
    report = status_all(tmp_path, {"B1": 200, "B6": 400})
    lines = format_status(report).splitlines()
    assert lines[lines.index("GPU-hours (tp × dp × servers × wall time):"):] == [
        "GPU-hours (tp × dp × servers × wall time):",
        "  B1: 8.00 GPU-h over 1h00m for 200 samples = 40.00 GPU-h per 1,000 samples (tp 8 × dp 1 × 1 server)",
        "  B6: 4.00 GPU-h over 30m00s for 100 samples = 40.00 GPU-h per 1,000 samples (tp 8 × dp 1 × 1 server)",
        "  job: 12.53 GPU-h over 1h34m for 300 samples = 41.78 GPU-h per 1,000 samples (tp 8 × dp 1 × 1 server)",
        "  job: 10m00s of generating left at the measured rates (no run is live)"]
    assert report.to_dict()["job"] == {
        "gpu": {"gpu_hours": 12.5333, "wall_s": 5640.0, "samples": 300, "gpu_hours_per_1k": 41.7778,
                "unknown_runs": 0, "gpus": "tp 8 × dp 1 × 1 server"},
        "projection": {"remaining_s": 600.0, "at": None, "live": False, "blocked": []}}
    page = render_html("B6", [], status_all(tmp_path, {"B6": 400}, total_of=[], others=False), "", "")
    assert ('<pre class="gpu">GPU-hours (tp × dp × servers × wall time):\n'
            "  B6: 4.00 GPU-h over 30m00s for 100 samples = 40.00 GPU-h per 1,000 samples (tp 8 × dp 1 × 1 server)\n"
            "  job: 10m00s of generating left at the measured rates (no run is live)</pre>") in page
    # runs that recorded no server (older versions) print no GPU lines
    s = DatasetStore(tmp_path / "older", "B1", fingerprint={"model": "m"}, target=10)
    s.open()
    s.write_samples([_sample(i) for i in range(3)])
    s.close({"samples_per_s": 1.0})
    assert "GPU-hours" not in format_status(status_all(tmp_path / "older", {"B1": 10}))


def test_mixed_naive_and_aware_times_span_their_seconds() -> None:
    """A hand-edited manifest's naive times are read as UTC, as GPU-hours reads them: no TypeError."""
    assert run_wall_s({"started_at": "2026-01-01T00:00:00", "ended_at": "2026-01-01T01:00:00+00:00"}) == 3600.0
    assert run_wall_s({"started_at": "2026-01-01T00:00:00+01:00", "updated_at": "2026-01-01T00:30:00"}) == 5400.0
    assert run_wall_s({"started_at": "2026-01-01T00:00:00"}) is None
    assert run_wall_s({"started_at": "not a time", "ended_at": "2026-01-01T01:00:00"}) is None
