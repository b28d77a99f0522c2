"""`gen-pipeline probe-kv`: two SGLang servers that differ only in KV dtype get the same prompt ids; each decodes
greedily and scores the reference's output teacher-forced (a divergence does not compound). Launched profiles run
one after the other: two copies of the model rarely fit one node."""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
import orjson

from gen_pipeline.config.dataset import DatasetConfig
from gen_pipeline.config.schema import check_flags, flag
from gen_pipeline.config.server import ServerProfile, load_server_profile, normalise_server_url
from gen_pipeline.display import count
from gen_pipeline.errors import ConfigError, ServerError, first_known
from gen_pipeline.http import Http, open_http
from gen_pipeline.probe import metrics as PM
from gen_pipeline.probe import sglang as PS
from gen_pipeline.records import Prompt
from gen_pipeline.server.attach import run_attached
from gen_pipeline.server.command import check_launchable
from gen_pipeline.server.handle import ServerHandle
from gen_pipeline.server.supervisor import run_server
from gen_pipeline.sources.loading import SourceStats, iter_prompts
from gen_pipeline.store.shards import write_atomic

T = TypeVar("T")
R = TypeVar("R")
_SAME_KV = {"bfloat16": "bf16", "auto": "auto"}
_IGNORED_DIFFS = {"name", "kv_cache_dtype", "port", "source", "startup_timeout_s", "health_interval_s",
                  "unhealthy_after", "max_restarts", "restart_backoff_s", "stop_grace_s"}


@dataclass(frozen=True)
class ProbeOptions:
    """What `probe-kv` was asked; ranges checked when constructed (ConfigError naming the flag)."""

    output_root: Path
    samples: Annotated[int, flag("--samples", ge=1)] = 200
    max_new_tokens: Annotated[int, flag("--max-new-tokens", ge=1)] = 256
    top_k: Annotated[int, flag("--top-k", ge=1)] = 5
    chunk: Annotated[int, flag("--tf-chunk", ge=0)] = 32  # reference tokens per teacher-forced request, 0 = all
    concurrency: Annotated[int, flag("--concurrency", ge=1)] = 32
    reference: ServerProfile | str | None = None  # a profile to launch or a URL to attach
    compare: ServerProfile | str | None = None
    allow_same_kv: bool = False

    def __post_init__(self) -> None:
        check_flags(self)


def probe_servers(config_dir: Path, *, server: str | None = None, server_url: str | None = None,
                  compare: str | None = None, compare_url: str | None = None,
                  allow_same_kv: bool = False) -> tuple[ServerProfile | str, ServerProfile | str]:
    """probe-kv's two servers from its flags (each keyword is the flag of that name): a profile of server.toml to launch
    (reference: baseline, compare: tuned by default) or a URL. Refused before any launch (ConfigError; ServerError:
    SGLang not installed): no compare server, one URL twice, a backend not SGLang, one KV dtype in both profiles."""
    if server_url and not (compare_url or compare):
        raise ConfigError("probe-kv needs a compare server: add --compare-url URL (a second server that differs "
                          "only in KV dtype, e.g. fp8_e4m3) or --compare PROFILE to launch one.")
    toml = config_dir / "server.toml"
    ref = normalise_server_url(server_url) if server_url else load_server_profile(server or "baseline", toml)
    cmp = (normalise_server_url(compare_url, "--compare-url") if compare_url
           else load_server_profile(compare or "tuned", toml))
    if isinstance(ref, str) and ref == cmp and not allow_same_kv:
        raise ConfigError(f"--server-url and --compare-url are the same server ({ref}); give two servers "
                          "that differ in KV dtype (or add --allow-same-kv for a noise-floor run against itself).")
    profiles = [(role, p) for role, p in (("reference", ref), ("compare", cmp)) if isinstance(p, ServerProfile)]
    for role, p in profiles:
        if p.backend not in ("sglang", "sim"):
            raise ConfigError(f"The {role} profile {p.where} is a {p.backend} server (backend = {p.backend!r}). "
                              f"{_NEEDS_SGLANG}")
        check_launchable(p)
    if (isinstance(ref, ServerProfile) and isinstance(cmp, ServerProfile) and not allow_same_kv
            and (a := _profile_kv(ref)) == _profile_kv(cmp)):
        raise ConfigError(f"Both servers use KV dtype {a} ({ref.where} and [profile.{cmp.name}]). {_SAME_KV_HELP}")
    return ref, cmp


