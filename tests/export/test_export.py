"""`gen-pipeline export` end to end on a real demo run (the `outputs` fixture, conftest.py): every format
loaded back with the real `datasets` library."""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import orjson
import pytest
from datasets import load_dataset, load_from_disk
from export_helpers import export, fail, jsonl

from gen_pipeline.export.formats import hf_features
from gen_pipeline.export.select import Mix, ValSplit, mix_counts, validation_ids

from pipeline_helpers import REPO, kill_group, read_samples, run_cli, start_cli, three_samples, wait_for, write_dataset
from user_docs import user_docs

# The keys of a row SpecForge's regeneration script writes on success, from its source
# (github.com/sgl-project/SpecForge at a6b6b0230009d15ec2a97a57384e6f53f0f96946):
# - scripts/prepare_data.py:131-142 `_conversation_row` writes the input rows: {"id", "conversations"};
# - scripts/regenerate_train_data.py:333-334 (end of `call_sglang`) keeps the row and sets
#   data["conversations"] = regenerated_messages; data["status"] = "success";
#   main() writes that dict as one JSON line (line 497).
# - scripts/validate_regenerated_data.py:69-73 and expand_reasoning_conversations.py:115-119 then
#   require a non-empty string id and status == "success"; validate's line 114: the last turn is
#   the assistant's.
SPECFORGE_SUCCESS_ROW = {"id": "opc-0", "status": "success",
                         "conversations": [{"role": "user", "content": "Hi"},
                                           {"role": "assistant", "content": "Hello", "reasoning_content": "greet"}]}


UNCHECKED_REASONING = ("  note: the samples keep reasoning; whether the trainer's chat template trains it was not "
                       "checked (pass --tokenizer PATH or --server NAME)")


def by_id(rows: list[dict]) -> dict[str, dict]:
    return {r["id"]: r for r in rows}


def check_specforge_row(row: dict) -> None:
    """The rules SpecForge's validate_regenerated_data.py applies to a row (as read, see above)."""
    assert isinstance(row["id"], str) and row["id"].strip()
    assert row["status"] == "success"
    roles = [m["role"] for m in row["conversations"] if m["role"] != "system"]
    assert roles[0] == "user" and roles[-1] == "assistant" and all(a != b for a, b in itertools.pairwise(roles))
    assert all(isinstance(m["content"], str) and m["content"].strip() for m in row["conversations"])


