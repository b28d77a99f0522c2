"""The target's chat template and the trainers: `check-template`, export's reasoning warning and refusal,
the `tokens` format loaded by SpecForge's own loader, server token ids, Harmony roles and the dataset card.
Tokenizers (conftest.py): Kimi-K2.5-style, Qwen3-style and plain ChatML templates, offline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from datasets import load_dataset
from export_helpers import export, export_here, fail, jsonl, specforge_payloads, write_store

from gen_pipeline.cli import main
from gen_pipeline.export.render import load_renderer
from gen_pipeline.export.select import covering
from gen_pipeline.export.template_check import REASONING_ADVICE
from gen_pipeline.records import Sample

from pipeline_helpers import read_samples, run_cli

# ---------------------------------------------------------------- check-template

ROW = re.compile(r"^  (\S+): (earlier turns|last turn) +([\d,]+) +([\d,]+) +([\d,]+) +([\d.]+%|-) +([\d,]+) +"
                 r"([\d.]+%|-) +([\d.]+)x$")

# per template: mode → (reasoning under the mask in earlier turns, in last turns); kimi and chatml render none
NONE, ALL, LAST = ("0.0%", "0.0%"), ("100.0%", "100.0%"), ("0.0%", "100.0%")
NO_REASONING = {"specforge": NONE, "specforge-last": NONE, "specforge-expanded": NONE, "speculators": NONE,
                "tokens": ALL}
EXPECTED = {"kimi": NO_REASONING, "chatml": NO_REASONING,
            "qwen3": {"specforge": LAST, "specforge-last": LAST, "specforge-expanded": ALL, "speculators": ALL,
                      "tokens": ALL}}


@pytest.mark.parametrize("kind", ["kimi", "qwen3", "chatml"])
def test_check_template_reports_what_each_trainer_trains(outputs: Path, tokenizers: dict[str, Path],
                                                        kind: str) -> None:
    r = run_cli("check-template", "--dataset", "demo", "--output-dir", outputs, "--tokenizer", tokenizers[kind],
                "--samples", "40")  # the covering choice keeps every multi-turn sample: all 46 earlier turns
    assert (r.returncode, r.stderr) == (0, "")
    lines = r.stdout.splitlines()
    assert lines[0] == (f"template check: 40 samples (86 assistant turns) of demo, chat template of "
                        f"{tokenizers[kind]}")
    header = {"kimi": "'<|im_assistant|>assistant<|im_middle|>', end of turn '<|im_end|>'",
              "qwen3": "'<|im_start|>assistant\\n', end of turn '<|im_end|>\\n'",
              "chatml": "'<|im_start|>assistant\\n', end of turn '<|im_end|>\\n'"}[kind]
    assert lines[1] == f"  assistant header {header} (what a SpecForge ChatTemplate for this target must declare)"
    rows = {(m[1], m[2]): m.groups()[2:] for m in map(ROW.match, lines) if m}
    assert len(rows) == 10
    for mode, (earlier, last) in EXPECTED[kind].items():
        assert (rows[(mode, "earlier turns")][0], rows[(mode, "last turn")][0]) == ("46", "40")
        assert (rows[(mode, "earlier turns")][3], rows[(mode, "last turn")][3]) == (earlier, last), mode
        # the answer is trained in every mode but train_only_last_turn's history
        answer = "0.0%" if mode == "specforge-last" else "100.0%"
        assert (rows[(mode, "earlier turns")][5], rows[(mode, "last turn")][5]) == (answer, "100.0%"), mode
    # --expand-turns rows hold earlier turns again as history: trained more than once
    assert float(rows[("specforge-expanded", "earlier turns")][6]) > 1.5
    assert rows[("speculators", "earlier turns")][6] == rows[("tokens", "earlier turns")][6] == "1.0"


def test_without_the_template_extra_the_message_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from gen_pipeline.errors import ConfigError
    from gen_pipeline.export import render

    real = importlib.util.find_spec
    monkeypatch.setattr(render.importlib.util, "find_spec", lambda name: None if name == "jinja2" else real(name))
    with pytest.raises(ConfigError) as e:
        render.load_renderer("/models/x")
    assert str(e.value) == ("rendering chat templates needs transformers and jinja2, which are not installed: "
                            "make venv EXTRAS=gpu on the GPU node (the one install that every make target runs "
                            "with); into another Python: pip install -e '.[template]' from the checkout "
                            "(transformers + jinja2).")


def test_check_template_says_what_is_missing_and_reads_an_export(outputs: Path, tmp_path: Path,
                                                                 tokenizers: dict[str, Path]) -> None:
    r = run_cli("check-template", "--dataset", "demo", "--output-dir", outputs)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("error: no tokenizer: pass --tokenizer PATH (the target model's folder, or one with its "
                        "tokenizer files and chat template), or --server NAME to use that profile's model.\n")
    r = run_cli("check-template", "--dataset", "demo", "--output-dir", outputs, "--server", "sim")
    assert r.returncode == 2
    assert r.stderr.startswith("error: --server sim: its model moonshotai/Kimi-K2.5: the tokenizer does not load "
                               "offline (")
    assert r.stderr.endswith("It is neither a folder here nor a hub model in the local cache: pass --tokenizer with "
                             "the model's folder.\n")
    tokens = tmp_path / "t.jsonl"
    export(outputs, "--dataset", "demo", "--format", "tokens", "--out", tokens, "--tokenizer", tokenizers["chatml"])
    r = run_cli("check-template", "--export", tokens, "--tokenizer", tokenizers["chatml"])
    assert r.returncode == 2 and r.stderr == (f"error: --export {tokens}: its rows have no `conversations` (a tokens "
                                              "export carries no text); check the samples it came from with "
                                              "--dataset NAME.\n")
    # a conversation export is read (no --expand-turns rows: it has its rows as they are)
    out = tmp_path / "s.jsonl"
    export(outputs, "--dataset", "demo", "--format", "specforge", "--out", out)
    r = run_cli("check-template", "--export", out, "--tokenizer", tokenizers["qwen3"], "--samples", "40")
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.startswith("template check: 40 samples (")
    assert f"assistant turns) of {out}, chat template of {tokenizers['qwen3']}\n" in r.stdout
    rows = {(m[1], m[2]): m.groups()[2:] for m in map(ROW.match, r.stdout.splitlines()) if m}
    assert rows[("specforge", "last turn")][3] == "100.0%" and ("specforge-expanded", "last turn") not in rows


# ---------------------------------------------------------------- export's warning and refusal

def test_require_trained_reasoning_refuses_unless_every_turn_trains(outputs: Path, tmp_path: Path,
                                                                    tokenizers: dict[str, Path]) -> None:
    """(The specforge warning in the same words: test_reasoning_check.py.)"""
    kimi, refused = tokenizers["kimi"], tmp_path / "refused.jsonl"
    advice = ("Export --format tokens (every turn's reasoning under the mask, loaded by SpecForge's data.prompts_path "
              "and speculators), or --expand-turns if the template keeps the last turn's reasoning (Qwen3-style), or "
              "serve a chat template that renders reasoning; `gen-pipeline check-template` shows it per turn.")
    assert fail(outputs, "--dataset", "demo", "--format", "speculators", "--out", refused, "--tokenizer", kimi,
                "--require-trained-reasoning") == (
        2, "error: --require-trained-reasoning: only 0.0% of the reasoning tokens of 32 samples are under the loss "
        f"mask when speculators prepare-data (one row per assistant turn) renders them with the chat template of "
        f"{kimi}. {advice}\n")
    assert not refused.exists() and not list(tmp_path.glob(".refused*"))
    # Qwen3-style: --expand-turns trains every turn's reasoning; the tokens format does for every template
    qwen = tmp_path / "q.jsonl"
    stdout = export(outputs, "--dataset", "demo", "--format", "specforge", "--out", qwen,
                    "--tokenizer", tokenizers["qwen3"], "--expand-turns", "--require-trained-reasoning")
    assert stdout.splitlines()[-1] == (
        "  note: 100.0% of the reasoning tokens of 32 samples are under the loss mask when SpecForge on --expand-turns "
        f"rows renders them with the chat template of {tokenizers['qwen3']}")
    for kind in ("kimi", "chatml"):
        export(outputs, "--dataset", "demo", "--format", "tokens", "--force", "--out", tmp_path / "t.jsonl",
               "--tokenizer", tokenizers[kind], "--require-trained-reasoning")


# ---------------------------------------------------------------- the tokens format

@pytest.mark.parametrize("kind", ["kimi", "qwen3", "chatml"])
def test_tokens_rows_load_in_specforges_prompts_path_with_each_turn_whole_under_the_mask(
        outputs: Path, tmp_path: Path, tokenizers: dict[str, Path], kind: str) -> None:
    out = tmp_path / "tokens.jsonl"
    stdout = export(outputs, "--dataset", "demo", "--format", "tokens", "--out", out, "--val-share", "0.05",
                    "--tokenizer", tokenizers[kind])
    assert "  tokens: 240 samples → 286 rows, one per assistant turn" in stdout.splitlines()
    rows = jsonl(out) + jsonl(tmp_path / "tokens.val.ndjson")
    assert len(rows) == 286 and all(set(row) == {"id", "input_ids", "loss_mask", "ids_from"} for row in rows)
    # speculators (its torch is not installable here) loads a .jsonl with load_dataset("json"); columns input_ids
    # and loss_mask pass through unrendered, as long as each other, with a trained token (preprocessing.py:392-394,
    # :472-476, :497-498, :603-610, :752-753)
    ds = load_dataset("json", data_files=str(out), split="train")
    assert {"input_ids", "loss_mask"} <= set(ds.column_names) and ds.num_rows == len(jsonl(out))
    # data.prompts_path: SpecForge reads the file itself
    assert specforge_payloads(out) == [{"input_ids": t["input_ids"], "loss_mask": t["loss_mask"]} for t in jsonl(out)]
    renderer, samples = load_renderer(str(tokenizers[kind])), read_samples(outputs, "demo")
    turns = {f"{s['id']}#turn{k}": m for s in samples  # '<id>#turn<k>' → that assistant message
             for k, m in enumerate(m for m in s["conversations"] if m["role"] == "assistant")}
    finish = {s["id"]: [t["finish_reason"] for t in s["meta"]["per_turn"]] for s in samples}
    assert "length" in {f for fs in finish.values() for f in fs}
    for row in rows:
        mask = row["loss_mask"]
        first = mask.index(1)
        assert len(mask) == len(row["input_ids"])
        assert mask == [0] * first + [1] * (len(mask) - first)  # the history, then exactly this turn
        turn = turns[row["id"]]
        trained = renderer.decode(row["input_ids"][first:])
        reasoning, answer = turn["reasoning_content"].strip(), turn["content"].strip()
        assert reasoning in trained and answer in trained and trained.index(reasoning) < trained.index(answer)
        # a turn the model did not end (max_new_tokens) ends where it stopped (issue 33)
        sample_id, k = row["id"].split("#turn")
        cut = finish[sample_id][int(k)] != "stop"
        assert trained.endswith("<|im_end|>" if kind == "kimi" else "<|im_end|>\n") != cut
        assert reasoning not in renderer.decode(row["input_ids"][:first])  # never in its own prompt
    assert {row["ids_from"] for row in rows} == {"template"}


def test_server_token_ids_make_the_rows_and_stay_out_of_conversation_formats(tmp_path: Path,
                                                                            tokenizers: dict[str, Path]) -> None:
    """Samples whose assistant turns carry the server's prompt_token_ids / token_ids (tokens.py): with another
    tokenizer given too, the export says nothing of that tokenizer's reasoning check."""
    root = tmp_path / "out"
    convs = [{"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "A1", "reasoning_content": "R1",
              "prompt_token_ids": [1, 2, 3], "token_ids": [7, 8, 9, 2]},
             {"role": "user", "content": "More"},
             {"role": "assistant", "content": "A2", "reasoning_content": "R2",
              "prompt_token_ids": [1, 2, 3, 4, 5, 6], "token_ids": [10, 11, 2]}]
    meta = {"model": "m", "backend": "sim", "finish_reason": "stop", "prompt_tokens": 9, "completion_tokens": 7,
            "turns": 2, "sampling": {"temperature": 0.6}, "kv_cache_dtype": "fp8_e4m3", "generated_at": "x"}
    write_store(root, "S", [Sample(f"S-{i}", "S", convs, meta) for i in range(3)])
    printed = export(root, "--dataset", "S", "--format", "tokens", "--out", tmp_path / "t.jsonl",
                     "--tokenizer", tokenizers["chatml"]).splitlines()
    assert not [x for x in printed if x.startswith("  warning:") or "of the reasoning tokens" in x]
    assert ("  note: tokens: every turn's row is the server's token ids, its reasoning and answer whole under the "
            "loss mask") in printed
    rows = sorted(jsonl(tmp_path / "t.jsonl"), key=lambda r: r["id"])
    assert rows[:2] == [
        {"id": "S-0#turn0", "input_ids": [1, 2, 3, 7, 8, 9, 2], "loss_mask": [0, 0, 0, 1, 1, 1, 1],
         "ids_from": "server"},
        {"id": "S-0#turn1", "input_ids": [1, 2, 3, 4, 5, 6, 10, 11, 2], "loss_mask": [0] * 6 + [1] * 3,
         "ids_from": "server"}]
    for fmt in ("specforge", "speculators"):
        export(root, "--dataset", "S", "--format", fmt, "--out", tmp_path / f"{fmt}.jsonl")
        assert {tuple(m) for row in jsonl(tmp_path / f"{fmt}.jsonl") for m in row["conversations"]} == {
            ("role", "content"), ("role", "content", "reasoning_content")}


