"""`gen-pipeline` (also `python -m gen_pipeline`): arguments → config; known errors → message + exit code.

A job (several datasets) exits with the worst of its datasets' codes (130/143 over 5 over 0); an error
ends the whole job with its code.

Exit codes: 0 ok, 1 validation found problems, 2 config/flag error (also: a missing source column, most
rows rejected), 3 server error, 4 store error (lock, config drift, disk), 5 the source has fewer valid rows
than the target (`check`/`generate` refused, or a run ended short of it), 130/143 interrupted by
SIGINT/SIGTERM (resumable).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gen_pipeline.config.dataset import DEFAULT_CONFIG_DIR, DEFAULT_OUTPUT_DIR, DatasetConfig, find_dataset_config
from gen_pipeline.errors import ConfigError, GenPipelineError

if TYPE_CHECKING:
    from gen_pipeline.config.server import ServerProfile
    from gen_pipeline.run.options import RunOptions

REFERENCE_DATASETS = ("B1", "B2", "B6", "B7")
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4")  # server/plan.py WEIGHT_BYTES, without its import cost


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR,
                   help="where outputs/<DATASET>/ live (default: %(default)s)")
    p.add_argument("--config-dir", type=Path, default=DEFAULT_CONFIG_DIR,
                   help="folder of dataset TOMLs and server.toml (default: %(default)s)")
    p.add_argument("--debug", action="store_true", help="show tracebacks for handled errors")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gen-pipeline", description=(
        "Regenerate prompt datasets with a target model on SGLang into EAGLE-3 (SpecForge) training data."))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="generate datasets up to their targets (resumes where it stopped)",
                       description="Start (or attach to) one server and generate each DATASET up to its target "
                                   "(several: one job through one server lifetime). Running the same command "
                                   "again resumes.")
    g.add_argument("--dataset", required=True, action="append",
                   help="a name from the config dir (B1, B2, B6, B7, demo) or a .toml path; several: repeat or "
                        "comma-separate (B1,B2,B6,B7); all = every dataset TOML of the config dir but demo")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--server", default="tuned", metavar="PROFILE",
                       help="server.toml profile to launch: tuned (default), baseline, sim (the built-in simulator)")
    where.add_argument("--server-url", action="append", default=[], metavar="URL",
                       help="attach to a running server or sglang-router instead (repeat or comma-separate)")
    g.add_argument("--limit", type=int, help="stop after this many new samples in this run")
    g.add_argument("--window", type=int, help="fixed concurrency instead of the adaptive controller "
                                              "(default: the dataset's generation.window; 0 there = adaptive)")
    g.add_argument("--model", default="", help="model id for requests (default: from the profile or /v1/models)")
    g.add_argument("--progress", choices=("auto", "bar", "log", "quiet"), default="auto",
                   help="progress display (auto: a bar on a terminal, log lines otherwise)")
    g.add_argument("--poll-interval-s", type=float, default=1.0,
                   help="seconds between load polls: the controller's input, a telemetry row each "
                        "(default: %(default)s)")
    g.add_argument("--drain-grace-s", type=float, default=30.0,
                   help="on SIGINT/SIGTERM, seconds to let in-flight requests finish (default: %(default)s)")
    g.add_argument("--proceed-anyway", action="store_true",
                   help="launch even when the source check fails (most rows rejected, too few valid rows)")
    g.add_argument("--rank", type=int, help="this process's rank when several share the dataset (with --world-size; "
                                            "default: SLURM_PROCID, else RANK)")
    g.add_argument("--world-size", type=int, help="how many ranks share the dataset, each writing "
                                                  "outputs/<DATASET>/rank-<R>-of-<W>/ (default: SLURM_NTASKS, else "
                                                  "WORLD_SIZE, else 1)")
    _common(g)

    c = sub.add_parser("check", help="read and parse a dataset's source before any server starts",
                       description="Parse the source as a run would (a local source up to 50,000 rows whole, "
                                   "else a sample): parsed prompts, reject reasons, prompt lengths, context fit. "
                                   "Exit 2 when most rows are rejected or a column is missing, 5 when the source "
                                   "has fewer valid rows than the remaining target.")
    c.add_argument("--dataset", required=True, help="a name from the config dir (B1, B2, B6, B7, demo) or a .toml path")
    c.add_argument("--server", default="tuned", metavar="PROFILE",
                   help="server.toml profile for the tokenizer and context length (default: %(default)s)")
    _common(c)

    s = sub.add_parser("status", help="per dataset: samples done/target, tokens, errors, throughput, ETA",
                       description="Read outputs/ only (works while a run goes and after one died).")
    s.add_argument("--dataset", action="append", default=[], help="only these datasets (repeatable)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    _common(s)

    v = sub.add_parser("validate", help="check a dataset's output: schema, duplicates, roles, think markers",
                       description="Exit 1 when a problem is found.")
    v.add_argument("--dataset", required=True, help="dataset name (its folder under --output-dir)")
    v.add_argument("--json", action="store_true", help="machine-readable output")
    _common(v)

    pl = sub.add_parser("plan", help="predict KV tokens and decode slots for a model, GPU and KV dtype",
                        description="Arithmetic from the model's config.json; no GPU needed.")
    pl.add_argument("--model-config", type=Path, default=DEFAULT_CONFIG_DIR / "models" / "kimi-k2.5-config.json",
                    help="the model's config.json (default: the bundled Kimi-K2.5 one)")
    pl.add_argument("--server", default="tuned", metavar="PROFILE",
                    help="server.toml profile whose tp_size, mem_fraction_static, kv_cache_dtype and hicache_size_gb "
                         "are the defaults below (default: %(default)s)")
    pl.add_argument("--config-dir", type=Path, default=DEFAULT_CONFIG_DIR,
                    help="folder of server.toml (default: %(default)s)")
    pl.add_argument("--gpu-mem-gb", type=float, default=141.0,
                    help="memory per GPU in GiB (default: %(default)s, H200)")
    pl.add_argument("--tp-size", type=int, help="tensor parallel size (default: the profile's)")
    pl.add_argument("--mem-fraction-static", type=float,
                    help="SGLang's static memory fraction (default: the profile's)")
    pl.add_argument("--kv-cache-dtype", help="KV dtype planned besides bf16 and fp8_e4m3 (default: the profile's)")
    pl.add_argument("--tokens-per-sample", type=int, default=4500,
                    help="prompt + completion tokens one request holds at its end (default: %(default)s, B2-like)")
    pl.add_argument("--weights-gb", type=float,
                    help="total weight size in GiB, e.g. 553 for Kimi-K2.5 INT4 (594 GB on disk); or give --params-b")
    pl.add_argument("--params-b", type=float,
                    help="parameter count in billions, with --weight-dtype (single-dtype checkpoints only)")
    pl.add_argument("--weight-dtype", choices=sorted(WEIGHT_DTYPES),
                    help="bytes per parameter for --params-b: bf16/fp16 2, fp8/int8 1, int4 0.5 (required with it)")
    pl.add_argument("--hicache-gb", type=float,
                    help="hierarchical cache per rank in GB (default: the profile's hicache_size_gb when it "
                         "enables the hierarchical cache)")
    pl.add_argument("--overhead-gb", type=float, default=0.0, help="activations/graphs per GPU outside the KV pool")
    pl.add_argument("--debug", action="store_true", help="show tracebacks for handled errors")

    _probe_kv_parser(sub)
    _export_parser(sub)
    _check_template_parser(sub)
    _telemetry_parsers(sub)
    return parser


def _probe_kv_parser(sub: Any) -> None:
    pk = sub.add_parser("probe-kv", help="measure what a KV-cache dtype (fp8_e4m3) does to the model's outputs",
                        description="Two servers that differ only in KV dtype, the same prompts, greedy decoding "
                                    "and teacher-forced scoring; writes outputs/<DATASET>/probe-kv.json.")
    pk.add_argument("--dataset", required=True, help="the dataset whose source gives the prompts (B2, demo, a .toml)")
    ref = pk.add_mutually_exclusive_group()
    ref.add_argument("--server", metavar="PROFILE", help="reference (bf16 KV) profile to launch (default: baseline)")
    ref.add_argument("--server-url", metavar="URL", help="attach to a running reference server instead")
    cmp = pk.add_mutually_exclusive_group()
    cmp.add_argument("--compare", metavar="PROFILE", help="compare (fp8 KV) profile to launch (default: tuned)")
    cmp.add_argument("--compare-url", metavar="URL", help="attach to a running compare server instead")
    pk.add_argument("--samples", type=int, default=200, help="prompts to probe (default: %(default)s)")
    pk.add_argument("--max-new-tokens", type=int, default=256, help="output cap per prompt (default: %(default)s)")
    pk.add_argument("--top-k", type=int, default=5, help="top_logprobs_num per position (default: %(default)s)")
    pk.add_argument("--tf-chunk", type=int, default=32,
                    help="reference tokens scored per teacher-forced request, 0 = all in one (default: %(default)s)")
    pk.add_argument("--concurrency", type=int, default=32, help="prompts in flight (default: %(default)s)")
    pk.add_argument("--allow-same-kv", action="store_true", help="allow equal KV dtypes (a noise-floor run)")
    _common(pk)


def _export_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = sub.add_parser("export", help="write what a trainer loads: one SpecForge/speculators JSONL or an HF dataset",
                       description="Export the committed samples of one or more datasets (safe during a run) into "
                                   "one training file (specforge, speculators) or a datasets folder (hf). "
                                   "Atomic: written under a temporary name, then renamed.")
    e.add_argument("--dataset", action="append", default=[], help="dataset name (repeatable or comma-separated)")
    e.add_argument("--format", required=True, choices=("specforge", "speculators", "hf", "tokens"),
                   help="specforge: JSONL of id/conversations/status; speculators: JSONL of id/conversations; "
                        "hf: save_to_disk folder or parquet files with a fixed schema; tokens: JSONL of "
                        "input_ids/loss_mask, one row per assistant turn (needs --tokenizer unless the samples "
                        "carry the server's token ids)")
    e.add_argument("--out", type=Path, required=True,
                   help="the .jsonl file (specforge, speculators, tokens) or folder (hf)")
    e.add_argument("--hf-layout", choices=("disk", "parquet"), default="disk",
                   help="hf: a DatasetDict for load_from_disk (default) or train/validation .parquet files")
    e.add_argument("--mix", help="take DATASET=SHARE,... (shares summing to 1) or DATASET=COUNT,... samples")
    e.add_argument("--seed", type=int, default=0, help="seed of the --mix choice and the row order (default: 0)")
    e.add_argument("--val-share", metavar="SHARE|COUNT",
                   help="validation split by id hash: a fraction (0.02) or a sample count (500); "
                        "JSONL formats write it to <out stem>.val.ndjson (no *.jsonl glob finds it)")
    e.add_argument("--expand-turns", action="store_true",
                   help="one row per assistant turn (history up to it; reasoning kept on that turn only)")
    e.add_argument("--keep-meta", action="store_true",
                   help="JSONL formats: keep each sample's meta (+ dataset); hf always has it")
    e.add_argument("--no-status", action="store_true",
                   help="specforge: leave out status (its gpt-oss/Harmony parser takes no extra column; its "
                        "validate/expand scripts then refuse the file)")
    e.add_argument("--harmony", action="store_true",
                   help="specforge, gpt-oss: assistant turns as assistant_analysis (reasoning) + assistant_final "
                        "(answer) messages, the roles SpecForge's Harmony parser renders; needs --no-status")
    _tokenizer_args(e)
    e.add_argument("--require-trained-reasoning", action="store_true",
                   help="refuse (exit 2) unless all the kept reasoning is under the trainer's loss mask with the "
                        "target's chat template (needs --tokenizer or --server)")
    e.add_argument("--server", help="server profile of the run (datasets_cfg/server.toml): the card's GPUs, and "
                                    "the tokenizer when --tokenizer is not given")
    e.add_argument("--drop-truncated", action="store_true", help="leave out samples cut at max_new_tokens")
    e.add_argument("--min-completion-tokens", type=int, default=0, metavar="N",
                   help="leave out samples with fewer completion tokens")
    e.add_argument("--force", action="store_true", help="replace --out if it exists")
    _common(e)


def _tokenizer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", metavar="PATH",
                   help="the target's tokenizer with its chat template: a model folder (or a cached hub id); "
                        "needs the `template` extra (transformers + jinja2)")
    p.add_argument("--template-kwargs", metavar="JSON", default="{}",
                   help='chat_template_kwargs for every render, e.g. \'{"thinking": true}\' (default: {})')


def _check_template_parser(sub: Any) -> None:
    t = sub.add_parser("check-template",
                       help="how much reasoning and answer each trainer trains, with the target's chat template",
                       description="Render samples through the target's tokenizer and chat template the way "
                                   "SpecForge (whole row; train_only_last_turn; --expand-turns rows), speculators "
                                   "(one row per turn) and --format tokens do, and print per turn the share of "
                                   "reasoning and answer tokens under the loss mask.")
    t.add_argument("--dataset", action="append", default=[], help="dataset name (repeatable or comma-separated)")
    t.add_argument("--export", type=Path, metavar="FILE",
                   help="a specforge or speculators JSONL export to check instead of --dataset's samples")
    t.add_argument("--samples", type=int, default=50, help="samples to render, chosen by id hash (default: 50)")
    t.add_argument("--seed", type=int, default=0, help="seed of that choice (default: 0)")
    t.add_argument("--server", help="server profile whose model's tokenizer to use when --tokenizer is not given")
    _tokenizer_args(t)
    _common(t)


def _telemetry_parsers(sub: Any) -> None:
    r = sub.add_parser("report", help="an HTML page of a dataset's telemetry: plots, status table, diagnosis",
                       description="Reads outputs/<DATASET>/telemetry.jsonl (needs the `report` extra: matplotlib).")
    r.add_argument("--dataset", required=True, help="dataset name (its folder under --output-dir)")
    r.add_argument("--out", type=Path, help="where to write the page (default: outputs/<DATASET>/report.html)")
    _diagnose_args(r)
    _common(r)

    dg = sub.add_parser("diagnose", help="what bounds a run (KV, admission, client, retractions, tail) and what to do",
                        description="Reads outputs/<DATASET>/telemetry.jsonl; every verdict is a rule of "
                                    "gen_pipeline/reports/diagnose.py.")
    dg.add_argument("--dataset", required=True, help="dataset name (its folder under --output-dir)")
    _diagnose_args(dg)
    _common(dg)


def _diagnose_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-config", type=Path, default=DEFAULT_CONFIG_DIR / "models" / "kimi-k2.5-config.json",
                   help="config.json to price the memory-fraction lever with `plan` (default: bundled Kimi-K2.5)")
    p.add_argument("--gpu-mem-gb", type=float, default=141.0,
                   help="memory per GPU in GiB for that lever (default: %(default)s)")
    p.add_argument("--tp-size", type=int, default=8, help="tensor parallel size for that lever (default: %(default)s)")


def cmd_generate(args: argparse.Namespace) -> int:
    import anyio

    from gen_pipeline.run.pipeline import run_generate

    cfgs = _job_configs(args)
    if len(cfgs) > 1:
        return _generate_job(args, cfgs)
    cfg = cfgs[0]
    opts = run_options(args, cfg)
    if opts.profile is not None:
        from gen_pipeline.server.command import check_launchable
        check_launchable(opts.profile)
    _check_before_launch(cfg, args, opts.profile)
    if opts.rank.ranked:  # which part this process writes, and why (a launcher's variables are easy to miss)
        print(f"{cfg.name}: {opts.rank.label} (from {opts.rank.source}), share {opts.rank.share(cfg.target_samples):,} "
              f"of {cfg.target_samples:,}, writing {args.output_dir / cfg.name / opts.rank.folder_name}/", flush=True)
    summary = anyio.run(run_generate, cfg, opts)
    summary.rank_label = opts.rank.label if opts.rank.ranked else ""
    print(summary.line(), flush=True)
    return summary.exit_code


def _job_configs(args: argparse.Namespace) -> list[DatasetConfig]:
    """--dataset B1,B2 / repeated / all → the configs, in order, each once; ConfigError names the TOML."""
    names = [n.strip() for arg in args.dataset for n in arg.split(",") if n.strip()]
    if not names:
        raise ConfigError("--dataset is empty: name a dataset (B2), several (B1,B2,B6,B7) or all.")
    expanded: list[str] = []
    for n in names:
        if n == "all":
            found = [str(p) for p in sorted(args.config_dir.glob("*.toml")) if p.stem not in ("server", "demo")]
            if not found:
                raise ConfigError(f"--dataset all: no dataset TOML in {args.config_dir}.")
            expanded += found
        else:
            expanded.append(n)
    cfgs: dict[str, DatasetConfig] = {}
    for n in expanded:
        cfg = find_dataset_config(n, args.config_dir)
        if cfg.name in cfgs and cfgs[cfg.name].path != cfg.path:
            raise ConfigError(f"{cfg.path} and {cfgs[cfg.name].path} both name dataset {cfg.name!r}: one "
                              "output folder each; rename one.")
        cfgs.setdefault(cfg.name, cfg)
    return list(cfgs.values())


def _generate_job(args: argparse.Namespace, cfgs: list[DatasetConfig]) -> int:
    """Several datasets through one server lifetime (gen_pipeline/run/job.py); every config and source is
    checked before the server starts, and a problem names its dataset's TOML."""
    import anyio

    from gen_pipeline.run.job import run_job

    opts = None
    for cfg in cfgs:
        try:
            o = run_options(args, cfg)
            if opts is not None and o.window != opts.window:
                raise ConfigError(f"generation.window = {cfg.generation.window} differs from the other datasets' "
                                  "(the job's datasets share one window); set it the same or pass --window.")
            opts = opts or o
            if opts.profile is not None and cfg is cfgs[0]:
                from gen_pipeline.server.command import check_launchable
                check_launchable(opts.profile)
            _check_before_launch(cfg, args, opts.profile)
        except GenPipelineError as e:
            from gen_pipeline.display import display_path

            where = [str(cfg.path), display_path(cfg.path)] if cfg.path else [cfg.name]
            if not any(w in str(e) for w in where):
                e.args = (f"{where[-1]}: {e}",)
            raise
    assert opts is not None
    summary = anyio.run(run_job, cfgs, opts)
    for line in summary.lines():
        print(line, flush=True)
    return summary.exit_code


