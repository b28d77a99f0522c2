"""`check`, and `generate` refusing before it launches: a new user's stumbles, each through the CLI."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from gen_pipeline.server.plan import GIB

from pipeline_helpers import REPO, assert_exact, cli_cmd, make_rows, run_cli, write_dataset
from user_docs import user_docs

LOADING = "T: loading the source T.jsonl\n"  # what generate says before the source check refuses


def gen(toml: Path, out: Path, *extra: str | Path) -> subprocess.CompletedProcess[str]:
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", out, "--progress", "quiet", *extra)
    assert "Traceback" not in r.stderr
    return r


def config_dir_with(tmp_path: Path, profile: str) -> Path:
    """datasets_cfg's server.toml plus one more profile (TOML text)."""
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "server.toml").write_text((REPO / "datasets_cfg" / "server.toml").read_text() + "\n" + profile)
    return cfg


HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
# Why no tokenizer measures the prompts: the sim profile's model (moonshotai/Kimi-K2.5) is not on this
# machine; without the `template` extra transformers is not there at all.
NO_TOKENIZER = ("the tokenizer of moonshotai/Kimi-K2.5 does not load offline (OSError), so no tokenizer"
                if HAS_TRANSFORMERS else "transformers is not installed, so no tokenizer")


# ---------------------------------------------------------------- check's report

def test_check_reads_a_small_local_source_whole(tmp_path: Path) -> None:
    rows = make_rows(20, invalid=2)
    rows[5] = {"id": "bad-type", "messages": "hello"}
    toml = write_dataset(tmp_path, target=15, rows=rows)
    cfg = config_dir_with(tmp_path, '[profile.ctx]\ninherits = "sim"\ncontext_length = 120\n')
    r = run_cli("check", "--dataset", toml, "--server", "ctx", "--config-dir", cfg, "--output-dir", tmp_path / "out")
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == f"""check T ({toml}): local files T.jsonl
  all 22 rows read (a local source of up to 50,000 rows is read whole)
  columns: id, messages
  valid: 19; rejected: 3 (empty_content 2, bad_type 1)
    empty_content, e.g. row 3: turn 0 has empty content
    bad_type, e.g. row 5: 'messages' must be a non-empty list of turns, got str
  parsed prompts (3 shown, cut at 160 characters):
    T-r0: [system] be helpful | [user] Question number 0: tell me about topic 0. | [user] Follow-up 0?
    T-r1: [user] Question number 1: tell me about topic 1.
    T-r2: [user] Question number 2: tell me about topic 2.
  prompt length in characters ({NO_TOKENIZER}), over 19 prompts: min 41, \
median 43, p90 63, p99 66, max 66
  tokens below are estimates at 4 characters per token
  context length 120 tokens ({cfg}/server.toml [profile.ctx] context_length): longest prompt ~17 tokens + \
max_new_tokens 96 = ~113: fits
  target: 0/15 done, 15 to go; the source can give 19 more
  OK
""".replace("\\\n", "")
    assert "make check DATASET=" in user_docs() and "gen-pipeline check --dataset" in user_docs()
    r = run_cli("check", "--help")
    assert r.returncode == 0 and "usage: gen-pipeline check" in r.stdout


@pytest.mark.parametrize("profile, max_new_tokens, line", [
    # ~tokens = ceil(characters / 4); 12 + 100 exceeds 111: the 10 prompts of 45+ characters (half: still OK)
    ("context_length = 111", 100, "  context length 111 tokens ({cfg}/server.toml [profile.p] context_length): "
     "longest prompt ~17 tokens + max_new_tokens 100 = ~117: 10 of 20 prompts do not fit; SGLang refuses those "
     "requests (HTTP 400, recorded as final failures). Lower max_new_tokens or raise context_length.\n"),
    ('model_path = "{model}"', 96, "  context length 4,096 tokens ({model}/config.json max_position_embeddings): "
     "longest prompt ~17 tokens + max_new_tokens 96 = ~113: fits\n"),
], ids=["prompts_that_do_not_fit", "from_a_local_models_config_json"])
def test_the_context_length_check(tmp_path: Path, profile: str, max_new_tokens: int, line: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"text_config": {"max_position_embeddings": 4096}}')
    toml = write_dataset(tmp_path, target=15, rows=make_rows(20), max_new_tokens=max_new_tokens)
    cfg = config_dir_with(tmp_path, f'[profile.p]\ninherits = "sim"\n{profile.format(model=model)}\n')
    r = run_cli("check", "--dataset", toml, "--server", "p", "--config-dir", cfg, "--output-dir", tmp_path / "out")
    assert (r.returncode, r.stderr) == (0, "")
    assert line.format(cfg=cfg, model=model) in r.stdout and r.stdout.endswith("  OK\n")


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed (not a dependency)")
def test_prompt_lengths_in_tokens_with_a_local_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # words and punctuation: "topic 0." is 3 tokens
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path / "model")
    toml = write_dataset(tmp_path, target=15, rows=make_rows(20))
    cfg = config_dir_with(tmp_path, f'[profile.tok]\ninherits = "sim"\nmodel_path = "{tmp_path / "model"}"\n'
                                    "context_length = 109\n")
    r = run_cli("check", "--dataset", toml, "--server", "tok", "--config-dir", cfg, "--output-dir", tmp_path / "out")
    assert (r.returncode, r.stderr) == (0, "")
    assert (f"  prompt length in tokens (the {tmp_path / 'model'} tokenizer, system + user turns, chat template not "
            "counted), over 20 prompts: min 10, median 12, p90 17, p99 17, max 17\n"
            f"  context length 109 tokens ({cfg}/server.toml [profile.tok] context_length): longest prompt 17 tokens "
            "+ max_new_tokens 96 = 113: 5 of 20 prompts do not fit; SGLang refuses those requests (HTTP 400, "
            "recorded as final failures). Lower max_new_tokens or raise context_length.\n") in r.stdout


