"""Which Python `make` runs and what `make venv` installs into it (VENV, EXTRAS, PIP_ARGS, VENV_ARGS). A fake
interpreter logs every command line (and makes a venv on `-m venv`): make's real recipes run without pip."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline_helpers import write_dataset

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")

FAKE_PYTHON = textwrap.dedent("""\
    #!/bin/sh
    # logs its command line (and the hint the Makefile exports to generate), makes a venv on -m venv
    hint="${GEN_PIPELINE_MAKE_SGLANG:+ [GEN_PIPELINE_MAKE_SGLANG=$GEN_PIPELINE_MAKE_SGLANG]}"
    printf '%s\\n' "$0 $*$hint" >> "$FAKE_LOG"
    if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
        for last; do :; done
        mkdir -p "$last/bin" && cp "$0" "$last/bin/python"
    fi
    """)
# --system-site-packages: the new venv's site-packages, then the parent venv's added by a .pth (Makefile CHAIN_SITE)
CHAIN = ['TMP/gpu/bin/python -c import sysconfig; print(sysconfig.get_paths()["purelib"])',
         'TMP/system/python3 -c import pathlib, site, sys; sys.prefix != sys.base_prefix and pathlib.Path(sys.argv[1], '
         '"zz_parent_venv_site.pth").write_text("\\n".join(site.getsitepackages()) + "\\n") ']


def fake_python(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FAKE_PYTHON)
    path.chmod(0o755)
    return path


# what an outer make passes down (`make test ARGS=...` exports ARGS too): the makes a test runs start clean
OUTER_MAKE = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "VENV", "EXTRAS", "ARGS")

def make(tmp_path: Path, *args: str, timeout_s: float = 60) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`make ARGS` in the checkout as from a user's shell (not a sub-make of `make test`); the fake
    interpreter's log lines of this call, with tmp_path written as TMP."""
    log = tmp_path / "python.log"
    before = log.read_text().splitlines() if log.exists() else []
    env = {k: v for k, v in os.environ.items() if k not in OUTER_MAKE}
    env["FAKE_LOG"] = str(log)
    r = subprocess.run(["make", "--no-print-directory", *args], capture_output=True, text=True, cwd=REPO,
                       env=env, timeout=timeout_s)
    after = log.read_text().splitlines() if log.exists() else []
    return r, [line.replace(str(tmp_path), "TMP") for line in after[len(before):]]


def test_make_venv_with_extras_then_every_target_runs_that_venv(tmp_path: Path) -> None:
    python3 = fake_python(tmp_path / "system" / "python3")
    r, calls = make(tmp_path, "venv", f"PYTHON={python3}", f"VENV={tmp_path}/gpu", "EXTRAS=test,sglang",
                    "VENV_ARGS=--system-site-packages")
    assert r.returncode == 0, r.stderr
    assert calls == [
        "TMP/system/python3 -m venv --system-site-packages TMP/gpu",
        *CHAIN,
        "TMP/gpu/bin/python -m pip install -q --upgrade pip",
        "TMP/gpu/bin/python -m pip install -q -e .[test,sglang]",
        "TMP/gpu/bin/python -m pip install -q --no-deps specforge==0.2.0",
    ]
    assert (tmp_path / "gpu" / ".installed").read_text() == "test,sglang\n"

    # the venv keeps its extras: no reinstall, and generate learns how to add SGLang to this very venv
    r, calls = make(tmp_path, "generate", f"VENV={tmp_path}/gpu", "DATASET=B2", "LIMIT=5")
    assert r.returncode == 0, r.stderr
    assert calls == ["TMP/gpu/bin/python -m gen_pipeline generate --dataset B2 --limit 5 "
                     "[GEN_PIPELINE_MAKE_SGLANG=make venv VENV=TMP/gpu EXTRAS=test,gpu]"]
    r, calls = make(tmp_path, "status", f"VENV={tmp_path}/gpu", "CONFIG_DIR=datasets_cfg/offline",
                    "OUTPUT_DIR=outputs/offline", "ARGS=--json")
    assert r.returncode == 0, r.stderr
    assert calls == ["TMP/gpu/bin/python -m gen_pipeline status --config-dir datasets_cfg/offline "
                     "--output-dir outputs/offline --json"]


