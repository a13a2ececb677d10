"""Every error message docs/troubleshooting.md quotes is still one the code raises: the page
cannot go stale silently when a message is reworded.

Each string literal of grammarrl/ (f-strings with their implicitly concatenated parts) becomes a
pattern whose replacement fields (`{key}`, `{err}`) match any text; a quoted message, without the
prefix the command line or the log puts before it, must match one of them whole."""

from __future__ import annotations

import ast
import re
from functools import cache

import pytest

from tests.conftest import REPO

PAGE = REPO / "docs" / "troubleshooting.md"
PREFIX = re.compile(r"^(error: |\[[^\]]*\]\[grammarrl\]\[ERROR\] - |grammarrl\.errors\.\w+: )")
MIN_FIXED = 20  # characters of fixed text a pattern needs, so that `f"{a}: {b}"` matches nothing


def quoted_messages(text: str) -> list[str]:
    """The messages of the page's `text` blocks (one per line), their prefix removed."""
    blocks = re.findall(r"^```text\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    return [PREFIX.sub("", line) for block in blocks for line in block.splitlines() if line]


def pattern(node: ast.AST) -> tuple[str, int] | None:
    """(regex, fixed characters) of a string literal or f-string, None for other nodes."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value), len(node.value)
    if not isinstance(node, ast.JoinedStr):
        return None
    parts, fixed = [], 0
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(re.escape(value.value))
            fixed += len(value.value)
        else:
            parts.append(".*?")
    return "".join(parts), fixed


@cache
def source_patterns() -> tuple[re.Pattern[str], ...]:
    found = set()
    for path in sorted((REPO / "grammarrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            made = pattern(node)
            if made is not None and made[1] >= MIN_FIXED:
                found.add(made[0])
    return tuple(re.compile(p, flags=re.DOTALL) for p in sorted(found))


def raised_by_the_code(message: str) -> bool:
    return any(p.fullmatch(message) for p in source_patterns())


MESSAGES = quoted_messages(PAGE.read_text(encoding="utf-8"))


def test_the_page_quotes_the_errors_users_meet():
    assert len(MESSAGES) >= 25, MESSAGES
    for fixed in ("unknown config key", "the hub is offline", "no config.json found locally"):
        assert any(fixed in m for m in MESSAGES), f"the page quotes no message with {fixed!r}"


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m[:60])
def test_each_quoted_message_is_raised_by_the_code(message):
    assert raised_by_the_code(message), (
        f"docs/troubleshooting.md quotes an error no string in grammarrl/ produces "
        f"(reworded or removed? update the page): {message}"
    )


def test_an_altered_message_is_caught():
    """The check can fail: a real message with one fixed word changed matches nothing."""
    real = "lamda: unknown config key (did you mean lambda?)"
    assert raised_by_the_code(real)
    assert not raised_by_the_code(real.replace("unknown", "unrecognised"))
    assert not raised_by_the_code("nothing here is an error message GrammarRL writes at all")


def test_prefixes_are_removed():
    text = "```text\nerror: a\n[2026-01-01 00:00:00,000][grammarrl][ERROR] - b\n```\n"
    assert quoted_messages(text) == ["a", "b"]
