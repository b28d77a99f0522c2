"""bench/gpu/user_path.sh (the GPU user's path the lead runs on an H200) dry-runs here with --sim: the same
make commands (plan, generate detached with nohup and its log kept, status, validate, export) end to end."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.bench, pytest.mark.skipif(shutil.which("make") is None, reason="no make")]


@pytest.mark.timeout(280)
def test_the_user_path_dry_run_passes_every_step(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "VENV", "EXTRAS")}
    r = subprocess.run(["bash", "bench/gpu/user_path.sh", "--sim", str(tmp_path / "keep"), str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=270)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.splitlines()[-1].endswith(
        "OK: install, launch, the 4-dataset job (110 samples), validate and export (110 rows) passed")
    log = (tmp_path / "out" / "generate.log").read_text().splitlines()
    assert log[-1] == "job (B1, B2, B6, B7): 110/110 samples (100.0%), +110 this run; every dataset at its target."
    rows = [orjson.loads(line) for line in (tmp_path / "out" / "job.jsonl").read_bytes().splitlines()]
    assert len(rows) == len({r["id"] for r in rows}) == 110