def test_tokens_without_server_ids_or_a_tokenizer_is_refused(outputs: Path, tmp_path: Path) -> None:
    code, err = fail(outputs, "--dataset", "demo", "--format", "tokens", "--out", tmp_path / "t.jsonl")
    assert code == 2 and re.fullmatch(r"error: sample demo-\d+ has no server token ids \(prompt_token_ids / token_ids "
                                      r"on its assistant turns\), so the tokens format renders it with the target's "
                                      r"chat template: pass --tokenizer PATH or --server NAME\.\n", err)


# ---------------------------------------------------------------- trainer fit

def test_a_trainer_given_the_export_folder_finds_no_validation_rows(outputs: Path, tmp_path: Path) -> None:
    """speculators' prepare-data given a folder loads every *.json and *.jsonl under it, recursively
    (speculators 0.9.0 data_generation/preprocessing.py:755-765): done here as it does it."""
    folder = tmp_path / "exports"
    folder.mkdir()
    export(outputs, "--dataset", "demo", "--format", "speculators", "--out", folder / "demo.jsonl",
           "--val-share", "0.05")
    files = sorted(str(p) for p in (*folder.rglob("*.json"), *folder.rglob("*.jsonl")))
    loaded = load_dataset("json", data_files=files, split="train")
    val = load_dataset("json", data_files=str(folder / "demo.val.ndjson"), split="train")
    assert files == [str(folder / "demo.jsonl")]
    assert loaded.num_rows + val.num_rows == 240 and 0 < val.num_rows < 30
    assert set(loaded["id"]).isdisjoint(val["id"])


