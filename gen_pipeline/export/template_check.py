"""`check-template`: how much of each assistant turn's reasoning and answer a trainer puts under its loss mask,
rendering the samples as SpecForge 0.2.0 (a6b6b023) and speculators 0.9.0 do (tests/contract/test_trainers.py runs
both). SpecForge (data/preprocessing.py -> data/parse.py) masks every span from the template's assistant header to
its end of turn (`train_only_last_turn`: the last); its "thinking" parser, modelled here, keeps reasoning_content.
speculators masks each assistant turn j from render(conv[:j], add_generation_prompt=True)'s end to the end of
render(conv[:j+1]). No default system prompt is added (it shifts tokens, not the mask)."""

from __future__ import annotations

import bisect
import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.config.server import ServerProfile
from gen_pipeline.display import count, display_path
from gen_pipeline.errors import ConfigError
from gen_pipeline.export.formats import expand_turns
from gen_pipeline.export.render import Renderer, load_renderer, recorded_kwargs, tokenizer_source
from gen_pipeline.export.select import covering
from gen_pipeline.export.tokens import SPECFORGE_MAX_LENGTH, TokenRowBuilder, has_server_ids, length_fit, sent_message
from gen_pipeline.store.layout import iter_committed_samples

MODES = {
    "specforge": "SpecForge (thinking parser), every assistant span of a row",
    "specforge-last": "SpecForge with data.train_only_last_turn: true",
    "specforge-expanded": "SpecForge on --expand-turns rows",
    "speculators": "speculators prepare-data (one row per assistant turn)",
    "tokens": "--format tokens (SpecForge prompts_path, speculators pre-tokenized)",
}


REASONING_ADVICE = (
    "Export --format tokens (every turn's reasoning under the mask, loaded by SpecForge's data.prompts_path and "
    "speculators), or --expand-turns if the template keeps the last turn's reasoning (Qwen3-style), or serve a chat "
    "template that renders reasoning; `gen-pipeline check-template` shows it per turn.")


def reasoning_verdict(share: float, samples: int, mode: str, source: str) -> tuple[bool, str]:
    """(all trained, what to say) about the share of kept reasoning under the loss mask of `mode`: the words
    `export` (its note, warning or --require-trained-reasoning refusal) and `check-template` both print."""
    what = (f"{100 * share:.1f}% of the reasoning tokens of {samples:,} samples are under the loss mask when "
            f"{MODES[mode]} renders them with the chat template of {source}")
    if share >= 1.0:
        return True, what
    return False, f"{what}. {REASONING_ADVICE}" if share == 0.0 else what


@dataclass
class TurnFigures:
    """One source assistant turn: its text, token counts and the best share of it under any row's mask."""

    reasoning: str
    answer: str
    reasoning_tokens: int
    answer_tokens: int
    last: bool
    reasoning_masked: float = 0.0  # share, 0..1, max over the rows that hold the turn
    answer_masked: float = 0.0
    answer_trained: float = 0.0  # sum over rows: 2.0 = the answer is trained twice


@dataclass
class ModeResult:
    mode: str
    rows: int = 0
    turns: dict[tuple[str, int], TurnFigures] = field(default_factory=dict)
    skipped_rows: int = 0  # speculators: the prompt and full renders diverge inside history

    def group(self, last: bool | None) -> tuple[int, int, float, int, float, float]:
        """(turns, reasoning tokens, share masked, answer tokens, share masked, answer trained ×)."""
        ts = [t for t in self.turns.values() if last is None or t.last == last]
        rt, at = sum(t.reasoning_tokens for t in ts), sum(t.answer_tokens for t in ts)
        return (len(ts), rt, _share(sum(t.reasoning_masked * t.reasoning_tokens for t in ts), rt),
                at, _share(sum(t.answer_masked * t.answer_tokens for t in ts), at),
                _share(sum(t.answer_trained * t.answer_tokens for t in ts), at))

    @property
    def reasoning_share(self) -> float | None:
        """Share of all reasoning tokens under the mask; None when the samples keep no reasoning."""
        _, rt, share, *_ = self.group(None)
        return share if rt else None


