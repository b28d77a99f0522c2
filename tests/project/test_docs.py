"""The user docs (README + docs/) say what the code does: the launch line is the launcher's, every link to a
measurement names a section the benchmarks write, and no page speaks the project's internal history."""

from __future__ import annotations

import re
import shlex

from gen_pipeline.config.server import load_server_profile
from gen_pipeline.server.command import build_command

from user_docs import PAGES, REPO, user_docs


def test_the_documented_launch_line_is_what_the_tuned_profile_starts() -> None:
    argv = build_command(load_server_profile("tuned"), port=30000, python="python")
    line = shlex.join(argv)
    assert "--stream-interval 8" in line and "--reasoning-parser kimi_k2" in line
    assert f"```text\n{line}\n```" in (REPO / "docs" / "gpu-node.md").read_text()


def test_links_to_measurements_name_sections_that_exist() -> None:
    measured = (REPO / "docs" / "measurements.md").read_text()
    anchors = set(re.findall(r'<a id="([\w-]+)"></a>', measured))
    linked = set(re.findall(r"measurements\.md#([\w-]+)", user_docs()))
    assert linked and linked - anchors == set()


def test_no_page_speaks_the_projects_history() -> None:
    """A new user cannot follow "issue 19" or "the seed" (the first job's measurements)."""
    found = [f"{p.name}: {m.group(0)}" for p in PAGES for m in
             re.finditer(r"\bissue \d+|\bthe seed\b|\bseed-calibrated|\bseed's", p.read_text())]
    assert found == []