def run_options(args: argparse.Namespace, cfg: DatasetConfig) -> RunOptions:
    """generate's flags + the dataset config + server.toml → RunOptions; raises ConfigError."""
    import os

    from gen_pipeline.config.server import load_controller_config, load_server_profile
    from gen_pipeline.run.options import RunOptions
    from gen_pipeline.store.ranks import resolve_rank

    rank, notes = resolve_rank(args.rank, args.world_size, os.environ)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    urls = tuple(_server_url(u) for arg in args.server_url for u in arg.split(",") if u.strip())
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit {args.limit} must be at least 1.")
    if args.window is not None and args.window < 1:
        raise ConfigError(f"--window {args.window} must be at least 1.")
    if not 0.05 <= args.poll_interval_s <= 60:
        raise ConfigError(f"--poll-interval-s {args.poll_interval_s:g} must be between 0.05 and 60 seconds.")
    server_toml = args.config_dir / "server.toml"
    profile = None if urls else load_server_profile(args.server, server_toml)
    window = args.window if args.window is not None else (cfg.generation.window or None)  # the flag wins
    return RunOptions(output_root=args.output_dir, profile=profile, server_urls=urls, model=args.model,
                      limit=args.limit, window=window, controller=load_controller_config(server_toml),
                      drain_grace_s=args.drain_grace_s, progress=args.progress,
                      poll_interval_s=args.poll_interval_s, rank=rank)


