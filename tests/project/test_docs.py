"""The user docs (README + docs/) say what the code does: the launch line is the launcher's, every link to a
measurement names a section the benchmarks write, and no page speaks the project's internal history."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

from gen_pipeline.config.server import load_server_profile
from gen_pipeline.server.command import build_command

from user_docs import PAGES, REPO, user_docs


def test_the_documented_launch_line_is_what_the_tuned_profile_starts() -> None:
    argv = build_command(load_server_profile("tuned"), port=30000, python="python")
    line = shlex.join(argv)
    assert "--stream-interval 8" in line and "--reasoning-parser kimi_k2" in line
    assert f"```text\n{line}\n```" in (REPO / "docs" / "gpu-node.md").read_text()


MEASURED = REPO / "docs" / "measurements.md"
# a pointer to a section of the measurements page, in code or a comment: the page with a #anchor, or the page
# followed by a quoted heading name (`docs/measurements.md, "name"`, `("name")`, `(section "name")`); a
# comment or docstring may break it over lines
_ANCHOR = re.compile(r"docs/measurements\.md#([\w-]+)")
_NAMED = re.compile(r"docs/measurements\.md`?[\s,(]*(?:section\s+)?\"([^\"]+)\"")
_BARE = re.compile(r"docs/measurements\.md, (\w[\w ]*):")  # in a message: (docs/measurements.md, job: ...)


def _pointers() -> list[tuple[str, str, str]]:
    """(file, kind, target) of every pointer to the measurements page in the product, the simulator, the bench
    and the tests (this file's patterns excluded)."""
    found = []
    files = [p for d in ("gen_pipeline", "sglang_sim", "bench", "tests") for p in sorted((REPO / d).rglob("*"))
             if p.suffix in (".py", ".md", ".sh") and p.resolve() != Path(__file__).resolve()]
    for path in files:
        text = re.sub(r"\n\s*(?:#\s*)?", " ", path.read_text())  # a name broken over comment or docstring lines
        rel = str(path.relative_to(REPO))
        found += [(rel, "anchor", m.group(1)) for m in _ANCHOR.finditer(text)]
        found += [(rel, "name", m.group(1)) for m in (*_NAMED.finditer(text), *_BARE.finditer(text))]
    return found


def test_every_pointer_to_the_measurements_page_names_a_section_it_has() -> None:
    """Code says why and points at the measured figure by the heading's name (or its anchor): a renamed or
    dropped heading leaves a pointer nobody can follow. A name is the start of a heading (case aside)."""
    text = MEASURED.read_text()
    anchors = set(re.findall(r'<a id="([\w-]+)"></a>', text))
    linked = set(re.findall(r"measurements\.md#([\w-]+)", user_docs()))  # the docs' links
    assert linked and linked - anchors == set()
    headings = [h.strip().lower() for h in re.findall(r"^#{2,4} (.+)$", text, re.M)]
    pointers = _pointers()
    assert len([p for p in pointers if p[1] == "name"]) >= 10  # the pattern still finds the product's pointers
    broken = [p for p in pointers
              if (p[1] == "anchor" and p[2] not in anchors)
              or (p[1] == "name" and p[2] not in anchors and not any(h.startswith(p[2].lower()) for h in headings))]
    assert broken == []


def test_the_measurements_page_speaks_no_project_history() -> None:
    """Headings say what was measured, not which issue asked for it; no page names an issue, a branch or "the
    seed" (the simulator's profile is "the seed profile"), nor does a user page ("the seed": the first job)."""
    found = [f"{p.name}: {m.group(0)}" for p in PAGES for m in
             re.finditer(r"\bissue \d+|\bthe seed\b|\bseed-calibrated|\bseed's", p.read_text())]
    assert found == []
    text = MEASURED.read_text()
    headings = re.findall(r"^#{1,4} (.+)$", text, re.M)
    assert [h for h in headings if re.search(r"\bissue\b|\bthe seed\b", h, re.I)] == []
    assert re.findall(r"\bissue \d+|\bbranch h-\w+|\bskeleton\b|\bthe seed\b(?![- ]profile)", text, re.I) == []
    # each section (a ## heading and what follows) says when it was measured and the command that measured it
    sections = re.split(r"^(?=## )", MEASURED.read_text(), flags=re.M)[1:]
    command = r"`[^`\n]*(?:python -m |bash bench/|gen-pipeline |pytest)[^`\n]*`"
    assert len(sections) >= 30
    assert [s.splitlines()[0] for s in sections
            if not (re.search(r"\b20\d\d-\d\d-\d\d\b", s) and re.search(command, s))] == []


def _code(text: str) -> list[str]:
    """The lines of fenced code blocks and the inline code spans of a page: where commands are written."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    indented = re.findall(r"^    (\S.*)$", rest, re.M)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"\n(?!\n)", " ", rest))  # a span may wrap a line
    return [line for block in fenced for line in block.splitlines()] + indented + inline


def test_every_documented_command_and_flag_exists() -> None:
    """`gen-pipeline CMD --flag` in the README and the docs: CMD is a command and each flag is one of its own."""
    from gen_pipeline.cli.parser import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    commands = {name: set(p._option_string_actions) for name, p in sub.choices.items()}
    seen, wrong = 0, []
    for page in PAGES:
        for line in _code(page.read_text()):
            # a command line: gen-pipeline first (after $, VAR=value, srun, a venv's bin/), or python's -m anywhere
            for m in re.finditer(r"(?:^(?:\$ )?(?:[A-Z_]+=\S+ )*(?:srun |exec |nohup )?(?:\S*/)?gen-pipeline"
                                 r"|-m gen_pipeline) ([a-z][\w-]*)([^#;&]*)", line.strip()):
                cmd, rest = m.group(1), m.group(2)
                seen += 1
                if cmd not in commands:
                    wrong.append(f"{page.name}: gen-pipeline {cmd}")
                    continue
                wrong += [f"{page.name}: gen-pipeline {cmd} {flag}"
                          for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest) if flag not in commands[cmd]]
    assert seen >= 30 and wrong == []


def test_every_file_the_docs_name_exists() -> None:
    """A path into the repository named in the README or the docs (a test, a bench module, an example) is there."""
    named = {m.group(1).rstrip(".") for page in PAGES for m in
             re.finditer(r"(?<![\w/.-])((?:tests|bench|gen_pipeline|sglang_sim|examples|datasets_cfg)/[\w./-]*[\w/])",
                          page.read_text())}
    assert len(named) >= 20 and sorted(p for p in named if not (REPO / p).exists()) == []
    # `python -m bench NAME` names a benchmark of bench/__main__.py, `python -m bench.X` a module of bench/
    # read, not imported: the default tests import nothing of bench/
    benches = set(re.findall(r'^    "(\w+)": "bench\.', (REPO / "bench" / "__main__.py").read_text(), re.M))
    text = "\n".join(p.read_text() for p in (*PAGES, MEASURED))
    names = set(re.findall(r"python -m bench ([a-z]\w*)", text))
    modules = set(re.findall(r"python -m (bench\.[\w.]+)", text))
    assert len(names) >= 10 and sorted(names - benches) == []
    assert sorted(m for m in modules if not (REPO / (m.replace(".", "/") + ".py")).exists()) == []
