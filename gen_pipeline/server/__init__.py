"""The inference server: launch + supervise (run_server), attach (run_attached), capacity and load."""

from gen_pipeline.config.server import DEFAULT_SERVER_CONFIG, ServerProfile, load_server_profile
from gen_pipeline.server.attach import run_attached
from gen_pipeline.server.command import build_command, build_env
from gen_pipeline.server.handle import ServerHandle
from gen_pipeline.server.load import read_load
from gen_pipeline.server.plan import Plan, format_plan, plan, plan_from_args
from gen_pipeline.server.supervisor import run_server

__all__ = [
    "DEFAULT_SERVER_CONFIG", "Plan", "ServerHandle", "ServerProfile", "build_command", "build_env", "format_plan",
    "load_server_profile", "plan", "plan_from_args", "read_load", "run_attached", "run_server",
]