HARMONY_ROLES = {"system", "user", "assistant_reasoning_effort", "assistant_analysis", "assistant_commentary",
                 "assistant_final"}  # SpecForge 0.2.0 HarmonyParser.build_single_turn_prompt, parse.py:365-384


def test_harmony_rows_use_the_roles_specforges_gpt_oss_parser_renders(outputs: Path, tmp_path: Path) -> None:
    """openai-harmony (the official parser) needs the o200k vocabulary from the network at first use,
    so SpecForge's Harmony parser's contract is checked: its roles, and no column but the ones its
    preprocessing pops (parse() takes no **kwargs, parse.py:387-394; id is popped, preprocessing.py:259-260)."""
    out = tmp_path / "h.jsonl"
    assert fail(outputs, "--dataset", "demo", "--format", "specforge", "--out", out, "--harmony") == (
        2, "error: --harmony needs --no-status: SpecForge's Harmony parser takes no extra column (its parse() has no "
        "**kwargs, specforge/data/parse.py:387-394).\n")
    export(outputs, "--dataset", "demo", "--format", "specforge", "--out", out, "--harmony", "--no-status")
    samples = {s["id"]: s for s in read_samples(outputs, "demo")}
    for row in jsonl(out):
        assert set(row) == {"id", "conversations"}
        assert {m["role"] for m in row["conversations"]} <= HARMONY_ROLES
        expected = []
        for m in samples[row["id"]]["conversations"]:
            if m["role"] == "assistant":
                expected += [("assistant_analysis", m["reasoning_content"]), ("assistant_final", m["content"])]
            else:
                expected.append((m["role"], m["content"]))
        assert [(m["role"], m["content"]) for m in row["conversations"]] == expected


