"""Hand-written sentences of the docs that state a status or a number are checked against the committed files they
cite (issue 46). Each claim names its doc, the words the doc says and how the cited file shows them; a status
sentence ("has not run", "not run yet", "not committed") that no claim checks fails, so a status cannot go stale
unnoticed. Generated blocks are checked by tests/test_report.py instead."""
from __future__ import annotations

import json
import re

import pytest

from rlkit import report
from rlkit.env import REPO_ROOT


def _passed(log: str) -> int:
    """How many tests a committed pytest log says passed, with none failed."""
    text = (REPO_ROOT / log).read_text(errors="replace")
    closing = re.findall(r"=*\s*(\d+) passed(?:, \d+ \w+)*(?: in [\d.]+s)?", text)
    assert closing and "failed" not in text.splitlines()[-1], f"{log}: no passing closing line"
    return int(closing[-1])


def _vllm_ceiling_tok_s(folder: str) -> float:
    return json.loads((REPO_ROOT / folder / "metrics.json").read_text())["output_tok_s"]


# (doc, the words it says, a check of the cited file that must hold for those words to be true)
CLAIMS = [
    ("docs/patches.md", "ran on the H200 with one rank in device session 9 and passed",
     lambda: _passed("outputs/_node/session9/resume-test.console.log") == 1),
    ("docs/patches.md", "in device session 12 and passed, 24 of 24",
     lambda: _passed("outputs/_node/session12/gpu-tests-profile-compiled.log") == 24),
    ("docs/results.md", "15,763 tokens/s), the limit of the two h200-1gpu runs in the table below",
     lambda: round(_vllm_ceiling_tok_s("outputs/_node/vllm_standalone/h200-1gpu")) == 15763
     and sum(1 for p in (REPO_ROOT / "outputs/05_grpo_qwen3_4b").iterdir() if p.name.startswith("h200-1gpu-")) == 2),
]
STATUS = re.compile(r"has not run|not run yet|not run on a GPU|is not committed|no run of [^.]* is committed")
DOCS = ("README.md", "docs/results.md", "docs/patches.md", "docs/offline-node.md", "docs/reliability.md")


def _prose(doc: str) -> str:
    """A doc without its generated blocks, on one line (sentences wrap)."""
    text = (REPO_ROOT / doc).read_text()
    for name in report.BLOCKS:
        begin, end = report.markers(name)
        if begin in text:
            text = text.split(begin)[0] + text.split(end)[1]
    return " ".join(text.split())


@pytest.mark.parametrize("doc,words,check", CLAIMS, ids=[c[1][:40] for c in CLAIMS])
def test_each_claim_is_in_its_doc_and_its_file_bears_it_out(doc, words, check):
    assert words in _prose(doc), f"{doc} no longer says {words!r}: update or drop the claim"
    assert check(), f"{doc} says {words!r}, which its cited file contradicts"


@pytest.mark.parametrize("doc", DOCS)
def test_no_status_sentence_goes_unchecked(doc):
    checked = [words for d, words, _ in CLAIMS if d == doc]
    sentences = re.split(r"(?<=[.;])\s+", _prose(doc))
    unchecked = [s for s in sentences if STATUS.search(s) and not any(w in s for w in checked)]
    assert not unchecked, f"{doc}: status sentences no claim checks (add one to CLAIMS): {unchecked}"
