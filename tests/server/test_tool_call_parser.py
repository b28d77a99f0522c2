"""The profile's tool_call_parser (issue 33 item 8): SGLang's --tool-call-parser on the launch line, its
name checked against SGLang 0.5.17's parsers when the profile loads; the bundled sim-tools profile."""

from pathlib import Path

import pytest

from gen_pipeline.errors import ConfigError
from gen_pipeline.server import build_command, load_server_profile


def test_tool_call_parser_becomes_its_flag_after_the_reasoning_parser(tmp_path: Path) -> None:
    p = tmp_path / "server.toml"
    p.write_text('[profile.t]\nmodel_path = "m"\nreasoning_parser = "qwen3"\ntool_call_parser = "qwen25"\n')
    argv = build_command(load_server_profile("t", p), port=5, python="py")
    at = argv.index("--reasoning-parser")
    assert argv[at:at + 4] == ["--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25"]


def test_an_unknown_parser_is_refused_with_the_known_names(tmp_path: Path) -> None:
    p = tmp_path / "server.toml"
    p.write_text('[profile.t]\nmodel_path = "m"\ntool_call_parser = "qwen3"\n')
    with pytest.raises(ConfigError) as e:
        load_server_profile("t", p)
    assert str(e.value).startswith(f"{p}: profile.t.tool_call_parser = 'qwen3' is not one of SGLang 0.5.17's "
                                   "parsers: apertus2509, ")
    assert "qwen25 for Qwen2.5/Qwen3" in str(e.value)


def test_the_bundled_sim_tools_profile_parses_kimi_calls() -> None:
    profile = load_server_profile("sim-tools")
    assert profile.tool_call_parser == "kimi_k2" and load_server_profile("tuned").tool_call_parser == ""
