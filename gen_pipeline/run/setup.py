"""Set-up of a job, before any server starts: `run_options`, and `open_datasets`, which reads the served model,
each store and each source once and refuses the launch on a check's problem (unless `proceed_anyway`)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import anyio

from gen_pipeline.config.dataset import DEFAULT_CONFIG_DIR, DEFAULT_OUTPUT_DIR, DatasetConfig
from gen_pipeline.config.run import RunFlags
from gen_pipeline.config.server import read_server_toml
from gen_pipeline.display import display_path
from gen_pipeline.errors import ConfigError, GenPipelineError
from gen_pipeline.http import Http, open_http
from gen_pipeline.reports.check import check_source, dataset_done
from gen_pipeline.run.connect import server_model
from gen_pipeline.run.dataset_run import EVENTS, DatasetRun
from gen_pipeline.run.dispatch import Window
from gen_pipeline.run.options import RunOptions
from gen_pipeline.server.command import check_launchable
from gen_pipeline.sources.loading import LoadedSource, load_source, source_label
from gen_pipeline.store.dataset_store import DatasetStore, ResumeState, default_opener
from gen_pipeline.store.ranks import resolve_rank


def run_options(cfgs: Sequence[DatasetConfig], *, config_dir: Path = DEFAULT_CONFIG_DIR,
                output_root: Path = DEFAULT_OUTPUT_DIR, server: str = "tuned", server_urls: Sequence[str] = (),
                rank: int | None = None, world_size: int | None = None, environ: Mapping[str, str] = os.environ,
                **flags: Any) -> tuple[RunOptions, list[str]]:
    """`generate`'s settings + the configs + server.toml → (RunOptions, notes). Each of `flags` (config/run.py;
    None: not given) is the flag's value, else server.toml's [run] key, else its default (--window: the datasets'
    generation.window first). Raises ConfigError naming the flag, or the TOML (and key) at fault."""
    unknown = set(flags) - {f.name for f in fields(RunFlags)}
    if unknown:
        raise TypeError(f"run_options() got unknown options: {', '.join(sorted(unknown))}")
    spec, notes = resolve_rank(rank, world_size, environ)
    urls = tuple(u for arg in server_urls for u in arg.split(",") if u.strip())
    toml = read_server_toml(config_dir / "server.toml")
    profile = None if urls else toml.profile(server)
    flagged = {k: v for k, v in flags.items() if v is not None}
    given = {**toml.run(), **flagged}  # the flag wins
    odd = next((c for c in cfgs[1:] if (c.generation.window or None) != (cfgs[0].generation.window or None)), None)
    if "window" not in flagged and odd is not None:
        where = display_path(odd.path) if odd.path else odd.name
        raise ConfigError(f"{where}: generation.window = {odd.generation.window} differs from the other "
                          "datasets' (the job's datasets share one window); set it the same or pass --window.")
    if "window" not in flagged and cfgs[0].generation.window:
        given["window"] = cfgs[0].generation.window  # the datasets' own, over server.toml's
    opts = RunOptions(output_root=output_root, profile=profile, server_urls=urls, controller=toml.controller(),
                      rank=spec, **given)
    return opts, notes


@dataclass
class OpenedDatasets:
    """What open_datasets yields: each dataset's part, the control HTTP session, the model, what was waived."""

    runs: list[DatasetRun]
    http: Http
    model: str
    waived: list[GenPipelineError] = field(default_factory=list)
    asked: dict[str, str] = field(default_factory=dict)  # {url: model} server_model asked (not asked again)


Claim = tuple[DatasetConfig, DatasetStore, ResumeState, LoadedSource | None]  # a claimed, checked dataset


class SetupStopped(Exception):
    """A signal stopped the set-up; `done`: {dataset: samples done} of each store claimed (and released) by then."""

    def __init__(self, done: dict[str, int]) -> None:
        super().__init__("the set-up was stopped by a signal")
        self.done = done


