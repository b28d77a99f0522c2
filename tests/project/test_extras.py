"""Every extra installs what its package imports (read with `ast`, checked against the installed distributions'
metadata); the simulator runs with only the [sim] closure importable (an import hook)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from sglang_sim.testing import SimProcess, free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
FIRST_PARTY = {"gen_pipeline", "sglang_sim", "bench", "tests"} | {p.stem for p in (ROOT / "tests").rglob("*.py")}
# Imported only when present, each with a fallback or a skip (not a dependency of any extra):
OPTIONAL = {"transformers": "check's token counts (reports/lengths.py) and a skipped test",
            "tokenizers": "a test skipped without transformers",
            "specforge": "SpecForge's own loader in test_export_tokens: `make venv` installs it --no-deps "
                         "(Makefile SPECFORGE_PIN: its torch-heavy dependencies are not needed by that module)",
            "bpe_openai": "bench loops' token counts (the bench extra; it falls back to the simulator's tokenizer)"}
# Which extras each part of the tree is run with.
SCOPES = {
    # matplotlib: the report extra, below; jinja2: the template extra (export/direct.py, only with transformers)
    "gen_pipeline (core)": ([], ["gen_pipeline"], {"matplotlib", "jinja2"}),
    "gen_pipeline.reports.page [report]": (["report"], ["gen_pipeline/reports/page.py"], set()),
    "sglang_sim [sim]": (["sim"], ["sglang_sim"], set()),
    # bench/gpu runs on the GPU node with the sglang extra (torch, transformers); tests/contract in its own venv
    "tests + bench [test]": (["test"], ["tests", "bench"], {"torch"}),
}
SKIP_PARTS = {"contract", "gpu"}


def requirements(extras: list[str]) -> list[str]:
    """The project's requirement strings for `extras`, its self-references (gen-pipeline[sim]) expanded."""
    found, todo, done = list(PROJECT["dependencies"]), list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in done:
            continue
        done.add(extra)
        for dep in PROJECT["optional-dependencies"][extra]:
            req = Requirement(dep)
            if canonicalize_name(req.name) == canonicalize_name(PROJECT["name"]):
                todo += sorted(req.extras)
            else:
                found.append(dep)
    return found


def closure(extras: list[str]) -> set[str]:
    """Every distribution `pip install gen-pipeline[extras]` brings (canonical names), read from the
    installed distributions' metadata; fails on a requirement that applies here and is not installed."""
    seen: set[str] = set()
    todo = [(Requirement(r), "") for r in requirements(extras)]
    while todo:
        req, from_extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": from_extra}):
            continue
        name = canonicalize_name(req.name)
        dist_extras = sorted(req.extras)
        key = f"{name}[{','.join(dist_extras)}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"{req} applies here but is not installed; run `make venv`")
        for dep in dist.requires or []:
            for extra in ["", *dist_extras]:
                todo.append((Requirement(dep), extra))
    return {key.partition("[")[0] for key in seen}


