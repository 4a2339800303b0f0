"""README.md is a front page and docs/ holds the rest: links resolve, cited result files are committed."""
import re
from pathlib import Path

import pytest

from rlkit.core.env import REPO_ROOT
from rlkit.report import sections as report

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
IDS = [p.relative_to(REPO_ROOT).as_posix() for p in DOCS]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CITED = re.compile(r"`(outputs/[^`<>*\s]+)`")  # a cited committed file or folder (no <placeholder>)


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of ``path``."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", path.read_text(), flags=re.MULTILINE)}


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_relative_links_resolve(doc):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        name, _, anchor = target.partition("#")
        path = (doc.parent / name).resolve() if name else doc
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
            broken.append(target)
    assert not broken, f"{doc.name}: links that lead nowhere: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_cited_results_are_committed(doc):
    """A path under outputs/ that a doc quotes names something git tracks, not a local run."""
    from rlkit.core.results import NotACheckout, tracked_files

    try:
        tracked = {p.relative_to(REPO_ROOT).as_posix() for p in tracked_files(REPO_ROOT / "outputs")}
    except NotACheckout as err:
        pytest.skip(str(err))
    folders = {str(Path(f).parent) + "/" for f in tracked} | {
        "/".join(f.split("/")[:i]) + "/" for f in tracked for i in range(2, f.count("/") + 1)}
    missing = [c for c in CITED.findall(doc.read_text()) if c not in tracked and c.rstrip("/") + "/" not in folders]
    assert not missing, f"{doc.name} cites results git does not track: {missing}"


def test_readme_is_a_front_page():
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail into docs/"
    begin, _ = report.markers("arc")
    head = "\n".join(lines[:40])
    assert begin in head and "The seed's arc at the seed's workload, commit" in head, \
        "the headline (the seed's arc at the seed's workload, from one commit) belongs on the first screen"
    for command in ("make demo", "make test", "make lab"):
        assert command in "\n".join(lines), command
    for doc in DOCS[1:]:
        assert f"(docs/{doc.name})" in "\n".join(lines), f"README does not link docs/{doc.name}"
