"""Configs: the dataset TOMLs and server.toml, read into frozen dataclasses and validated."""

from gen_pipeline.config.dataset import DatasetConfig, find_dataset_config, find_dataset_configs, load_dataset_config
from gen_pipeline.config.server import ServerProfile, load_server_profile

# what gen_pipeline/__init__.py's _EXPORTS loads from here
__all__ = ["DatasetConfig", "ServerProfile", "find_dataset_config", "find_dataset_configs", "load_dataset_config",
           "load_server_profile"]
