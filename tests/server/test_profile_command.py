"""Profiles from TOML and the argv/env they become (pure)."""

from pathlib import Path

import pytest

from gen_pipeline.config.server import ServerProfile
from gen_pipeline.errors import ConfigError
from gen_pipeline.server import build_command, build_env, load_server_profile
from gen_pipeline.server.command import flag_origin

FULL = """
[profile.full]
model_path = "/models/m"
served_model_name = "m"
tp_size = 8
dp_size = 2
mem_fraction_static = 0.9
kv_cache_dtype = "fp8_e4m3"
enable_hierarchical_cache = true
hicache_size_gb = 48
num_continuous_decode_steps = 4
stream_interval = 8
enable_metrics = true
reasoning_parser = "kimi_k2"
trust_remote_code = true
host = "0.0.0.0"
port = 31000
max_running_requests = 256
context_length = 32768
command = ["{python}", "-m", "sglang.launch_server"]
extra_args = ["--chunked-prefill-size", "8192", "--disable-cuda-graph"]
startup_timeout_s = 60
[profile.full.env]
NCCL_DEBUG = "INFO"

[profile.child]
inherits = "full"
kv_cache_dtype = "bf16"
enable_metrics = false
[profile.child.env]
NCCL_IB_DISABLE = "1"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "server.toml"
    p.write_text(text)
    return p


def test_every_key_becomes_its_flag(tmp_path):
    profile = load_server_profile("full", write(tmp_path, FULL))
    assert build_command(profile, port=31000, python="/py") == [
        "/py", "-m", "sglang.launch_server",
        "--model-path", "/models/m", "--served-model-name", "m", "--tp-size", "8", "--dp-size", "2",
        "--mem-fraction-static", "0.9", "--kv-cache-dtype", "fp8_e4m3", "--enable-hierarchical-cache",
        "--hicache-size", "48", "--num-continuous-decode-steps", "4", "--stream-interval", "8", "--enable-metrics",
        "--reasoning-parser", "kimi_k2", "--trust-remote-code", "--max-running-requests", "256",
        "--context-length", "32768", "--host", "0.0.0.0", "--port", "31000",
        "--chunked-prefill-size", "8192", "--disable-cuda-graph",
    ]


def test_defaults_leave_out_unset_flags_and_false_booleans():
    profile = ServerProfile(name="x", model_path="m", enable_metrics=False)
    assert build_command(profile, port=5, python="py") == [
        "py", "-m", "sglang.launch_server", "--model-path", "m", "--tp-size", "1", "--dp-size", "1",
        "--kv-cache-dtype", "auto", "--num-continuous-decode-steps", "1", "--host", "127.0.0.1", "--port", "5"]


def test_inherits_overrides_keys_and_merges_env(tmp_path):
    profile = load_server_profile("child", write(tmp_path, FULL))
    argv = build_command(profile, port=1, python="py")
    assert argv[argv.index("--kv-cache-dtype") + 1] == "bf16"
    assert "--enable-metrics" not in argv and "--enable-hierarchical-cache" in argv
    assert profile.env == {"NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "1"}
    env = build_env(profile, base={"PATH": "/bin", "NCCL_DEBUG": "WARN"})
    assert env == {"PATH": "/bin", "NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "1", "PYTHONUNBUFFERED": "1"}


def test_overrides_apply_and_are_validated(tmp_path):
    path = write(tmp_path, FULL)
    profile = load_server_profile("full", path, overrides={"port": 0, "extra_args": ["--x"]})
    assert (profile.port, profile.extra_args, profile.tp_size) == (0, ("--x",), 8)
    with pytest.raises(ConfigError) as e:
        load_server_profile("full", path, overrides={"tp_size": "8"})
    assert str(e.value) == ("override of profile.full: tp_size = '8' must be an integer (got a string). "
                            "Remove the quotes.")


def test_unknown_key_names_file_and_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, '[profile.a]\nmodel_path = "m"\nkv_cache_dtyp = "fp8_e4m3"\n')
    with pytest.raises(ConfigError, match=r"^server\.toml: profile\.a\.kv_cache_dtyp: unknown key\. Known keys here: "
                                          r".*Check the spelling or remove it\.$"):
        load_server_profile("a", Path("server.toml"))


def test_unknown_profile_lists_known_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, FULL)
    with pytest.raises(ConfigError) as e:
        load_server_profile("tunned", Path("server.toml"))
    assert str(e.value) == "server.toml: Profile 'tunned' not found. Known profiles: child, full."


@pytest.mark.parametrize("line, message", [
    ('mem_fraction_static = "0.9"', "profile.a.mem_fraction_static = '0.9' must be a number between 0 and 1 "
     "(the share of GPU memory for weights + KV cache, e.g. 0.90)."),
    ("mem_fraction_static = 1.5", "profile.a.mem_fraction_static = 1.5 must be a number between 0 and 1 "
     "(the share of GPU memory for weights + KV cache, e.g. 0.90)."),
    ("tp_size = 0", "profile.a.tp_size = 0 must be at least 1."),
    ("stream_interval = 0", "profile.a.stream_interval = 0 must be at least 1 (tokens per streamed chunk; leave it "
     "out for SGLang's default, 1)."),
    ("enable_metrics = 1", "profile.a.enable_metrics = 1 must be true or false (got an integer)."),
    ("env = { NCCL_DEBUG = 1 }", "profile.a.env.NCCL_DEBUG = 1 must be a string (environment values are text). "
     "Put it in quotes."),
    ('inherits = "nope"', "profile.a.inherits = 'nope': not found. Known profiles: a."),
])
def test_bad_values_are_named(tmp_path, monkeypatch, line, message):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, f'[profile.a]\nmodel_path = "m"\n{line}\n')
    with pytest.raises(ConfigError) as e:
        load_server_profile("a", Path("server.toml"))
    assert str(e.value) == f"server.toml: {message}"


def test_shipped_profiles_load():
    tuned = load_server_profile("tuned")
    assert (tuned.tp_size, tuned.mem_fraction_static, tuned.kv_cache_dtype, tuned.hicache_size_gb,
            tuned.num_continuous_decode_steps, tuned.stream_interval, tuned.enable_metrics,
            tuned.trust_remote_code) == (8, 0.9, "fp8_e4m3", 48, 4, 8, True, True)
    assert "NCCL_NVLS_ENABLE" in tuned.env
    baseline = load_server_profile("baseline")
    assert (baseline.kv_cache_dtype, baseline.mem_fraction_static, baseline.enable_hierarchical_cache) == (
        "bf16", 0.85, False)
    for name in ("sim", "sim-seed"):
        p = load_server_profile(name)
        assert p.command == ("{python}", "-m", "sglang_sim")
        assert p.kv_cache_dtype == "fp8_e4m3" and "--sim-profile" in p.extra_args


def test_flag_origin():
    p = ServerProfile(name="x", model_path="m", extra_args=("--foo", "1"))
    assert flag_origin(p, "--kv-cache-dtype") == "kv_cache_dtype"
    assert flag_origin(p, "--foo") == "extra_args"
    assert flag_origin(p, "--bar") is None
