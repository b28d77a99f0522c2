"""Kill storm: a five-dataset job SIGKILLed over and over, `status` and a five-dataset `export` after each kill.

    python -m bench.kill_storm [--rounds 12] [--seed 0]

Each round starts `generate` over five datasets (launch mode on even rounds: the CLI starts the simulator
itself and only the CLI is killed, so the next round meets the server it left; attach mode on odd rounds),
SIGKILLs it at a seeded moment (start-up, source loading, a shard rotation, mid-generation), then runs
`status --json` and `export` of the five datasets, which must both exit 0. After the last round one more
`generate` runs to the end; every dataset must hold exactly its target, each id once. Writes the
"kill_storm" bench section.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench.report import md_table, write_section
from sglang_sim.testing import start_sim

from pipeline_helpers import (
    REPO,
    SIM_FAST,
    count_output,
    make_rows,
    run_cli_process,
    start_cli,
    wait_for_aim,
    write_dataset,
)

NAMES = ("T1", "T2", "T3", "T4", "T5")
TARGET = 40
STATUS_ARGS = tuple(a for n in NAMES for a in ("--dataset", n))
AIMS = ("start-up", "loading", "rotation", "write")
OFFLINE = REPO / "datasets_cfg" / "offline"  # its server.toml's [profile.sim]: the simulator, launched by the CLI


def _kill_at(proc, folder: Path, aim: str, rng: random.Random) -> bool:
    """Block until `aim`, then SIGKILL the CLI alone (not its server); True if it was still running."""
    if aim == "start-up":
        time.sleep(rng.uniform(0.05, 0.6))  # the kill's moment itself is what is random here
        landed = proc.poll() is None
    elif aim == "loading":
        time.sleep(rng.uniform(0.8, 2.0))
        landed = proc.poll() is None
    else:
        landed = wait_for_aim(proc, folder, "rotation" if aim == "rotation" else "write", rng, timeout_s=60)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return landed


def run(rounds: int, seed: int) -> dict:
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="kill-storm-"))
    config_dir = work / "cfg"  # the five TOMLs beside the offline server.toml
    config_dir.mkdir()
    (config_dir / "server.toml").write_bytes((OFFLINE / "server.toml").read_bytes())
    tomls = [write_dataset(config_dir, name=n, rows=make_rows(60), target=TARGET, max_new_tokens=64,
                           shard_max_samples=rng.choice([4, 7, 11]), fsync_every=rng.choice([1, 3, 8]))
             for n in NAMES]
    out, log = work / "out", work / "cli.log"
    datasets = ",".join(NAMES)
    assert [t.stem for t in tomls] == list(NAMES)
    rows = []
    with start_sim([*SIM_FAST, "--served-model-name", "moonshotai/Kimi-K2.5"]) as sim:
        def generate_args(mode: str) -> tuple:
            where = ("--server", "sim") if mode == "launch" else ("--server-url", sim.url)
            return ("generate", "--dataset", datasets, *where, "--config-dir", config_dir, "--output-dir", out,
                    "--progress", "log")

        primed = run_cli_process(*generate_args("attach"), "--limit", "3")  # every dataset has samples to export
        assert primed.returncode == 0, primed.stderr[-2000:]
        for r in range(rounds):
            mode, aim = ("launch" if r % 2 == 0 else "attach"), rng.choice(AIMS)
            proc = start_cli(*generate_args(mode), log=log)
            landed = _kill_at(proc, out / NAMES[0], aim, rng)
            status = run_cli_process("status", "--json", *STATUS_ARGS, "--config-dir", config_dir, "--output-dir", out)
            export = run_cli_process("export", "--dataset", ",".join(NAMES), "--format", "specforge", "--out",
                                     work / f"export-{r}.jsonl", "--output-dir", out, "--config-dir", config_dir,
                                     "--force")
            rows.append({"round": r + 1, "mode": mode, "aim": aim, "landed": landed, "status_rc": status.returncode,
                         "export_rc": export.returncode, "errors": (status.stderr + export.stderr)[-600:]
                         if status.returncode or export.returncode else ""})
        final = run_cli_process(*generate_args("attach"), timeout_s=600)
    counts = {n: count_output(out, n) for n in NAMES}
    status = run_cli_process("status", "--json", *STATUS_ARGS, "--config-dir", config_dir, "--output-dir", out)
    export = run_cli_process("export", "--dataset", ",".join(NAMES), "--format", "specforge", "--out",
                             work / "export-final.jsonl", "--output-dir", out, "--config-dir", config_dir, "--force")
    exported = sum(1 for _ in (work / "export-final.jsonl").open()) if export.returncode == 0 else None
    return {"rounds": rows, "final_rc": final.returncode, "final_stderr": final.stderr[-600:],
            "counts": {n: {"lines": c[0], "unique": c[1], "unparseable": c[2]} for n, c in counts.items()},
            "lost": sum(max(0, TARGET - c[1]) for c in counts.values()),
            "duplicated": sum(c[0] - c[2] - c[1] for c in counts.values()),
            "final_status_rc": status.returncode, "final_export_rc": export.returncode, "exported_rows": exported,
            "work": str(work)}


def markdown(res: dict, command: str) -> str:
    bad = [r for r in res["rounds"] if r["status_rc"] or r["export_rc"]]
    table = md_table(["round", "mode", "killed at", "landed", "status rc", "export rc"],
                     [[r["round"], r["mode"], r["aim"], "yes" if r["landed"] else "no (ended first)", r["status_rc"],
                       r["export_rc"]] for r in res["rounds"]])
    return (f"## Kill storm: five datasets, SIGKILL, then status and export (`{command}`)\n\n"
            f"{len(res['rounds'])} rounds on this machine ({time.strftime('%Y-%m-%d')}), launch and attach mode "
            f"alternating, five datasets of {TARGET} samples: {len(bad)} rounds with a status or export exit other "
            f"than 0; after the last round one run to the end exited {res['final_rc']}: lost {res['lost']}, "
            f"duplicated {res['duplicated']}, final status rc {res['final_status_rc']}, export rc "
            f"{res['final_export_rc']} ({res['exported_rows']} rows).\n\n{table}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    res = run(args.rounds, args.seed)
    command = f"python -m bench.kill_storm --rounds {args.rounds} --seed {args.seed}"
    text = markdown(res, command)
    print(text)
    write_section("kill_storm", {k: v for k, v in res.items() if k != "work"}, text)
    ok = (res["lost"] == 0 and res["duplicated"] == 0 and res["final_rc"] == 0 and res["final_status_rc"] == 0
          and res["final_export_rc"] == 0 and not any(r["status_rc"] or r["export_rc"] for r in res["rounds"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