def test_other_extras_reinstall_offline_and_test_targets_say_what_is_missing(tmp_path: Path) -> None:
    fake_python(tmp_path / "gpu" / "bin" / "python")
    (tmp_path / "gpu" / ".installed").write_text("test,sglang\n")
    r, calls = make(tmp_path, "venv", f"VENV={tmp_path}/gpu", "EXTRAS=sglang",
                    "PIP_ARGS=--no-index --find-links /data/wheels")
    assert r.returncode == 0, r.stderr
    assert calls == ["TMP/gpu/bin/python -m pip install -q --no-index --find-links /data/wheels -e .[sglang]"]
    assert (tmp_path / "gpu" / ".installed").read_text() == "sglang\n"

    r, calls = make(tmp_path, "test", f"VENV={tmp_path}/gpu")
    assert (r.returncode, calls) == (2, [])
    assert r.stderr.endswith(f"*** {tmp_path}/gpu has the extras sglang, without the test tools: "
                             "make venv EXTRAS=test,sglang.  Stop.\n")
    # a venv made before the stamp named its extras is not reinstalled
    fake_python(tmp_path / "old" / "bin" / "python")
    (tmp_path / "old" / ".installed").write_text("")  # what `touch` left
    r, calls = make(tmp_path, "plan", f"VENV={tmp_path}/old")
    assert r.returncode == 0, r.stderr
    assert calls == ["TMP/old/bin/python -m gen_pipeline plan"]


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed here")
def test_make_generate_without_sglang_names_the_make_command(tmp_path: Path) -> None:
    toml = write_dataset(tmp_path, target=10)
    r, _ = make(tmp_path, "generate", f"DATASET={toml}", f"OUTPUT_DIR={tmp_path}/out", timeout_s=120)
    assert r.returncode == 2  # make's own code for a failed recipe
    python = REPO / ".venv" / "bin" / "python"
    # the extras this checkout's venv was made with, plus gpu (`make venv EXTRAS=test,bench` for the benches)
    extras = ",".join(e for e in ((REPO / ".venv" / ".installed").read_text().strip() or "test").split(",")
                      if e not in ("sglang", "gpu"))
    assert (f"error: datasets_cfg/server.toml [profile.tuned] launches SGLang ({python} -m sglang.launch_server), "
            "but sglang is not installed in this Python. Install it into the venv make runs: make venv "
            f"EXTRAS={extras + ',' if extras else ''}gpu (offline: add PIP_ARGS=\"--no-index --find-links DIR\", "
            "DIR holding the wheels; "
            "docs/install.md, \"On the GPU node\"). Without a GPU, try the pipeline on the simulator: --server sim "
            "(make demo).\n") in r.stderr
    assert not (tmp_path / "out" / "T").exists()


def test_the_offline_no_deps_install_and_demo_job_run_the_readmes_commands(tmp_path: Path) -> None:
    # docs/install.md "On the GPU node", a wheel set of only what the image lacks (bench/gpu/user_path.sh)
    python3 = fake_python(tmp_path / "system" / "python3")
    r, calls = make(tmp_path, "venv", f"PYTHON={python3}", f"VENV={tmp_path}/gpu", "EXTRAS=gpu",
                    "VENV_ARGS=--system-site-packages", "PIP_ARGS=--no-index --no-deps --no-build-isolation")
    assert r.returncode == 0, r.stderr
    assert calls == [
        "TMP/system/python3 -m venv --system-site-packages TMP/gpu",
        *CHAIN,
        "TMP/gpu/bin/python -m pip install -q --no-index --no-deps --no-build-isolation -e .[gpu]",
    ]
    assert (tmp_path / "gpu" / ".installed").read_text() == "gpu\n"
    r, calls = make(tmp_path, "demo-job", f"VENV={tmp_path}/gpu")
    assert r.returncode == 0, r.stderr
    assert calls == [
        "TMP/gpu/bin/python -m gen_pipeline generate --dataset all --server sim --config-dir datasets_cfg/offline "
        "--output-dir outputs/offline",
        "TMP/gpu/bin/python -m gen_pipeline status --config-dir datasets_cfg/offline --output-dir outputs/offline"]


PURELIB = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


def test_a_venv_made_from_a_venvs_python_still_sees_its_packages(tmp_path: Path) -> None:
    """A python3 that is itself a venv (the lent H200's image): `--system-site-packages` links the *base*
    interpreter's site-packages, so make adds the parent venv's with a .pth, after the new venv's own."""
    base = tmp_path / "image-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base)], check=True, timeout=60)
    purelib = subprocess.run([str(base / "bin" / "python"), "-c", PURELIB], capture_output=True, text=True,
                             check=True).stdout.strip()
    (Path(purelib) / "image_only_pkg.py").write_text("WHERE = 'image'\n")
    new = tmp_path / "venv"
    r, _ = make(tmp_path, f"VENV={new}", f"PYTHON={base / 'bin' / 'python'}",
                "VENV_ARGS=--system-site-packages --without-pip", f"{new}/pyvenv.cfg")
    assert r.returncode == 0, r.stdout + r.stderr
    probe = ("import sys, image_only_pkg; "
             "print(image_only_pkg.WHERE, sys.path.index(sys.argv[1]) < sys.path.index(sys.argv[2]))")
    own = subprocess.run([str(new / "bin" / "python"), "-c", PURELIB], capture_output=True, text=True,
                         check=True).stdout.strip()
    seen = subprocess.run([str(new / "bin" / "python"), "-c", probe, own, purelib], capture_output=True, text=True)
    assert seen.stdout.split() == ["image", "True"], seen.stderr  # the image's package, the venv's own first
    plain = tmp_path / "plain"  # without --system-site-packages nothing of the image leaks in
    r, _ = make(tmp_path, f"VENV={plain}", f"PYTHON={base / 'bin' / 'python'}", "VENV_ARGS=--without-pip",
                f"{plain}/pyvenv.cfg")
    assert r.returncode == 0
    assert subprocess.run([str(plain / "bin" / "python"), "-c", "import image_only_pkg"]).returncode == 1
