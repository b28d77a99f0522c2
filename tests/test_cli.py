"""The CLI in-process: messages and exit codes for mistakes, `plan` output."""

import pytest

from gen_pipeline.cli import main


def test_plan_needs_the_weight_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 2
    assert capsys.readouterr().err == (
        "error: plan needs the weight size: pass --weights-gb (total GiB on disk, e.g. 594 for Kimi-K2.5 INT4) "
        "or --params-b with --weight-dtype (e.g. --params-b 1040 --weight-dtype int4).\n")


def test_plan_shows_fp8_doubling_the_kv_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu-mem-gb", "94", "--weights-gb", "578", "--mem-fraction-static", "0.90"]) == 0
    out = capsys.readouterr().out
    assert "MLA attention, 61 layers" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("bf16 ", "fp8_e4m3 "))}
    bf16, fp8 = (int(rows[k][2].replace(",", "")) for k in ("bf16", "fp8_e4m3"))
    assert fp8 == 2 * bf16


@pytest.mark.parametrize("argv, message", [
    (["generate", "--dataset", "demo", "--limit", "0"], "error: --limit 0 must be at least 1.\n"),
    (["generate", "--dataset", "demo", "--window", "-3"], "error: --window -3 must be at least 1.\n"),
    (["generate", "--dataset", "demo", "--server", "nope"], None),
])
def test_generate_flag_mistakes(argv: list[str], message: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    if message is not None:
        assert err == message
    else:
        assert "nope" in err and "tuned" in err and "Traceback" not in err


def test_validate_of_a_dataset_never_generated(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--dataset", "B7", "--output-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path}/B7: no such output folder. "
                                       "Generate it first (make generate DATASET=B7).\n")
