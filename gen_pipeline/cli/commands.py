"""The commands: parsed arguments → one library call → printed lines and an exit code (every check is
the library's). Heavy modules are imported inside the command that needs them, so `status` stays fast."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from typing import TYPE_CHECKING

from gen_pipeline.config.dataset import DatasetConfig, find_dataset_config, find_dataset_configs
from gen_pipeline.display import count, write_line

if TYPE_CHECKING:
    from gen_pipeline.config.server import ServerProfile
    from gen_pipeline.run.options import JobSummary, RunOptions

REFERENCE_DATASETS = ("B1", "B2", "B6", "B7")


def cmd_generate(args: argparse.Namespace) -> int:
    from gen_pipeline.signals import EXIT_CODES, hold_signals

    with hold_signals():  # a SIGINT/SIGTERM/SIGHUP ends the run with its summary, never the process
        code = _cmd_generate(args)
    if code in EXIT_CODES.values():
        exit_past_threads(code)
    return code


def _cmd_generate(args: argparse.Namespace) -> int:
    import anyio

    from gen_pipeline.cli.logs import console_events, quiet_datasets
    from gen_pipeline.run.progress import Progress

    quiet_datasets()
    cfgs = _generate_configs(args)
    opts = options_from_args(args, cfgs)
    if opts.rank.ranked:  # which part this process writes, and why (a launcher's variables are easy to miss)
        for cfg in cfgs:
            print(f"{cfg.name}: {opts.rank.label} (from {opts.rank.source}), share "
                  f"{opts.rank.share(cfg.target_samples):,} of {cfg.target_samples:,}, writing "
                  f"{args.output_dir / cfg.name / opts.rank.folder_name}/", flush=True)
    with Progress(cfgs[0].name, mode=args.progress) as progress, console_events(bar=progress.mode == "bar"):
        if progress.mode != "quiet":
            opts = replace(opts, on_progress=progress.update)
        summary = anyio.run(_generate, cfgs, opts)
    for line in summary.lines():  # run.log has them too: a reader gone changes nothing (display.write_line)
        write_line(line, sys.stdout)
    return summary.exit_code


def _generate_configs(args: argparse.Namespace) -> list[DatasetConfig]:
    """--dataset's configs (a warning for each file of `all` that is no TOML), or --input's, inferred."""
    from gen_pipeline.config.from_input import input_dataset, sampling_flags

    flags = sampling_flags(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                           input_given=args.input is not None)
    if args.input is not None:
        cfg, note = input_dataset(args.input, args.output_dir, command="gen-pipeline " + shlex.join(args.argv),
                                  **flags)
        print(f"{cfg.name}: {note}", flush=True)
        return [cfg]
    skipped: list[str] = []
    cfgs = find_dataset_configs(args.dataset, args.config_dir, skipped)
    for warning in skipped:
        print(f"warning: {warning}", file=sys.stderr)
    return cfgs


def exit_past_threads(code: int, join_s: float = 0.5) -> None:
    """End the process with `code` now (logs and streams flushed) when a non-daemon thread still runs after
    `join_s`: Python joins them at exit, and a source load a signal abandoned (run/setup.py: `datasets`
    cannot be interrupted) may never end. Returns when no thread is left."""
    import contextlib
    import logging
    import os
    import threading
    import time

    deadline = time.monotonic() + join_s
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    if not any(t.is_alive() and not t.daemon and t is not threading.current_thread() for t in threading.enumerate()):
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone: nothing more to say
            stream.flush()
    os._exit(code)


def options_from_args(args: argparse.Namespace, cfgs: Sequence[DatasetConfig]) -> RunOptions:
    """generate's flags → RunOptions (gen_pipeline/run/setup.py); its notes go to stderr."""
    from gen_pipeline.config.run import RunFlags
    from gen_pipeline.run.setup import run_options

    flags = {f.name: getattr(args, f.name) for f in fields(RunFlags)}
    opts, notes = run_options(cfgs, config_dir=args.config_dir, output_root=args.output_dir, server=args.server,
                              server_urls=args.server_url, rank=args.rank, world_size=args.world_size, **flags)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return opts


async def _generate(cfgs: list[DatasetConfig], opts: RunOptions) -> JobSummary:
    from gen_pipeline.cli.logs import run_logs
    from gen_pipeline.run.job import open_job

    async with open_job(cfgs, opts) as job:
        for problem in job.waived:
            print(f"warning: {problem} (--proceed-anyway: generating anyway)", file=sys.stderr, flush=True)
        with run_logs(job.folders):
            return await job.run()


