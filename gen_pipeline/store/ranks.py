"""Many orchestrators, one dataset: which rank this process is, which prompts it owns, its share of the target.
Pure. Rank R of W owns the ids whose blake2b (not `hash()`, salted per process) is R mod W: the same on every machine
and run. A rank never takes over another's prompts: a short slice of the source stops at "source exhausted".
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gen_pipeline.errors import ConfigError

_FOLDER = re.compile(r"^rank-(\d+)-of-(\d+)$")


@dataclass(frozen=True)
class RankSpec:
    """This process is rank `rank` of `world` (0 <= rank < world); world 1 = the whole dataset."""

    rank: int = 0
    world: int = 1
    source: str = "default"  # where it came from, for messages: "--rank/--world-size", "SLURM_PROCID/...", ...

    @property
    def ranked(self) -> bool:
        return self.world > 1

    @property
    def folder_name(self) -> str:
        return rank_folder_name(self.rank, self.world)

    @property
    def label(self) -> str:
        return f"rank {self.rank} of {self.world}"

    def owns(self, sample_id: str) -> bool:
        return owner_rank(sample_id, self.world) == self.rank

    def share(self, target: int) -> int:
        return rank_share(target, self.rank, self.world)


def owner_rank(sample_id: str, world: int) -> int:
    """The rank (0..world-1) that owns `sample_id`: the first 8 bytes of its blake2b digest, mod world."""
    if world <= 1:
        return 0
    return int.from_bytes(hashlib.blake2b(sample_id.encode("utf-8"), digest_size=8).digest(), "big") % world


def rank_share(target: int, rank: int, world: int) -> int:
    """Rank `rank`'s exact part of `target`; the shares of ranks 0..world-1 sum to `target`."""
    return target // world + (1 if rank < target % world else 0)


def rank_folder_name(rank: int, world: int) -> str:
    return f"rank-{rank}-of-{world}"


def parse_rank_folder(name: str) -> tuple[int, int] | None:
    """(rank, world) of a folder named rank-<R>-of-<W> with 0 <= R < W, else None."""
    if not (m := _FOLDER.match(name)):
        return None
    rank, world = int(m.group(1)), int(m.group(2))
    return (rank, world) if 0 <= rank < world else None


def _check(rank: int, world: int, rank_name: str, world_name: str, sep: str = " ") -> None:
    """0 <= rank < world, world >= 1; `sep` shows a value as a flag's (" ") or a variable's ("=")."""
    if world < 1:
        raise ConfigError(f"{world_name}{sep}{world} must be at least 1 (the number of ranks sharing the dataset).")
    if not 0 <= rank < world:
        raise ConfigError(f"{rank_name}{sep}{rank} must be between 0 and {world - 1}: ranks are numbered 0 to "
                          f"{world_name} - 1, and {world_name} is {world}.")


def _env_int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name].strip())
    except ValueError:
        raise ConfigError(f"The environment variable {name}={env[name]!r} is not an integer. Fix or unset it, "
                          "or pass --rank and --world-size, which win over the environment.") from None


def _from_env(env: Mapping[str, str], rank_var: str, world_var: str) -> RankSpec | None:
    have = [v for v in (rank_var, world_var) if env.get(v, "").strip()]
    if not have or have in (["SLURM_NTASKS"], ["SLURM_PROCID"]):
        # one of the two alone is a shell of SLURM's, not an srun task: salloc's sets SLURM_NTASKS, a batch
        # script's SLURM_PROCID=0 (and SLURM_NTASKS only under --ntasks), as seen on slurm-wlm 22.05
        return None
    if len(have) == 1:
        missing = world_var if have[0] == rank_var else rank_var
        raise ConfigError(f"The environment sets {have[0]}={env[have[0]]} but not {missing}: set both "
                          f"(rank and world size), or pass --rank and --world-size, which win over the environment.")
    rank, world = _env_int(env, rank_var), _env_int(env, world_var)
    _check(rank, world, rank_var, world_var, sep="=")
    return RankSpec(rank, world, f"{rank_var}/{world_var}")


def resolve_rank(rank: int | None, world: int | None, env: Mapping[str, str]) -> tuple[RankSpec, list[str]]:
    """This process's rank: --rank/--world-size, else SLURM's (array and/or srun task), else RANK/WORLD_SIZE, else 0
    of 1; with notes (SLURM's and torchrun's disagree). Raises ConfigError naming the flag or variable."""
    if rank is not None or world is not None:
        if rank is None or world is None:
            given, missing = ("--rank", "--world-size") if world is None else ("--world-size", "--rank")
            raise ConfigError(f"{given} needs {missing} too: pass both (e.g. --rank 1 --world-size 4), or neither "
                              "to read them from SLURM (a job array's or srun's task) or RANK/WORLD_SIZE.")
        _check(rank, world, "--rank", "--world-size")
        return RankSpec(rank, world, "--rank/--world-size"), []
    # SLURM first (a job array's task and/or an `srun` task), then torchrun's RANK/WORLD_SIZE
    found = [spec for spec in (_from_slurm(env), _from_env(env, "RANK", "WORLD_SIZE")) if spec is not None]
    if not found:
        return RankSpec(), []
    if len(found) == 1 or (found[0].rank, found[0].world) == (found[1].rank, found[1].world):
        return found[0], []
    return found[0], [f"both {found[0].source} ({found[0].rank} of {found[0].world}) and RANK/WORLD_SIZE "
                      f"({found[1].rank} of {found[1].world}) are set; using SLURM's (pass --rank/--world-size "
                      "to choose)."]


def _from_slurm(env: Mapping[str, str]) -> RankSpec | None:
    """A job array's task (`sbatch --array=0-<W-1>`), an `srun` task, or task p of n in array task a
    of A: rank a·n + p of A·n. None outside SLURM (or in an `salloc` shell)."""
    # SLURM sets SLURM_PROCID=0 (and SLURM_NTASKS with --ntasks) in the batch script's own shell too: an array task's
    # script is "task 0 of 1" of its job, the array gives the rank, and an `srun` with several tasks splits it further.
    tasks = _from_env(env, "SLURM_PROCID", "SLURM_NTASKS")
    _check_array_numbering(env)  # before the range check: its message says what to do with such an array
    array = _from_env(env, "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT")
    if array is None:
        return tasks
    if tasks is None or tasks.world == 1:
        return array
    return RankSpec(array.rank * tasks.world + tasks.rank, array.world * tasks.world,
                    f"{array.source} and {tasks.source}")


def _check_array_numbering(env: Mapping[str, str]) -> None:
    """The world size is the array's task count, so its indices must be exactly 0..count-1."""
    lo, hi = env.get("SLURM_ARRAY_TASK_MIN", "").strip(), env.get("SLURM_ARRAY_TASK_MAX", "").strip()
    if not lo or not hi or not env.get("SLURM_ARRAY_TASK_COUNT", "").strip():
        return
    count = _env_int(env, "SLURM_ARRAY_TASK_COUNT")
    if (lo, hi) == ("0", str(count - 1)):
        return
    raise ConfigError(f"This job array is numbered {lo}-{hi} with {count} task{'s' if count != 1 else ''} "
                      f"(SLURM_ARRAY_TASK_MIN={lo}, SLURM_ARRAY_TASK_MAX={hi}, SLURM_ARRAY_TASK_COUNT={count}), "
                      "but ranks come from one array numbered 0 to W-1 (--array=0-3 for 4 ranks; a %N throttle "
                      "is fine): the world size is the array's task count. To rerun one rank, requeue its task "
                      "(scontrol requeue <jobid>_<rank>) or run it with --rank R --world-size W.")
