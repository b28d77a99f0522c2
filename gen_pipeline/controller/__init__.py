"""Concurrency controller: pure policy that sizes the in-flight window to the server's KV pool.

See `core` for the policy; `Controller`, `ControllerConfig` and `ControllerStats` are the API.
"""

from gen_pipeline.controller.config import ControllerConfig, ControllerStats
from gen_pipeline.controller.core import Controller

__all__ = ["Controller", "ControllerConfig", "ControllerStats"]