@asynccontextmanager
async def open_datasets(cfgs: Sequence[DatasetConfig], opts: RunOptions,
                        stop: anyio.CancelScope | None = None) -> AsyncIterator[OpenedDatasets]:
    """Everything a job needs before its server starts; closes every store on the way out (SetupStopped: `stop`)."""
    if opts.profile is not None:
        check_launchable(opts.profile)
    stop = stop or anyio.CancelScope()
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(open_http(cfgs[0].generation, 16))  # control traffic
        opened = OpenedDatasets([], http, "")
        stores: list[DatasetStore] = []
        try:
            claims: list[Claim] = []
            with stop:
                await _claim_and_check(cfgs, opts, opened, stores, claims)
            if stop.cancel_called:
                raise SetupStopped({s.dataset: s.done for s in stores if s.claimed})
            window = Window(fixed=opts.window)  # the job's datasets share one (the KV pool is one pool)
            for cfg, store, state, source in claims:
                await anyio.to_thread.run_sync(store.begin)
                skip = set(state.done_ids) | store.final_failure_ids()
                opened.runs.append(DatasetRun(cfg, opts, store, skip, window, source, state.notes))
            yield opened
        finally:
            with anyio.CancelScope(shield=True):  # the manifests must be committed even when cancelled
                runs = {id(r.store): r for r in opened.runs}
                for store in stores:
                    run = runs.get(id(store))
                    # nothing written this run: the manifest keeps the last real run's figures (status shows them)
                    progress = None if run is None or run.dispatch.ok == 0 else run.progress_record()
                    await anyio.to_thread.run_sync(store.close, progress)
                for run in opened.runs:
                    run.telemetry.close()


async def _claim_and_check(cfgs: Sequence[DatasetConfig], opts: RunOptions, opened: OpenedDatasets,
                           stores: list[DatasetStore], claims: list[Claim]) -> None:
    """The model, then every lock, then each claim and source check; a source load is abandoned when cancelled."""
    opened.model = await server_model(opts, opened.http, opened.asked)
    mine = [DatasetStore(opts.output_root, cfg.name, fingerprint=cfg.fingerprint(opened.model),
                         target=cfg.target_samples, shard_max_samples=cfg.output.shard_max_samples,
                         fsync_every=cfg.output.fsync_every, file_opener=opts.file_opener or default_opener,
                         rank=opts.rank) for cfg in cfgs]
    stores += mine  # before the claims: a claim that ends while cancelled is released all the same
    # Every lock first, in one order for every job: two jobs started with their datasets crossed (T,U and
    # U,T) cannot each hold one and both be refused the other; the first lock decides which one runs.
    for store in sorted(mine, key=lambda s: str(s.folder)):
        await anyio.to_thread.run_sync(store.lock)
    for cfg, store in zip(cfgs, mine, strict=True):
        state = await anyio.to_thread.run_sync(store.claim)
        if store.remaining:  # the set-up's slow step: a hub download can take minutes
            EVENTS.info("%s: loading the source %s", cfg.name, source_label(cfg.source), extra={"dataset": cfg.name})
        source = await anyio.to_thread.run_sync(_check, cfg, store, opts, len(cfgs) > 1, opened.waived,
                                                abandon_on_cancel=True)
        claims.append((cfg, store, state, source))


def _check(cfg: DatasetConfig, store: DatasetStore, opts: RunOptions, several: bool,
           waived: list[GenPipelineError]) -> LoadedSource | None:
    """The pre-launch check of one claimed dataset; raises its first problem unless proceed_anyway (→ `waived`)."""
    if store.remaining == 0:
        return None
    try:
        source = load_source(cfg)
        if opts.rank.ranked:  # a rank checks the whole source against the whole dataset (all ranks)
            done, final_failed = dataset_done(opts.output_root, cfg)
        else:
            done, final_failed = store.done, len(store.final_failure_ids())
        report = check_source(cfg, source, done=done, final_failed=final_failed, profile=opts.profile,
                              limit=opts.limit)
        if report.problems and not opts.proceed_anyway:
            raise report.problems[0]
    except GenPipelineError as e:
        raise _named(e, cfg) if several else e from None
    waived += [_named(p, cfg) if several else p for p in report.problems]
    return source


def _named(e: GenPipelineError, cfg: DatasetConfig) -> GenPipelineError:
    """The error, its message starting with the dataset's TOML unless it names it already."""
    where = [str(cfg.path), display_path(cfg.path)] if cfg.path else [cfg.name]
    if not any(w in str(e) for w in where):
        e.args = (f"{where[-1]}: {e}",)
    return e
