"""`diagnose` on the real H200 traces of issue 19: each recorded run's per-second trace as the telemetry rows
`gen-pipeline diagnose` reads (bench/gpu/traces.py telemetry_rows), its verdicts and the elasticity they
rest on, beside what the CLI's own telemetry said on the GPU machine (the run's `diagnose` field).

    python -m bench.gpu.verdicts [TRACES.json ...]     (default: the four committed files)

The CLI polled at its own times and sized tokens per request with the controller's estimate, so its
verdict may differ from the trace's where the elasticity is near a bound; the trace is what is committed.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from bench.gpu.traces import COMMITTED, telemetry_rows
from gen_pipeline.reports.diagnose import diagnose, elasticity, view

TRACE_FILES = COMMITTED
MAX_RUNNING = 3_750  # SGLang's max_running_requests on the lent H200 with 60,000 KV tokens
# mean prompt tokens of h200_results.json's 1,500 samples: the short regime's prompts are the same generator
# and seed (bench/gpu/setup.py write_prompts); its traces carry no lengths, the long regime's do
SHORT_PROMPT_TOKENS = 187.5


def run_rows(entry: dict, run: dict) -> list[dict]:
    """Telemetry rows of one recorded run (`entry`: a regime of a traces file, `run`: one of its runs): the
    pool's KV tokens, tokens per request = mean prompt + the run's mean completion."""
    lengths = entry.get("lengths")
    prompt = statistics.fmean(p for p, _ in lengths) if lengths else SHORT_PROMPT_TOKENS
    return telemetry_rows(run["trace"], kv_tokens=entry["kv_tokens"], max_running=MAX_RUNNING,
                          tokens_per_request=prompt + run["completion_tokens"] / run["rows"], samples=run["rows"])


def verdicts(paths: tuple[Path, ...] = TRACE_FILES) -> list[dict]:
    """Per run of every file: file, regime, client, round, elasticity (None: not read), the trace's verdicts
    and the CLI's."""
    out = []
    for path in paths:
        data = json.loads(path.read_text())
        for regime in ("short", "long"):
            for run in data.get(regime, {}).get("runs", []):
                rows = run_rows(data[regime], run)
                out.append({"file": path.name, "regime": regime, "client": run["client"], "round": run["round"],
                            "elasticity": elasticity(view(rows).after_warmup),
                            "rules": [v.rule for v in diagnose(rows)], "cli": run.get("diagnose") or []})
    return out


def main(argv: list[str]) -> int:
    paths = tuple(Path(a) for a in argv) or TRACE_FILES
    print("| file | regime | client | round | elasticity [one-sided 95 % bounds] polls | diagnose (trace) "
          "| diagnose (CLI on the GPU machine) |\n|---|---|---|---|---|---|---|")
    for r in verdicts(paths):
        e = r["elasticity"]
        read = f"{e.slope:.2f} [{e.low:.2f}, {e.high:.2f}] {e.polls}" if e else "not read"
        print(f"| {r['file']} | {r['regime']} | {r['client']} | {r['round']} | {read} | "
              f"{' '.join(r['rules']) or '-'} | {' '.join(r['cli']) or '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
