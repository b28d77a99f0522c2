"""What a user sees in a log (not a terminal): plain lines with done/target, rates, window, ETA."""

import io

from gen_pipeline.display import format_duration
from gen_pipeline.records import RunSnapshot
from gen_pipeline.run.progress import Progress


def test_log_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    p = Progress("B2", stream=out, log_every_s=3600)
    assert p.mode == "log"
    p.update(RunSnapshot(done=900, target=18_000, samples_per_s=0.5, tokens_per_s=1400.0, in_flight=150, window=152,
                     running=140, queued=10, kv_usage=0.93, retractions_total=40, retractions_run=4))
    p.update(RunSnapshot(done=1000, target=18_000, samples_per_s=0.5, tokens_per_s=1412.0, in_flight=150, window=152))
    p.close()
    lines = out.getvalue().splitlines()
    assert lines == [
        "B2 900/18,000 (5.0%) 0.50 samples/s, 1,400 tok/s, in flight 150/152, running 140 queued 10, KV 93%, "
        "retracted 4, eta 9h30m",
        "B2 1,000/18,000 (5.6%) 0.50 samples/s, 1,412 tok/s, in flight 150/152, eta 9h26m",
    ]


def test_durations() -> None:
    assert [format_duration(s) for s in (None, 5, 65, 3600 * 27 + 60)] == ["?", "5s", "1m05s", "27h01m"]
