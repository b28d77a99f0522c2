"""Dataset config loading: every shipped config loads; mistakes name the file and the key."""

from dataclasses import fields
from pathlib import Path

import pytest

from gen_pipeline.cli import build_parser
from gen_pipeline.cli.commands import options_from_args
from gen_pipeline.config.dataset import DEFAULT_CONFIG_DIR, available_datasets, find_dataset_config, load_dataset_config
from gen_pipeline.config.server import load_controller_config
from gen_pipeline.controller import ControllerConfig
from gen_pipeline.errors import ConfigError
from gen_pipeline.run.setup import run_options
from tests.pipeline_helpers import run_cli, write_dataset

REFERENCE = {"B1": 30_000, "B2": 18_000, "B6": 20_000, "B7": 20_000}


def test_shipped_configs_load_with_reference_targets() -> None:
    assert set(REFERENCE) | {"demo"} <= set(available_datasets())
    targets = {n: find_dataset_config(n).target_samples for n in REFERENCE}
    assert targets == REFERENCE
    assert sum(targets.values()) == 88_000
    demo = find_dataset_config("demo")
    assert demo.resolve(demo.source.files[0]).exists()


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "X.toml"
    p.write_text(text)
    return p


BASE = 'target_samples = 10\n[source]\nfiles = ["a.jsonl"]\nschema = "messages"\nfield = "messages"\n'


def load(tmp_path: Path, text: str):
    """BASE with `text` after it, loaded from tmp_path / X.toml."""
    return load_dataset_config(write(tmp_path, BASE + text))


@pytest.mark.parametrize("extra, message", [
    ('[sampling]\ntemperature = "0.7"\n',
     'sampling.temperature = \'0.7\' must be a number (got a string). Remove the quotes.'),
    ('[sampling]\ntemprature = 0.7\n', "sampling.temprature: unknown key. Known keys here: "
                                        "chat_template_kwargs, extra_body, frequency_penalty, max_new_tokens, "
                                        "min_p, mix, mix_seed, presence_penalty, reasoning_effort, "
                                        "repetition_penalty, seed, stop, temperature, top_k, top_p. "
                                        "Did you mean temperature? Check the spelling or remove it."),
    ('[generation]\nreasoning = "maybe"\n', "generation.reasoning = 'maybe' is not one of 'keep', 'disable', 'none'."),
    ('[output]\nshard_max_samples = 0\n', "output.shard_max_samples and output.fsync_every must be at least 1."),
    ('colour = 1\n', "colour: unknown key. Known top-level keys: generation, name, output, sampling, source, "
                     "target_samples. Check the spelling or remove it."),
    ("target_samples = \n", "X.toml: not valid TOML (Invalid value (at line 1, column 18)). Fix the syntax and run "
                            "again."),
    ("", "X.toml: [source] needs exactly one of hf_id (a Hugging Face dataset) or files (local jsonl/json/parquet "
         "paths)."),  # BASE with hf_id as well as files
])
def test_config_errors_name_file_and_key(tmp_path: Path, extra: str, message: str) -> None:
    text = BASE + extra if extra.startswith("[") else extra + BASE
    with pytest.raises(ConfigError) as e:
        load_dataset_config(write(tmp_path, text if extra else BASE.replace("[source]\n", '[source]\nhf_id = "o"\n')))
    assert str(e.value).endswith(message)
    assert "X.toml" in str(e.value)


def test_fingerprint_changes_with_sampling() -> None:
    cfg = find_dataset_config("demo", DEFAULT_CONFIG_DIR)
    fp = cfg.fingerprint("m")
    assert fp["sampling"] == {"max_new_tokens": 512, "temperature": 0.7, "top_p": 0.95}
    assert fp != cfg.fingerprint("other-model")


# ---------------------------------------------------------------- every documented key is read


