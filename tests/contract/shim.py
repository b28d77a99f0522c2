"""Stubs, before `import sglang`, what SGLang 0.5.17 imports and a CPU machine cannot load: only `torchvision`
(PyPI's wheels are CUDA builds); any `torchvision.*` module or attribute is a placeholder that raises if called."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = ("torchvision",)


class _Placeholder:
    """Stands for any torchvision object; attribute access works, a call says what happened."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args: object, **kwargs: object) -> object:
        raise RuntimeError(f"{self._name} is stubbed in the contract venv (tests/contract/shim.py)")

    def __repr__(self) -> str:
        return f"<stub {self._name}>"


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__version__ = "0.0+contract-stub"
        module.__file__ = __file__  # some callers look at where a module lives
        module.__getattr__ = _Placeholder(spec.name).__getattr__  # type: ignore[method-assign]
        return module

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    """Put the stub finder first on sys.meta_path (idempotent)."""
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())