def cmd_check(args: argparse.Namespace) -> int:
    from gen_pipeline.cli.logs import quiet_datasets
    from gen_pipeline.config.server import load_server_profile
    from gen_pipeline.reports.check import format_report, run_check

    quiet_datasets()
    cfg = find_dataset_config(args.dataset, args.config_dir)
    profile = load_server_profile(args.server, args.config_dir / "server.toml")
    report = run_check(cfg, output_root=args.output_dir, profile=profile)
    print(format_report(report), flush=True)
    if report.problems:
        raise report.problems[0]
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from gen_pipeline.reports.status import check_output_root, config_targets, format_status, status_all

    targets, warnings = config_targets(args.config_dir, args.output_dir, args.dataset)
    check_output_root(args.output_dir)  # after the configs: a config named and wrong is the first thing to fix
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    # the total is the reference job's (88,000 over B1, B2, B6, B7), over the ones asked for
    report = status_all(args.output_dir, targets, total_of=[d for d in REFERENCE_DATASETS if d in targets],
                        others=not args.dataset)
    _print_report(args, report.to_dict, lambda: format_status(report))
    return 0


def _print_report(args: argparse.Namespace, as_dict: Callable[[], object], as_text: Callable[[], str]) -> None:
    """--json: the report's dict, indented; else its text."""
    import orjson

    print(orjson.dumps(as_dict(), option=orjson.OPT_INDENT_2).decode() if args.json else as_text())


def cmd_validate(args: argparse.Namespace) -> int:
    from gen_pipeline.reports.validate import validate_named

    report = validate_named(args.dataset, args.output_dir, args.config_dir)
    _print_report(args, report.to_dict, report.format)
    return 0 if report.ok else 1


def cmd_plan(args: argparse.Namespace) -> int:
    from gen_pipeline.config.server import load_server_profile
    from gen_pipeline.reports.job_time import plan_job_time
    from gen_pipeline.server.plan import format_plan, plan_from_args, profile_cuda_graph_max_bs, profile_inputs

    profile = load_server_profile(args.server, args.config_dir / "server.toml")
    inputs, note = profile_inputs(profile, tp_size=args.tp_size, mem_fraction_static=args.mem_fraction_static,
                                  kv_cache_dtype=args.kv_cache_dtype, hicache_gb=args.hicache_gb,
                                  dcp_size=args.dcp_size)
    p = plan_from_args(args.model_config, gpu_mem_gb=args.gpu_mem_gb, tokens_per_sample=args.tokens_per_sample,
                       weights_gb=args.weights_gb, params_b=args.params_b, weight_dtype=args.weight_dtype,
                       overhead_gb=args.overhead_gb, inputs_note=note, **inputs)
    if (graphs := profile_cuda_graph_max_bs(profile.extra_args)) is not None:
        p = replace(p, cuda_graph_max_bs=graphs, cuda_graph_note=f"--cuda-graph-max-bs of {profile.where}")
    print(format_plan(p))
    skipped: list[str] = []
    job = plan_job_time(p, args.config_dir, args.output_dir, decode_tok_s=args.decode_tok_s, skipped=skipped)
    for warning in skipped:
        print(f"warning: {warning}", file=sys.stderr)
    if job:
        print("\n" + job)
    return 0


