"""The docs keep up with the code and the repository: every agent setting is in the agent
page's settings table, every result file the benchmarks page cites exists (the build checks
that too), and the README opens with the two commands and points into docs/ at pages that
exist."""

from __future__ import annotations

import re
from pathlib import Path

from hotspan.agent.config import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _section(text: str, title: str) -> str:
    after = text.split(f"\n## {title}\n", 1)[1]
    return after.split("\n## ", 1)[0]


def test_agent_page_lists_every_setting() -> None:
    table = _section((DOCS / "agent.md").read_text(), "Settings")
    assert len(SETTINGS) >= 40, SETTINGS
    missing = [s for s in SETTINGS if f"`{s}`" not in table]
    assert not missing, f"docs/agent.md's settings table leaves out {missing}"


def test_agent_page_has_an_overhead_section() -> None:
    section = _section((DOCS / "agent.md").read_text(), "Overhead")
    assert "bench/results/agent-defaults.md" in section


def test_benchmark_results_cited_exist() -> None:
    cited = set()
    for page in DOCS.glob("*.md"):
        cited |= set(re.findall(r"\(path:\.\./(bench/results/[^)]+)\)", page.read_text()))
    assert cited, "no page links a benchmark result file"
    missing = sorted(c for c in cited if not (ROOT / c).is_file())
    assert not missing, f"the docs link result files that do not exist: {missing}"


def test_readme_opens_with_the_two_commands_and_links_into_docs() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    assert blocks[:2] == [
        "python3 -m pip install . && python3 -m hotspan server\n",
        "bash scripts/test.sh\n",
    ], blocks[:2]
    assert text.index("```sh") < text.index("\n## "), "the commands come before any section"
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 10, links
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links docs that do not exist: {missing}"