def load_prompts(cfg: DatasetConfig, n: int) -> list[Prompt]:
    """The first `n` valid prompts of the source, in source order (deterministic)."""
    prompts = list(itertools.islice(iter_prompts(cfg, frozenset(), SourceStats(), []), n))
    if not prompts:
        raise ConfigError(f"Dataset {cfg.name}: its source has no valid prompt to probe with.")
    return prompts


def kv_dtype(handle: ServerHandle, fallback: str | None) -> str | None:
    value = handle.info.get("kv_cache_dtype") or fallback
    return _SAME_KV.get(value, value) if value else None


_NEEDS_SGLANG = ("probe-kv needs SGLang's native /generate with input_ids, return_logprob and logprob_start_len; "
                 "run it against two SGLang servers. (vLLM's /v1/completions with token-id prompts, logprobs and "
                 "prompt_logprobs could serve, but is not implemented.)")
_SAME_KV_HELP = ("probe-kv compares two KV dtypes (e.g. --server baseline --compare tuned, or bf16 and fp8_e4m3 "
                 "servers with --server-url/--compare-url). To measure the noise floor of two equal servers on "
                 "purpose, add --allow-same-kv.")


@contextlib.asynccontextmanager
async def open_server(where: ServerProfile | str | None, role: str, log_dir: Path,
                      http: Http) -> AsyncIterator[ServerHandle]:
    """Launch a profile (its log in log_dir; stopped on exit) or attach a URL; refuse a server that is not
    SGLang (probe-kv and tune)."""
    async with anyio.create_task_group() as tg:
        run = partial(run_server, where, log_dir=log_dir) if isinstance(where, ServerProfile) else partial(
            run_attached, [str(where)])
        h = await tg.start(partial(run, http=http))
        try:
            if h.info.get("backend") not in (None, "sglang"):
                raise ServerError(f"The {role} server {h.base_urls[0]} is not SGLang (it has no /server_info; "
                                  f"looks like {h.info.get('backend')}). {_NEEDS_SGLANG}")
            yield h
        finally:
            tg.cancel_scope.cancel()


@dataclass
class RefSide:
    """What the reference server gave for one prompt: the prompt ids, its greedy output, its own scores."""

    prompt: Prompt
    ids: list[int]
    free: list[PM.Position]
    forced: list[PM.Position]


async def reference_side(http: Http, ref: ServerHandle, prompt: Prompt, cfg: DatasetConfig,
                          opts: ProbeOptions) -> RefSide:
    kwargs = {"thinking": False, "enable_thinking": False} if cfg.generation.reasoning == "disable" else None
    # the conversation up to and including its first user turn (system message kept)
    end = next((i for i, m in enumerate(prompt.messages) if m["role"] == "user"), len(prompt.messages) - 1)
    turn = [{"role": m["role"], "content": m["content"]} for m in prompt.messages[:end + 1]]
    ids = await PS.prompt_ids(http, ref.base_urls[0], ref.model, turn, kwargs)
    free = await PS.free_run(http, ref.base_urls[0], ids, opts.max_new_tokens, opts.top_k)
    forced = await PS.score(http, ref.base_urls[0], ids, [p.token for p in free], opts.top_k, opts.chunk)
    return RefSide(prompt, ids, free, forced[0])


async def compare_side(http: Http, cmp: ServerHandle, side: RefSide, opts: ProbeOptions) -> PM.PromptResult:
    reference = [p.token for p in side.free]
    free = await PS.free_run(http, cmp.base_urls[0], side.ids, opts.max_new_tokens, opts.top_k)
    forced = await PS.score(http, cmp.base_urls[0], side.ids, reference, opts.top_k, opts.chunk)
    result = PM.compare_prompt(side.prompt.id, len(side.ids), reference, [p.token for p in free],
                               side.forced, forced[0])
    result.cache = forced[1:]
    return result


