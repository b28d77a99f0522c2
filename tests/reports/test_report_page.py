"""The report page as a user sees it in headless Chromium: its text from the DOM, nothing past its box or the
window's edge, a screenshot that is not blank; the plot's legends outside the panels."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from html import unescape
from pathlib import Path

import orjson
import pytest

from gen_pipeline.records import Sample
from gen_pipeline.reports.diagnose import Hardware, diagnose, format_diagnosis
from gen_pipeline.reports.page import build_report, plot_figure, write_report
from gen_pipeline.store.dataset_store import DatasetStore

from pipeline_helpers import REPO, run_cli

FP = {"model": "moonshotai/Kimi-K2.5", "source": {"hf_id": "org/long-outputs", "split": "train", "files": []},
      "sampling": {"max_new_tokens": 4096, "temperature": 0.7, "top_p": 0.95}, "reasoning": "keep",
      "truncated": "keep"}
RUN_LOG = """\
2026-03-01T10:00:00.100Z INFO run of B2: 0/18,000 samples done
2026-03-01T10:00:00.200Z INFO starting SGLang (tuned) on http://127.0.0.1:30000, log: outputs/B2/server.log
2026-03-01T10:04:10.000Z INFO SGLang ready after 250 s: Kimi-K2.5 tp=8 kv=fp8_e4m3 376,000 KV tokens, max running \
2048, hicache 48 GB
"""


def telemetry_rows(polls: int = 120, capacity: int = 376_000) -> list[dict]:
    """Two runs a day apart of a KV-bound job: the pool fills past 0.9 with requests queued, running swings
    ±15 % as long requests finish and are replaced, and the decode rate follows it (more slots pay)."""
    rows, t = [], 1_772_359_450.0
    for run in (1, 2):
        for i in range(polls):
            ramp = min(1.0, i / 20)
            usage = 0.62 + 0.33 * ramp + 0.02 * math.sin(i / 3)
            swing = 1 + 0.15 * math.sin(i / 4)
            running = int((40 + 100 * ramp) * swing)
            rows.append({"t": t, "t_run_s": float(i), "run": run, "window": running + 20, "in_flight": running + 18,
                         "running": running, "queued": 18 if i > 5 else 0, "kv_used_tokens": int(usage * capacity),
                         "kv_usage": round(usage, 4), "kv_capacity_tokens": capacity, "max_running_requests": 2048,
                         "kv_dtype": "fp8_e4m3", "mem_fraction_static": 0.9, "gen_tok_s": (1300.0 * ramp + 200) * swing,
                         "client_tok_s": 1250.0 * ramp, "samples_per_s": 0.3 * ramp, "retractions_total": i // 40,
                         "retractions": i // 40, "done": i * 2, "target": 18000, "failures": 0, "mode": "load",
                         "reason": "steady", "tokens_per_request": 4400.0, "held_tokens_per_request": 2600.0,
                         "restarts": 0})
            t += 1.0
        t += 86_400
    return rows


def sample(dataset: str, i: int) -> Sample:
    return Sample(f"{dataset}-{i}", dataset, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                  {"model": FP["model"], "finish_reason": "stop", "prompt_tokens": 100, "completion_tokens": 4000,
                   "sampling": FP["sampling"]})


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[Path, list[dict]]:
    """outputs/ with B2 (two runs, telemetry, run.log) and an unrelated dataset; B2's report page written."""
    out = tmp_path_factory.mktemp("outputs")
    for run in range(2):
        with DatasetStore(out, "B2", fingerprint=FP, target=18_000) as s:
            s.open()
            s.write_samples([sample("B2", run * 10 + i) for i in range(10)])
    with DatasetStore(out, "other", fingerprint=FP, target=5) as s:
        s.open()
        s.write_samples([sample("other", 0)])
    folder = out / "B2"
    (folder / "telemetry.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in telemetry_rows()))
    (folder / "run.log").write_text(RUN_LOG)
    rows = telemetry_rows()
    hw = Hardware(json.loads((REPO / "datasets_cfg/models/kimi-k2.5-config.json").read_text()), 141.0, 8,
                  label="kimi-k2.5-config.json")
    diagnosis = format_diagnosis("B2", rows, diagnose(rows, hw))
    assert max(map(len, diagnosis.splitlines())) > 140  # lines that ran off the right edge of the old page
    path = write_report(folder / "report.html", build_report(out, "B2", rows, diagnosis, 18_000))
    manifest = orjson.loads((folder / "manifest.json").read_bytes())
    return path, manifest["runs"]


# ---------------------------------------------------------------- headless Chromium


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's chromium, installed with apt-get when missing and this user may; else a skip that says why."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip("headless Chromium is not installed and cannot be installed here (apt-get install chromium "
                    "needs root and Debian/Ubuntu); .ci/run installs it")
    r = subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], capture_output=True, text=True, timeout=900)
    found = shutil.which("chromium")
    if not found:
        pytest.skip(f"apt-get install chromium failed: {r.stderr.strip()[-300:]}")
    return found


