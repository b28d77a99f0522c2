"""Configs: the dataset TOMLs and server.toml, read into frozen dataclasses and validated."""
