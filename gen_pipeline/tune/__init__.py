"""`gen-pipeline tune`: the shipped server profile against one-lever candidates, measured on the job's own
prompts within a share of its predicted time; the winner written as a profile."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gen_pipeline.config.dataset import DatasetConfig
from gen_pipeline.config.server import ServerProfile, load_server_profile
from gen_pipeline.errors import ConfigError
from gen_pipeline.server.command import check_launchable
from gen_pipeline.store.layout import dataset_folder
from gen_pipeline.tune.plan import LEVERS, NOT_ON_ONE_GPU, TuneOptions, TunePlan, make_plan
from gen_pipeline.tune.report import write_result
from gen_pipeline.tune.trials import run_trials

__all__ = ["LEVERS", "NOT_ON_ONE_GPU", "TuneOptions", "TunePlan", "make_plan", "run_tune", "shipped_profile"]


async def run_tune(cfg: DatasetConfig, tp: TunePlan, opts: TuneOptions, say: Callable[[str], None] = print) -> Path:
    """Run the trials of `tp` (make_plan's, already stated), print the table, write the profile; its path."""
    res = await run_trials(cfg, tp, opts, say)
    path, lines = write_result(tp, res, dataset_folder(opts.output_root, cfg.name) / "tune", opts.config_dir)
    for line in lines:
        say(line)
    say(f"kept {res.kept:,} samples of the {tp.shipped.name} trial in the store (the other trials did the same "
        "prompts: dropped)")
    return path


def shipped_profile(config_dir: Path, name: str) -> ServerProfile:
    """The shipped profile to tune (server.toml of config_dir). ConfigError unless it launches SGLang or the
    simulator (the output check needs SGLang's /generate), ServerError when SGLang is not installed."""
    p = load_server_profile(name, config_dir / "server.toml")
    if p.backend not in ("sglang", "sim"):
        raise ConfigError(f"tune: {p.where} launches a {p.backend} server (backend = {p.backend!r}); tune checks "
                          "each candidate's answers through SGLang's native /generate (as probe-kv does): tune an "
                          "SGLang profile.")
    check_launchable(p)
    return p
