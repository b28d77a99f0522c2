"""ENOSPC / EIO on write through the store's file layer; an output folder that cannot be created."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from store_helpers import FullDisk

import gen_pipeline.run.setup as setup
from gen_pipeline import cli
from gen_pipeline.config.dataset import find_dataset_config
from gen_pipeline.errors import DiskError
from gen_pipeline.run import RunOptions, run_generate

from pipeline_helpers import assert_exact, read_samples, run_cli, write_dataset


@pytest.mark.parametrize(("code", "hint"), [(errno.ENOSPC, "free space and run the same command to resume"),
                                            (errno.EIO, "check the disk and run the same command to resume")])
async def test_write_error_stops_run_keeps_committed_and_resumes(tmp_path: Path, sim_url: str, code: int,
                                                                 hint: str) -> None:
    cfg = find_dataset_config(str(write_dataset(tmp_path / "ds", target=60, max_new_tokens=64,
                                                shard_max_samples=7, fsync_every=3)))
    out = tmp_path / "out"
    opts = RunOptions(output_root=out, server_urls=(sim_url,), window=4,
                      file_opener=FullDisk(20_000, code))
    with pytest.raises(DiskError) as info:
        await run_generate(cfg, opts)
    msg = str(info.value)
    kept = read_samples(out)
    assert msg.startswith("Writing ") and "/T/shard-0000" in msg.split(" failed: ")[0], msg
    assert f"failed: {os.strerror(code)}. {len(kept)} samples are committed and safe; {hint}." in msg
    assert 0 < len(kept) < 60 and len({s["id"] for s in kept}) == len(kept)
    summary = await run_generate(cfg, RunOptions(output_root=out, server_urls=(sim_url,)))
    assert (summary.done, summary.written) == (60, 60 - len(kept))
    assert_exact(out, 60)


def test_cli_disk_full_exits_4(tmp_path: Path, sim_url: str, monkeypatch, capsys) -> None:
    toml = write_dataset(tmp_path / "ds", target=60, max_new_tokens=64)
    monkeypatch.setattr(setup, "default_opener", FullDisk(5_000))  # the CLI has no such flag
    code = cli.main(["generate", "--dataset", str(toml), "--server-url", sim_url, "--output-dir",
                     str(tmp_path / "out"), "--progress", "quiet"])
    err = capsys.readouterr().err
    assert code == 4
    assert err.startswith("error: Writing ") and err.rstrip().endswith(
        "samples are committed and safe; free space and run the same command to resume."), err
    assert "Traceback" not in err


def test_output_dir_not_creatable_fails_before_any_request(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    toml = write_dataset(tmp_path / "ds", target=60)
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", blocker / "out")
    assert r.returncode == 4
    assert r.stderr == (f"error: Cannot create {blocker}/out/T: Not a directory. Fix the path's permissions or "
                        "choose another output folder.\n")
    assert "starting SGLang" not in r.stdout