_Row = tuple[Any, Any, list[TurnFigures]]  # (ids, loss mask; both None: a row skipped), the turns it holds


def _share(x: float, total: int) -> float:
    return x / total if total else 0.0


class TemplateCheck:
    """Renders samples as each trainer does and measures what their masks cover."""

    def __init__(self, renderer: Renderer):
        self.r = renderer
        self.header, self.end_of_turn = renderer.markers()
        self._pattern = re.compile(re.escape(self.header) + r"([\s\S]*?(?:" + re.escape(self.end_of_turn) + "|$))")
        self._tokens = TokenRowBuilder(renderer)  # one for all samples: it keeps what it tokenized

    def run_mode(self, samples: list[dict[str, Any]], mode: str) -> ModeResult:
        result = ModeResult(mode)
        for s in samples:
            turns = self._turns(s, result)
            for ids, mask, present in self._rows(s, mode, turns):
                result.rows += 1
                if ids is None:
                    result.skipped_rows += 1
                    continue
                self._measure(ids, mask, present)
        return result

    def _turns(self, sample: dict[str, Any], result: ModeResult) -> list[TurnFigures]:
        answers = [m for m in sample["conversations"] if m.get("role") == "assistant"]
        for k, m in enumerate(answers):
            r, a = (m.get("reasoning_content") or "").strip(), (m.get("content") or "").strip()
            result.turns[(sample["id"], k)] = TurnFigures(r, a, len(self.r.encode(r)) if r else 0,
                                                          len(self.r.encode(a)) if a else 0, k == len(answers) - 1)
        return [result.turns[(sample["id"], k)] for k in range(len(answers))]

    def _rows(self, sample: dict[str, Any], mode: str, turns: list[TurnFigures]) -> list[_Row]:
        convs = [sent_message(m) for m in sample["conversations"]]
        if mode in ("specforge", "specforge-last"):
            return [self._specforge(convs, turns, last_only=mode == "specforge-last")]
        if mode == "specforge-expanded":
            rows = expand_turns({"id": sample["id"], "conversations": convs})
            return [self._specforge(r["conversations"], turns[:r["turn_index"] + 1], last_only=False) for r in rows]
        if mode == "speculators":
            return self._speculators(convs, turns)
        built = self._tokens.rows([{**sample, "conversations": sample["conversations"]}])
        return [(r["input_ids"].tolist(), r["loss_mask"].tolist(), turns[:r["turn_index"] + 1]) for r in built]

    def _specforge(self, convs: list[dict[str, Any]], turns: list[TurnFigures], *, last_only: bool) -> _Row:
        text = self.r.render(convs, generation_prompt=False)
        ids = self.r.encode(text)
        mask = [0] * len(ids)
        matches = list(self._pattern.finditer(text))
        for m in matches[-1:] if last_only else matches:
            start, end = len(self.r.encode(text[:m.start(1)])), len(self.r.encode(text[:m.end(1)]))
            mask[min(start, len(ids)):min(end, len(ids))] = [1] * (min(end, len(ids)) - min(start, len(ids)))
        return ids, mask, turns

    def _speculators(self, convs: list[dict[str, Any]], turns: list[TurnFigures]) -> list[_Row]:
        out: list[_Row] = []
        k = 0
        for j, m in enumerate(convs):
            if m["role"] != "assistant":
                continue
            k += 1
            if j == 0:
                continue
            norm = [{**c, "thinking": c["reasoning_content"]} if c.get("reasoning_content") else c for c in convs]
            prompt = self.r.encode(self.r.render(norm[:j], generation_prompt=True))
            full = self.r.encode(self.r.render(norm[:j + 1], generation_prompt=False))
            boundary = len(prompt) if full[:len(prompt)] == prompt else len(os.path.commonprefix([prompt, full]))
            if boundary < len(prompt):
                hist = self.r.encode(self.r.render(norm[:j], generation_prompt=False))
                if full[:len(hist)] != hist or boundary < len(hist):
                    out.append((None, None, turns[:k]))
                    continue
            out.append((full, [0] * boundary + [1] * (len(full) - boundary), turns[:k]))
        return out

    def _measure(self, ids: list[int], mask: list[int], present: list[TurnFigures]) -> None:
        text = self.r.decode(ids)
        # character offset → token by binary search over decoded prefix lengths: any tokenizer that decodes
        # (fast tokenizers' offset mappings are not universal)
        prefix_chars = functools.cache(lambda i: len(self.r.decode(ids[:i])))

        def masked(start: int, end: int) -> float:
            """Share of the tokens covering characters [start, end) whose mask is 1."""
            i0, last = (bisect.bisect_right(range(len(ids)), c, key=lambda i: prefix_chars(i + 1))
                        for c in (start, end - 1))  # the tokens holding the first and the last character
            return sum(mask[i0:last + 1]) / (last + 1 - i0) if last + 1 > i0 else 0.0

        cursor = 0
        for t in present:
            a = text.find(t.answer, cursor) if t.answer else -1
            if t.reasoning:
                r = text.find(t.reasoning, cursor, a if a >= 0 else len(text))
                if r >= 0:
                    t.reasoning_masked = max(t.reasoning_masked, masked(r, r + len(t.reasoning)))
            if a >= 0:
                share = masked(a, a + len(t.answer))
                t.answer_masked = max(t.answer_masked, share)
                t.answer_trained += share
                cursor = a + len(t.answer)


