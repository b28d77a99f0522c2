"""A run record whose times mix naive and offset-aware ISO strings (a hand-edited manifest) spans the same
seconds as status and the card read it, naive read as UTC as GPU-hours reads it: no TypeError."""

from __future__ import annotations

from gen_pipeline.reports.status import run_wall_s


def test_mixed_naive_and_aware_times_span_their_seconds() -> None:
    assert run_wall_s({"started_at": "2026-01-01T00:00:00", "ended_at": "2026-01-01T01:00:00+00:00"}) == 3600.0
    assert run_wall_s({"started_at": "2026-01-01T00:00:00+01:00", "updated_at": "2026-01-01T00:30:00"}) == 5400.0
    assert run_wall_s({"started_at": "2026-01-01T00:00:00"}) is None
    assert run_wall_s({"started_at": "not a time", "ended_at": "2026-01-01T01:00:00"}) is None