def run_chromium(binary: str, tmp: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run",
                           f"--user-data-dir={tmp / 'profile'}", *args, url],
                          capture_output=True, text=True, timeout=180)


# A layout check run inside the page: every element with text ends inside the window, and none's content
# is wider than its box (a <pre> that scrolls sideways counts: its text runs off what is shown).
LAYOUT_CHECK = """<script>
const vw = document.documentElement.clientWidth, bad = [];
for (const el of document.body.querySelectorAll('*')) {
  if (el.id === 'layout-check' || !el.getClientRects().length) continue;
  const r = el.getBoundingClientRect(), name = el.tagName + ': ' + (el.textContent || el.alt || '').slice(0, 60);
  if (r.right > vw + 0.5) bad.push('past the right edge (' + Math.round(r.right) + ' > ' + vw + ') ' + name);
  if (el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0) bad.push('wider than its box ' + name);
}
if (document.documentElement.scrollWidth > vw) bad.push('the page scrolls sideways');
const out = document.createElement('pre'); out.id = 'layout-check'; out.textContent = JSON.stringify(bad);
document.body.appendChild(out);
</script>"""


def _inner(tag: str, html: str) -> list[str]:
    """The unescaped contents of each `tag` element of `html` (the page nests no tags inside cells and pres)."""
    return [unescape(x) for x in re.findall(rf"<{tag}\b[^>]*>(.*?)</{tag}>", html, re.S)]


def test_the_page_in_headless_chromium(page, chromium: str, tmp_path: Path) -> None:
    path, runs = page
    checked = tmp_path / "checked.html"
    checked.write_text(path.read_text().replace("</body>", LAYOUT_CHECK + "</body>"))
    dom = run_chromium(chromium, tmp_path, checked.as_uri(), "--window-size=1000,3000", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    pres = _inner("pre", dom.stdout)
    assert json.loads(pres[-1]) == []  # the layout check's: nothing runs off the right edge or out of its box
    context, status = ([_inner("t[dh]", tr) for tr in re.findall(r"<tr>(.*?)</tr>", t, re.S)]
                       for t in re.findall(r"<table\b.*?</table>", dom.stdout, re.S))
    first, last = runs[0]["started_at"], runs[-1]["ended_at"]
    assert dict(context) == {
        "Runs": f"2, first started {first[:10]} {first[11:16]} UTC, last ended {last[:10]} {last[11:16]} UTC",
        "Model": "moonshotai/Kimi-K2.5",
        "Server": "profile tuned (launched, http://127.0.0.1:30000); Kimi-K2.5 tp=8 kv=fp8_e4m3 376,000 KV tokens, "
                  "max running 2048, hicache 48 GB",
        "KV capacity": "376,000 tokens, KV dtype fp8_e4m3, mem_fraction_static 0.9, max running requests 2,048",
        "Sampling": "max_new_tokens 4096, temperature 0.7, top_p 0.95; reasoning keep; truncated keep",
        "Source": "hub org/long-outputs, split train"}
    assert status[0][:3] == ["dataset", "done/target", "%"]
    assert [row[0] for row in status[1:]] == ["B2"]  # its own dataset only: "other" is not on B2's page
    assert status[1][1:3] == ["20/18,000", "0.1%"]
    assert pres[0].startswith("B2: run 2 (240 polls over 2 run(s); mode load)\nkv_bound: GPU KV capacity")

    shot = tmp_path / "page.png"
    r = run_chromium(chromium, tmp_path, path.as_uri(), "--window-size=1000,2600", f"--screenshot={shot}")
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))[..., :3]
    assert pixels.shape[:2] == (2600, 1000)
    ink = (pixels < 0.9).any(axis=2)
    assert ink.mean() > 0.02  # text and plots, not a blank page
    plot_band = ink[1000:2400]  # the plots sit below the tables
    assert plot_band.mean() > 0.01 and (pixels[1000:2400].std(axis=2) > 0.1).mean() > 0.001  # colored lines


def test_legends_are_outside_the_panels_and_the_threshold_is_labelled() -> None:
    fig = plot_figure(telemetry_rows(), "B2")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    panels = fig.axes[:4]  # the twin axis of the first panel comes after them
    for ax in panels:
        legend = ax.get_legend()
        assert legend is not None
        box, area = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
        assert box.x0 >= area.x1, f"{ax.get_ylabel()}: legend over the lines"
        assert box.x1 <= fig.bbox.x1 + 1, f"{ax.get_ylabel()}: legend cut off by the figure edge"
    kv = panels[1]
    assert "kv_full 0.90" in [t.get_text() for t in kv.texts]
    assert "kv_full 0.90 (diagnose: the pool fills)" in [t.get_text() for t in kv.get_legend().get_texts()]
    assert panels[3].get_ylim()[0] == 0  # retractions: a count, never below 0
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_report_command_writes_that_page(page, tmp_path: Path) -> None:
    path, _ = page
    r = run_cli("report", "--dataset", "B2", "--output-dir", path.parent.parent, "--out", tmp_path / "r.html")
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "r.html").read_text()
    assert '<table class="context">' in html and ">other<" not in html
