"""Configs: the dataset TOMLs and server.toml, read into frozen dataclasses and validated."""

from gen_pipeline.config.dataset import (
    DEFAULT_CONFIG_DIR,
    DEFAULT_OUTPUT_DIR,
    DatasetConfig,
    GenerationConfig,
    OutputConfig,
    SourceConfig,
    available_datasets,
    find_dataset_config,
    find_dataset_configs,
    load_dataset_config,
)
from gen_pipeline.config.sampling import SamplingConfig
from gen_pipeline.config.server import (
    DEFAULT_SERVER_CONFIG,
    ServerProfile,
    load_controller_config,
    load_server_profile,
    normalise_server_url,
)

__all__ = [
    "DEFAULT_CONFIG_DIR", "DEFAULT_OUTPUT_DIR", "DEFAULT_SERVER_CONFIG", "DatasetConfig", "GenerationConfig",
    "OutputConfig", "SamplingConfig", "ServerProfile", "SourceConfig", "available_datasets", "find_dataset_config",
    "find_dataset_configs", "load_controller_config", "load_dataset_config", "load_server_profile",
    "normalise_server_url",
]