def imports(paths: list[str]) -> dict[str, str]:
    """Top-level module → first file:line that imports it (absolute imports; `if TYPE_CHECKING:` skipped)."""
    found: dict[str, str] = {}
    for rel in paths:
        base = ROOT / rel
        files = [base] if base.is_file() else sorted(base.rglob("*.py"))
        for path in files:
            if SKIP_PARTS & set(path.relative_to(ROOT).parts):
                continue
            tree = ast.parse(path.read_text(), str(path))
            skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
            for node in ast.walk(tree):
                if id(node) in skipped:
                    continue
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
                for name in names:
                    found.setdefault(name.partition(".")[0], f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def providers() -> dict[str, set[str]]:
    return {top: {canonicalize_name(d) for d in dists} for top, dists in metadata.packages_distributions().items()}


@pytest.mark.parametrize("scope", list(SCOPES))
def test_every_import_is_installed_by_its_extras(scope: str) -> None:
    extras, paths, elsewhere = SCOPES[scope]
    dists, by_module = closure(extras), providers()
    missing = [f"{module} ({where})" for module, where in sorted(imports(paths).items())
               if module not in sys.stdlib_module_names and module not in FIRST_PARTY
               and module not in OPTIONAL and module not in elsewhere and not by_module.get(module, set()) & dists]
    assert missing == [], f"{scope}: imported but not installed by gen-pipeline[{','.join(extras)}]: {missing}"


def test_modules_run_with_python_dash_m_come_with_the_test_extra() -> None:
    """Subprocesses the tests and benchmarks start (`python -m sglang_router.launch_router`, ...)."""
    started = set()
    for path in [*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        if not SKIP_PARTS & set(path.relative_to(ROOT).parts):
            started |= set(re.findall(r'sys\.executable,\s*"-m",\s*"([A-Za-z_][\w.]*)"', path.read_text()))
    dists, by_module = closure(["test"]), providers()
    tops = {m.partition(".")[0] for m in started} - FIRST_PARTY - set(sys.stdlib_module_names)
    assert "sglang_router" in tops
    assert [t for t in sorted(tops) if not by_module.get(t, set()) & dists] == []



ONLY_THESE = """
import importlib.abc, json, runpy, sys
allowed = set(json.loads(sys.argv[1]))

class OnlyTheSimExtra(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in allowed or top in sys.stdlib_module_names:
            return None
        raise ModuleNotFoundError(f"No module named {name!r} (not installed by gen-pipeline[sim])", name=name)

sys.meta_path.insert(0, OnlyTheSimExtra())
sys.argv = ["sglang_sim", *sys.argv[2:]]
runpy.run_module("sglang_sim", run_name="__main__", alter_sys=True)
"""


def test_the_simulator_runs_with_only_the_sim_extra(tmp_path: Path) -> None:
    dists = closure(["sim"])
    allowed = sorted({"gen_pipeline", "sglang_sim"} | {t for t, ds in providers().items() if ds & dists})
    port = free_port()
    log_path = tmp_path / "sim.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", ONLY_THESE, json.dumps(allowed), "--host", "127.0.0.1",
                                 "--port", str(port), "--sim-profile", "fast", "--sim-startup-s", "0",
                                 "--enable-metrics"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    sim = SimProcess(proc, port, log_path)
    try:
        wait_healthy(sim, 60)
        chat = httpx.post(sim.url + "/v1/chat/completions", timeout=30, json={
            "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]})
        assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] > 0
        assert "sglang:num_running_reqs" in httpx.get(sim.url + "/metrics", timeout=30).text
        assert "not installed by gen-pipeline[sim]" not in sim.log_text()
    finally:
        sim.stop()



GPU_INSTALL = "make venv EXTRAS=gpu"
# What each make target a user runs on the GPU node needs beyond the core install (top-level modules; the
# distributions are named alike): SGLang for the servers it launches, matplotlib for report's plots, the
# chat-template tools for check's token counts and export --format tokens, the simulator for the demos.
TARGET_NEEDS = {
    "generate": {"sglang"}, "probe-kv": {"sglang"}, "tune": {"sglang"}, "report": {"matplotlib"},
    "check": {"transformers", "jinja2"}, "export": {"transformers", "jinja2"},
    "demo": {"starlette", "uvicorn"}, "demo-job": {"starlette", "uvicorn"},
    "status": set(), "validate": set(), "plan": set(), "diagnose": set(), "venv": set(),
}
# The developer's targets: the test extra (make venv EXTRAS=test), or their own venv (contract, docs).
DEV_TARGETS = {"test", "e2e", "bench-test", "lint", "chaos", "slurm-test", "contract", "bench", "docs", "clean"}


def user_docs() -> dict[str, str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text() for p in pages}


def gpu_requirements() -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements(["gpu"])}


def test_every_documented_make_target_has_what_it_needs_in_the_one_gpu_install() -> None:
    documented = {t for text in user_docs().values() for t in re.findall(r"(?:^|`)make ([a-z][\w-]*)", text, re.M)}
    makefile = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    assert documented - makefile == set(), "documented make targets the Makefile lacks"
    assert sorted(documented - DEV_TARGETS - set(TARGET_NEEDS)) == [], "say what these targets need (TARGET_NEEDS)"
    missing = {t: sorted(TARGET_NEEDS[t] - gpu_requirements()) for t in documented - DEV_TARGETS}
    assert {t: m for t, m in missing.items() if m} == {}, f"not brought by {GPU_INSTALL}"
    # every `make venv EXTRAS=` a user reads (docs, the tool's messages) is the GPU install's, and every
    # `pip install -e '.[X]'` a message names installs a part of it
    seen = {f"{where}: {m}" for where, text in user_docs().items() for m in re.findall(r"make venv [^`\n]*", text)
            if "EXTRAS=" in m and "EXTRAS=gpu" not in m and "EXTRAS=test" not in m}
    assert seen == set()
    gpu_extras = set(PROJECT["optional-dependencies"]["gpu"][0].partition("[")[2].rstrip("]").split(","))
    for path in sorted((ROOT / "gen_pipeline").rglob("*.py")):
        text = path.read_text()
        assert set(re.findall(r"EXTRAS=([\w,]+)", text)) <= {"gpu", "...,gpu"}, path
        assert set(re.findall(r"pip install -e '\.\[(\w+)\]'", text)) <= gpu_extras | {"gpu"}, path


def test_the_optional_imports_come_with_their_extra_and_the_gpu_install() -> None:
    """Whatever gen_pipeline or the simulator imports beyond the core install comes with its extra and the gpu one."""
    core, by_module = closure([]), providers()
    assert by_module["matplotlib"] & closure(["report"]) and not by_module["matplotlib"] & core  # core: without it
    for module in ("starlette", "uvicorn"):
        assert by_module[module] & closure(["sim"]) and not by_module[module] & core
    assert by_module["sglang_router"] & closure(["router"])  # an sglang-router in front of several servers
    optional = {m for m in imports(["gen_pipeline", "sglang_sim"])
                if m not in sys.stdlib_module_names and m not in FIRST_PARTY
                and not by_module.get(m, set()) & core and m != "_typeshed"}
    assert optional == {"jinja2", "matplotlib", "starlette", "transformers", "uvicorn"}
    assert optional - gpu_requirements() == set()


def test_report_without_matplotlib_names_the_gpu_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from gen_pipeline.errors import ConfigError
    from gen_pipeline.reports import page

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ConfigError) as e:
        page._pyplot()
    assert str(e.value) == ("report needs matplotlib, which is not installed in this Python. On the GPU node: "
                            "make venv EXTRAS=gpu (the one install that every make target runs with); into "
                            "another Python: pip install -e '.[report]' from the checkout.")
