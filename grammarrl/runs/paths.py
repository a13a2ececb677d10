"""Paths in run records, the same on every machine.

A record (job.json, results.json, run.log) names a file under the data directory as
`<data>/...`, under the cache as `<cache>/...`, and under the repository (the working directory
a job starts in) relative to it; example ids are already `file:line` relative to the data
directory (`grammarrl.data.sources.relative_uid`). `relativize` rewrites text by such rules
(`experiments.relativize_paths` applies it to committed results with the rules of the machines
that made them); `read_record` turns `<data>` and `<cache>` back into this machine's directories.
"""

from __future__ import annotations

import functools
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from omegaconf import OmegaConf

from grammarrl.config.checks import CONF_DIR

DATA, CACHE = "<data>", "<cache>"
BEFORE = r"(?<![\w.~/<>-])"  # a root starts a path: not inside another path or token
AFTER = r"(?![\w.-])"  # and ends where its name ends (then `/`, a quote, a space, `:`...)


class Rule(NamedTuple):
    """Paths under `root` (a regex) are written `token/...`; token "" makes them relative."""

    kind: str
    root: str
    token: str


def relativize(text: str, rules: Sequence[Rule]) -> tuple[str, Counter[str]]:
    """`text` with each rule's paths rewritten, in order, and the replacements per kind. An example
    id (`"<root>/file:line"`, a JSON string) becomes relative to its root, as ids are written."""
    counts: Counter[str] = Counter()
    for rule in rules:
        uid = re.compile(rf'"{rule.root}/([^"\s]+:\d+)"')
        text, found = uid.subn(r'"\1"', text)
        counts[f"{rule.kind}_id"] += found

        def replace(match: re.Match[str], token: str = rule.token) -> str:
            if match.group("sep"):
                return f"{token}/" if token else ""
            return token or "."

        path = re.compile(rf"{BEFORE}{rule.root}(?:(?P<sep>/)(?=[^\s\"'/])|{AFTER})")
        text, found = path.subn(replace, text)
        counts[rule.kind] += found
    return text, +counts


@dataclass(frozen=True)
class Roots:
    """The directories a record's paths are written relative to (None: not set)."""

    data: str | None
    cache: str | None
    repo: str | None

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Roots:
        """A job's roots: its config's `data.dir` and `cache_dir`, and the working directory."""
        data = config.get("data") or {}
        return cls(_absolute(data.get("dir")), _absolute(config.get("cache_dir")), str(Path.cwd()))

    @classmethod
    def here(cls) -> Roots:
        """This machine's default roots: $GRAMMARRL_DATA_DIR, conf/config.yaml's `cache_dir`
        ($GRAMMARRL_CACHE_DIR, else under the home directory) and the working directory."""
        return cls(
            _absolute(os.environ.get("GRAMMARRL_DATA_DIR")),
            _absolute(_default_cache_dir()),
            str(Path.cwd()),
        )

    def rules(self) -> list[Rule]:
        """Data, cache, then repository: the most specific first."""
        named = (("data", self.data, DATA), ("cache", self.cache, CACHE), ("repo", self.repo, ""))
        return [Rule(kind, re.escape(root), token) for kind, root, token in named if root]


def _default_cache_dir() -> str:
    """`cache_dir` as conf/config.yaml resolves it on this machine (its one default)."""
    return _resolved_cache_dir(os.environ.get("GRAMMARRL_CACHE_DIR"), os.environ.get("HOME"))


@functools.cache
def _resolved_cache_dir(env_cache: str | None, home: str | None) -> str:
    """conf/config.yaml's `cache_dir`, read once per value of the variables it depends on (the
    job's log file formats every line with it)."""
    return str(OmegaConf.load(Path(CONF_DIR) / "config.yaml").cache_dir)


def _absolute(value: Any) -> str | None:
    """An absolute directory as written (`~` expanded, no trailing `/`); None for others and `/`."""
    if not value:
        return None
    path = os.path.expanduser(str(value)).rstrip("/")
    return path if os.path.isabs(path) and path else None


def portable(value: Any, roots: Roots) -> Any:
    """A record (nested dicts, lists, strings) with its paths relativized (`relativize`)."""
    rules = roots.rules()
    return _strings(value, lambda text: relativize(text, rules)[0])


def local(value: Any, roots: Roots) -> Any:
    """A record read on this machine: `<data>` and `<cache>` as `roots` name them (kept where
    `roots` has none); relative paths stay relative to the working directory."""
    named = [
        (re.compile(rf"{re.escape(t)}(?=/|{AFTER})"), r)
        for t, r in ((DATA, roots.data), (CACHE, roots.cache))
        if r
    ]

    def localized(text: str) -> str:
        for token, root in named:
            text = token.sub(lambda _, path=root: path, text)
        return text

    return _strings(value, localized)


def _strings(value: Any, change: Callable[[str], str]) -> Any:
    """`value` (nested dicts, lists, strings) with `change` applied to every string."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, Mapping):
        return {key: _strings(item, change) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strings(item, change) for item in value]
    return value
