"""After a start SGLang admits only ~16 long requests (each reserving its clipped max_new_tokens at ratio 0.7):
through the real path the adaptive window reaches 90 % of that batch as fast as a fixed window at the slot
count, on the simulator's clock (a loaded machine only gives the adaptive client more polls per sim second)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gen_pipeline.config.dataset import load_dataset_config
from gen_pipeline.run import RunOptions, run_generate
from sglang_sim.testing import start_sim

from pipeline_helpers import write_dataset

# a comparison of speeds: with the benchmarks (make bench-test), not under make test's load
pytestmark = pytest.mark.bench

SAMPLES, SLOTS_WINDOW, TIME_SCALE, POLL_S = 120, 40, 4.0, 0.1
WITHIN_S = 1.0  # simulated seconds: the ramp within a second of a fixed window's
_WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega".split()


async def _admissions(window: int | None, folder: Path) -> list[list[float]]:
    rows = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"Story {i}: " + " ".join(
        _WORDS[(i + k) % len(_WORDS)] for k in range(300))}]} for i in range(SAMPLES)]
    # whole answers (on_loop off): streamed at 4x the H200's rate, the client on 2 shared cores, not the
    # controller, would set the ramp
    cfg = load_dataset_config(write_dataset(folder / "ds", rows=rows, target=SAMPLES, max_new_tokens=4096,
                                            extra="on_loop = \"off\"\n[sampling.extra_body]\nmin_tokens = 1000\n",
                                            shard_max_samples=10_000, fsync_every=1_000))
    sim_args = ["--sim-profile", "h200", "--max-total-tokens", "60000", "--time-scale", str(TIME_SCALE),
                "--sim-output-mean", "300", "--sim-output-spread", "0.8", "--enable-metrics", "--log-level", "warning"]
    with start_sim(sim_args, log_path=folder / "sim.log") as sim:
        opts = RunOptions(output_root=folder / "out", server_urls=(sim.url,), window=window, poll_interval_s=POLL_S)
        summary = await run_generate(cfg, opts)
        async with httpx.AsyncClient(timeout=10.0) as http:
            stats = (await http.get(sim.url + "/sim/stats")).raise_for_status().json()
    assert (summary.done, summary.failures) == (SAMPLES, 0)
    return stats["admissions"]


def _seconds_to(admissions: list[list[float]], running: float) -> float:
    t0 = admissions[0][0]
    return next(t - t0 for t, n in admissions if n >= running)


async def test_the_ramp_after_a_start_is_as_fast_as_a_fixed_window(tmp_path: Path) -> None:
    fixed = await _admissions(SLOTS_WINDOW, tmp_path / "fixed")
    ours = await _admissions(None, tmp_path / "adaptive")
    # SGLang's cautious start, the same for both: 13 in the first round, a few more in the second
    assert fixed[0][1] <= 16 and ours[0][1] <= 16
    level = 0.9 * max(n for _, n in fixed)
    assert _seconds_to(ours, level) <= _seconds_to(fixed, level) + WITHIN_S, (
        f"adaptive reached {level:.0f} running after {_seconds_to(ours, level):.1f} sim s, "
        f"fixed {SLOTS_WINDOW} after {_seconds_to(fixed, level):.1f}")
