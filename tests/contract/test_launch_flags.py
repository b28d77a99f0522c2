"""Every shipped profile's launch command parses with SGLang's own parser to the values it meant; a flag SGLang
does not know names the profile and the TOML key that produced it. So do tune's candidates, and a lever tune
skips as inert is one SGLang's code never reads."""

from __future__ import annotations

import argparse
import functools
import re
import tomllib

import pytest
from sglang_contract import PIN, SGLANG, ParsedArgs, ParseError, installed_version, sglang_parser

from gen_pipeline.config.server import DEFAULT_SERVER_CONFIG, SGLANG_COMMAND, ServerProfile, load_server_profile
from gen_pipeline.server import command
from gen_pipeline.tune.plan import LEVERS, Lever
from sglang_sim import cli as sim_cli

# Profile key -> the ServerArgs field it sets (where the names differ: hicache_size is GB too).
FIELD = {"hicache_size_gb": "hicache_size"}
PROFILES = sorted(tomllib.loads(DEFAULT_SERVER_CONFIG.read_text())["profile"])


def test_installed_sglang_is_the_pin():
    assert installed_version() == PIN


def sglang_flags(profile: ServerProfile) -> list[str]:
    """What follows the command in build_command's argv; a simulator profile's own extra_args
    (--sim-*, --time-scale) are the simulator's, not SGLang's, and are left out."""
    argv = command.build_command(profile, port=30000, python="python")
    flags = argv[len(profile.command):]
    if tuple(profile.command) != SGLANG_COMMAND and profile.extra_args:
        flags = flags[:len(flags) - len(profile.extra_args)]
    return flags


def parse(profile: ServerProfile, name: str, where: str) -> ParsedArgs:
    """SGLang's parse of the profile's flags; AssertionError naming profile + key otherwise."""
    parser = sglang_parser()
    flags = sglang_flags(profile)
    for flag in (f.split("=", 1)[0] for f in flags if f.startswith("--")):
        if flag not in parser._option_string_actions:
            raise AssertionError(f"{where}: profile {name!r}, key {command.flag_origin(profile, flag)!r} "
                                 f"produced {flag}, which SGLang {installed_version()}'s parser does not know")
    try:
        ns = parser.parse_args(flags)
    except ParseError as e:
        flag = next((f for f in flags if f.startswith("--") and f in str(e)), None)
        key = command.flag_origin(profile, flag) if flag else None
        raise AssertionError(f"{where}: profile {name!r}, key {key!r}: SGLang {installed_version()} "
                             f"rejects {' '.join(flags)}: {e}") from None
    return ParsedArgs.from_cli_args(ns)


def meant(profile: ServerProfile, key: str) -> object:
    """The ServerArgs value a profile key means: unset keys leave SGLang's default."""
    value = getattr(profile, key)
    if value is None or value == "" or value is False or (key == "hicache_size_gb" and value == 0):
        return getattr(ParsedArgs, FIELD.get(key, key))  # the dataclass default
    return value


@pytest.mark.parametrize("name", PROFILES)
def test_profile_parses_with_sglangs_parser_to_what_it_meant(name):
    profile = load_server_profile(name)
    args = parse(profile, name, str(DEFAULT_SERVER_CONFIG))
    for key in command.FLAGS:
        assert getattr(args, FIELD.get(key, key)) == meant(profile, key), (name, key)
    assert args.port == 30000
    if tuple(profile.command) == SGLANG_COMMAND:  # what the launcher runs is SGLang's server module
        assert profile.command[-1] == "sglang.launch_server"


def test_tuned_means_the_reference_settings():
    args = parse(load_server_profile("tuned"), "tuned", "server.toml")
    assert (args.tp_size, args.mem_fraction_static, args.kv_cache_dtype, args.enable_hierarchical_cache,
            args.hicache_size, args.num_continuous_decode_steps, args.enable_metrics, args.reasoning_parser,
            args.trust_remote_code) == (8, 0.9, "fp8_e4m3", True, 48, 4, True, "kimi_k2", True)


@pytest.mark.parametrize(("key", "renamed", "message"), [
    ('extra_args = ["--enable-metrix"]', False,
     "{path}: profile 'p', key 'extra_args' produced --enable-metrix, which SGLang {pin}'s parser does not know"),
    ('kv_cache_dtype = "fp8_e4m3"', True, ".*profile 'p', key 'kv_cache_dtype' produced --kv-cache-type,.*"),
    ('kv_cache_dtype = "fp3"', False, ".*profile 'p', key 'kv_cache_dtype': .*invalid choice: 'fp3'.*")])