@dataclass
class IdsAgreement:
    """Turns carrying the server's token ids, against the same turns rendered with the template."""

    turns: int = 0
    prompt_equal: int = 0  # the rendered prompt's ids are the server's prompt_token_ids
    output_prefix: int = 0  # the server's token_ids start the rendered turn (which adds the template's tail)
    first_mismatch: str = ""

    def format(self) -> str:
        line = (f"  server token ids vs the template: {self.turns:,} turns carry them; rendered prompt equal in "
                f"{self.prompt_equal:,}, server output a prefix of the rendered turn in {self.output_prefix:,}")
        return line + (f"\n    first difference: {self.first_mismatch}" if self.first_mismatch else "")


def compare_server_ids(samples: list[dict[str, Any]], renderer: Renderer) -> IdsAgreement:
    """How exactly the template reproduces what the server tokenized (the rendered tokens path)."""
    out = IdsAgreement()
    for s in samples:
        history: list[dict[str, Any]] = []
        r = renderer.for_kwargs(recorded_kwargs(s))  # with the chat_template_kwargs the server rendered it with
        for m in s["conversations"]:
            if m.get("role") == "assistant" and has_server_ids(m):
                prompt, output = r.turn_text(history, sent_message(m))
                p, o = r.encode(prompt), r.encode(output)
                server_p, server_o = [int(i) for i in m["prompt_token_ids"]], [int(i) for i in m["token_ids"]]
                out.turns += 1
                out.prompt_equal += p == server_p
                out.output_prefix += o[:len(server_o)] == server_o
                if not out.first_mismatch and (p != server_p or o[:len(server_o)] != server_o):
                    which, ours, theirs = ("prompt", p, server_p) if p != server_p else ("output", o, server_o)
                    at = len(os.path.commonprefix([ours, theirs]))
                    mine, server = renderer.decode(ours[at:at + 8]), renderer.decode(theirs[at:at + 8])
                    out.first_mismatch = f"{s['id']}: {which} token {at}: template {mine!r} vs server {server!r}"
            history.append(sent_message(m))
    return out