# ---------------------------------------------------------------- refused before launch

@pytest.mark.parametrize("rows, field, message", [
    (None, "msgs", "source.field = 'msgs': the source has no such column. Its columns: id, messages. Set "
     "source.field to the column holding the conversations or prompts."),
    ([{"id": f"r{i}", "messages": [{"from": "human", "value": "hi"}]} for i in range(12)], "messages",
     "12 of 12 rows are rejected (missing_field 12); the first, row 0: turn 0 needs 'role' and 'content'; it has "
     "'from', 'value'; set source.schema = \"sharegpt\" for from/value turns. Check source.schema = 'messages' and "
     "source.field = 'messages' (gen-pipeline check --dataset T shows the parsed rows)."),
], ids=["a_wrong_column_names_the_columns", "most_rows_rejected_says_the_first_reason"])
def test_refused_before_launch(tmp_path: Path, rows: list[dict] | None, field: str, message: str) -> None:
    toml = write_dataset(tmp_path, target=10, rows=rows)
    toml.write_text(toml.read_text().replace('field = "messages"', f'field = "{field}"'))
    message = f"error: {toml}: {message}\n"
    r = run_cli("check", "--dataset", toml, "--output-dir", tmp_path / "out")
    assert (r.returncode, r.stderr) == (2, message)
    r = gen(toml, tmp_path / "out")
    assert (r.returncode, r.stdout, r.stderr) == (2, LOADING, message)
    assert not (tmp_path / "out" / "T").exists()  # no server.log: nothing was launched


def test_too_few_valid_rows_is_refused_then_proceeds_and_ends_short_with_exit_5(tmp_path: Path) -> None:
    toml, out = write_dataset(tmp_path, target=30, rows=make_rows(20, invalid=2)), tmp_path / "out"
    message = (f"{toml}: the source can give 20 more samples (20 valid rows, 0 done), but 30 are needed to reach "
               "target_samples = 30. Add rows to the source or lower target_samples to 20; or pass --proceed-anyway "
               "to generate what there is.")
    r = run_cli("check", "--dataset", toml, "--output-dir", out)
    assert (r.returncode, r.stderr) == (5, f"error: {message}\n")
    assert r.stdout.endswith(f"  1 problem(s); generate refuses to launch (--proceed-anyway overrides):\n"
                             f"    - {message}\n")
    r = gen(toml, out)
    assert (r.returncode, r.stdout, r.stderr) == (5, LOADING, f"error: {message}\n")
    r = gen(toml, out, "--proceed-anyway")
    assert r.stderr == f"warning: {message} (--proceed-anyway: generating anyway)\n"
    assert r.returncode == 5
    last = r.stdout.splitlines()[-1]
    assert last.startswith("T: 20/30 samples (66.7%), +20 this run in ")
    assert last.endswith(", 2 invalid rows skipped; the source has no more prompts: 10 samples short of the target; "
                         "add rows to the source or lower target_samples.")
    assert len(assert_exact(out, 20)) == 20
    r = gen(toml, tmp_path / "limited", "--limit", "5")  # a --limit within the source is not refused
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].endswith("stopped at --limit; run again to continue.")


