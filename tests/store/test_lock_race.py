"""Two jobs started together with their datasets crossed (`--dataset T,U` and `--dataset U,T`): one runs,
the other is refused naming the holder, never a permissions message. A job takes its locks first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from store_helpers import make

from gen_pipeline.cli import main
from gen_pipeline.store.lock import RunLock
from sglang_sim.testing import start_sim

from pipeline_helpers import SIM_FAST, assert_exact, make_rows, start_cli, write_dataset


def test_a_folder_removed_between_mkdir_and_lock_is_made_again(tmp_path: Path, monkeypatch) -> None:
    refused = make(tmp_path)  # the run that made B2, holds its lock, and is then refused another dataset
    refused.claim()
    real = RunLock.acquire.__func__  # type: ignore[attr-defined]
    calls: list[Path] = []

    def acquire(cls: type[RunLock], folder: Path) -> RunLock:
        if not calls:  # the refused run gives up right after our mkdir, before our lock's create
            refused.release()
            assert not folder.exists()
        calls.append(folder)
        return real(cls, folder)

    monkeypatch.setattr(RunLock, "acquire", classmethod(acquire))
    store = make(tmp_path)
    state = store.claim()
    assert (state.done, len(calls)) == (0, 2)
    assert (tmp_path / "B2" / ".lock").is_file()
    store.release()  # this run made the folder again: it removes it when it gives up
    assert not (tmp_path / "B2").exists()


def _two(tmp_path: Path, target: int = 8) -> tuple[Path, Path]:
    """Datasets T and U in one config folder."""
    cfg = tmp_path / "cfg"
    write_dataset(cfg, name="T", target=target, max_new_tokens=32)
    write_dataset(cfg, name="U", target=target, max_new_tokens=32, rows=make_rows(40))
    return cfg / "T.toml", cfg / "U.toml"


def test_a_job_takes_every_lock_before_it_loads_a_source(tmp_path: Path, capsys, events: list[str]) -> None:
    t, u = _two(tmp_path)
    out = tmp_path / "out"
    held = make(out, "T")  # another run writing T
    held.claim()
    try:
        code = main(["generate", "--dataset", f"{u},{t}", "--server", "sim", "--output-dir", str(out),
                     "--progress", "quiet"])
    finally:
        held.release()
    err = capsys.readouterr().err
    assert code == 4, err
    assert events == []  # no "U: loading the source": refused before any slow step, U not claimed first
    assert re.search(r"is being written by another run on this host \(pid \d+, started \d\d:\d\d:\d\d\)", err), err
    assert not (out / "U").exists()


@pytest.mark.e2e  # two real CLI processes race for the same locks: make e2e
@pytest.mark.parametrize("trial", range(3))
def test_two_jobs_with_crossed_datasets_one_runs_the_other_names_the_holder(tmp_path: Path, trial: int) -> None:
    t, u = _two(tmp_path, target=40)
    out = tmp_path / "out"
    with start_sim(SIM_FAST, ready_timeout_s=30) as sim:
        args = ("--server-url", sim.url, "--output-dir", out, "--progress", "quiet", "--window", "4")
        logs = [tmp_path / "tu.log", tmp_path / "ut.log"]
        procs = [start_cli("generate", "--dataset", f"{t},{u}", *args, log=logs[0]),
                 start_cli("generate", "--dataset", f"{u},{t}", *args, log=logs[1])]
        try:
            codes = [p.wait(timeout=120) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    texts = [log.read_text() for log in logs]
    for text in texts:
        assert "Traceback" not in text and "permissions" not in text, texts
    assert 0 in codes and set(codes) <= {0, 4}, (codes, texts)
    for code, text, other in zip(codes, texts, reversed(procs), strict=True):
        if code == 4:  # refused: it names the run that holds the lock
            assert f"is being written by another run on this host (pid {other.pid}, started" in text, texts
    assert_exact(out, 40, "T")
    assert_exact(out, 40, "U")
