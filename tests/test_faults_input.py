"""Issue 5.4: bad input through the CLI: messages that name the file/key, counted rejects, no tracebacks."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest

from sglang_sim.testing import start_sim
from pipeline_helpers import SIM_FAST, assert_exact, make_rows, run_cli, write_dataset


@pytest.fixture(scope="module")
def sim_url():
    with start_sim(SIM_FAST + ["--context-length", "600"], ready_timeout_s=30) as sim:
        yield sim.url


def gen(toml: Path, out: Path, *where: str):
    r = run_cli("generate", "--dataset", toml, *where, "--output-dir", out, "--progress", "quiet")
    assert "Traceback" not in r.stderr
    return r


def test_dataset_file_not_json(tmp_path: Path, sim_url: str) -> None:
    toml = write_dataset(tmp_path, target=10)
    (tmp_path / "T.jsonl").write_text('this is not json\n{"id": 1}\n')
    r = gen(toml, tmp_path / "out", "--server-url", sim_url)
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == (
        f"error: {toml}: could not load source T.jsonl: ArrowInvalid: JSON parse error: Invalid value. in row 0. "
        "Check that every line is one JSON object (JSON Lines) or the file is valid JSON/Parquet.")


def test_bad_rows_are_counted_rejects_and_context_400_is_final(tmp_path: Path, sim_url: str) -> None:
    rows = make_rows(30)
    rows[2] = {"id": "wt", "messages": "hello"}
    rows[4] = {"id": "mf"}
    rows[5] = {"id": "ec", "messages": [{"role": "user", "content": ""}]}
    rows[6] = {"id": "na", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
    rows[7] = {"id": "big", "messages": [{"role": "user", "content": "x " * 5_000_000}]}  # 10 MB
    rows[8] = {"id": "ctx", "messages": [{"role": "user", "content": "word " * 1500}]}  # > 600-token context
    rows[9] = {"id": "wt2", "messages": [{"role": "user", "content": 5}]}
    toml, out = write_dataset(tmp_path / "ds", target=24, rows=rows), tmp_path / "out"
    r = gen(toml, out, "--server-url", sim_url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].startswith("T: 23/24 samples (95.8%), +23 this run in ")
    assert r.stdout.splitlines()[-1].endswith(", 1 failed (http_400 1; 1 final, 0 retried by the next run), "
                                              "6 invalid rows skipped; the source has no more prompts.")
    rejects = [orjson.loads(x) for x in (out / "T" / "rejects.jsonl").read_bytes().splitlines()]
    assert [(x["row"], x["reason"]) for x in rejects] == [
        (2, "bad_type"), (4, "missing_field"), (5, "empty_content"), (6, "roles_not_alternating"),
        (7, "prompt_too_long"), (9, "bad_type")]
    assert rejects[4]["detail"] == "10000000 characters > source.max_prompt_chars = 400000"
    err = [orjson.loads(x) for x in (out / "T" / "errors.jsonl").read_bytes().splitlines()]
    assert err == [{"id": "T-ctx", "dataset": "T", "reason": "http_400", "attempts": 1, "retryable": False,
                    "run": 1, "detail": "HTTP 400: The input (1515 tokens) is longer than the model's context "
                                        "length (600 tokens)."}]
    seen = httpx.get(sim_url + "/sim/stats").json()["requests_seen"]
    again = gen(toml, out, "--server-url", sim_url)
    assert again.returncode == 0
    assert "+0 this run" in again.stdout
    assert httpx.get(sim_url + "/sim/stats").json()["requests_seen"] == seen  # the 400 is not sent again
    assert len(assert_exact(out, 23)) == 23


def test_unknown_config_key(tmp_path: Path) -> None:
    toml = write_dataset(tmp_path, target=10, extra="bogus_key = 3")
    r = gen(toml, tmp_path / "out", "--server", "sim")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"error: {toml}: generation.bogus_key: unknown key. Known keys here: connect_timeout_s, "
                        "empty_turn, max_attempts, reasoning, request_timeout_s, retry_initial_wait_s, retry_max_wait_s, "
                        "truncated, window. Check the spelling or remove it.\n")


def test_missing_dataset_config_lists_existing(tmp_path: Path) -> None:
    r = gen(Path("NOPE"), tmp_path / "out", "--server", "sim")
    assert r.returncode == 2
    assert r.stderr == ("error: No dataset config 'NOPE': datasets_cfg/NOPE.toml does not exist. "
                        "Configs in datasets_cfg: B1, B2, B6, B7, demo.\n")


def test_server_url_not_a_url(tmp_path: Path) -> None:
    r = gen(write_dataset(tmp_path, target=10), tmp_path / "out", "--server-url", "not-a-url")
    assert r.returncode == 2
    assert r.stderr == ("error: --server-url 'not-a-url' must start with http:// or https:// "
                        "(e.g. http://gpu-node:30000).\n")


def test_server_url_nothing_listening(tmp_path: Path) -> None:
    from sglang_sim.testing import free_port
    url = f"http://127.0.0.1:{free_port()}"
    r = gen(write_dataset(tmp_path, target=10), tmp_path / "out", "--server-url", url)
    assert r.returncode == 3
    assert r.stderr == (f"error: {url}/v1/models did not list a model (ConnectError: All connection attempts "
                        "failed). Is SERVER_URL an SGLang or OpenAI-compatible server? Check the address and that "
                        "the server is up.\n")
