"""The metrics, /v1/loads and /server_info fields gen_pipeline reads exist in SGLang's source with the types we
assume, and the simulator serves exactly those (SGLang's collectors, LoadSnapshot, ServerArgs, `ast`)."""

from __future__ import annotations

import ast
import dataclasses
import functools

import httpx
import msgspec
from prometheus_client.parser import text_string_to_metric_families
from sglang_contract import ParsedArgs, source

from gen_pipeline.server import capacity, load
from sglang_sim import cli as sim_cli

# SGLang 0.5.17's scheduler labels at dp_size 1 (observability/metrics_collector.py builds them:
# dp_rank is added only when the scheduler has one).
SCHEDULER_LABELS = {"model_name": "m", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
# load._GAUGES field -> the Prometheus type we assume
COUNTER_FIELDS = {"retractions_total", "gen_tokens_total"}


@functools.cache
def sglang_metrics() -> dict[str, tuple[str, frozenset[str]]]:
    """family name -> (type, label names) of every metric SGLang's scheduler + tokenizer define."""
    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector, TokenizerMetricsCollector

    out = {}
    args = ParsedArgs(model_path="m")  # registered once per process: the global prometheus registry
    for collector in (SchedulerMetricsCollector(labels=dict(SCHEDULER_LABELS), server_args=args),
                      TokenizerMetricsCollector(labels={"model_name": "m"}, server_args=args)):
        for metric in vars(collector).values():
            if hasattr(metric, "_type") and hasattr(metric, "_labelnames"):
                out[metric._name] = (metric._type, frozenset(metric._labelnames))
    return out


def family(name: str, field: str) -> tuple[str, str]:
    """Sample name we read -> (family name, type we assume)."""
    if field in COUNTER_FIELDS:
        return name.removesuffix("_total"), "counter"
    return name, "gauge"


def we_read() -> dict[str, str]:
    return dict(family(name, field) for field, names in load._GAUGES.items() for name in names
                if name.startswith("sglang:") and name not in load.OLDER_SGLANG_NAMES)


def test_metrics_we_read_exist_and_the_simulator_serves_sglangs(sim):
    theirs = sglang_metrics()
    assert {name: theirs.get(name, ("missing",))[0] for name in we_read()} == we_read()
    # the simulator serves SGLang's metrics exactly
    served = {f.name: f for f in text_string_to_metric_families(httpx.get(sim.url + "/metrics").text)}
    for name, fam in served.items():
        assert name in theirs, f"the simulator serves {name}, which SGLang does not define"
        labels = {k for s in fam.samples for k in s.labels}
        assert (fam.type, labels) == (theirs[name][0], set(theirs[name][1])), name
    assert set(we_read()) <= set(served), "a metric we read is missing from the simulator"


def _fields(struct: type) -> dict[str, object]:
    return {f.name: f.type for f in msgspec.structs.fields(struct)}


def _returned_dict_keys(module: str, function: str) -> set[str]:
    """Keys of the dict literal(s) `function` in `module` returns."""
    tree = ast.parse(source(module))
    fn = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and n.name == function)
    keys = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Dict):
            keys |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return keys


def test_v1_loads_fields_we_read_and_the_simulators_shape_are_sglangs(sim):
    from sglang.srt.managers.load_snapshot import _CORE_KEYS, _SECTION_FIELDS, LoadSnapshot, QueueMetrics

    fields = _fields(LoadSnapshot)
    ints = ("num_running_reqs", "num_waiting_reqs", "num_used_tokens", "max_total_num_tokens", "max_running_requests")
    assert {k: fields[k] for k in ints} == dict.fromkeys(ints, int)
    assert (fields["token_usage"], fields["gen_throughput"]) == (float, float)
    assert {"loads", "version"} <= _returned_dict_keys("srt/entrypoints/v1_loads.py", "get_loads")
    body = httpx.get(sim.url + "/v1/loads").json()
    assert set(body) == _returned_dict_keys("srt/entrypoints/v1_loads.py", "get_loads")
    for entry in body["loads"]:
        core = {k: v for k, v in entry.items() if k not in _SECTION_FIELDS}
        assert set(core) == set(_CORE_KEYS)
        msgspec.convert(core, LoadSnapshot)  # every value of SGLang's type (raises otherwise)
        assert set(entry) - set(core) <= {"queues"}
        queues = entry["queues"]
        assert list(queues) == list(_fields(QueueMetrics))
        msgspec.convert(list(queues.values()), QueueMetrics)


def _server_info_keys() -> dict[str, object]:
    """/server_info's keys: ServerArgs fields (type as annotated) + scheduler_info + its own."""
    from sglang.srt.server_args import ServerArgs

    keys: dict[str, object] = {f.name: f.type for f in dataclasses.fields(ServerArgs)}
    keys |= dict.fromkeys(_returned_dict_keys("srt/managers/scheduler.py", "get_init_info"), "scheduler_info")
    keys |= dict.fromkeys(_returned_dict_keys("srt/entrypoints/http_server.py", "server_info"), "server_info")
    return keys


def _internal_state_keys() -> set[str]:
    """Keys the scheduler's get_internal_state sets on its dict (`ret[...] = ...`)."""
    tree = ast.parse(source("srt/managers/scheduler.py"))
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "get_internal_state")
    return {t.slice.value for n in ast.walk(fn) if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)}


def test_server_info_fields_we_read_and_the_simulators_keys_are_sglangs(sim):
    keys = _server_info_keys()
    read = set(capacity.INFO_KEYS) | {"max_total_num_tokens", "internal_states", "dp_size", "max_running_requests"}
    assert sorted(read - set(keys)) == []
    assumed = {"tp_size": "int", "dp_size": "int", "mem_fraction_static": "float", "kv_cache_dtype": "str",
               "enable_hierarchical_cache": "bool", "hicache_size": "int", "num_continuous_decode_steps": "int",
               "context_length": "int", "max_running_requests": "int", "enable_metrics": "bool",
               "model_path": "str", "reasoning_parser": "str"}
    for key, typ in assumed.items():
        assert typ in str(keys[key]), (key, keys[key])
    assert "effective_max_running_requests_per_dp" in _internal_state_keys()
    body = httpx.get(sim.url + "/server_info").json()
    parser = sim_cli.build_parser()
    sim_only = {a.dest for g in parser._action_groups if g.title and g.title.startswith("simulator")
                for a in g._group_actions} | {"sim_time_s", "sim_hicache_tokens"}
    assert sorted(set(body) - set(keys) - sim_only) == []
    state = body["internal_states"][0]
    assert isinstance(state["effective_max_running_requests_per_dp"], int)
    assert isinstance(body["max_total_num_tokens"], int) and body["max_total_num_tokens"] == 3000
