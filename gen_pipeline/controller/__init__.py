"""Concurrency controller: pure policy that sizes the in-flight window to the server's KV pool (see `core`)."""

from gen_pipeline.controller.config import ControllerConfig, ControllerStats
from gen_pipeline.controller.core import Controller

__all__ = ["Controller", "ControllerConfig", "ControllerStats"]