async def run_probe(cfg: DatasetConfig, opts: ProbeOptions, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the probe; write outputs/<DATASET>/probe-kv.json; return the report."""
    prompts = load_prompts(cfg, opts.samples)
    folder = opts.output_root / cfg.name
    folder.mkdir(parents=True, exist_ok=True)
    async with open_http(cfg.generation, 2 * opts.concurrency + 8) as http:
        try:
            results, failures, servers = await _measure(http, prompts, folder, cfg, opts, say)
        except BaseExceptionGroup as group:
            raise first_known(group) from None
    if not results:
        raise ServerError(f"probe-kv: every prompt failed; the first error: {failures[0]['error']}")
    report = build_report(cfg, opts, servers, results, failures)
    write_atomic(folder / "probe-kv.json", orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return report


async def _measure(http: Http, prompts: list[Prompt], folder: Path, cfg: DatasetConfig,
                   opts: ProbeOptions, say: Callable[[str], None]) -> tuple[Any, Any, dict[str, Any]]:
    """The reference side over every prompt, then the compare side. A launched compare server starts
    only once the reference is stopped; an attached one (already running) is checked first."""
    ref_p, cmp_p = opts.reference, opts.compare  # two profiles that differ in more than the KV dtype: warned
    if isinstance(ref_p, ServerProfile) and isinstance(cmp_p, ServerProfile) and (diff := [
            f.name for f in fields(ServerProfile)
            if f.name not in _IGNORED_DIFFS and getattr(ref_p, f.name) != getattr(cmp_p, f.name)]):
        say(f"warning: profiles {ref_p.name} and {cmp_p.name} also differ in {', '.join(diff)}; capacity and speed "
            "keys do not change the numbers, attention or model keys (extra_args, model_path) would.")
    say(f"probing {count(len(prompts))} prompts of {cfg.name}: greedy, max_new_tokens {opts.max_new_tokens}, "
        f"top-{opts.top_k} logprobs, teacher forcing in chunks of {opts.chunk or 'all'} tokens")
    attached = not isinstance(opts.compare, ServerProfile)
    async with open_server(opts.reference, "reference", folder / "probe-kv" / "reference", http) as ref:
        ref_kv = kv_dtype(ref, _profile_kv(opts.reference))
        servers = {"reference": _server_entry(ref, ref_kv)}
        async with contextlib.AsyncExitStack() as stack:
            early = await stack.enter_async_context(open_server(
                opts.compare, "compare", folder / "probe-kv" / "compare", http)) if attached else None
            cmp_kv = kv_dtype(early, None) if early else _profile_kv(opts.compare)
            if ref_kv is None or cmp_kv is None:  # checked once the reference answers, before any request
                unknown = ref.base_urls[0] if ref_kv is None else early.base_urls[0] if early else ""
                say(f"warning: cannot tell the KV dtype of {unknown} (no kv_cache_dtype in /server_info).")
            elif ref_kv == cmp_kv and not opts.allow_same_kv:
                raise ConfigError(f"Both servers use KV dtype {cmp_kv}; {_SAME_KV_HELP}")
            sides, failures = await each_prompt(prompts, [p.id for p in prompts], opts,
                                                lambda p: reference_side(http, ref, p, cfg, opts))
            if early is not None:
                return await _compare_all(http, early, sides, failures, servers, opts)
    async with open_server(opts.compare, "compare", folder / "probe-kv" / "compare", http) as cmp:
        return await _compare_all(http, cmp, sides, failures, servers, opts)


async def _compare_all(http: Http, cmp: ServerHandle, sides: list[RefSide], failures: list[dict[str, str]],
                       servers: dict[str, Any], opts: ProbeOptions) -> tuple[Any, Any, dict[str, Any]]:
    servers["compare"] = _server_entry(cmp, kv_dtype(cmp, _profile_kv(opts.compare)))
    results, more = await each_prompt(sides, [x.prompt.id for x in sides], opts,
                                      lambda side: compare_side(http, cmp, side, opts))
    return results, failures + more, servers


def _server_entry(h: ServerHandle, kv: str | None) -> dict[str, Any]:
    return {"url": h.base_urls[0], "model": h.model, "kv_cache_dtype": kv, "version": h.info.get("version")}


def _profile_kv(where: ServerProfile | str | None) -> str | None:
    return _SAME_KV.get(where.kv_cache_dtype, where.kv_cache_dtype) if isinstance(where, ServerProfile) else None


async def each_prompt(items: list[T], ids: list[str], opts: ProbeOptions,
                one: Callable[[T], Awaitable[R]]) -> tuple[list[R], list[dict[str, str]]]:
    """`one` over every item, opts.concurrency at a time: the results in item order, and a failure
    record per item whose request failed (the probe goes on without it)."""
    limiter = anyio.CapacityLimiter(opts.concurrency)
    done: dict[int, R] = {}
    failures: list[dict[str, str]] = []

    async def run(i: int, item: T) -> None:
        async with limiter:
            try:
                done[i] = await one(item)
            except PS.ProbeRequestError as e:
                failures.append({"id": ids[i], "error": str(e)})

    async with anyio.create_task_group() as tg:
        for i, item in enumerate(items):
            tg.start_soon(run, i, item)
    return [done[i] for i in sorted(done)], failures


def build_report(cfg: DatasetConfig, opts: ProbeOptions, servers: dict[str, Any],
                 results: list[PM.PromptResult], failures: list[dict[str, str]]) -> dict[str, Any]:
    agg = PM.aggregate(results)
    cached = sum(r.cache[0] for r in results)
    reusable = sum(r.cache[1] for r in results)
    agg["compare_prefix_cache_share"] = cached / reusable if reusable else None
    level, line = PM.verdict(agg, servers["compare"]["kv_cache_dtype"] or "compare")
    return {
        "dataset": cfg.name,
        "settings": {"samples": opts.samples, "max_new_tokens": opts.max_new_tokens, "top_logprobs_num": opts.top_k,
                     "teacher_forcing_chunk": opts.chunk, "temperature": 0.0},
        "servers": servers, "thresholds": dict(PM.THRESHOLDS), "kl_estimator": PM.KL_ESTIMATOR,
        "aggregate": agg, "verdict": level, "verdict_line": line,
        "failed_prompts": failures, "per_prompt": [r.to_dict() for r in results],
    }


def format_report(report: dict[str, Any], path: Path) -> str:
    a, s = report["aggregate"], report["servers"]
    d = a["first_divergence"]
    med = "-" if d["median"] is None else f"{d['median']:g}"
    lines = [
        f"probe-kv {report['dataset']}: reference {s['reference']['kv_cache_dtype']} ({s['reference']['url']}) "
        f"vs compare {s['compare']['kv_cache_dtype']} ({s['compare']['url']})",
        f"  prompts {a['prompts']} ({len(report['failed_prompts'])} failed), "
        f"teacher-forced positions {a['positions']:,}",
        f"  free run: exact match {100 * a['exact_match_share']:.1f} %, first divergent token median {med} "
        f"over {d['diverged_prompts']} diverged prompts (positions: "
        f"{', '.join(f'{k}: {v}' for k, v in d['histogram'].items() if v)})",
        f"  teacher forced: top-1 agreement {100 * a['top1_agreement_share']:.2f} %, |Δ logprob| mean "
        f"{a['abs_dlogprob_mean']:.4f} p99 {a['abs_dlogprob_p99']:.4f}, "
        f"KL mean {a['kl_mean']:.5f} p99 {a['kl_p99']:.5f}",
    ]
    share = a.get("compare_prefix_cache_share")
    if share is not None and share < 0.5:
        lines.append(f"  warning: the compare server reused only {100 * share:.0f} % of the prefix between scoring "
                     "chunks (radix cache off?): teacher-forced figures then understate the KV dtype's effect.")
    lines += [f"  {report['verdict_line']}", f"  written to {path}"]
    if report["failed_prompts"]:
        print(f"first failure: {report['failed_prompts'][0]['error']}", file=sys.stderr)
    return "\n".join(lines)