def _check_before_launch(cfg: DatasetConfig, args: argparse.Namespace, profile: ServerProfile | None) -> None:
    """The source check, before any server starts: raise its first problem (unless --proceed-anyway)."""
    from gen_pipeline.reports.check import run_check
    from gen_pipeline.reports.status import read_status

    status = read_status(args.output_dir, cfg.name, cfg.target_samples)
    if status.remaining == 0 or status.state.startswith("running"):
        return  # the run says "nothing to do", or that another run holds the lock
    report = run_check(cfg, output_root=args.output_dir, profile=profile, limit=args.limit)
    for problem in report.problems:
        if not args.proceed_anyway:
            raise problem
        print(f"warning: {problem} (--proceed-anyway: generating anyway)", file=sys.stderr, flush=True)


def cmd_check(args: argparse.Namespace) -> int:
    from gen_pipeline.config.server import load_server_profile
    from gen_pipeline.reports.check import format_report, run_check

    cfg = find_dataset_config(args.dataset, args.config_dir)
    profile = load_server_profile(args.server, args.config_dir / "server.toml")
    report = run_check(cfg, output_root=args.output_dir, profile=profile)
    print(format_report(report), flush=True)
    if report.problems:
        raise report.problems[0]
    return 0


def _server_url(url: str) -> str:
    """A server's base URL; an OpenAI-style ".../v1" is accepted (the client adds /v1/... itself)."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--server-url {url!r} must start with http:// or https:// (e.g. http://gpu-node:30000).")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _targets(config_dir: Path, output_dir: Path, only: Sequence[str]) -> dict[str, int | None]:
    """{dataset name: target} from the configs (the name inside a TOML wins over its file name).

    A named dataset with outputs but no config gets None (status reads the target its run
    recorded); a config that does not load is reported on stderr and shown without a target."""
    targets: dict[str, int | None] = {}
    for n in list(only) or [str(p) for p in sorted(config_dir.glob("*.toml")) if p.stem != "server"]:
        if not n.endswith(".toml") and not (config_dir / f"{n}.toml").exists() and (output_dir / n).is_dir():
            targets[n] = None
            continue
        try:
            cfg = find_dataset_config(n, config_dir)
        except ConfigError as e:
            if only:
                raise
            print(f"warning: {e}", file=sys.stderr)
            targets.setdefault(Path(n).stem, None)
            continue
        targets[cfg.name] = cfg.target_samples
    return targets


def cmd_status(args: argparse.Namespace) -> int:
    from gen_pipeline.reports.status import format_status, status_all

    targets = _targets(args.config_dir, args.output_dir, args.dataset)
    # the total is the reference job's (88,000 over B1, B2, B6, B7), over the ones asked for
    report = status_all(args.output_dir, targets, total_of=[d for d in REFERENCE_DATASETS if d in targets])
    if args.json:
        import orjson
        sys.stdout.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(format_status(report))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from gen_pipeline.reports.validate import validate_dataset

    name = args.dataset
    if name.endswith(".toml") or (args.config_dir / f"{name}.toml").exists():
        name = find_dataset_config(name, args.config_dir).name  # the TOML's `name` picks the folder
    folder = args.output_dir / name
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such output folder. Generate it first (make generate DATASET={args.dataset}).")
    report = validate_dataset(folder)
    if report.rows == 0 and report.ok:
        raise ConfigError(f"{folder}: nothing to validate: no samples yet ({report.files} shard"
                          f"{'' if report.files == 1 else 's'}, all empty). "
                          f"Generate it first (make generate DATASET={args.dataset}).")
    if args.json:
        import orjson
        sys.stdout.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(report.format())
    return 0 if report.ok else 1


def cmd_plan(args: argparse.Namespace) -> int:
    from gen_pipeline.config.server import load_server_profile
    from gen_pipeline.server.plan import WEIGHTS_EXAMPLE, plan_from_args, profile_inputs

    if args.weights_gb is None and args.params_b is None:
        raise ConfigError(f"plan needs the weight size: pass {WEIGHTS_EXAMPLE}.")
    if args.params_b is not None and args.weights_gb is None and args.weight_dtype is None:
        raise ConfigError(f"--params-b {args.params_b:g} needs --weight-dtype ({', '.join(WEIGHT_DTYPES)}): the "
                          "bytes per parameter. For a mixed-precision checkpoint (Kimi-K2.5 INT4) pass --weights-gb.")
    profile = load_server_profile(args.server, args.config_dir / "server.toml")
    inputs, note = profile_inputs(profile, tp_size=args.tp_size, mem_fraction_static=args.mem_fraction_static,
                                  kv_cache_dtype=args.kv_cache_dtype, hicache_gb=args.hicache_gb)
    print(plan_from_args(args.model_config, gpu_mem_gb=args.gpu_mem_gb, tokens_per_sample=args.tokens_per_sample,
                         weights_gb=args.weights_gb, params_b=args.params_b, weight_dtype=args.weight_dtype,
                         overhead_gb=args.overhead_gb, inputs_note=note, **inputs))
    return 0


def cmd_probe_kv(args: argparse.Namespace) -> int:
    import anyio

    from gen_pipeline.config.server import load_server_profile
    from gen_pipeline.probe.core import ProbeOptions, format_report, run_probe

    for flag, value, low in (("--samples", args.samples, 1), ("--max-new-tokens", args.max_new_tokens, 1),
                             ("--top-k", args.top_k, 1), ("--tf-chunk", args.tf_chunk, 0),
                             ("--concurrency", args.concurrency, 1)):
        if value < low:
            raise ConfigError(f"{flag} {value} must be at least {low}.")
    if args.server_url and not (args.compare_url or args.compare):
        raise ConfigError("probe-kv needs a compare server: add --compare-url URL (a second server that differs "
                          "only in KV dtype, e.g. fp8_e4m3) or --compare PROFILE to launch one.")
    cfg = find_dataset_config(args.dataset, args.config_dir)
    toml = args.config_dir / "server.toml"
    ref = _server_url(args.server_url) if args.server_url else load_server_profile(args.server or "baseline", toml)
    cmp = _server_url(args.compare_url) if args.compare_url else load_server_profile(args.compare or "tuned", toml)
    if isinstance(ref, str) and ref == cmp and not args.allow_same_kv:
        raise ConfigError(f"--server-url and --compare-url are the same server ({ref}); give two servers "
                          "that differ in KV dtype (or add --allow-same-kv for a noise-floor run against itself).")
    opts = ProbeOptions(output_root=args.output_dir, samples=args.samples, max_new_tokens=args.max_new_tokens,
                        top_k=args.top_k, chunk=args.tf_chunk, concurrency=args.concurrency, reference=ref,
                        compare=cmp, allow_same_kv=args.allow_same_kv)
    report = anyio.run(run_probe, cfg, opts)
    print(format_report(report, args.output_dir / cfg.name / "probe-kv.json"), flush=True)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from gen_pipeline.export.core import ExportOptions, run_export
    from gen_pipeline.export.select import Filters, parse_mix, parse_val

    names = [n.strip() for arg in args.dataset for n in arg.split(",") if n.strip()]
    names = [find_dataset_config(n, args.config_dir).name if n.endswith(".toml") else n for n in names]
    opts = ExportOptions(datasets=tuple(names), format=args.format, out=args.out, output_root=args.output_dir,
                         hf_layout=args.hf_layout, mix=parse_mix(args.mix) if args.mix else None, seed=args.seed,
                         val=parse_val(args.val_share), expand_turns=args.expand_turns, keep_meta=args.keep_meta,
                         status=not args.no_status, force=args.force,
                         filters=Filters(args.drop_truncated, args.min_completion_tokens),
                         harmony=args.harmony, tokenizer=args.tokenizer, profile=_profile(args),
                         template_kwargs=_template_kwargs(args.template_kwargs),
                         require_trained_reasoning=args.require_trained_reasoning,
                         command="gen-pipeline " + shlex.join(args.argv))
    print(run_export(opts).format(), flush=True)
    return 0


def _profile(args: argparse.Namespace) -> ServerProfile | None:
    from gen_pipeline.config.server import load_server_profile

    return load_server_profile(args.server, args.config_dir / "server.toml") if args.server else None


def _template_kwargs(text: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"--template-kwargs {text!r} is not JSON ({e}); give an object, e.g. "
                          '\'{"thinking": true}\'.') from None
    if not isinstance(value, dict):
        raise ConfigError(f"--template-kwargs {text!r} must be a JSON object (keys → chat template variables).")
    return value


def cmd_check_template(args: argparse.Namespace) -> int:
    from gen_pipeline.export.template_check import check_template

    names = [n.strip() for arg in args.dataset for n in arg.split(",") if n.strip()]
    print(check_template(output_root=args.output_dir, datasets=names, export=args.export, samples=args.samples,
                         seed=args.seed, tokenizer=args.tokenizer, profile=_profile(args),
                         template_kwargs=_template_kwargs(args.template_kwargs)), flush=True)
    return 0


def _telemetry_of(args: argparse.Namespace) -> tuple[Path, list[dict[str, Any]], str]:
    """(dataset folder, telemetry rows, diagnosis text); ConfigError when the folder is missing."""
    import json

    from gen_pipeline.reports.diagnose import Hardware, diagnose, format_diagnosis
    from gen_pipeline.store.telemetry import read_telemetry

    folder = args.output_dir / args.dataset
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such output folder. Generate it first (make generate DATASET={args.dataset}).")
    rows = read_telemetry(folder)
    try:
        model_cfg = json.loads(args.model_config.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--model-config {args.model_config}: cannot read it as JSON ({e}).") from None
    hw = Hardware(model_cfg, args.gpu_mem_gb, args.tp_size, label=args.model_config.name)
    return folder, rows, format_diagnosis(args.dataset, rows, diagnose(rows, hw) if rows else [])


def cmd_diagnose(args: argparse.Namespace) -> int:
    print(_telemetry_of(args)[2])
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from gen_pipeline.reports.page import render_html, write_report
    from gen_pipeline.reports.status import format_status, status_all

    folder, rows, diagnosis = _telemetry_of(args)
    targets = _targets(args.config_dir, args.output_dir, [args.dataset])
    status = format_status(status_all(args.output_dir, targets, total_of=[]))
    page = render_html(args.dataset, rows, status, diagnosis)
    path = write_report(args.out or folder / "report.html", page)
    print(f"{path}: {len(rows)} polls, {path.stat().st_size:,} bytes")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "generate": cmd_generate, "status": cmd_status, "validate": cmd_validate, "plan": cmd_plan,
    "check": cmd_check,
    "probe-kv": cmd_probe_kv,
    "export": cmd_export,
    "check-template": cmd_check_template,
    "report": cmd_report,
    "diagnose": cmd_diagnose,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        return COMMANDS[args.command](args)
    except GenPipelineError as e:
        if args.debug:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted; run the same command to resume.", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `gen-pipeline status | head`: the reader left; not an error to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
