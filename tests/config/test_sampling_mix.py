"""A sampling mix ([[sampling.mix]]): validated, each sample's variant drawn from (mix_seed, its source row) so a
resume draws the same, sent, recorded, fingerprinted, and its shares shown."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import httpx
import orjson
import pytest
from servers import sim_in_thread

from gen_pipeline.config.dataset import load_dataset_config
from gen_pipeline.config.mix import SamplingMix
from gen_pipeline.errors import ConfigDriftError, ConfigError
from gen_pipeline.reports.page import _status_html
from gen_pipeline.reports.status import DatasetStatus, StatusReport, read_status
from gen_pipeline.store.fingerprint import check_rows
from tests.config.test_config import load

from pipeline_helpers import (
    MIX_META_KEYS,
    SIM_FAST,
    _shard_lines,
    assert_exact,
    kill_group,
    make_rows,
    read_samples,
    run_cli,
    start_cli,
    wait_for,
    write_dataset,
)

# every optional key (sent and recorded by every variant, test_sampling.py's too) but reasoning_effort
KEYS = ('top_k = 20\nmin_p = 0.05\nrepetition_penalty = 1.05\npresence_penalty = 0.5\nfrequency_penalty = -0.25\n'
        'stop = ["</answer>", "STOP"]\nseed = 1234\nchat_template_kwargs = { thinking = true }\n'
        "extra_body = { min_tokens = 2, skip_special_tokens = false }\n")
SAMPLING = "[sampling]\nmax_new_tokens = 16\ntemperature = 0.7\ntop_p = 0.95\n" + KEYS
# three variants: greedy, the base as it is, hot without thinking
MIX = """[[sampling.mix]]
share = 0.5
temperature = 0.0
[[sampling.mix]]
share = 0.3
[[sampling.mix]]
share = 0.2
temperature = 1.0
chat_template_kwargs = { thinking = false }
"""
SHARES = (0.5, 0.3, 0.2)


def mix_of(tmp_path: Path, seed: int = 0) -> SamplingMix:
    cfg = load(tmp_path, SAMPLING + (f"mix_seed = {seed}\n" if seed else "") + MIX)
    assert cfg.mix is not None
    return cfg.mix


# ---------------------------------------------------------------- the config


def test_a_mix_loads_with_each_variant_the_base_plus_its_overrides(tmp_path: Path) -> None:
    mix = mix_of(tmp_path)
    assert [v.share for v in mix.variants] == [0.5, 0.3, 0.2]
    assert [(v.sampling.temperature, v.sampling.top_p, v.sampling.chat_template_kwargs) for v in mix.variants] == [
        (0.0, 0.95, {"thinking": True}), (0.7, 0.95, {"thinking": True}), (1.0, 0.95, {"thinking": False})]
    assert [mix.describe(i) for i in range(3)] == [
        "temperature 0.0", "the base [sampling]", "temperature 1.0, chat_template_kwargs.thinking false"]
    assert load(tmp_path, SAMPLING).mix is None
    decimals = SAMPLING + "".join(f"[[sampling.mix]]\nshare = {s}\ntemperature = {t}\n"
                                  for s, t in ((0.7, 0.1), (0.2, 0.2), (0.1, 0.3)))
    assert 0.7 + 0.2 + 0.1 != 1.0  # 0.9999999999999999: shares sum to 1 within rounding
    assert [v.share for v in load(tmp_path, decimals).mix.variants] == [0.7, 0.2, 0.1]


@pytest.mark.parametrize("text, message", [
    (SAMPLING + MIX.replace("share = 0.2", "share = 0.3"),
     "sampling.mix: the shares sum to 1.1 (0.5 + 0.3 + 0.3); they must sum to 1."),
    (SAMPLING + MIX.replace("share = 0.3\n", ""),
     "sampling.mix[1] has no share: give each [[sampling.mix]] its share of the samples (share = 0.25)."),
    (SAMPLING + MIX.replace("share = 0.5", 'share = "0.5"'),
     "sampling.mix[0].share = '0.5' must be a number (got a string). Remove the quotes."),
    (SAMPLING + MIX.replace("share = 0.5", "share = 0"),
     "sampling.mix[0].share = 0 must be above 0 and at most 1 (its fraction of the samples)."),
    (SAMPLING + "[[sampling.mix]]\nshare = 1.0\n",
     "sampling.mix has 1 variant: a mix needs at least two [[sampling.mix]] tables (for one, set its keys in "
     "[sampling] and remove the mix)."),
    (SAMPLING + MIX.replace("temperature = 1.0", "temprature = 1.0"),
     "sampling.mix[2].temprature: unknown key. Known keys here: chat_template_kwargs, frequency_penalty, "
     "max_new_tokens, min_p, presence_penalty, reasoning_effort, repetition_penalty, seed, share, stop, "
     "temperature, top_k, top_p. Did you mean temperature? Check the spelling or remove it."),
    (SAMPLING + MIX.replace("temperature = 0.0", "temperature = -1.0"),
     "sampling.mix[0].temperature = -1.0 must be a finite number of at least 0 (0 = greedy)."),
    (SAMPLING + MIX.replace("temperature = 0.0", 'reasoning_effort = "low"'),
     "sampling.mix[0].reasoning_effort: [sampling] does not set reasoning_effort, so the other variants would not "
     "send it and their samples would record other keys. Set it in [sampling] too (sampling.reasoning_effort = "
     "...: what the other variants send)."),
    (SAMPLING + MIX.replace("thinking = false", "enable_thinking = false"),
     "sampling.mix[2].chat_template_kwargs.enable_thinking: [sampling] does not set "
     "chat_template_kwargs.enable_thinking, so the other variants would not send it and their samples would "
     "record other keys. Set it in [sampling] too (sampling.chat_template_kwargs = { enable_thinking = ... }: "
     "what the other variants send)."),
    (SAMPLING + MIX.replace("thinking = false", 'thinking = "no"'),
     "sampling.mix[2].chat_template_kwargs.thinking = 'no' must be a boolean like "
     "sampling.chat_template_kwargs.thinking (True): every sample records one type."),
    (SAMPLING + MIX.replace("share = 0.3\n", "share = 0.3\n[sampling.mix.extra_body]\nmin_tokens = 2\n"),
     "sampling.mix[1].extra_body: a variant cannot change extra_body (every variant sends it verbatim); set it in "
     "[sampling.extra_body], or use a key a variant may change."),
    (SAMPLING + "mix_seed = 3\n",
     "sampling.mix_seed is set but there is no [[sampling.mix]]: declare the variants, or remove mix_seed."),
    (SAMPLING + "mix_seed = 1.5\n" + MIX, "sampling.mix_seed = 1.5 must be an integer (got a number)."),
])
def test_bad_mixes_are_named_with_file_and_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str,
                                               message: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        load(tmp_path, text)
    assert str(e.value) == f"X.toml: {message}"


# ---------------------------------------------------------------- the draw


def test_the_draw_depends_only_on_the_seed_and_the_row(tmp_path: Path) -> None:
    a, b = mix_of(tmp_path), mix_of(tmp_path)  # two loads: two processes, a run and its resume
    draws = [a.pick(f"T-{k}", k) for k in range(600)]
    assert draws == [b.pick(f"T-{k}", k) for k in range(600)]
    assert draws == [a.pick("another id", k) for k in range(600)]  # the row's place, not its id, decides
    assert draws[::-1] == [a.pick(f"T-{k}", k) for k in reversed(range(600))]  # order of asking does not matter
    other = [mix_of(tmp_path, seed=7).pick(f"T-{k}", k) for k in range(600)]
    # another seed, another draw (the seed rotates the sequence: 147 of these 600 rows change variant)
    assert sum(x != y for x, y in zip(draws, other, strict=True)) > 100
    assert Counter(other) == Counter(draws) or all(abs(Counter(other)[i] / 600 - sh) < 0.02
                                                   for i, sh in enumerate(SHARES))
    # windows of consecutive rows, and strided subsets, get the declared shares closely
    big = [a.pick("x", k) for k in range(2400)]
    for rows in (big[:500], big[1000:1500], big[1::2], big[1::4], big[3::8]):
        counts = Counter(rows)
        for i, share in enumerate(SHARES):
            assert abs(counts[i] / len(rows) - share) < 0.02, (i, counts, len(rows))
    # a prompt without a source row is placed by its id: the same config loaded again draws the same
    by_id = [a.pick(f"id-{k}") for k in range(3000)]
    assert by_id == [b.pick(f"id-{k}") for k in range(3000)]
    counts = Counter(by_id)
    for i, share in enumerate(SHARES):
        assert abs(counts[i] / 3000 - share) < 0.03, counts  # independent draws: ±3 sd at 3,000


# ---------------------------------------------------------------- through the simulator


@pytest.fixture(scope="module")
def sim_url():
    """One simulator (with a reasoning parser: thinking on gives reasoning_content, off none) for the module."""
    with sim_in_thread([*SIM_FAST, "--reasoning-parser", "kimi_k2"], ready_timeout_s=30) as sim:
        yield sim.url


def _mix_dataset(folder: Path, *, rows: int, target: int) -> Path:
    toml = write_dataset(folder, rows=make_rows(rows), target=target, max_new_tokens=16, shard_max_samples=60,
                         fsync_every=16)
    text = toml.read_text()
    toml.write_text(text.replace("top_p = 0.95\n", "top_p = 0.95\n" + KEYS + MIX))
    return toml


def _expected_sampling(variant: int) -> dict:
    return {"max_new_tokens": 16, "temperature": (0.0, 0.7, 1.0)[variant], "top_p": 0.95, "top_k": 20, "min_p": 0.05,
            "repetition_penalty": 1.05, "presence_penalty": 0.5, "frequency_penalty": -0.25,
            "stop": ["</answer>", "STOP"], "seed": 1234, "chat_template_kwargs": {"thinking": variant != 2},
            "extra_body": {"min_tokens": 2, "skip_special_tokens": False}}


def test_requests_carry_the_drawn_sampling_and_rows_record_it(tmp_path: Path, sim_url: str) -> None:
    toml = _mix_dataset(tmp_path / "cfg", rows=40, target=40)
    before = httpx.get(sim_url + "/sim/stats").json()["chat_sampling"]
    out = tmp_path / "out"
    r = run_cli("generate", "--dataset", toml, "--server-url", sim_url, "--output-dir", out, "--progress", "quiet")
    assert r.returncode == 0, r.stderr
    samples = assert_exact(out, 40)
    assert all(set(s["meta"]) == MIX_META_KEYS for s in samples)
    mix = load_dataset_config(toml).mix
    by_variant: Counter[int] = Counter()
    turns: Counter[str] = Counter()
    for s in samples:
        k = int(s["id"].rsplit("-r", 1)[1])  # make_rows: id r<k> at source row k (no invalid rows)
        variant = s["meta"]["sampling_variant"]
        assert variant == mix.pick(s["id"], k)
        assert s["meta"]["sampling"] == _expected_sampling(variant)
        by_variant[variant] += 1
        seen = {k: v for k, v in _expected_sampling(variant).items() if k in ("temperature", "top_p",
                                                                              "chat_template_kwargs")}
        turns[orjson.dumps(seen, option=orjson.OPT_SORT_KEYS).decode()] += s["meta"]["turns"]
        reasoning = [m["reasoning_content"] for m in s["conversations"] if m["role"] == "assistant"]
        if variant == 2:
            assert reasoning == [""] * len(reasoning)  # thinking off: the server wrote none
    assert set(by_variant) == {0, 1, 2}
    # what the server received: per sampling, exactly one request per recorded turn (no retries on this sim)
    after = httpx.get(sim_url + "/sim/stats").json()["chat_sampling"]
    assert {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)} == dict(turns)
    assert any(m.get("reasoning_content") for s in samples if s["meta"]["sampling_variant"] != 2
               for m in s["conversations"] if m["role"] == "assistant")
    v = run_cli("validate", "--dataset", toml, "--output-dir", out)
    assert v.returncode == 0, v.stdout
    st = read_status(out, "T", None)
    assert (st.variants, st.mix) == ({str(k): n for k, n in by_variant.items()}, [
        (0.5, "temperature 0.0"), (0.3, "the base [sampling]"),
        (0.2, "temperature 1.0, chat_template_kwargs.thinking false")])
    # ranks: each rank's part counts its own; status sums them (two copies of this folder as two ranks)
    for r in (0, 1):
        shutil.copytree(out / "T", tmp_path / "ranked" / "T" / f"rank-{r}-of-2",
                        ignore=shutil.ignore_patterns(".lock"))
    ranked = read_status(tmp_path / "ranked", "T", None)
    assert (ranked.world_size, ranked.variants, ranked.mix) == (2, {k: 2 * n for k, n in st.variants.items()}, st.mix)

    # validate checks each row against its variant: a row claiming variant 0 with variant 1's sampling
    tampered = tmp_path / "tampered"
    shutil.copytree(out, tampered)
    shard = sorted((tampered / "T").glob("shard-*.jsonl"))[0]
    lines = shard.read_bytes().splitlines()
    variants = [orjson.loads(line)["meta"]["sampling_variant"] for line in lines]
    n = next(i for i, v in enumerate(variants) if v == 1 and 0 in variants[:i])  # after a genuine variant 0
    for i, claimed in ((n, 0), (n + 1, 7)):  # and the next row claims a variant the mix does not have
        row = orjson.loads(lines[i])
        row["meta"]["sampling_variant"] = claimed
        lines[i] = orjson.dumps(row)
    shard.write_bytes(b"\n".join(lines) + b"\n")
    v = run_cli("validate", "--dataset", toml, "--output-dir", tampered, "--json")
    report = orjson.loads(v.stdout)
    assert (v.returncode, report["problems"]) == (1, {"mix_sampling": 2, "mixed_config": 1})
    assert [p["message"] for p in report["examples"] if p["kind"] == "mix_sampling"] == [
        "meta.sampling.temperature is 0.7 here, 0.0 in the declared mix for sampling_variant 0",
        "meta.sampling_variant is 7: the declared mix has variants 0 to 2"]

    # a changed mix or sampling key refuses the resume, naming what changed
    toml.write_text(toml.read_text().replace("share = 0.5\ntemperature = 0.0", "share = 0.5\ntemperature = 0.1")
                    .replace("target_samples = 40", "target_samples = 41").replace("seed = 1234", "seed = 99")
                    .replace("min_tokens = 2", "min_tokens = 3"))
    r = run_cli("generate", "--dataset", toml, "--server-url", sim_url, "--output-dir", out, "--progress", "quiet")
    where = str(out / "T")
    assert (r.returncode, r.stdout) == (4, "")
    assert r.stderr == (
        f"error: {where} was written with a different config (3 settings differ):\n"
        f"  sampling.extra_body.min_tokens: 2 in {where}, 3 now\n"
        f"  sampling.seed: 1234 in {where}, 99 now\n"
        f"  sampling_mix.0.temperature: 0.0 in {where}, 0.1 now\n"
        "Resuming would mix samples made two ways in one dataset. Restore the old settings to resume, "
        "or write to a new output folder or dataset name.\n")
    assert len(read_samples(out)) == 40


@pytest.mark.e2e  # the process is the subject: make e2e
def test_a_killed_mixed_run_resumes_to_exact_counts_and_the_declared_shares(tmp_path: Path, sim_url: str) -> None:
    target = 500
    toml = _mix_dataset(tmp_path / "cfg", rows=520, target=target)
    out, log = tmp_path / "out", tmp_path / "cli.log"
    args = ("generate", "--dataset", toml, "--server-url", sim_url, "--output-dir", out, "--progress", "log")
    proc = start_cli(*args, log=log)
    wait_for(lambda: (out / "T").is_dir() and _shard_lines(out / "T") >= 150 or proc.poll() is not None,
             timeout_s=240)
    assert proc.poll() is None, log.read_text()[-2000:]  # killed mid-way, not after the end
    kill_group(proc)
    assert _shard_lines(out / "T") < target
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert ("T: sampling mix: variant 0: 50.0%, temperature 0.0; variant 1: 30.0%, the base [sampling]; variant 2: "
            "20.0%, temperature 1.0, chat_template_kwargs.thinking false\n") in r.stdout + r.stderr
    samples = assert_exact(out, target)  # exact count, no duplicate id
    v = run_cli("validate", "--dataset", toml, "--output-dir", out)
    assert v.returncode == 0, v.stdout
    counts = Counter(s["meta"]["sampling_variant"] for s in samples)
    for i, share in enumerate(SHARES):
        assert abs(counts[i] / target - share) <= 0.02, counts
        assert all(s["meta"]["sampling"] == _expected_sampling(i) for s in samples
                   if s["meta"]["sampling_variant"] == i)

    cfg = ("--config-dir", toml.parent, "--output-dir", out)
    st = run_cli("status", "--dataset", "T", *cfg)
    assert st.returncode == 0, st.stderr
    pct = [f"{100 * counts[i] / target:.1f}%" for i in range(3)]
    lines = st.stdout.splitlines()
    mix = lines.index("T: sampling mix, samples committed per variant:")
    assert lines[mix + 5] == "GPU-hours (tp × dp × servers × wall time):"  # after the mix: issue 24's lines
    assert lines[mix:mix + 4] == [
        "T: sampling mix, samples committed per variant:",
        f"  variant 0 (temperature 0.0): {counts[0]} samples, {pct[0]} (declared 50.0%)",
        f"  variant 1 (the base [sampling]): {counts[1]} samples, {pct[1]} (declared 30.0%)",
        f"  variant 2 (temperature 1.0, chat_template_kwargs.thinking false): {counts[2]} samples, {pct[2]} "
        "(declared 20.0%)"]
    js = orjson.loads(run_cli("status", "--dataset", "T", "--json", *cfg).stdout)
    assert js["datasets"]["T"]["variants"] == {str(i): counts[i] for i in range(3)}

    ck = run_cli("check", "--dataset", toml, "--output-dir", out)
    assert "\n".join([
        "  sampling mix (3 variants, mix_seed 0; a sample's variant is drawn from the seed and its source row):",
        "    variant 0: 50.0%, temperature 0.0",
        "    variant 1: 30.0%, the base [sampling]",
        "    variant 2: 20.0%, temperature 1.0, chat_template_kwargs.thinking false"]) in ck.stdout, ck.stdout

    exp = tmp_path / "export" / "train.jsonl"
    exp.parent.mkdir()
    e = run_cli("export", "--dataset", "T", *cfg, "--format", "specforge", "--out", exp)
    assert e.returncode == 0, e.stderr
    card = (exp.parent / "README.md").read_text()
    assert f"- variant 0 (temperature 0.0): {counts[0]} samples, {pct[0]} (declared 50.0%)" in card


def test_the_report_page_shows_the_produced_shares() -> None:
    d = DatasetStatus("T", 10, done=10, mix=[(0.5, "temperature 0.0"), (0.5, "the base [sampling]")],
                      variants={"0": 4, "1": 6})
    page = _status_html(StatusReport([d], 10, 10, ["T"]))
    assert page.endswith("<p>T: sampling mix, samples committed per variant:</p><pre>"
                         "variant 0 (temperature 0.0): 4 samples, 40.0% (declared 50.0%)\n"
                         "variant 1 (the base [sampling]): 6 samples, 60.0% (declared 50.0%)</pre>")
    assert "sampling mix" not in _status_html(StatusReport([DatasetStatus("U", 10, done=10)], 10, 10, ["U"]))


def test_with_manifest_and_fingerprint_lost_the_rows_refuse_another_mix(tmp_path: Path) -> None:
    """store/fingerprint.py check_rows: a row is checked against its own variant of the configured mix."""
    fp = orjson.loads(orjson.dumps(load(tmp_path, SAMPLING + MIX).fingerprint("m")))
    two = SAMPLING + "[[sampling.mix]]\nshare = 0.5\ntemperature = 0.0\n[[sampling.mix]]\nshare = 0.5\n"
    fp_two = orjson.loads(orjson.dumps(load(tmp_path, two).fingerprint("m")))
    fp_plain = orjson.loads(orjson.dumps(load(tmp_path, SAMPLING).fingerprint("m")))
    folder = tmp_path / "out"

    def refusal(fp: dict, row: dict) -> str:
        try:
            check_rows(folder, [("shard-000001.jsonl", orjson.dumps(row, option=orjson.OPT_SORT_KEYS), 3)], fp)
        except ConfigDriftError as e:
            return str(e)
        return "accepted"

    row = {"model": "m", "sampling": _expected_sampling(2), "sampling_variant": 2}
    assert refusal(fp, row) == "accepted"
    assert refusal(fp, {**row, "sampling_variant": 1}) == (
        f"{folder} was written with a different config (2 settings differ):\n"
        f"  sampling.chat_template_kwargs.thinking: False in {folder}, True now\n"
        f"  sampling.temperature: 1.0 in {folder}, 0.7 now\n"
        "Resuming would mix samples made two ways in one dataset. Restore the old settings to resume, or write to a "
        "new output folder or dataset name.\n"
        "(Its manifest.json and fingerprint.json are gone: the settings were read from the rows, shard-000001.jsonl "
        "line 3.)")
    assert f"  sampling_variant: 2 in {folder}, (not set) now\n" in refusal(fp_two, row)  # no variant 2 now
    assert f"  sampling_variant: 2 in {folder}, (not set) now\n" in refusal(fp_plain, row)  # no mix now
    plain_row = {"model": "m", "sampling": _expected_sampling(1)}
    assert refusal(fp_plain, plain_row) == "accepted"
    assert f"  sampling_variant: (not set) in {folder}, 0 now\n" in refusal(fp, plain_row)  # a mix now