def test_a_flag_sglang_refuses_names_the_profile_and_key(tmp_path, monkeypatch, key, renamed, message):
    if renamed:  # as if SGLang renamed --kv-cache-dtype: our FLAGS table still says the old spelling
        monkeypatch.setitem(command.FLAGS, "kv_cache_dtype", "--kv-cache-type")
    path = tmp_path / "server.toml"
    path.write_text(f'[profile.base]\nmodel_path = "m"\n[profile.p]\ninherits = "base"\n{key}\n')
    with pytest.raises(AssertionError) as e:
        parse(load_server_profile("p", path), "p", str(path))
    assert re.fullmatch(message.format(path=re.escape(str(path)), pin=re.escape(PIN)), str(e.value), re.S)


def test_simulators_sglang_flags_are_sglangs():
    """The simulator takes SGLang's spellings (the launcher starts it the same way): each of them,
    stored under SGLang's name (/server_info shows it), and each --kv-cache-dtype choice."""
    ours = argparse.ArgumentParser(allow_abbrev=False)
    sim_cli._sglang_flags(ours)
    theirs = sglang_parser()._option_string_actions
    flags = [f for f in ours._option_string_actions if f.startswith("--")]
    assert sorted(f for f in flags if f not in theirs) == []
    assert {f: ours._option_string_actions[f].dest for f in flags} == {f: theirs[f].dest for f in flags}
    assert set(sim_cli.KV_CACHE_DTYPES) <= set(theirs["--kv-cache-dtype"].choices)


def test_every_tune_candidate_of_the_tuned_profile_parses_with_sglangs_parser(tmp_path):
    """tune's LEVERS (gen_pipeline/tune/plan.py) applied to the tuned profile: each launch command parses, to
    the value the candidate is named for."""
    from gen_pipeline.tune.plan import TuneOptions, candidate, plan_profile

    tuned = load_server_profile("tuned")
    base = plan_profile(tuned, TuneOptions(output_root=tmp_path, config_dir=DEFAULT_SERVER_CONFIG.parent), 4500)
    actions = sglang_parser()._option_string_actions
    for lever in LEVERS:
        c = candidate(tuned, lever, base)
        args = parse(c.profile, c.name, "tune")
        action = actions[lever.flag]
        assert getattr(args, action.dest) == action.type(c.name.rpartition("=")[2]), c.name


@functools.cache
def sglang_sources() -> dict[str, str]:
    """Every module of the installed SGLang but srt/server_args.py (which parses the flags), by relative path."""
    files = {f.relative_to(SGLANG).as_posix(): f for f in sorted(SGLANG.rglob("*.py"))}
    return {path: f.read_text(errors="replace") for path, f in files.items() if path != "srt/server_args.py"}


@pytest.mark.parametrize("lever", LEVERS, ids=[lv.name for lv in LEVERS])
def test_a_tune_lever_is_marked_inert_exactly_when_sglang_never_reads_its_field(lever: Lever):
    """A lever marked inert (tune skips it: a trial would measure nothing) has a ServerArgs field no module of
    SGLang but server_args.py names; every other lever's field is named somewhere (a flag parsed and ignored
    would be an inert lever tune still spends trials on)."""
    dest = sglang_parser()._option_string_actions[lever.flag].dest
    readers = [path for path, text in sglang_sources().items() if dest in text]  # a mention: read or not
    where = f"SGLang {installed_version()} ({SGLANG})"
    if lever.inert:
        assert readers == [], (
            f"{where}: {', '.join(readers)} name {dest}, so {lever.flag} may act now; drop inert= from the "
            f"{lever.name} lever in gen_pipeline/tune/plan.py (it said: {lever.inert}) so tune tries it again.")
    else:
        assert readers, (
            f"{where}: no module but srt/server_args.py names {dest}, so {lever.flag} is parsed and ignored; mark "
            f"the {lever.name} lever inert=\"SGLang {installed_version()} parses {lever.flag} but ...\" in "
            "gen_pipeline/tune/plan.py so tune skips it.")


def test_a_profiles_speculative_extra_args_reach_sglang(tmp_path):
    """A draft is set through extra_args (issue 34 part 3): the flags reach the launch line verbatim, SGLang's
    parser takes them, and /get_server_info's speculative_algorithm (what run/connect.py reads) is that field."""
    path = tmp_path / "server.toml"
    spec = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d", "--speculative-num-steps",
            "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    path.write_text(f'[profile.p]\nmodel_path = "m"\nextra_args = {spec!r}\n'.replace("'", '"'))
    profile = load_server_profile("p", path)
    assert command.build_command(profile, port=30000, python="python")[-len(spec):] == spec
    args = parse(profile, "p", str(path))
    assert (args.speculative_algorithm, args.speculative_draft_model_path, args.speculative_num_steps,
            args.speculative_eagle_topk, args.speculative_num_draft_tokens) == ("EAGLE3", "d", 3, 1, 4)