def test_generation_window_is_the_default_for_the_window_flag_and_the_controller_table_is_read(tmp_path: Path) -> None:
    (tmp_path / "server.toml").write_text((DEFAULT_CONFIG_DIR / "server.toml").read_text()
                                          + "\n[controller]\ntarget_usage = 0.8\nmax_window = 256\n")
    assert load_controller_config(tmp_path / "server.toml") == ControllerConfig(target_usage=0.8, max_window=256)
    toml = write(tmp_path, BASE + "[generation]\nwindow = 7\n")
    cfg = load_dataset_config(toml)
    args = build_parser().parse_args(["generate", "--dataset", str(toml), "--server", "sim",
                                      "--config-dir", str(tmp_path)])
    opts = options_from_args(args, [cfg])
    assert (opts.window, opts.controller) == (7, ControllerConfig(target_usage=0.8, max_window=256))
    args = build_parser().parse_args(["generate", "--dataset", str(toml), "--window", "3",
                                      "--config-dir", str(tmp_path)])
    assert options_from_args(args, [cfg]).window == 3  # the flag wins
    adaptive = load(tmp_path, "")
    assert options_from_args(args.__class__(**{**vars(args), "window": None}), [adaptive]).window is None
    assert run_options([cfg], config_dir=tmp_path, server="sim", window=0)[0].window is None  # 0 = adaptive, as in TOML
    with pytest.raises(ConfigError) as e:
        load(tmp_path, "[generation]\nwindow = -1\n")
    assert str(e.value).endswith("X.toml: generation.window = -1 must be 0 (the adaptive controller) or a fixed "
                                 "number of requests in flight.")


def test_a_controller_table_of_one_key_and_none_at_all(tmp_path: Path) -> None:
    guarded = tmp_path / "guarded.toml"
    guarded.write_text("[controller]\nretraction_guard = true\n")
    assert load_controller_config(guarded) == ControllerConfig(retraction_guard=True) != ControllerConfig()
    assert load_controller_config(DEFAULT_CONFIG_DIR / "server.toml") == ControllerConfig()
    assert load_controller_config(tmp_path / "absent.toml") == ControllerConfig()


@pytest.mark.parametrize("table, message", [
    ("[run]\nserver_wait_s = -5", "run.server_wait_s = -5 must be at least 0 seconds."),
    ("[run]\nserver_wait_s = \"10m\"", "run.server_wait_s = '10m' must be a number (got a string). Remove the quotes."),
    ("[run]\nserver_wait = 900", "run.server_wait: unknown key. Known keys here: drain_grace_s, gpus_per_server, "
                                 "hang_timeout_s, health_interval_s, limit, model, poll_interval_s, proceed_anyway, "
                                 "readers, routing, server_wait_s, window. Did you mean server_wait_s? Check the "
                                 "spelling or remove it."),
    ("[controller]\ntarget_usag = 0.8\n", "controller.target_usag: unknown key. Known keys here: "
     + ", ".join(sorted(f.name for f in fields(ControllerConfig))) + ". Did you mean target_usage? "
     "Check the spelling or remove it."),
    ("[controller]\nmax_window = \"64\"\n",
     "controller.max_window = '64' must be an integer (got a string). Remove the quotes."),
    ("[controller]\nretraction_guard = \"yes\"\n",
     "controller.retraction_guard = 'yes' must be true or false (got a string)."),
    ("[controller]\ntarget_usage = 1.5\n",
     "controller.target_usage = 1.5 must be above 0 and at most 1 (a share of the KV pool)."),
    ("[controller]\nmin_window = 8\nmax_window = 4\n",
     "controller.min_window = 8, max_window = 4: need 1 <= min_window <= max_window."),
    ("[controler]\n", "controler: unknown key. Known top-level keys: controller, profile, run. Did you mean "
                      "controller? Check the spelling or remove it."),
])
def test_server_toml_mistakes_stop_generate_before_anything_starts(tmp_path: Path, table: str, message: str) -> None:
    """A [controller] table is added to the shipped server.toml; a [run] table's body replaces the shipped one's."""
    if table.startswith("[run]"):
        cfg_dir = _with_run(tmp_path / "cfg", table.removeprefix("[run]\n"))
    else:
        cfg_dir = tmp_path / "cfg"
        cfg_dir.mkdir()
        (cfg_dir / "server.toml").write_text((DEFAULT_CONFIG_DIR / "server.toml").read_text() + "\n" + table)
    toml = write_dataset(tmp_path / "data")
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--config-dir", cfg_dir,
                "--output-dir", tmp_path / "out")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error: {cfg_dir / 'server.toml'}: {message}\n")
    assert not (tmp_path / "out").exists()


def _with_run(cfg_dir: Path, run_table: str) -> Path:
    """The shipped server.toml in `cfg_dir` with its [run] table's body replaced by `run_table`."""
    cfg_dir.mkdir(parents=True, exist_ok=True)
    shipped = (DEFAULT_CONFIG_DIR / "server.toml").read_text()
    assert "\n[run]\n" in shipped
    (cfg_dir / "server.toml").write_text(shipped.replace("\n[run]\n", f"\n[run]\n{run_table}\n", 1))
    return cfg_dir
