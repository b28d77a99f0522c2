"""generate's options declared once (config/run.py RunFlags): the CLI's flags are built from the
declarations, server.toml's [run] takes every one under its name, and server.toml is read once a run."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from gen_pipeline.cli import build_parser
from gen_pipeline.cli.commands import options_from_args
from gen_pipeline.config.dataset import DEFAULT_CONFIG_DIR, load_dataset_config
from gen_pipeline.config.run import RunFlags
from gen_pipeline.errors import ConfigError
from gen_pipeline.run.options import RunOptions
from gen_pipeline.run.setup import run_options
from tests.config.test_config import BASE, write

FLAGS = {f.name: "--" + f.name.replace("_", "-") for f in fields(RunFlags)}


def generate_actions() -> dict[str, object]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return {s: a for a in sub.choices["generate"]._actions for s in a.option_strings}  # type: ignore[attr-defined]


def test_every_declared_option_is_a_generate_flag_with_its_default_in_the_help() -> None:
    actions = generate_actions()
    for f in fields(RunFlags):
        action = actions[FLAGS[f.name]]
        assert action.default is None  # not given: server.toml's [run], then the declaration's default
        if f.default not in (None, "", False) and "default:" not in action.help:
            assert action.help.endswith(f"(default: {f.default})"), action.help
    assert actions["--routing"].choices == ("affinity", "free-kv")
    assert actions["--hang-timeout-s"].help.endswith("(default: 5.0)")


def test_the_options_a_run_gets_are_the_declared_defaults() -> None:
    opts = RunOptions(server_urls=("http://gpu:30000",))
    assert {f.name: getattr(opts, f.name) for f in fields(RunFlags)} == {f.name: f.default for f in fields(RunFlags)}


@pytest.mark.parametrize("key, toml_value, flag_value, expected", [
    ("hang_timeout_s", "9", "2", (9.0, 2.0)),
    ("health_interval_s", "0.5", "1", (0.5, 1.0)),
    ("routing", '"free-kv"', "affinity", ("free-kv", "affinity")),
    ("limit", "7", "3", (7, 3)),
    ("server_wait_s", "900", "0", (900.0, 0.0)),  # the flag wins even when it is 0
])
def test_every_option_may_be_set_in_the_run_table_and_the_flag_wins(
        tmp_path: Path, key: str, toml_value: str, flag_value: str, expected: tuple[object, object]) -> None:
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    (cfg_dir / "server.toml").write_text(f"[run]\n{key} = {toml_value}\n")
    toml = write(tmp_path, BASE)

    def value(cfg_dir: Path, *flags: str) -> object:
        args = build_parser().parse_args(["generate", "--dataset", str(toml), "--server-url", "http://gpu1:30000",
                                          "--config-dir", str(cfg_dir), *flags])
        return getattr(options_from_args(args, [load_dataset_config(toml)]), key)

    assert (value(cfg_dir), value(cfg_dir, FLAGS[key], flag_value)) == expected
    for other in (DEFAULT_CONFIG_DIR, tmp_path / "no-server-toml"):  # the shipped [run], or no server.toml at all
        assert value(other) == RunFlags.__dataclass_fields__[key].default


def test_a_run_table_value_out_of_range_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "server.toml").write_text("[run]\npoll_interval_s = 0.01\n")
    with pytest.raises(ConfigError) as e:
        run_options([load_dataset_config(write(tmp_path, BASE))], config_dir=tmp_path, server_urls=["http://g:1"])
    assert str(e.value) == (f"{tmp_path / 'server.toml'}: run.poll_interval_s = 0.01 must be between 0.05 and 60 "
                            "seconds.")


def test_server_toml_is_read_once_a_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import gen_pipeline.config.server as server

    reads: list[Path] = []
    real = server.read_toml
    monkeypatch.setattr(server, "read_toml", lambda path: reads.append(path) or real(path))
    cfg = load_dataset_config(write(tmp_path, BASE))
    opts, _ = run_options([cfg], config_dir=DEFAULT_CONFIG_DIR, server="sim", limit=3)
    assert (opts.profile is not None and opts.profile.name, opts.limit) == ("sim", 3)
    assert reads == [DEFAULT_CONFIG_DIR / "server.toml"]
