"""A tmpfs in a private mount namespace (`unshare`) for a child process: the kernel's own ENOSPC or EROFS.
Needs user namespaces or root; `require_namespaces()` skips a test with the reason otherwise."""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

_SCRIPT = 'mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@"'


@functools.cache
def _unshare() -> tuple[tuple[str, ...] | None, str]:
    """The unshare prefix that can mount a tmpfs here, or (None, why not)."""
    if shutil.which("unshare") is None:
        return None, "util-linux `unshare` is not installed"
    why = ""
    for prefix in (("unshare", "--user", "--map-root-user", "--mount"), ("unshare", "--mount")):
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([*prefix, "sh", "-c", _SCRIPT, "sh", "size=64k", d, "true"], capture_output=True,
                               text=True, timeout=30)
        if r.returncode == 0:
            return prefix, ""
        why = r.stderr.strip() or f"exit {r.returncode}"
    return None, f"cannot mount a tmpfs in a private mount namespace here ({why}): needs user namespaces or root"


def require_namespaces() -> None:
    if _unshare()[0] is None:
        pytest.skip(_unshare()[1])


def in_tmpfs(mount_at: Path, argv: Sequence[str | Path], *, size: str = "256k", read_only: bool = False) -> list[str]:
    """`argv` run with a fresh tmpfs of `size` (read-only if asked) mounted at `mount_at`, seen by it alone."""
    prefix, why = _unshare()
    assert prefix is not None, why
    options = f"size={size}" + (",ro" if read_only else "")
    return [*prefix, "sh", "-c", _SCRIPT, "sh", options, str(mount_at), *map(str, argv)]