# ---------------------------------------------------------------- the dataset card

def test_the_card_beside_the_data(outputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo.jsonl"
    export(outputs, "--dataset", "demo", "--format", "specforge", "--out", out, "--val-share", "0.05",
           "--server", "sim")
    card = (tmp_path / "README.md").read_text()
    front, body = card.split("\n---\n", 1)
    assert front.splitlines()[:3] == ["---", 'gen_pipeline_export: "demo.jsonl"', 'pretty_name: "demo"']
    assert "- `demo.jsonl`: train, " in body and "- `demo.val.ndjson`: validation, " in body
    assert "Server: `sim` profile (tp 8 × dp 1 = 8 GPUs)." in body
    assert ("| demo | moonshotai/Kimi-K2.5 | sim | fp8_e4m3 | `{\"max_new_tokens\": 512, \"temperature\": 0.7, "
            "\"top_p\": 0.95}` |") in body
    samples = read_samples(outputs, "demo")
    truncated = sum(s["meta"]["finish_reason"] == "length" for s in samples)
    assert (f"| demo | 240 | 0 | 240 | {100 * truncated / 240:.1f}% | 0.0% | 6 |") in body
    tokens = (sum(s["meta"]["prompt_tokens"] for s in samples), sum(s["meta"]["completion_tokens"] for s in samples))
    row = next(line for line in body.splitlines() if line.startswith(f"| demo | {tokens[0]:,} | {tokens[1]:,} | "))
    # measured (the run recorded the sim's tp 8 × dp 1): wall time from the first request, x its 8 GPUs
    wall_h, gpus, per_1k = re.fullmatch(r"\| demo \| [\d,]+ \| [\d,]+ \| ([\d.]+) h \| (\d+) \(tp 8 × dp 1 × 1 "
                                        r"server\) \| ([\d.]+) \|", row).groups()
    # wall time is printed to 3 decimals of an hour: the per-1K figure (from the unrounded time) is within
    # that rounding (x 8 GPUs / 240 samples x 1000) and its own 2-decimal rounding of it
    slack = 0.0005 * 8 / 240 * 1000 + 0.005
    assert gpus == "8" and float(per_1k) == pytest.approx(float(wall_h) * 8 / 240 * 1000, abs=slack)
    assert "--server sim" in body.split("## Export")[1]
    lines = body.splitlines()
    gpu = lines.index("GPU-hours (tp × dp × servers × wall time):")
    line = re.fullmatch(r"demo: ([\d.]+) GPU-h over \S+ for 240 samples = ([\d.]+) GPU-h per 1,000 samples "
                        r"\(tp 8 × dp 1 × 1 server\)", lines[gpu + 1])
    assert line and line[2] == per_1k and float(line[1]) == pytest.approx(float(per_1k) * 0.24, abs=0.006)
    assert lines[gpu + 2:gpu + 4] == ["job: every dataset is done", "```"]
    # another export in the same folder gets its own card; no --server: the GPUs the run recorded
    stdout = export(outputs, "--dataset", "demo", "--format", "speculators", "--out", tmp_path / "s.jsonl")
    assert f"  card: {tmp_path / 's.README.md'}" in stdout.splitlines()
    assert f"| 8 (tp 8 × dp 1 × 1 server) | {per_1k} |" in (tmp_path / "s.README.md").read_text()
    assert "Server: unknown (export with --server NAME to record it)." in (tmp_path / "s.README.md").read_text()


def test_check_template_compares_the_servers_ids_with_the_template(tmp_path: Path,
                                                                   tokenizers: dict[str, Path]) -> None:
    """What the later step needs to show the rendered path equal to the server's tokenization: turns
    whose ids the template reproduces, and the first difference where it does not."""
    renderer = load_renderer(str(tokenizers["chatml"]))
    eot = renderer.encode("<|im_end|>")
    samples = []
    for i in range(4):
        user = {"role": "user", "content": f"Question {i}"}
        turn = {"role": "assistant", "content": f" the answer {i}", "reasoning_content": f"think {i}"}
        prompt, output = renderer.turn_text([user], turn)
        out_ids = renderer.encode(output)
        out_ids = out_ids[:out_ids.index(eot[0]) + 1]  # the server stops at the stop token
        prompt_ids = renderer.encode(prompt) + ([5] if i == 3 else [])  # sample 3: not what the template renders
        samples.append(Sample(f"S-{i}", "S", [user, {**turn, "prompt_token_ids": prompt_ids, "token_ids": out_ids}],
                              {"model": "m", "finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 1}))
    write_store(tmp_path / "out", "S", samples)
    r = run_cli("check-template", "--dataset", "S", "--output-dir", tmp_path / "out", "--tokenizer",
                tokenizers["chatml"])
    assert (r.returncode, r.stderr) == (0, "")
    last = r.stdout.splitlines()[-2:]
    assert last[0] == ("  server token ids vs the template: 4 turns carry them; rendered prompt equal in 3, server "
                       "output a prefix of the rendered turn in 4")
    assert last[1].startswith("    first difference: S-3: prompt token ")


# ---------------------------------------------------------------- the reasoning check reads every kind of conversation

SINGLE, MULTI = 209, 3  # 3 multi-turn samples in 212, as in the issue


def _turn(i: int, k: int) -> dict:
    return {"role": "assistant", "content": f"the answer {i} to part {k} is here",
            "reasoning_content": f"first think about part {k} of question {i} then answer"}


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("out")
    samples = []
    for i in range(SINGLE + MULTI):
        convs = [{"role": "user", "content": f"question {i}"}, _turn(i, 0)]
        if i >= SINGLE:
            convs += [{"role": "user", "content": f"and then {i}?"}, _turn(i, 1)]
        samples.append(Sample(f"S-{i:03d}", "S", convs, {"model": "m", "finish_reason": "stop", "prompt_tokens": 5,
                                                         "completion_tokens": 9, "turns": len(convs) // 2,
                                                         "chat_template_kwargs": "{}"}))
    return write_store(root, "S", samples)


def test_require_trained_reasoning_refuses_whatever_the_seed(multi: Path, tmp_path: Path, built: dict[str, Path],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3-style: SpecForge trains the last turn's reasoning only; the 3 multi-turn samples' first turns
    are untrained, so the export must refuse for every seed (it passed for 3 seeds of 10): the check's
    samples cover every multi-turn one."""
    rows = [{"id": f"S-{i}", "conversations": [{"role": "assistant"}] * (2 if i >= SINGLE else 1), "meta": {}}
            for i in range(SINGLE + MULTI)]
    out = tmp_path / "s.jsonl"
    for seed in range(10):
        chosen = covering(rows, 32, seed)
        assert len(chosen) == 32 and sum(len(r["conversations"]) > 1 for r in chosen) == MULTI
        rc = export_here(multi, "--dataset", "S", "--format", "specforge", "--out", out, "--tokenizer", built["qwen3"],
                         "--require-trained-reasoning", "--seed", str(seed))
        err = capsys.readouterr().err
        assert rc == 2 and not out.exists(), seed
        assert err.startswith("error: --require-trained-reasoning: only ") and "% of the reasoning tokens of 32 " in err


def test_check_template_warns_in_exports_words(multi: Path, tmp_path: Path, built: dict[str, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    kimi = built["kimi"]
    assert export_here(multi, "--dataset", "S", "--format", "specforge", "--out", tmp_path / "s.jsonl",
                       "--tokenizer", kimi) == 0
    warning = capsys.readouterr().out.splitlines()[-1]
    assert warning == ("  warning: 0.0% of the reasoning tokens of 32 samples are under the loss mask when SpecForge "
                       f"(thinking parser), every assistant span of a row renders them with the chat template of "
                       f"{kimi}. {REASONING_ADVICE}")
    assert main(["check-template", "--output-dir", str(multi), "--dataset", "S", "--tokenizer", str(kimi),
                 "--samples", "32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert warning in lines
    assert [line.split(" when ")[1].split(" renders ")[0] for line in lines if line.startswith("  warning: ")] == [
        "SpecForge (thinking parser), every assistant span of a row", "SpecForge with data.train_only_last_turn: true",
        "SpecForge on --expand-turns rows", "speculators prepare-data (one row per assistant turn)"]


# ---------------------------------------------------------------- what SpecForge's loader keeps at data.max_length

# (prompt tokens, output tokens) per sample: fits both; cut at 2,048; nothing trained before 2,048; long
LENGTHS = [(100, 200), (1500, 1000), (2100, 50), (3000, 4000), (7000, 2000), (300, 20)]


@pytest.fixture(scope="module")
def longs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("out")
    samples = []
    for i, (p, o) in enumerate(LENGTHS):
        turn = {"role": "assistant", "content": "a", "reasoning_content": "r",
                "prompt_token_ids": [5 + i % 7] * p, "token_ids": [9] * o}
        samples.append(Sample(f"S-{i}", "S", [{"role": "user", "content": "q"}, turn],
                              {"model": "m", "finish_reason": "stop", "prompt_tokens": p, "completion_tokens": o,
                               "turns": 1, "chat_template_kwargs": "{}"}))
    return write_store(root, "S", samples)


@pytest.mark.parametrize("max_length", [2048, 8192])
def test_export_reports_what_specforges_loader_keeps(longs: Path, tmp_path: Path, max_length: int,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.jsonl"
    flags = [] if max_length == 2048 else ["--max-length", str(max_length)]
    assert export_here(longs, "--dataset", "S", "--format", "tokens", "--out", out, *flags) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "SpecForge data.max_length" in x)
    m = re.fullmatch(r"  (note|warning): SpecForge data\.max_length ([\d,]+): ([\d,]+) of 6 rows kept, ([\d,]+) of "
                     r"([\d,]+) trained tokens \(([\d.]+)%\)(.*)", line)
    assert m, line
    kind, limit, rows, kept, total, _, rest = m.groups()
    total_trained = sum(o for _, o in LENGTHS)
    assert (int(limit.replace(",", "")), int(total.replace(",", ""))) == (max_length, total_trained)
    loaded = specforge_payloads(out, max_length)
    assert (int(rows), int(kept.replace(",", ""))) == (len(loaded), sum(sum(t["loss_mask"]) for t in loaded))
    # 2,048: the second row cut to 548 trained tokens, three rows with none left; 8,192: the fifth row cut
    assert (kind, int(rows), kept, bool(rest)) == {2048: ("warning", 3, "768", True),
                                                   8192: ("warning", 6, "6,462", True)}[max_length]


def test_check_template_reports_it_too(longs: Path, tmp_path: Path, built: dict[str, Path],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-template", "--output-dir", str(longs), "--dataset", "S", "--tokenizer", str(built["chatml"]),
                 "--max-length", "8192"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ("  warning: --format tokens, SpecForge data.max_length 8,192: 6 of 6 rows kept, 6,462 of 7,270 trained "
            "tokens (88.9%); rows are cut at max_length and those left with no trained token are dropped: raise "
            "data.max_length to the longest row (see --max-length N) or leave the long rows out") in lines
    with pytest.raises(SystemExit) as e:  # argparse's usage error
        export_here(longs, "--dataset", "S", "--format", "tokens", "--out", tmp_path / "t.jsonl", "--max-length", "0")
    assert e.value.code == 2
    assert "argument --max-length: '0' must be a whole number of tokens, 1 or more (e.g. 8192)" in \
        capsys.readouterr().err