def cmd_probe_kv(args: argparse.Namespace) -> int:
    import anyio

    from gen_pipeline.cli.logs import console_events, quiet_datasets
    from gen_pipeline.probe.core import ProbeOptions, format_report, probe_servers, run_probe

    quiet_datasets()
    opts = ProbeOptions(output_root=args.output_dir, samples=args.samples, max_new_tokens=args.max_new_tokens,
                        top_k=args.top_k, chunk=args.tf_chunk, concurrency=args.concurrency,
                        allow_same_kv=args.allow_same_kv)
    cfg = find_dataset_config(args.dataset, args.config_dir)
    ref, cmp = probe_servers(args.config_dir, server=args.server, server_url=args.server_url, compare=args.compare,
                             compare_url=args.compare_url, allow_same_kv=args.allow_same_kv)
    with console_events(bar=False):
        report = anyio.run(run_probe, cfg, replace(opts, reference=ref, compare=cmp))
    print(format_report(report, args.output_dir / cfg.name / "probe-kv.json"), flush=True)
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    import anyio

    from gen_pipeline.cli.logs import console_events, quiet_datasets
    from gen_pipeline.config.schema import declared_flags
    from gen_pipeline.tune import TuneOptions, make_plan, run_tune, shipped_profile

    quiet_datasets()
    names = [f.field for f in declared_flags(TuneOptions)] + ["model_config", "gpu_mem_gb", "weights_gb"]
    given = {k: getattr(args, k) for k in names}
    if args.levers is not None:
        given["levers"] = tuple(n.strip() for n in args.levers.split(",") if n.strip())
    opts = TuneOptions(output_root=args.output_dir, config_dir=args.config_dir,
                       **{k: v for k, v in given.items() if v is not None})
    cfg = find_dataset_config(args.dataset, args.config_dir)
    tp = make_plan(cfg, shipped_profile(args.config_dir, args.server), opts)
    print("\n".join(tp.lines()), flush=True)
    with console_events(bar=False):
        anyio.run(run_tune, cfg, tp, opts, lambda line: print(line, flush=True))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from gen_pipeline.cli.logs import quiet_datasets
    from gen_pipeline.export.core import export_names, run_export
    from gen_pipeline.export.options import ExportOptions
    from gen_pipeline.export.render import parse_template_kwargs
    from gen_pipeline.export.select import Filters, parse_mix, parse_val

    quiet_datasets()
    opts = ExportOptions(datasets=export_names(args.dataset, args.config_dir), format=args.format, out=args.out,
                         output_root=args.output_dir, hf_layout=args.hf_layout,
                         mix=parse_mix(args.mix) if args.mix else None, seed=args.seed, val=parse_val(args.val_share),
                         expand_turns=args.expand_turns, keep_meta=args.keep_meta, status=not args.no_status,
                         force=args.force, filters=Filters(args.drop_truncated, args.min_completion_tokens),
                         harmony=args.harmony, tokenizer=args.tokenizer, profile=_profile(args),
                         template_kwargs=parse_template_kwargs(args.template_kwargs),
                         require_trained_reasoning=args.require_trained_reasoning, max_length=args.max_length,
                         command="gen-pipeline " + shlex.join(args.argv))
    print(run_export(opts).format(), flush=True)
    return 0


def cmd_check_template(args: argparse.Namespace) -> int:
    from gen_pipeline.cli.logs import quiet_datasets
    from gen_pipeline.export.render import parse_template_kwargs
    from gen_pipeline.export.template_check import check_template

    quiet_datasets()
    names = [n.strip() for arg in args.dataset for n in arg.split(",") if n.strip()]
    print(check_template(output_root=args.output_dir, datasets=names, export=args.export, samples=args.samples,
                         seed=args.seed, tokenizer=args.tokenizer, profile=_profile(args),
                         template_kwargs=parse_template_kwargs(args.template_kwargs), max_length=args.max_length),
          flush=True)
    return 0


def _profile(args: argparse.Namespace) -> ServerProfile | None:
    """--server PROFILE of export and check-template (None when not given)."""
    from gen_pipeline.config.server import load_server_profile

    return load_server_profile(args.server, args.config_dir / "server.toml") if args.server else None


def cmd_diagnose(args: argparse.Namespace) -> int:
    from gen_pipeline.reports.diagnose import diagnose_dataset

    print(diagnose_dataset(args.output_dir, args.dataset, model_config=args.model_config, gpu_mem_gb=args.gpu_mem_gb,
                           tp_size=args.tp_size).text)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from gen_pipeline.reports.diagnose import diagnose_dataset
    from gen_pipeline.reports.page import build_report, write_report
    from gen_pipeline.reports.status import config_targets

    found = diagnose_dataset(args.output_dir, args.dataset, model_config=args.model_config, gpu_mem_gb=args.gpu_mem_gb,
                             tp_size=args.tp_size)
    targets, _ = config_targets(args.config_dir, args.output_dir, [args.dataset])
    page = build_report(args.output_dir, args.dataset, found.rows, found.text, targets.get(args.dataset))
    path = write_report(args.out or found.folder / "report.html", page)
    print(f"{path}: {count(len(found.rows))} polls, {count(path.stat().st_size)} bytes")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "generate": cmd_generate, "status": cmd_status, "validate": cmd_validate, "plan": cmd_plan,
    "check": cmd_check, "probe-kv": cmd_probe_kv, "tune": cmd_tune, "export": cmd_export,
    "check-template": cmd_check_template, "report": cmd_report, "diagnose": cmd_diagnose,
}