def test_a_large_source_is_sampled_and_its_shortfall_estimated(tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": "" if i % 4 == 3 else f"q {i}"}]}
            for i in range(50_012)]  # over the 50,000 rows read whole; a quarter rejected
    toml = write_dataset(tmp_path, target=40_000, rows=rows)
    r = run_cli("check", "--dataset", toml, "--output-dir", tmp_path / "out")
    message = (f"{toml}: the source can give 37,509 more samples (about: an estimate from 1,500 valid of the first "
               "2,000 rows, scaled to 50,012 rows; 0 done), but 40,000 are needed to reach target_samples = "
               "40,000. Add rows to the source or lower target_samples to 37,509; or pass --proceed-anyway to "
               "generate what there is.")
    assert (r.returncode, r.stderr) == (5, f"error: {message}\n")
    assert r.stdout.splitlines()[1] == ("  the first 2,000 of 50,012 rows read (a sample: hub sources and local ones "
                                        "over 50,000 rows)")
    assert "  target: 0/40,000 done, 40,000 to go; the source can give 37,509 (estimated from the sample) more\n" \
        in r.stdout


# ---------------------------------------------------------------- sources

def test_specforge_role_content_turns_under_sharegpt(tmp_path: Path) -> None:
    # SpecForge's own style: `conversations` of role/content turns (half of them), from/value the rest
    rows = [{"id": f"s{i}", "conversations": [{"role": "user", "content": f"Question {i}?"},
                                              {"role": "assistant", "content": "old"}] if i % 2 else
             [{"from": "human", "value": f"Question {i}?"}, {"from": "gpt", "value": "old"}]} for i in range(12)]
    toml = write_dataset(tmp_path, target=12, rows=rows)
    toml.write_text(toml.read_text().replace('schema = "messages"', 'schema = "sharegpt"')
                    .replace('field = "messages"', 'field = "conversations"'))
    r = gen(toml, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].endswith("; target reached.")
    samples = assert_exact(tmp_path / "out", 12)
    assert {s["conversations"][0]["content"] for s in samples} == {f"Question {i}?" for i in range(12)}
    assert not (tmp_path / "out" / "T" / "rejects.jsonl").exists()


def test_bad_json_lines_are_rejects_and_strict_refuses(tmp_path: Path) -> None:
    toml, out = write_dataset(tmp_path, target=10, rows=make_rows(12)), tmp_path / "out"
    lines = (tmp_path / "T.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "T.jsonl").write_bytes(b"".join([lines[0], b'{"id": "cut", "messages": [\n', *lines[1:], b"[1, 2]\n"]))
    r = run_cli("check", "--dataset", toml, "--output-dir", out)
    assert r.returncode == 0, r.stderr
    assert "  valid: 12; rejected: 2 (bad_json 2)\n" in r.stdout
    assert "    bad_json, e.g. row 12: T.jsonl line 2 is not valid JSON (unexpected end of data, column 28)\n" \
        in r.stdout
    r = gen(toml, out)
    assert r.returncode == 0, r.stderr
    rejects = [orjson.loads(x) for x in (out / "T" / "rejects.jsonl").read_bytes().splitlines()]
    assert [(x["row"], x["file"], x["line"], x["reason"], x["detail"]) for x in rejects] == [
        (12, "T.jsonl", 2, "bad_json", "T.jsonl line 2 is not valid JSON (unexpected end of data, column 28)"),
        (13, "T.jsonl", 14, "bad_json", "T.jsonl line 14 is a JSON list, not an object")]
    assert len(assert_exact(out, 10)) == 10
    toml.write_text(toml.read_text().replace('id_field = "id"', 'id_field = "id"\nstrict = true'))
    r = gen(toml, tmp_path / "out2")
    assert (r.returncode, r.stdout) == (2, LOADING)
    assert r.stderr == (f"error: {toml}: T.jsonl line 2 is not valid JSON (unexpected end of data, column 28); "
                        "source.strict = true refuses the file. Fix or delete that line, or remove strict to skip "
                        "such lines into rejects.jsonl.\n")


HUB_TOML = """target_samples = 10
[source]
hf_id = "open-r1/OpenR1-Math-220k"
schema = "prompt"
field = "problem"
"""


@pytest.mark.parametrize("env, reason", [
    ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE=1 is set"),
    ({"HF_ENDPOINT": "http://hub.invalid"}, "hub.invalid does not resolve: "),
])
@pytest.mark.e2e  # the process is the subject: make e2e
def test_hub_unreachable_is_said_at_once_with_what_to_do(tmp_path: Path, env: dict[str, str], reason: str) -> None:
    toml = tmp_path / "H.toml"
    toml.write_text(HUB_TOML)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and "proxy" not in k.lower()}
    clean["HF_HOME"] = str(tmp_path / "hf")  # an empty cache: nothing to fall back on
    for command in ("check", "generate"):
        r = subprocess.run(cli_cmd(command, "--dataset", toml, "--server", "sim", "--output-dir", tmp_path / "out"),
                           capture_output=True, text=True, cwd=REPO, env={**clean, **env}, timeout=60)
        loading = "H: loading the source open-r1/OpenR1-Math-220k (split train)\n" if command == "generate" else ""
        assert (r.returncode, r.stdout) == (2, loading)
        head, _, tail = r.stderr.partition(reason)
        assert head == f"error: {toml}: the Hugging Face hub is not reachable ("
        assert tail.endswith(
            ") and open-r1/OpenR1-Math-220k (split train) is not in the local cache. Download the dataset's files "
            "where the hub is reachable (hf download --repo-type dataset open-r1/OpenR1-Math-220k --local-dir DIR), "
            f"copy them here, and in {toml} set source.files to the local .jsonl/.json/.parquet files (and remove "
            "hf_id).\n")
        assert "\n" not in tail[:-1]  # one line: no retry noise


