"""The published pages read as a guide and as results, not as a lab notebook: no words about who
worked when ("this session", "the eighth session"), which machine was borrowed or who shared it.
Checked in every page the site publishes from the repository: docs/*.md, README.md,
experiments/results/*.md and benchmarks/README.md."""

from __future__ import annotations

import re

from tests.conftest import REPO

PUBLISHED = ("docs/*.md", "README.md", "experiments/results/*.md", "benchmarks/README.md")
LOG_WORDS = re.compile(
    r"\bsessions?\b|\bborrow(ed|ing)?\b|\b(this|next|last)\s+round\b|\bshared\s+the\s+machine\b"
    r"|\blent\b",
    re.IGNORECASE,
)
# "session" as a name in code (a requests.Session, a W&B or ONNX Runtime session) is not about
# who worked when: an occurrence inside `backticks` is allowed.
INLINE_CODE = re.compile(r"`[^`\n]*`")


def log_wording(text: str) -> list[tuple[int, str]]:
    """(line number, words) for each research-log phrase outside inline code; a phrase may run
    over a line break."""
    prose = INLINE_CODE.sub(lambda code: "#" * len(code.group()), text)
    return [
        (prose.count("\n", 0, found.start()) + 1, " ".join(found.group().split()))
        for found in LOG_WORDS.finditer(prose)
    ]


def test_log_wording_is_found():
    text = (
        "Ran in the eighth session.\nA GPU was borrowed.\n"
        "`requests.Session()` is code.\nNext round: more seeds.\nA read-only agent shared the "
        "machine" + "\nfor part of it.\nA sessional note.\n"
    )
    assert log_wording(text) == [
        (1, "session"),
        (2, "borrowed"),
        (4, "Next round"),
        (5, "shared the machine"),
    ]


def test_no_published_page_narrates_who_worked_when():
    pages = sorted({p for pattern in PUBLISHED for p in REPO.glob(pattern)})
    assert len(pages) > 20
    found = [
        f"{page.relative_to(REPO)}:{number}: {word}"
        for page in pages
        for number, word in log_wording(page.read_text())
    ]
    assert not found, "research-log wording on a published page:\n" + "\n".join(found)
