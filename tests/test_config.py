"""Dataset config loading: every shipped config loads; mistakes name the file and the key."""

from pathlib import Path

import pytest

from gen_pipeline.config import DEFAULT_CONFIG_DIR, available_datasets, find_dataset_config, load_dataset_config
from gen_pipeline.errors import ConfigError

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


@pytest.mark.parametrize("extra, message", [
    ('[sampling]\ntemperature = "0.7"\n',
     'sampling.temperature = \'0.7\' must be a number (got a string). Remove the quotes.'),
    ('[sampling]\ntemprature = 0.7\n', "sampling.temprature: unknown key. Known keys here: max_new_tokens, "
                                        "temperature, top_p. Check the spelling or remove it."),
    ('[generation]\nreasoning = "maybe"\n', "generation.reasoning = 'maybe' is not one of 'keep', 'disable', 'none'."),
    ('[output]\nshard_max_samples = 0\n', "output.shard_max_samples and output.fsync_every must be at least 1."),
    ('colour = 1\n', "colour: unknown key. Known top-level keys: generation, name, output, sampling, source, "
                     "target_samples. Check the spelling or remove it."),
])
def test_config_errors_name_file_and_key(tmp_path: Path, extra: str, message: str) -> None:
    text = BASE + extra if extra.startswith("[") else extra + BASE
    with pytest.raises(ConfigError) as e:
        load_dataset_config(write(tmp_path, text))
    assert str(e.value).endswith(message)
    assert "X.toml" in str(e.value)


def test_missing_dataset_config_lists_the_existing_ones() -> None:
    with pytest.raises(ConfigError) as e:
        find_dataset_config("B3")
    assert "No dataset config 'B3'" in str(e.value)
    assert "B1, B2, B6, B7, demo" in str(e.value)


def test_invalid_toml_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_dataset_config(write(tmp_path, "target_samples = \n"))


def test_source_needs_exactly_one_of_hf_id_and_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exactly one of hf_id"):
        load_dataset_config(write(tmp_path, 'target_samples = 1\n[source]\nschema = "prompt"\n'))


def test_fingerprint_changes_with_sampling() -> None:
    cfg = find_dataset_config("demo", DEFAULT_CONFIG_DIR)
    fp = cfg.fingerprint("m")
    assert fp["sampling"] == {"max_new_tokens": 512, "temperature": 0.7, "top_p": 0.95}
    assert fp != cfg.fingerprint("other-model")