# ---------------------------------------------------------------- launcher, make, plan

@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed here")
def test_the_tuned_profile_without_sglang_says_what_to_install(tmp_path: Path) -> None:
    toml = write_dataset(tmp_path, target=10)
    r = run_cli("generate", "--dataset", toml, "--output-dir", tmp_path / "out")
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == (
        f"error: datasets_cfg/server.toml [profile.tuned] launches SGLang ({sys.executable} -m "
        f"sglang.launch_server), but sglang is not installed in this Python. Install it into this Python: "
        f"{sys.executable} -m pip install -e '.[gpu]' (from the checkout), or make venv EXTRAS=gpu and "
        "run through make. Without a GPU, try the pipeline on the simulator: --server sim (make demo).\n")
    assert not (tmp_path / "out" / "T").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_status_json_is_pipeable(tmp_path: Path) -> None:
    # as from a user's shell: not a sub-make of `make test` (which prints "Entering directory")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    r = subprocess.run(["make", "status", f"ARGS=--json --output-dir {tmp_path} --dataset demo"],
                       capture_output=True, text=True, cwd=REPO, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert orjson.loads(r.stdout)["datasets"]["demo"]["done"] == 0


def test_plan_says_where_its_inputs_came_from_and_its_weight_examples_add_up() -> None:
    r = run_cli("plan", "--weights-gb", "553", "--gpu-mem-gb", "141", "--overhead-gb", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == [
        "inputs from datasets_cfg/server.toml [profile.tuned], flags override: tp_size 8 (profile), "
        "mem_fraction_static 0.9 (profile), kv_cache_dtype fp8_e4m3 (profile), hicache_gb 48 (profile)",
        "weights: 553 GiB (--weights-gb)"]
    assert ("  3. hierarchical cache (48 GB host RAM per rank: 733,430 tokens (bf16), 1,466,860 tokens (fp8_e4m3))"
            in r.stdout)
    assert "fp8_e4m3             35,136    1,765,580           392     +43,089  <- the profile's kv_cache_dtype" \
        in r.stdout
    r = run_cli("plan", "--weights-gb", "553", "--server", "baseline", "--hicache-gb", "8", "--tp-size", "16")
    assert r.stdout.splitlines()[0] == (
        "inputs from datasets_cfg/server.toml [profile.baseline], flags override: tp_size 16 (flag), "
        "mem_fraction_static 0.85 (profile), kv_cache_dtype bf16 (profile), hicache_gb 8 (flag)")
    # the weight examples agree with the arithmetic
    assert round(594e9 / GIB) == 553 and round(70e9 * 2 / GIB, 1) == 130.4  # the message: tests/cli/test_cli.py
    r = run_cli("plan", "--params-b", "70", "--weight-dtype", "bf16", "--tp-size", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1] == "weights: 70B parameters × 2 bytes (bf16) = 130.4 GiB"
    r = run_cli("plan", "--params-b", "70")
    assert (r.returncode, r.stderr) == (2, (
        "error: --params-b 70 needs --weight-dtype (bf16, fp16, fp8, int8, int4): the bytes per parameter. For a "
        "mixed-precision checkpoint (Kimi-K2.5 INT4) pass --weights-gb.\n"))
    assert "553, Kimi-K2.5 INT4 = 594 GB on disk" in " ".join(run_cli("plan", "--help").stdout.split())
    assert 'make plan ARGS="--gpu-mem-gb 140.4"' in user_docs()
