"""`gen-pipeline`'s arguments: one sub-parser per command (argparse only; the commands are commands.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gen_pipeline.config.dataset import DEFAULT_CONFIG_DIR, DEFAULT_OUTPUT_DIR
from gen_pipeline.config.run import RunFlags
from gen_pipeline.config.sampling import SamplingConfig
from gen_pipeline.config.schema import declared_flags
from gen_pipeline.server.plan import REFERENCE_GPU, REFERENCE_GPU_MEM_GIB, REFERENCE_OVERHEAD_GIB, WEIGHT_BYTES


def folder(value: str) -> Path:
    """A folder flag's value; an empty one is refused (as Path("") it would be the current folder)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("is empty, which would mean the current folder: name the folder "
                                         "(e.g. outputs), or leave the flag out for its default")
    return Path(value)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output-dir", type=folder, default=DEFAULT_OUTPUT_DIR,
                   help="where outputs/<DATASET>/ live (default: %(default)s)")
    p.add_argument("--config-dir", type=folder, default=DEFAULT_CONFIG_DIR,
                   help="folder of dataset TOMLs and server.toml (default: %(default)s)")
    p.add_argument("--debug", action="store_true", help="show tracebacks for handled errors")


def _option_flags(p: argparse.ArgumentParser, cls: Any) -> None:
    """A flag per option `cls` declares (config/schema.py `flag`): name, type, choices and help from the
    declaration, with the field's default; None when not given (then server.toml's [run] or the default)."""
    for f in declared_flags(cls):
        if f.type is bool:
            p.add_argument(f.name, action="store_true", default=None, help=f.help)
            continue
        shown = "" if f.default in (None, "") or "default:" in f.help else f" (default: {f.default})"
        p.add_argument(f.name, type=f.type, default=None, choices=f.choices or None, help=f.help + shown)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gen-pipeline", description=(
        "Regenerate prompt datasets with a target model on SGLang into EAGLE-3 (SpecForge) training data."))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="generate datasets up to their targets (resumes where it stopped)",
                       description="Start (or attach to) one server and generate each DATASET up to its target "
                                   "(several: one job through one server lifetime). Running the same command "
                                   "again resumes. server.toml's [run] table may set the flags from --model to "
                                   "--routing under their names with '_' (server_wait_s = 900); a flag wins.")
    what = g.add_mutually_exclusive_group(required=True)
    what.add_argument("--dataset", action="append",
                      help="a name from the config dir (B1, B2, B6, B7, demo) or a .toml path; several: repeat or "
                           "comma-separate (B1,B2,B6,B7); all = every dataset TOML of the config dir but demo")
    what.add_argument("--input", type=Path, metavar="FILE.jsonl",
                      help="a prompt file instead of a dataset TOML: its schema is inferred and the TOML used is "
                           "written to --output-dir/<name>.toml (the same command, or --dataset on it, resumes)")
    for key, tp in (("max_new_tokens", int), ("temperature", float), ("top_p", float)):  # SamplingConfig's defaults
        g.add_argument(f"--{key.replace('_', '-')}", type=tp,
                       help=f"with --input: sampling.{key} (default: {getattr(SamplingConfig, key)})")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--server", default="tuned", metavar="PROFILE",
                       help="server.toml profile to launch: tuned (default), baseline, sim (the built-in simulator)")
    where.add_argument("--server-url", action="append", default=[], metavar="URL",
                       help="attach to a running server or sglang-router instead (repeat or comma-separate)")
    g.add_argument("--progress", choices=("auto", "bar", "log", "quiet"), default="auto",
                   help="progress display (auto: a bar on a terminal, log lines otherwise)")
    _option_flags(g, RunFlags)
    g.add_argument("--rank", type=int, help="this process's rank when several share the dataset (with --world-size; "
                                            "default: SLURM_ARRAY_TASK_ID and/or SLURM_PROCID, else RANK)")
    g.add_argument("--world-size", type=int, help="how many ranks share the dataset, each writing "
                                                  "outputs/<DATASET>/rank-<R>-of-<W>/ (default: SLURM_ARRAY_TASK_COUNT "
                                                  "and/or SLURM_NTASKS, else WORLD_SIZE, else 1)")
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

    pl = sub.add_parser("plan", help="predict KV tokens, decode slots and the job's wall time for a model and GPU",
                        description="Arithmetic from the model's config.json; no GPU needed. The defaults are "
                                    f"the reference node: 8 x {REFERENCE_GPU} ({REFERENCE_GPU_MEM_GIB:g} GiB), "
                                    "Kimi-K2.5 INT4. Then the job's wall time: every dataset TOML of "
                                    "--config-dir, less what --output-dir already holds.")
    pl.add_argument("--model-config", type=Path, default=DEFAULT_CONFIG_DIR / "models" / "kimi-k2.5-config.json",
                    help="the model's config.json (default: the bundled Kimi-K2.5 one)")
    pl.add_argument("--server", default="tuned", metavar="PROFILE",
                    help="server.toml profile whose tp_size, mem_fraction_static, kv_cache_dtype and hicache_size_gb "
                         "are the defaults below (default: %(default)s)")
    pl.add_argument("--config-dir", type=folder, default=DEFAULT_CONFIG_DIR,
                    help="folder of server.toml and the job's dataset TOMLs (default: %(default)s)")
    pl.add_argument("--output-dir", type=folder, default=DEFAULT_OUTPUT_DIR,
                    help="where the job's samples so far are (default: %(default)s): the time left, and each "
                         "dataset's own lengths once it has 20 samples")
    pl.add_argument("--gpu-mem-gb", type=float, default=REFERENCE_GPU_MEM_GIB,
                    help=f"memory per GPU in GiB as nvidia-smi's total (MiB / 1024) (default: %(default)s, the "
                         f"reference node's {REFERENCE_GPU}; H200: 140.4, H100 80 GB: 79.6)")
    pl.add_argument("--tp-size", type=int, help="tensor parallel size (default: the profile's)")
    pl.add_argument("--dcp-size", type=int,
                    help="decode context parallel size: d x the KV tokens where TP copies the KV (MLA) "
                         "(default: the profile's --dcp-size, else 1)")
    pl.add_argument("--mem-fraction-static", type=float,
                    help="SGLang's static memory fraction (default: the profile's)")
    pl.add_argument("--kv-cache-dtype", help="KV dtype planned besides bf16 and fp8_e4m3 (default: the profile's)")
    pl.add_argument("--tokens-per-sample", type=int, default=4500,
                    help="prompt + completion tokens one request holds at its end (default: %(default)s, B2-like)")
    pl.add_argument("--weights-gb", type=float,
                    help="total weight size in GiB (default with the bundled config: 553, Kimi-K2.5 INT4 = 594 GB "
                         "on disk); or give --params-b")
    pl.add_argument("--params-b", type=float,
                    help="parameter count in billions, with --weight-dtype (single-dtype checkpoints only)")
    pl.add_argument("--weight-dtype", choices=sorted(WEIGHT_BYTES),
                    help="bytes per parameter for --params-b: bf16/fp16 2, fp8/int8 1, int4 0.5 (required with it)")
    pl.add_argument("--hicache-gb", type=float,
                    help="hierarchical cache per rank in GB (default: the profile's hicache_size_gb when it "
                         "enables the hierarchical cache)")
    pl.add_argument("--overhead-gb", type=float, default=REFERENCE_OVERHEAD_GIB,
                    help="GiB per GPU outside weights and KV pool: CUDA context, NCCL buffers, activations, CUDA "
                         "graphs (default: %(default)s, what the reference node's measured pools imply)")
    pl.add_argument("--decode-tok-s", type=float,
                    help="the job's wall time at this measured aggregate decode rate (make status shows a run's "
                         "tok/s) instead of the reference node's modelled rate")
    pl.add_argument("--debug", action="store_true", help="show tracebacks for handled errors")

    _probe_kv_parser(sub)
    _tune_parser(sub)
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


