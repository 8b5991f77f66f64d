"""Outside facts are cited from the project's own docs: every ``docs/sources.md §N`` names a section
that exists, and nothing cites a file that is not part of the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("loadtest", "tests", "docs", "traffic_profiles", "servers", "tools", "README.md")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".j2", ".sh", ".toml"}
CITATION = re.compile(r"docs/sources\.md\s+§(\d+)")


def _files() -> list[Path]:
    out: list[Path] = []
    for name in SCANNED:
        p = ROOT / name
        out += [p] if p.is_file() else [f for f in p.rglob("*") if f.suffix in SUFFIXES and f.is_file()]
    return out


def test_every_citation_names_a_section_of_docs_sources() -> None:
    sections = set(re.findall(r"^## §(\d+) ", (ROOT / "docs" / "sources.md").read_text(), re.M))
    cited: dict[str, list[str]] = {}
    for f in _files():
        for n in CITATION.findall(f.read_text(errors="replace")):
            cited.setdefault(n, []).append(str(f.relative_to(ROOT)))
    assert cited, "no citation found: the scan is broken"
    missing = {n: where for n, where in cited.items() if n not in sections}
    assert not missing, missing


def test_no_citation_of_a_file_outside_the_repository() -> None:
    # The workplace's notes beside the repository (the trace files there are data, read by path).
    outside = re.compile("(REFERENCE|DESIGN)" + r"\.md")
    hits = [str(f.relative_to(ROOT)) for f in _files() if outside.search(f.read_text(errors="replace"))]
    assert not hits, hits
