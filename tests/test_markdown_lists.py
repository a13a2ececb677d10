"""Every list on the docs site starts after a blank line: Python-Markdown (MkDocs) reads a list
that follows a paragraph line as more of the paragraph, and `mkdocs build --strict` says nothing.
Checked in `docs/` and in every file the site includes (`--8<--` snippets)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

ITEM = re.compile(r"^([-*+]|\d+\.)\s+\S")
FENCE = re.compile(r"^\s*(```|~~~)")
SNIPPET = re.compile(r'^--8<-- "([^"]+)"', re.MULTILINE)


def site_sources() -> list[Path]:
    """The Markdown pages under docs/ and the repository files they include."""
    pages = sorted((REPO / "docs").rglob("*.md"))
    included = {REPO / name for page in pages for name in SNIPPET.findall(page.read_text())}
    return pages + sorted(included)


def glued_lists(text: str) -> list[int]:
    """Line numbers of top-level list items that directly follow a paragraph line, outside code
    fences: a line that is not an item or its continuation in a tight list (no blank line since
    the item), a table row, a heading or HTML. Python-Markdown reads such an item as more of the
    paragraph, also after an item's second paragraph."""
    found, fenced, tight, previous = [], False, False, ""
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            item = bool(ITEM.match(line))
            if item and previous.strip() and not tight and previous[0] not in "|#<":
                found.append(number)
            tight = item or (tight and bool(line.strip()))
        previous = line
    return found


def test_glued_lists_are_found():
    text = "Intro:\n- a\n  more a\n- b\n\nText\n\n- c\n\n- d\n```\nx:\n- no\n```\n"
    assert glued_lists(text) == [2]
    assert glued_lists("- a\n\n    a's second paragraph\n- b\n") == [4]


def test_every_list_on_the_site_follows_a_blank_line():
    glued = [
        f"{path.relative_to(REPO)}:{number}"
        for path in site_sources()
        for number in glued_lists(path.read_text())
    ]
    assert not glued, "add a blank line before these list items:\n" + "\n".join(glued)


def test_the_built_site_holds_no_list_inside_a_paragraph(tmp_path):
    """The site as MkDocs builds it: no paragraph holds a line that starts a list item."""
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(tmp_path)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    run_on = re.compile(r"<p>(?:[^<]|<(?!/p>))*?\n[-*] ")
    pages = sorted(tmp_path.rglob("index.html"))
    assert pages
    glued = [str(p.relative_to(tmp_path)) for p in pages if run_on.search(p.read_text())]
    assert not glued