def check_template(*, output_root: Path, datasets: list[str], export: Path | None, samples: int, seed: int,
                   tokenizer: str | None, profile: ServerProfile | None, template_kwargs: dict[str, Any],
                   max_length: int = SPECFORGE_MAX_LENGTH) -> str:
    """The report of `gen-pipeline check-template`; raises ConfigError (no samples, no tokenizer)."""
    if samples < 1:
        raise ConfigError(f"--samples {samples} must be 1 or more.")
    rows, what = _samples(output_root, datasets, export)
    chosen = covering(rows, samples, seed)
    source, flag, trust = tokenizer_source(tokenizer, profile)
    renderer = load_renderer(source, kwargs=template_kwargs, flag=flag, trust_remote_code=trust)
    check = TemplateCheck(renderer)
    results = [check.run_mode(chosen, m) for m in MODES if export is None or m != "specforge-expanded"]
    turns = sum(1 for r in chosen for m in r["conversations"] if m.get("role") == "assistant")
    report = format_report(results, check, f"{len(chosen):,} samples ({turns:,} assistant turns) of {what}")
    warnings = [f"  warning: {reasoning_verdict(r.reasoning_share, len(chosen), r.mode, renderer.source)[1]}"
                for r in results if r.reasoning_share is not None and r.reasoning_share < 1.0]
    fits, fit = length_fit(TokenRowBuilder(renderer).rows(chosen), max_length)
    warnings.append(f"  {'note' if fits else 'warning'}: --format tokens, {fit}")
    agreement = compare_server_ids(chosen, renderer)
    return "\n".join([report, *warnings] + ([agreement.format()] if agreement.turns else []))


def _samples(output_root: Path, datasets: list[str], export: Path | None) -> tuple[list[dict[str, Any]], str]:
    if export is not None:
        if datasets:
            raise ConfigError("check-template takes --dataset or --export, not both.")
        try:
            rows = [orjson.loads(line) for line in export.read_bytes().splitlines() if line.strip()]
        except (OSError, orjson.JSONDecodeError) as e:
            raise ConfigError(f"--export {export}: cannot read it as JSON lines ({e}).") from None
        if rows and "conversations" not in rows[0]:
            raise ConfigError(f"--export {export}: its rows have no `conversations` (a tokens export carries no "
                              "text); check the samples it came from with --dataset NAME.")
        return rows, display_path(export)
    if not datasets:
        raise ConfigError("check-template needs --dataset NAME (repeatable) or --export FILE.")
    rows = []
    for name in datasets:
        folder = output_root / name
        if not folder.is_dir():
            raise ConfigError(f"No dataset {name!r}: {display_path(folder)} does not exist. Generate it first "
                              f"(make generate DATASET={name}) or pass --output-dir.")
        rows += list(iter_committed_samples(folder))
    if not rows:
        raise ConfigError(f"{', '.join(datasets)}: no committed samples yet. Generate some first.")
    return rows, ", ".join(datasets)


def format_report(results: list[ModeResult], check: TemplateCheck, what: str) -> str:
    lines = [f"template check: {what}, chat template of {check.r.source}",
             f"  assistant header {check.header!r}, end of turn {check.end_of_turn!r} (what a SpecForge ChatTemplate "
             "for this target must declare)",
             f"  {'how it trains':<52} {'turns':>6} {'rows':>5} {'reasoning tok':>13} {'masked':>7} "
             f"{'answer tok':>10} {'masked':>7} {'trained':>7}"]
    for res in results:
        for label, last in (("earlier turns", False), ("last turn", True)):
            n, rt, rs, at, as_, ax = res.group(last)
            if not n:
                continue
            name = f"{res.mode}: {label}"
            lines.append(f"  {name:<52} {n:>6,} {res.rows:>5,} {rt:>13,} {_pct(rs, rt):>7} {at:>10,} "
                         f"{_pct(as_, at):>7} {ax:>6.1f}x")
        if res.skipped_rows:
            lines.append(f"  {res.mode}: {count(res.skipped_rows)} rows dropped (renders diverge inside history)")
    lines += [f"  {m:<18} {d}" for m, d in MODES.items() if any(r.mode == m for r in results)]
    lines.append("  masked: share of the turn's tokens under the loss mask in the best row that holds it; "
                 "trained: answer tokens trained per answer token over all rows")
    return "\n".join(lines)


def _pct(share: float, total: int) -> str:
    return f"{100 * share:.1f}%" if total else "-"
