"""Every count in a line a user reads has the thousands separator (display.count)."""

from dataclasses import replace

from gen_pipeline.display import count
from gen_pipeline.records import RunSnapshot
from gen_pipeline.run.options import RunSummary
from gen_pipeline.run.progress import postfix


def test_count() -> None:
    assert [count(n) for n in (0, 999, 1538, 88_000, 1_234_567)] == ["0", "999", "1,538", "88,000", "1,234,567"]


def test_summary_line_counts() -> None:
    s = RunSummary("B2", done=12_000, target=18_000, written=1538, failures=2500, rejects=1200, elapsed_s=65,
                   stopped_by="SIGTERM", failure_reasons={"http_500": 1538, "timeout": 962}, final_failures=1100)
    assert s.line() == (
        "B2: 12,000/18,000 samples (66.7%), +1,538 this run in 1m05s, 2,500 failed (http_500 1,538, timeout 962; "
        "1,100 final, 1,400 retried by the next run), 1,200 invalid rows skipped; stopped (SIGTERM); run the same "
        "command to resume.")


def test_progress_counts() -> None:
    live = RunSnapshot(done=900, target=18_000, samples_per_s=0.5, tokens_per_s=14000.0, in_flight=1500,
                       window=2048, running=1200, queued=1100, kv_usage=0.93)
    assert postfix(live) == "14,000 tok/s, in flight 1,500/2,048, running 1,200 queued 1,100, KV 93%"
    read_apart = replace(live, readers=3)  # where the answers are read: reader processes (run/readers.py)
    assert postfix(read_apart) == ("14,000 tok/s, in flight 1,500/2,048, 3 reader processes, running 1,200 queued "
                                   "1,100, KV 93%")
    assert postfix(replace(live, readers=1)).split(", ")[2] == "1 reader process"
    shrunk = RunSnapshot(done=900, target=18_000, samples_per_s=0.5, tokens_per_s=1400.0, in_flight=2500,
                         window=1200)
    assert postfix(shrunk) == "1,400 tok/s, in flight 2,500 (window lowered to 1,200; 1,300 finishing before new ones)"
    final = RunSnapshot(done=900, target=18_000, samples_per_s=0.5, tokens_per_s=1400.0, in_flight=0, window=1,
                        final=True, peak_running=1500, peak_queued=2000, peak_kv_usage=0.9)
    assert postfix(final) == "1,400 tok/s, peak running 1,500 queued 2,000, peak KV 90%"
