"""A user's most common sequence: one dataset, the job with it and another, status, an export of both. The
job's 'nothing to do' run of T records gpus None, which status and export must sort among the runs."""

from __future__ import annotations

from pathlib import Path

import orjson

from pipeline_helpers import META_KEYS, REPO, assert_exact, run_cli, write_dataset


def test_one_dataset_then_the_job_then_status_and_an_export_of_both(tmp_path: Path) -> None:
    cfg, out, exported = tmp_path / "cfg", tmp_path / "out", tmp_path / "exports" / "TU.jsonl"
    write_dataset(cfg, name="T", target=8, max_new_tokens=16)
    write_dataset(cfg, name="U", target=6, max_new_tokens=16)
    (cfg / "server.toml").write_text((REPO / "datasets_cfg" / "server.toml").read_text())
    dirs = ("--config-dir", cfg, "--output-dir", out)

    first = run_cli("generate", "--dataset", "T", "--server", "sim", *dirs, "--progress", "quiet")
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.splitlines()[-1].startswith("T: 8/8 samples (100.0%), +8 this run in "), first.stdout
    job = run_cli("generate", "--dataset", "T,U", "--server", "sim", *dirs, "--progress", "quiet")
    assert job.returncode == 0, job.stdout + job.stderr
    assert "T: 8/8 samples (100.0%); the target is already reached, nothing to do." in job.stdout, job.stdout
    assert job.stdout.splitlines()[-1] == (
        "job (T, U): 14/14 samples (100.0%), +6 this run; every dataset at its target.")
    assert all(set(s["meta"]) == META_KEYS for s in assert_exact(out, 8, "T"))  # no sampling_variant without a mix
    assert_exact(out, 6, "U")

    status = run_cli("status", *dirs)
    assert (status.returncode, status.stderr) == (0, ""), status.stdout + status.stderr
    assert "Traceback" not in status.stdout
    as_json = run_cli("status", "--json", *dirs)
    assert (as_json.returncode, as_json.stderr) == (0, ""), as_json.stderr
    datasets = orjson.loads(as_json.stdout)["datasets"]
    assert {n: (d["state"], d["done"], d["target"], d["runs"]) for n, d in datasets.items()} == {
        "T": ("finished", 8, 8, 2), "U": ("finished", 6, 6, 1)}

    export = run_cli("export", "--dataset", "T", "--dataset", "U", "--format", "specforge", "--out", exported, *dirs)
    assert (export.returncode, "Traceback" in export.stderr) == (0, False), export.stdout + export.stderr
    assert export.stdout.splitlines()[1:3] == ["  T: 8 committed samples, 0 dropped, 8 exported",
                                               "  U: 6 committed samples, 0 dropped, 6 exported"], export.stdout
    assert f"  card: {exported.parent / 'README.md'}" in export.stdout.splitlines()
    assert len(exported.read_bytes().splitlines()) == 14
    card = (exported.parent / "README.md").read_text()
    assert "T" in card and "U" in card
