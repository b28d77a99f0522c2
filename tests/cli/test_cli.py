"""The CLI in-process: messages and exit codes for mistakes, `plan` output."""

from pathlib import Path

import pytest

from gen_pipeline.cli import main

# not the bundled one
OTHER_CONFIG = str(Path(__file__).resolve().parents[1] / "server" / "data" / "kimi-k2.5-config.json")


def test_plan_shows_fp8_doubling_the_kv_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu-mem-gb", "94", "--weights-gb", "578", "--mem-fraction-static", "0.90"]) == 0
    out = capsys.readouterr().out
    assert "MLA attention, 61 layers" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("bf16 ", "fp8_e4m3 "))}
    bf16, fp8 = (int(rows[k][2].replace(",", "")) for k in ("bf16", "fp8_e4m3"))
    assert fp8 == 2 * bf16


@pytest.mark.parametrize("argv, message", [
    (["plan", "--model-config", OTHER_CONFIG],
     "error: plan needs the weight size: pass --weights-gb (the checkpoint's total size in GiB; Kimi-K2.5 INT4: "
     "594 GB on disk = 553 GiB) or --params-b with --weight-dtype (e.g. --params-b 70 --weight-dtype bf16 = "
     "130.4 GiB).\n"),
    (["generate", "--dataset", "demo", "--limit", "0"], "error: --limit 0 must be at least 1.\n"),
    (["generate", "--dataset", "demo", "--window", "-3"],
     "error: --window -3 must be at least 0.\n"),
    (["generate", "--dataset", "demo", "--server", "nope"], None),
    (["generate", "--dataset", "b2"], "error: No dataset config 'b2': datasets_cfg/b2.toml does not exist. "
                                      "Configs in datasets_cfg: B1, B2, B6, B7, demo, tools. Did you mean B2?\n"),
    (["plan", "--gpu-mem-gb", "10", "--weights-gb", "594", "--overhead-gb", "0"],
     "error: Nothing is left for the KV cache: 10 GiB/GPU × mem_fraction_static 0.9 = 9.0 GiB, but the weights "
     "take 74.2 GiB/GPU. At tp_size 8 and this fraction each GPU needs more than 82.5 GiB, so 8 x 10 GiB GPUs "
     "cannot hold the model with a KV cache. The smallest node that can: 8 x RTX PRO 6000 Blackwell, 96 GB "
     "(95.6 GiB/GPU). Or use tp_size 128 on these GPUs (16 nodes of 8 GPUs), a larger mem_fraction_static or "
     "smaller (quantized) weights.\n"),
    # Kimi-K2.5 on 8 x H100 80 GB: the refusal names the smallest node that fits and the tp_size needed
    (["plan", "--gpu-mem-gb", "79.6"],
     "error: Nothing is left for the KV cache: 79.6 GiB/GPU × mem_fraction_static 0.9 = 71.6 GiB, but the weights "
     "take 69.1 GiB/GPU and overhead 4.5 GiB. At tp_size 8 and this fraction each GPU needs more than 81.8 GiB, "
     "so 8 x 79.6 GiB GPUs cannot hold the model with a KV cache. The smallest node that can: 8 x RTX PRO 6000 "
     "Blackwell, 96 GB (95.6 GiB/GPU). Or use tp_size 16 on these GPUs (2 nodes of 8 GPUs), a larger "
     "mem_fraction_static or smaller (quantized) weights.\n"),
    (["validate", "--dataset", "B7", "--output-dir", "{tmp}"],
     "error: {tmp}/B7: no such output folder. Generate it first (make generate DATASET=B7).\n"),
    (["status", "--output-dir", "{tmp}/nonexistent/out"],
     "error: --output-dir {tmp}/nonexistent/out: no such folder, so no dataset has output there. Pass the folder "
     "generate wrote to (default: outputs), or run generate first: it makes the folder.\n"),
    (["generate", "--dataset", "demo", "--temperature", "0.1", "--output-dir", "{tmp}"],
     "error: --temperature goes with --input only: with --dataset, the TOML's [sampling] table sets them. Edit it "
     "there.\n"),
    (["plan", "--model-config", "{tmp}/config.json", "--output-dir", "{tmp}"],
     "error: --model-config {tmp}/config.json: no such file (pass the model's config.json).\n"),
])
def test_flag_mistakes(tmp_path: Path, argv: list[str], message: str | None,
                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    if message is not None:
        assert err == message.format(tmp=tmp_path)
    else:
        assert "nope" in err and "tuned" in err and "Traceback" not in err


def test_a_toml_whose_name_is_not_its_file_name_is_refused_by_every_command(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """`name` must equal the file's name, so every command finds the same folder."""
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    (cfg_dir / "mine.toml").write_text('name = "other"\ntarget_samples = 5\n[source]\nfiles = ["x.jsonl"]\n'
                                       'schema = "prompt"\nfield = "q"\n')
    (cfg_dir / "broken.toml").write_text("target_samples = \n")
    out = tmp_path / "out"
    refused = (f"{cfg_dir}/mine.toml: name = 'other' differs from the file's name (mine.toml). The name picks the "
               "output folder (outputs/other/) and the ids (other-...), and every command finds a dataset by its file "
               "name, so the two must agree: rename the file to other.toml, or set name = 'mine' (or remove name: it "
               "defaults to the file's name).")
    for argv in (["generate", "--dataset", "mine", "--server", "sim"], ["validate", "--dataset", "mine"],
                 ["check", "--dataset", "mine", "--server", "sim"], ["status", "--dataset", "mine"],
                 ["export", "--dataset", str(cfg_dir / "mine.toml"), "--format", "specforge", "--out",
                  str(tmp_path / "x.jsonl")]):
        assert main([*argv, "--config-dir", str(cfg_dir), "--output-dir", str(out)]) == 2, argv
        assert capsys.readouterr().err == f"error: {refused}\n", argv
    out.mkdir()  # status refuses an output folder that does not exist
    assert main(["status", "--json", "--config-dir", str(cfg_dir), "--output-dir", str(out)]) == 0
    captured = capsys.readouterr()
    import orjson
    report = orjson.loads(captured.out)["datasets"]
    assert report["mine"]["target"] is None and report["broken"]["target"] is None
    assert captured.err.startswith(f"warning: {cfg_dir}/broken.toml: not valid TOML")
    assert f"warning: {refused}\n" in captured.err