def test_specforge_rows_have_exactly_the_keys_of_a_regenerated_success_row(outputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo.jsonl"
    summary = export(outputs, "--dataset", "demo", "--format", "specforge", "--out", out)
    assert summary.splitlines()[1:] == ["  demo: 240 committed samples, 0 dropped, 240 exported",
                                        "  split: train 240",
                                        f"  card: {tmp_path / 'README.md'}",
                                        UNCHECKED_REASONING]
    assert summary.startswith(f"exported 240 rows (specforge) to {out} in ")
    rows = jsonl(out)
    check_specforge_row(SPECFORGE_SUCCESS_ROW)  # the fixture itself passes SpecForge's rules
    assert all(set(r) == set(SPECFORGE_SUCCESS_ROW) for r in rows)
    for r in rows:
        check_specforge_row(r)
    shards = by_id(read_samples(outputs, "demo"))
    assert len(rows) == len(shards) == 240 and set(by_id(rows)) == set(shards)
    assert all(r["conversations"] == shards[r["id"]]["conversations"] for r in rows)
    ds = load_dataset("json", data_files=str(out), split="train")
    assert ds.num_rows == 240 and sorted(ds.column_names) == sorted(SPECFORGE_SUCCESS_ROW)
    assert set(ds[0]["conversations"][-1]) == {"role", "content", "reasoning_content"}
    # --keep-meta, --no-status
    export(outputs, "--dataset", "demo", "--format", "specforge", "--out", tmp_path / "m.jsonl", "--keep-meta")
    rows = jsonl(tmp_path / "m.jsonl")
    assert all(list(r) == ["id", "conversations", "status", "meta"] for r in rows)
    assert all(r["meta"] == {**shards[r["id"]]["meta"], "dataset": "demo"} for r in rows)
    export(outputs, "--dataset", "demo", "--format", "specforge", "--out", tmp_path / "n.jsonl", "--no-status")
    assert {tuple(r) for r in jsonl(tmp_path / "n.jsonl")} == {("id", "conversations")}


def test_expanded_turns_reproduce_every_assistant_turn_once(outputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    summary = export(outputs, "--dataset", "demo", "--format", "specforge", "--out", out, "--expand-turns")
    shards = read_samples(outputs, "demo")
    turns = {(s["id"], k): m for s in shards
             for k, m in enumerate(m for m in s["conversations"] if m["role"] == "assistant")}
    assert len(turns) > len(shards)  # the demo has multi-turn samples
    rows = jsonl(out)
    assert f"  --expand-turns: 240 samples → {len(turns)} rows, one per assistant turn" in summary.splitlines()
    seen = Counter()
    for r in rows:
        check_specforge_row(r)
        assert set(r) == {"id", "conversations", "status"}
        source, _, k = r["id"].rpartition("#turn")
        seen[(source, int(k))] += 1
        assert r["conversations"][-1] == turns[(source, int(k))]  # the turn whole, reasoning included
        history = r["conversations"][:-1]
        assert all("reasoning_content" not in m for m in history if m["role"] == "assistant")
        original = next(s for s in shards if s["id"] == source)["conversations"]
        stripped = [{k2: v for k2, v in m.items() if k2 != "reasoning_content"} for m in original[:len(history)]]
        assert history == stripped
    assert seen == Counter(dict.fromkeys(turns, 1))
    assert load_dataset("json", data_files=str(out), split="train").num_rows == len(turns)
    export(outputs, "--dataset", "demo", "--format", "specforge", "--out", tmp_path / "m.jsonl", "--expand-turns",
           "--keep-meta")
    metas = {r["id"]: r["meta"] for r in jsonl(tmp_path / "m.jsonl")}
    assert all((m["source_id"], m["assistant_turn_index"], m["dataset"]) == (i.rpartition("#turn")[0],
               int(i.rpartition("#turn")[2]), "demo") for i, m in metas.items())


def test_split_is_stable_under_re_export_and_disjoint(outputs: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    summary = export(outputs, "--dataset", "demo", "--format", "specforge", "--out", a, "--val-share", "0.1")
    export(outputs, "--dataset", "demo", "--format", "specforge", "--out", b, "--val-share", "0.1", "--seed", "7")
    train, val = {r["id"] for r in jsonl(a)}, {r["id"] for r in jsonl(tmp_path / "a.val.ndjson")}
    assert train.isdisjoint(val) and len(train | val) == 240 and 10 <= len(val) <= 40
    val_path = tmp_path / "a.val.ndjson"
    assert summary.splitlines()[-3:] == [f"  split: train {len(train)} → {a}, validation {len(val)} → {val_path}",
                                         f"  card: {tmp_path / 'README.md'}", UNCHECKED_REASONING]
    # another seed reorders the rows but keeps every sample on its side of the split
    assert {r["id"] for r in jsonl(tmp_path / "b.val.ndjson")} == val
    assert [r["id"] for r in jsonl(b)] != [r["id"] for r in jsonl(a)]
    before = a.read_bytes(), (tmp_path / "a.val.ndjson").read_bytes()
    export(outputs, "--dataset", "demo", "--format", "specforge", "--out", a, "--val-share", "0.1", "--force")
    assert (a.read_bytes(), (tmp_path / "a.val.ndjson").read_bytes()) == before  # idempotent to the byte
    summary = export(outputs, "--dataset", "demo", "--format", "specforge", "--out", a, "--force")
    assert summary.splitlines()[-2] == (f"  note: removed {tmp_path / 'a.val.ndjson'} (an earlier export's "
                                        "validation rows, now in train)")
    assert len(jsonl(a)) == 240 and not (tmp_path / "a.val.ndjson").exists()
    # a count; expanded turns follow their sample's side
    c = tmp_path / "c.jsonl"
    export(outputs, "--dataset", "demo", "--format", "specforge", "--out", c, "--val-share", "25", "--expand-turns")
    sources = [{r["id"].rpartition("#turn")[0] for r in jsonl(p)} for p in (c, tmp_path / "c.val.ndjson")]
    assert len(sources[1]) == 25 and sources[0].isdisjoint(sources[1]) and len(sources[0] | sources[1]) == 240
    assert not list(tmp_path.glob(".*export-tmp*"))


def test_hf_disk_and_parquet_load_back_with_the_fixed_schema(outputs: Path, tmp_path: Path) -> None:
    export(outputs, "--dataset", "demo", "--dataset", "T", "--format", "hf", "--out", tmp_path / "hf",
           "--val-share", "0.05")
    export(outputs, "--dataset", "demo,T", "--format", "hf", "--hf-layout", "parquet", "--out", tmp_path / "pq",
           "--val-share", "0.05")
    disk = load_from_disk(str(tmp_path / "hf"))
    parquet = load_dataset("parquet", data_dir=str(tmp_path / "pq"))
    assert set(disk) == set(parquet) == {"train", "validation"}
    shards = by_id(read_samples(outputs, "demo") + read_samples(outputs, "T"))
    for split in ("train", "validation"):
        assert disk[split].features == parquet[split].features == hf_features()
        assert disk[split].to_list() == parquet[split].to_list()
    rows = disk["train"].to_list() + disk["validation"].to_list()
    assert len(rows) == 300 and {r["id"] for r in rows} == set(shards)
    assert {r["id"] for r in disk["train"]}.isdisjoint(r["id"] for r in disk["validation"])
    for r in rows:
        s = shards[r["id"]]
        assert r["dataset"] == s["dataset"] and r["source_id"] == r["id"]
        assert [{k: v for k, v in m.items() if v is not None} for m in r["conversations"]] == s["conversations"]
        assert r["meta"]["completion_tokens"] == s["meta"]["completion_tokens"]
        assert orjson.loads(r["meta"]["sampling"]) == s["meta"]["sampling"]


def test_speculators_layout(outputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    export(outputs, "--dataset", "demo", "--format", "speculators", "--out", out, "--drop-truncated")
    rows = jsonl(out)
    truncated = sum(s["meta"]["finish_reason"] == "length" for s in read_samples(outputs, "demo"))
    assert 0 < truncated < 10 and len(rows) == 240 - truncated and all(list(r) == ["id", "conversations"] for r in rows)
    ds = load_dataset("json", data_files=str(out), split="train")
    assert ds.column_names == ["id", "conversations"]
    assert all(m["reasoning_content"] for c in ds["conversations"] for m in c if m["role"] == "assistant")


def test_filters_and_mix(outputs: Path, tmp_path: Path) -> None:
    shards = read_samples(outputs, "demo")
    short = sum(1 for s in shards if s["meta"]["completion_tokens"] < 40 and s["meta"]["finish_reason"] != "length")
    assert short > 0
    summary = export(outputs, "--dataset", "demo", "--format", "specforge", "--out", tmp_path / "f.jsonl",
                     "--drop-truncated", "--min-completion-tokens", "40")
    truncated = sum(s["meta"]["finish_reason"] == "length" for s in shards)
    kept = 240 - truncated - short
    assert summary.splitlines()[1] == (f"  demo: 240 committed samples, {truncated + short} dropped ({short} under 40 "
                                       f"completion tokens, {truncated} truncated (finish_reason length)), {kept} "
                                       "exported")
    assert len(jsonl(tmp_path / "f.jsonl")) == kept
    # shares: as many rows as the datasets can fill in those proportions (T's 60 = 0.25 of 240)
    summary = export(outputs, "--mix", "demo=0.75,T=0.25", "--format", "specforge", "--out", tmp_path / "m.jsonl")
    ids = [r["id"] for r in jsonl(tmp_path / "m.jsonl")]
    assert Counter(i.split("-")[0] for i in ids) == {"demo": 180, "T": 60}
    assert "  demo: 240 committed samples, 0 dropped, 180 exported (of 240 eligible, --mix)" in summary.splitlines()
    export(outputs, "--mix", "demo=0.75,T=0.25", "--format", "specforge", "--out", tmp_path / "m2.jsonl")
    assert (tmp_path / "m2.jsonl").read_bytes() == (tmp_path / "m.jsonl").read_bytes()  # same seed, same file
    export(outputs, "--mix", "demo=100,T=20", "--seed", "3", "--format", "specforge", "--out", tmp_path / "c.jsonl")
    counted = [r["id"] for r in jsonl(tmp_path / "c.jsonl")]
    assert Counter(i.split("-")[0] for i in counted) == {"demo": 100, "T": 20}
    assert counted[:20] != ids[:20]  # another seed, another order and choice
    # the datasets are interleaved, not one block after the other
    assert {i.split("-")[0] for i in ids[:40]} == {"demo", "T"}


@pytest.mark.e2e  # the process is the subject: make e2e
def test_export_during_a_run_reads_only_committed_lines(outputs: Path, tmp_path: Path) -> None:
    root = tmp_path / "live"
    shutil.copytree(outputs / "demo", root / "demo")
    last = sorted((root / "demo").glob("shard-*.jsonl"))[-1]
    with open(last, "ab") as f:  # a writer caught mid-line
        f.write(b'{"id": "demo-torn", "dataset": "demo", "conversa')
    before = last.read_bytes()
    export(root, "--dataset", "demo", "--format", "specforge", "--out", tmp_path / "t.jsonl")
    assert last.read_bytes() == before  # export reads; it repairs nothing
    assert {r["id"] for r in jsonl(tmp_path / "t.jsonl")} == {s["id"] for s in read_samples(outputs, "demo")}
    # a real run writing while exports go
    toml = write_dataset(tmp_path / "cfg", target=400, max_new_tokens=400,
                         rows=[{"id": f"r{i}", "messages": [{"role": "user", "content": f"q {i}"}]}
                               for i in range(450)])
    proc = start_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", root, log=tmp_path / "cli.log")
    exported: list[list[dict]] = []
    try:
        wait_for(lambda: sum(p.read_bytes().count(b"\n") for p in (root / "T").glob("shard-*.jsonl")) >= 10,
                 timeout_s=60)
        for k in range(3):
            export(root, "--dataset", "T", "--format", "specforge", "--out", tmp_path / f"live{k}.jsonl", "--keep-meta")
            exported.append(jsonl(tmp_path / f"live{k}.jsonl"))
    finally:
        kill_group(proc)
    final = by_id(read_samples(root, "T"))
    for rows in exported:
        assert rows and len({r["id"] for r in rows}) == len(rows)
        assert all(r["conversations"] == final[r["id"]]["conversations"] for r in rows)
    assert len(exported[0]) <= len(exported[-1]) <= len(final)


@pytest.mark.parametrize("args, message", [
    (("--dataset", "dmeo"), "No dataset 'dmeo': {outputs}/dmeo does not exist. Datasets with samples in {outputs}: "
     "T, demo. Did you mean demo? Generate it first (make generate DATASET=dmeo) or pass --output-dir."),
    (("--mix", "demo=0.7,T=0.2"), "--mix 'demo=0.7,T=0.2': the shares sum to 0.9, not 1. Make them add up to 1 "
     "(e.g. B1=0.6,B2=0.4), or give sample counts instead (B1=1000,B2=500)."),
    (("--mix", "demo=0.5,T=30"), "--mix 'demo=0.5,T=30' mixes shares and counts: give every dataset a share (0.3, "
     "summing to 1) or every dataset a sample count (1000)."),
    (("--mix", "demo=100,T=61"), "--mix: T asks for 61 but has 60 eligible samples (after filters). Lower those "
     "counts or generate more."),
    (("--dataset", "T", "--min-completion-tokens", "100000"), "T: every one of its 60 samples was dropped (60 under "
     "100000 completion tokens). Relax --drop-truncated / --min-completion-tokens."),
    (("--dataset", "T", "--val-share", "1.5"), "--val-share '1.5' must be a fraction below 1 (0.02 = 2% of the "
     "samples) or a whole number of samples (500)."),
    (("--dataset", "T", "--out", "{tmp}/x.json"), "--out {tmp}/x.json: the specforge format writes one JSONL file; "
     "give a path ending in .jsonl (e.g. --out exports/B2.jsonl)."),
    (("--dataset", "T", "--format", "hf", "--out", "{tmp}/h", "--no-status"), "--no-status applies to --format "
     "specforge only (the hf format has no status)."),
    (("--dataset", "T", "--out", "{tmp}/file/T.jsonl"), "--out {tmp}/file/T.jsonl: {tmp}/file is a file, not a "
     "folder. Choose another --out."),
    (("--dataset", "T", "--format", "tokens", "--expand-turns"), "--expand-turns does not apply to --format tokens: "
     "it already writes one row per assistant turn. Drop --expand-turns."),
    (("--dataset", "T", "--format", "speculators", "--expand-turns"), "--expand-turns does not apply to --format "
     "speculators: its prepare_data.py already makes one training row per assistant turn. Drop --expand-turns."),
    (("--dataset", "T", "--format", "speculators", "--harmony"), "--harmony applies to --format specforge only "
     "(SpecForge's gpt-oss parser), not to speculators."),
    (("--dataset", "T", "--mix", "demo=0.5,T=0.5"), "--dataset T and --mix demo, T name different datasets; --mix "
     "alone is enough."),
])
def test_bad_flags_get_one_clear_message_and_exit_2(outputs: Path, tmp_path: Path, args: tuple[str, ...],
                                                    message: str) -> None:
    args = tuple(a.format(tmp=tmp_path) for a in args)
    (tmp_path / "file").write_text("not a folder")
    out = () if "--out" in args else ("--out", tmp_path / "x.jsonl")
    expected = f"error: {message.format(outputs=outputs, tmp=tmp_path)}\n"
    assert fail(outputs, "--format", "specforge", *out, *args) == (2, expected)
    assert not (tmp_path / "x.jsonl").exists() and not list(tmp_path.glob(".*export-tmp*"))


def test_bad_input_gets_one_clear_message_and_a_nonzero_exit(outputs: Path, tmp_path: Path) -> None:
    sf = ("--format", "specforge")
    empty = tmp_path / "empty"
    (empty / "E").mkdir(parents=True)
    (empty / "E" / "shard-00000.jsonl").write_bytes(b'{"id": "E-1", "conv')  # only a torn line
    code, err = fail(empty, "--dataset", "E", *sf, "--out", tmp_path / "x.jsonl")
    assert (code, err) == (2, f"error: E has no committed samples yet (no whole line in the shards of {empty / 'E'}). "
                              "Generate some first (make generate DATASET=E).\n")
    existing = tmp_path / "old.jsonl"
    existing.write_bytes(b"keep me\n")
    code, err = fail(outputs, "--dataset", "T", *sf, "--out", existing)
    assert (code, err) == (4, f"error: {existing} already exists. Pass --force to replace it (the new export is "
                              "written beside it and swapped in), or choose another --out.\n")
    assert existing.read_bytes() == b"keep me\n"
    code, err = fail(outputs, "--dataset", "T", "--format", "hf", "--out", existing)
    assert code == 4 and existing.read_bytes() == b"keep me\n"
    broken = tmp_path / "broken"
    shutil.copytree(outputs / "T", broken / "T")
    shard = sorted((broken / "T").glob("shard-*.jsonl"))[0]
    lines = shard.read_bytes().splitlines(keepends=True)
    shard.write_bytes(lines[0] + b"garbage\n" + b"".join(lines[1:]))
    code, err = fail(broken, "--dataset", "T", *sf, "--out", tmp_path / "x.jsonl")
    assert (code, err) == (4, f"error: {shard} line 2 is not a sample, and it is not the last line, so this is not a "
                              "torn write: the file is damaged. Run `gen-pipeline validate` on the dataset, fix or "
                              "delete that line, then export again.\n")
    assert not (tmp_path / "x.jsonl").exists() and not list(tmp_path.glob(".*export-tmp*"))


def test_force_replaces_a_folder_atomically(outputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    stale = tmp_path / f".hf.export-tmp-{2**22 + 1}"  # above Linux's largest pid_max: a process that is gone
    stale.mkdir()  # what a killed export leaves
    export(outputs, "--dataset", "T", "--format", "hf", "--out", out)
    assert not stale.exists()
    export(outputs, "--dataset", "demo", "--format", "hf", "--out", out, "--force")
    assert load_from_disk(str(out))["train"].num_rows == 240
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


@pytest.mark.parametrize("command, flag, texts", [
    ("export", "--expand-turns", ("gen-pipeline export --dataset B2 --format specforge", "--format hf",
                                  "make export DATASET=")),
    ("check-template", "--tokenizer", ("gen-pipeline check-template --dataset B2", "--format tokens",
                                       "data.prompts_path", ".val.ndjson", "--harmony --no-status"))])
def test_the_command_has_help_and_is_in_the_readme(command: str, flag: str, texts: tuple[str, ...]) -> None:
    r = run_cli(command, "--help")
    assert r.returncode == 0 and f"usage: gen-pipeline {command}" in r.stdout and flag in r.stdout
    assert [text for text in texts if text not in user_docs()] == []


def test_a_sample_keeps_its_side_of_the_split_when_the_dataset_grows_and_mix_counts() -> None:
    small = [f"B2-{i:05d}" for i in range(2_000)]
    grown = small + [f"B2-{i:05d}" for i in range(2_000, 10_000)]
    val_small, val_grown = validation_ids(small, ValSplit(share=0.02)), validation_ids(grown, ValSplit(share=0.02))
    assert val_grown & set(small) == val_small
    assert 0.015 < len(val_grown) / len(grown) < 0.025
    assert len(validation_ids(grown, ValSplit(count=123))) == 123
    # --mix shares fill the largest output in proportion
    shares = Mix("share", {"B1": 0.3, "B2": 0.2, "B6": 0.25, "B7": 0.25})
    counts = mix_counts(shares, {"B1": 30_000, "B2": 18_000, "B6": 20_000, "B7": 20_000})
    assert counts == {"B1": 24_000, "B2": 16_000, "B6": 20_000, "B7": 20_000}  # B6 and B7 are the limit
    assert mix_counts(Mix("count", {"B1": 10, "B2": 5}), {"B1": 10, "B2": 99}) == {"B1": 10, "B2": 5}


# ---------------------------------------------------------------- exports/ in a fresh clone: made, git-ignored

@pytest.mark.parametrize("fmt, out", [("specforge", "exports/sub/T.jsonl"), ("hf", "exports/chat")])
def test_export_makes_its_missing_folders(tmp_path: Path, fmt: str, out: str) -> None:
    dest = tmp_path / out
    r = run_cli("export", "--dataset", "T", "--format", fmt, "--out", dest, "--output-dir",
                three_samples(tmp_path / "outputs"), "--val-share", "1")
    assert (r.returncode, r.stderr) == (0, "")
    if fmt == "specforge":
        assert len(dest.read_bytes().splitlines()) == 2
        assert len(dest.with_name("T.val.ndjson").read_bytes().splitlines()) == 1
    else:
        assert (dest / "train").is_dir() and (dest / "validation").is_dir()


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout")
def test_git_ignores_the_readmes_export_folders() -> None:
    readme = user_docs()
    outs = sorted(set(re.findall(r"(?:--out |OUT=)((?:exports|outputs)/[^\s`\"']+)", readme)))
    assert any(o.startswith("exports/") for o in outs)
    r = subprocess.run(["git", "check-ignore", "--no-index", *outs], capture_output=True, text=True, cwd=REPO)
    assert sorted(r.stdout.split()) == outs, orjson.dumps(outs).decode()
