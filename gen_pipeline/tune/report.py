"""`tune`'s result: the measured table (printed, and as comments of the written profile) and the winner
as a server.toml profile `[profile.<P>-tuned]` that inherits the shipped one (outputs/<D>/tune/<P>-tuned.toml)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from gen_pipeline.display import display_path
from gen_pipeline.store.shards import write_atomic
from gen_pipeline.tune.plan import NOT_ON_ONE_GPU, TunePlan
from gen_pipeline.tune.trials import TuneResult


def write_result(tp: TunePlan, res: TuneResult, folder: Path, config_dir: Path) -> tuple[Path, list[str]]:
    """Write folder/<P>-tuned.toml (the winner's profile, or only the table when the shipped one stays);
    returns its path and the lines to print: the table (per candidate: median tok/s, against the shipped one)."""
    name, ships = tp.shipped.name, res.outcomes[0].median
    width = max(len(o.candidate.name) for o in res.outcomes)
    lines = [f"{'candidate':<{width}} {'tok/s':>9} {'server':>9} {'trials':>6} {'vs shipped':>10}  output check"]
    for o in res.outcomes:
        ratio = f"{o.median / ships:.2f}x" if o.tok_s and ships else "-"
        server = f"{statistics.median(o.server_tok_s):,.0f}" if o.server_tok_s else "-"
        check = ("refused: " if o.refused else "") + o.check + (" <- winner" if o is res.winner else "")
        lines.append(f"{o.candidate.name:<{width}} {o.median:>9,.0f} {server:>9} {len(o.tok_s):>6} {ratio:>10}  "
                     f"{check}")
    lines += [f"skipped {c}: {why}" for c, why in tp.skipped]
    head = [f"# gen-pipeline tune: {len(res.outcomes)} profiles, {tp.rounds} round(s) of the job's next "
            f"{tp.prompts:,} prompts (the same for each), completion tok/s (median over rounds; server: its "
            f"decode rate as its load polls read it); noise {100 * res.noise:.0f} %"]
    body = ["# " + line for line in lines] + ["# not tried on one GPU: " + "; ".join(NOT_ON_ONE_GPU.values())]
    won = res.winner.candidate
    if res.winner is res.outcomes[0]:
        verdict = (f"no candidate beat {name} by more than the noise ({100 * res.noise:.0f} %): the shipped profile "
                   "stays.")
        profile: list[str] = [f"# {verdict}"]
    else:
        verdict = (f"winner: {won.name}, {res.winner.median / res.outcomes[0].median:.2f}x {name}. To use it, append "
                   f"[profile.{name}-tuned] of this file to {display_path(config_dir / 'server.toml')} and run "
                   f"generate --server {name}-tuned.")
        profile = ["", f"[profile.{name}-tuned]", f'inherits = "{name}"']
        # a lever's value is a string, number, bool or list of strings: their JSON is their TOML
    profile += [f"{key} = {json.dumps(value)}" for key, value in won.change.items()]
    path = folder / f"{name}-tuned.toml"
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(path, ("\n".join(head + body + profile) + "\n").encode())
    return path, [*lines, verdict, f"written to {display_path(path)}"]
