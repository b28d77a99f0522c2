"""The library refuses what the CLI refuses, with the same messages; set-up reads the model, the store and
the source once; the library only emits log records; the manifest is checked field by field."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import anyio
import orjson
import pytest

import gen_pipeline.run.connect as connect
import gen_pipeline.run.setup as setup
import gen_pipeline.server.attach as attach
from gen_pipeline import ConfigError, RunOptions, SourceShortError, load_dataset_config, run_generate, run_job
from gen_pipeline.config.server import load_server_profile
from gen_pipeline.export.select import Filters
from gen_pipeline.probe.core import ProbeOptions
from gen_pipeline.reports.status import read_status
from gen_pipeline.server.plan import PlanNumbers
from gen_pipeline.store.manifest import read_manifest

from pipeline_helpers import assert_exact, make_rows, run_cli, write_dataset


@pytest.fixture(scope="module")
def sim_url(shared_sim):  # tests/servers.py: one simulator per worker
    return shared_sim.url


@pytest.mark.parametrize(("options", "message"), [
    (lambda: RunOptions(server_urls=("http://s:1",), limit=0), "--limit 0 must be at least 1."),
    (lambda: RunOptions(server_urls=("http://s:1",), window=-3), "--window -3 must be at least 0."),
    (lambda: RunOptions(server_urls=("http://s:1",), drain_grace_s=-5),
     "--drain-grace-s -5 must be at least 0 seconds."),
    (lambda: RunOptions(server_urls=("http://s:1",), poll_interval_s=0.01),
     "--poll-interval-s 0.01 must be between 0.05 and 60 seconds."),
    (lambda: RunOptions(server_urls=("gpu:30000",)),
     "--server-url 'gpu:30000' must start with http:// or https:// (e.g. http://gpu-node:30000)."),
    (lambda: RunOptions(), "RunOptions needs a server: a profile to launch or server_urls to attach to."),
    (lambda: ProbeOptions(Path("out"), samples=0), "--samples 0 must be at least 1."),
    (lambda: ProbeOptions(Path("out"), chunk=-1), "--tf-chunk -1 must be at least 0."),
    (lambda: Filters(min_completion_tokens=-1), "--min-completion-tokens -1 must be at least 0."),
    (lambda: PlanNumbers(94.0, 8, 1.2, 4500, 553.0), "--mem-fraction-static 1.2 must be above 0 and below 1."),
    (lambda: PlanNumbers(0.0, 8, 0.9, 4500, 553.0), "--gpu-mem-gb 0 must be above 0."),
])
def test_a_library_caller_gets_the_flag_refusals(options, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        options()
    assert str(e.value) == message


@pytest.mark.parametrize("argv, message", [
    (["--drain-grace-s", "-5"], "error: --drain-grace-s -5 must be at least 0 seconds.\n"),
    (["--poll-interval-s", "61"], "error: --poll-interval-s 61 must be between 0.05 and 60 seconds.\n"),
])
def test_the_cli_says_the_same(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from gen_pipeline.cli import main

    assert main(["generate", "--dataset", "demo", *argv]) == 2
    assert capsys.readouterr().err == message


def test_urls_are_normalised_once_in_the_options() -> None:
    opts = RunOptions(server_urls=(" http://gpu:30000/v1/ ", "http://gpu2:30000/"))
    assert opts.server_urls == ("http://gpu:30000", "http://gpu2:30000")


def test_the_pre_launch_check_refuses_through_the_library_and_leaves_no_trace(tmp_path: Path) -> None:
    # a sync test: the CLI below runs in this process (in an async test run_cli starts a process)
    toml = write_dataset(tmp_path, target=30, rows=make_rows(20, invalid=2))
    cfg, out = load_dataset_config(toml), tmp_path / "out"
    # no server at that URL: the check refuses before any request (the model is given)
    opts = RunOptions(output_root=out, server_urls=("http://127.0.0.1:9",), model="m")
    with pytest.raises(SourceShortError) as e:
        anyio.run(run_generate, cfg, opts)
    cli = run_cli("generate", "--dataset", toml, "--server-url", "http://127.0.0.1:9", "--model", "m",
                  "--output-dir", out)
    assert (cli.returncode, cli.stderr) == (5, f"error: {e.value}\n")
    assert str(e.value) == (
        f"{toml}: the source can give 20 more samples (20 valid rows, 0 done), but 30 are needed to reach "
        "target_samples = 30. Add rows to the source or lower target_samples to 20; or pass --proceed-anyway "
        "to generate what there is.")
    assert not (out / "T").exists()  # the claimed store was released and its new folder removed


async def test_set_up_asks_the_model_once_and_reads_the_source_and_store_once(
        tmp_path: Path, sim_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, int] = {"identify": 0, "load_source": 0}
    identify, load_source = attach.identify, setup.load_source

    async def counting_identify(http, url):  # type: ignore[no-untyped-def]
        calls["identify"] += 1
        return await identify(http, url)

    def counting_load(cfg):  # type: ignore[no-untyped-def]
        calls["load_source"] += 1
        return load_source(cfg)

    def no_status(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("a one-run dataset's check uses the opened store, not a second read")

    monkeypatch.setattr(attach, "identify", counting_identify)
    monkeypatch.setattr(connect, "identify", counting_identify)
    monkeypatch.setattr(setup, "load_source", counting_load)
    monkeypatch.setattr(setup, "dataset_done", no_status)
    cfgs = [load_dataset_config(write_dataset(tmp_path / "ds", name=n, target=8, max_new_tokens=16)) for n in "AB"]
    summary = await run_job(cfgs, RunOptions(output_root=tmp_path / "out", server_urls=(sim_url + "/v1",)))
    assert [r.stopped_by for r in summary.runs] == ["target", "target"] and summary.exit_code == 0
    assert calls == {"identify": 1, "load_source": 2}  # GET /v1/models once; each source once
    for name in "AB":
        assert_exact(tmp_path / "out", 8, name)


async def test_the_library_only_emits_records(tmp_path: Path, sim_url: str, capsys: pytest.CaptureFixture[str],
                                              caplog: pytest.LogCaptureFixture) -> None:
    import datasets

    # `datasets`' own progress bars (its tqdm on stderr) are not the library's output; they were off here only
    # when an earlier test in the same process had run the CLI (quiet_datasets): off now whatever ran before
    datasets.disable_progress_bars()
    cfg = load_dataset_config(write_dataset(tmp_path / "ds", target=6, max_new_tokens=16))
    with caplog.at_level(logging.INFO, logger="gen_pipeline"):
        summary = await run_generate(cfg, RunOptions(output_root=tmp_path / "out", server_urls=(sim_url,)))
    assert summary.done == 6
    assert capsys.readouterr() == ("", "")  # no handler, no print: nothing shown
    assert not (tmp_path / "out" / "T" / "run.log").exists()  # run.log is the CLI's handler
    journal = [r for r in caplog.records if r.name == "gen_pipeline.journal"]
    assert [r.getMessage() for r in journal if getattr(r, "dataset", None) == "T"][0] == "run of T: 0/6 samples done"
    assert journal[-1].getMessage() == summary.line() and getattr(journal[-1], "dataset", None) == "T"
    assert any(r.name == "gen_pipeline.server.attach" and r.getMessage().startswith("attached to ")
               for r in caplog.records)


def test_a_manifest_field_of_the_wrong_type_is_named_and_the_folder_rebuilt(tmp_path: Path) -> None:
    toml = write_dataset(tmp_path / "ds", target=10, max_new_tokens=16)
    out = tmp_path / "out"
    assert run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", out, "--limit", "5",
                   "--progress", "quiet").returncode == 0
    path = out / "T" / "manifest.json"
    manifest = orjson.loads(path.read_bytes())
    manifest["runs"][0]["samples_written"] = "5"
    path.write_bytes(orjson.dumps(manifest))
    assert read_manifest(out / "T") == (None, f"{path}: runs[0].samples_written = \"5\" is not an integer; "
                                              "rebuilt it from the shards")
    assert read_status(out, "T", 10).done == 5  # status reads the shards, no traceback
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", out, "--progress", "quiet")
    assert r.returncode == 0, r.stderr
    assert f"T: {path}: runs[0].samples_written = \"5\" is not an integer; rebuilt it from the shards" in r.stdout
    assert_exact(out, 10)


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed here")
def test_server_profile_of_the_options_is_checked_launchable_in_the_library(tmp_path: Path) -> None:
    from gen_pipeline import ServerError
    profile = load_server_profile("tuned")
    toml = write_dataset(tmp_path, target=5)
    with pytest.raises(ServerError, match="sglang is not installed in this Python"):
        anyio.run(run_generate, load_dataset_config(toml), RunOptions(output_root=tmp_path / "out", profile=profile))
    assert not (tmp_path / "out").exists()