def _tune_parser(sub: Any) -> None:
    from gen_pipeline.tune.plan import LEVERS, TuneOptions

    t = sub.add_parser("tune", help="measure one-lever variants of a server profile on the job's prompts; write the "
                                    "fastest whose answers match",
                       description="Launch the shipped profile and one candidate per single-GPU lever one after "
                                   "another on the job's next prompts (the same for each, prefix cache flushed), "
                                   "within a share of the job's predicted time; refuse a candidate whose greedy "
                                   "answers differ as probe-kv measures; write the winner to "
                                   "outputs/<DATASET>/tune/<PROFILE>-tuned.toml.")
    t.add_argument("--dataset", required=True, help="the dataset whose prompts the trials generate (B2, a .toml)")
    t.add_argument("--server-profile", "--server", dest="server", default="tuned", metavar="PROFILE",
                   help="the shipped profile of server.toml to tune (default: %(default)s)")
    t.add_argument("--levers", help="comma-separated levers to try (default: all: "
                                    f"{', '.join(lv.name for lv in LEVERS)})")
    _option_flags(t, TuneOptions)
    t.add_argument("--model-config", type=Path, help="config.json `plan` sizes each candidate with (default: the "
                                                     "bundled Kimi-K2.5)")
    t.add_argument("--gpu-mem-gb", type=float, help=f"GiB per GPU for plan (default: {REFERENCE_GPU_MEM_GIB}, "
                                                    f"{REFERENCE_GPU})")
    t.add_argument("--weights-gb", type=float, help="total weight size in GiB for plan (default with the bundled "
                                                    "config: 553)")
    _common(t)


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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number of tokens, 1 or more (e.g. 8192)")
    return value


def _tokenizer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", metavar="PATH",
                   help="the target's tokenizer with its chat template: a model folder (or a cached hub id); "
                        "needs the `template` extra (transformers + jinja2)")
    p.add_argument("--max-length", type=_positive_int, default=2048, metavar="N",
                   help="the trainer's length limit (SpecForge data.max_length) the tokens rows are checked against: "
                        "rows and trained tokens it keeps (default: SpecForge's 2048)")
    p.add_argument("--template-kwargs", metavar="JSON", default="{}",
                   help='chat_template_kwargs of the trainers\' renders, e.g. \'{"thinking": true}\', and of the '
                        'tokens rows of samples that recorded none (written before meta.chat_template_kwargs); '
                        'a sample that recorded its requests\' chat_template_kwargs is rendered with them '
                        '(default: {})')


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
    p.add_argument("--gpu-mem-gb", type=float, default=REFERENCE_GPU_MEM_GIB,
                   help=f"memory per GPU in GiB for that lever (default: %(default)s, {REFERENCE_GPU})")
    p.add_argument("--tp-size", type=int, default=8, help="tensor parallel size for that lever (default: %(default)s)")
