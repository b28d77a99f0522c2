"""SGLang 0.5.17's HTTP benchmark client (`python -m sglang.bench_serving`) where SGLang's runtime cannot
be imported: the dry run's contract venv has SGLang's files but no torchvision, and `import sglang` runs
sglang/__init__.py, which imports the whole runtime.

    python -m bench.gpu.sglang_client [bench_serving flags]

bench_serving itself is a pure HTTP client (aiohttp, transformers' tokenizer, numpy); of SGLang it imports
sglang.benchmark.* and two names: FAKE_BOOTSTRAP_HOST (sglang/srt/disaggregation/utils.py, whose module
imports the runtime) and resolve_base_url / resolve_host_port (sglang/srt/utils/network.py). This registers
the packages on the way as bare namespaces (their __init__ files are not run) and that one constant, then
runs sglang.bench_serving as __main__, unchanged. On the GPU machine the phase runs
`python -m sglang.bench_serving` directly.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
import types
from pathlib import Path

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # sglang/srt/disaggregation/utils.py, 0.5.17


def _bare(name: str, path: Path) -> None:
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    sys.modules[name] = module


def main() -> None:
    spec = importlib.util.find_spec("sglang")  # a top-level package is found, not imported
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"sglang is not installed in {sys.executable}: run this with the Python SGLang is installed in")
    root = Path(list(spec.submodule_search_locations)[0])
    for name, sub in (("sglang", ""), ("sglang.srt", "srt"), ("sglang.srt.utils", "srt/utils"),
                      ("sglang.srt.disaggregation", "srt/disaggregation")):
        _bare(name, root / sub)
    utils = types.ModuleType("sglang.srt.disaggregation.utils")
    utils.FAKE_BOOTSTRAP_HOST = FAKE_BOOTSTRAP_HOST  # type: ignore[attr-defined]
    sys.modules[utils.__name__] = utils
    sys.argv[0] = "sglang.bench_serving"
    runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
