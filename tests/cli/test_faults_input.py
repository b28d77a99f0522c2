"""Bad input through the CLI: messages that name the file/key, counted rejects, no tracebacks."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest
from servers import sim_in_thread

from sglang_sim.testing import free_port

from pipeline_helpers import SIM_FAST, assert_exact, make_rows, run_cli, write_dataset


@pytest.fixture(scope="module")
def sim_url():
    with sim_in_thread(SIM_FAST + ["--context-length", "600"], ready_timeout_s=30) as sim:
        yield sim.url


def gen(toml: Path, out: Path, *where: str):
    r = run_cli("generate", "--dataset", toml, *where, "--output-dir", out, "--progress", "quiet")
    assert "Traceback" not in r.stderr
    return r


def test_bad_rows_and_lines_are_counted_rejects_and_context_400_is_final(tmp_path: Path, sim_url: str) -> None:
    rows = make_rows(30)
    rows[2] = {"id": "wt", "messages": "hello"}
    rows[4] = {"id": "mf"}
    rows[5] = {"id": "ec", "messages": [{"role": "user", "content": ""}]}
    rows[6] = {"id": "na", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
    rows[7] = {"id": "big", "messages": [{"role": "user", "content": "x " * 5_000_000}]}  # 10 MB
    rows[8] = {"id": "ctx", "messages": [{"role": "user", "content": "word " * 1500}]}  # > 600-token context
    rows[9] = {"id": "wt2", "messages": [{"role": "user", "content": 5}]}
    toml, out = write_dataset(tmp_path / "ds", target=24, rows=rows), tmp_path / "out"
    lines = (tmp_path / "ds" / "T.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "ds" / "T.jsonl").write_bytes(b"".join(lines[:2] + [b"this is not json\n"] + lines[2:]))
    r = gen(toml, out, "--server-url", sim_url)
    assert r.returncode == 5, r.stderr  # the final failure leaves the target out of the source's reach
    assert r.stdout.splitlines()[-1].startswith("T: 23/24 samples (95.8%), +23 this run in ")
    assert r.stdout.splitlines()[-1].endswith(", 1 failed (http_400 1; 1 final, 0 retried by the next run), "
                                              "7 invalid rows skipped; the source has no more prompts: 1 samples "
                                              "short of the target; add rows to the source or lower target_samples.")
    rejects = [orjson.loads(x) for x in (out / "T" / "rejects.jsonl").read_bytes().splitlines()]
    assert rejects[0] == {"dataset": "T", "row": 30, "reason": "bad_json", "file": "T.jsonl", "line": 3, "run": 1,
                          "detail": "T.jsonl line 3 is not valid JSON (invalid literal, expected 'true', column 1)"}
    assert [(x["row"], x["reason"]) for x in rejects[1:]] == [
        (2, "bad_type"), (4, "missing_field"), (5, "empty_content"), (6, "roles_not_alternating"),
        (7, "prompt_too_long"), (9, "bad_type")]
    assert rejects[5]["detail"] == "10000000 characters > source.max_prompt_chars = 400000"
    err = [orjson.loads(x) for x in (out / "T" / "errors.jsonl").read_bytes().splitlines()]
    assert err == [{"id": "T-ctx", "dataset": "T", "reason": "http_400", "attempts": 1, "retryable": False,
                    "loops": 0, "empty": 0, "tokens_not_decoded": 0, "discarded_tokens": 0,  # the gate's counts
                    "run": 1, "detail": "HTTP 400: The input (1515 tokens) is longer than the model's context "
                                        "length (600 tokens)."}]
    seen = httpx.get(sim_url + "/sim/stats").json()["requests_seen"]
    again = gen(toml, out, "--server-url", sim_url)  # refused before any request: nothing left to try
    assert (again.returncode, again.stdout) == (5, "T: loading the source T.jsonl\n")
    assert again.stderr == (
        f"error: {toml}: the source can give 0 more samples (24 valid rows, 23 done, 1 failed for good), but 1 "
        "are needed to reach target_samples = 24. Add rows to the source or lower target_samples to 23; or pass "
        "--proceed-anyway to generate what there is.\n")
    assert httpx.get(sim_url + "/sim/stats").json()["requests_seen"] == seen  # the 400 is not sent again
    assert len(assert_exact(out, 23)) == 23


@pytest.mark.parametrize(("extra", "where", "code", "message"), [
    ("bogus_key = 3", ["{toml}", "--server", "sim"], 2,
     "{toml}: generation.bogus_key: unknown key. Known keys here: connect_timeout_s, empty_turn, max_attempts, "
     "on_loop, reasoning, request_timeout_s, retry_initial_wait_s, retry_max_wait_s, truncated, window. Check the "
     "spelling or remove it."),
    ("", ["NOPE", "--server", "sim"], 2, "No dataset config 'NOPE': datasets_cfg/NOPE.toml does not exist. "
                                         "Configs in datasets_cfg: B1, B2, B6, B7, demo, tools."),
    ("", ["{toml}", "--server-url", "not-a-url"], 2,
     "--server-url 'not-a-url' must start with http:// or https:// (e.g. http://gpu-node:30000)."),
    ("", ["{toml}", "--server-url", "{url}"], 3, "Cannot reach {url}: Connection refused. Check SERVER_URL and that "
                                                 "the server is running (and listening on that host and port)."),
], ids=["unknown-key", "no-such-dataset", "not-a-url", "nothing-listening"])
def test_a_mistake_names_what_to_fix(tmp_path: Path, extra: str, where: list[str], code: int, message: str) -> None:
    names = {"toml": write_dataset(tmp_path, target=10, extra=extra), "url": f"http://127.0.0.1:{free_port()}"}
    toml, *flags = [w.format(**names) for w in where]
    r = gen(Path(toml), tmp_path / "out", *flags)
    assert (r.returncode, r.stdout, r.stderr) == (code, "", f"error: {message.format(**names)}\n")
