"""Rewrite the absolute paths of the machines that made committed results, in place:

    python -m experiments.relativize_paths [PATHS ...]   # default: the two results folders

The conventions of run records (`grammarrl.runs.paths`): the data directory (`/work/shared/data`,
any `.../shared/data`, $GRAMMARRL_DATA_DIR) is `<data>` and an example id `file:line` relative to
it; the cache (`~/.cache/grammarrl` of any user) is `<cache>`; a checkout (`/work/<name>` alone
or before `multirun/`, `outputs/`, `conf/`...) is left out, making its paths
relative to the repository; what remains under `/tmp/`, `/work/` and home directories is
under `<tmp>`, `<work>` and `<home>` (a bare `/tmp`, as in `${oc.env:HOME,/tmp}`, is kept). Only those substrings change (a JSON file keeps its layout); every
rewritten JSON, JSON-lines and YAML file must still parse. Markdown is prose written by hand (its
paths are examples, such as `/path/to/shared/data`): left alone. Running it again changes nothing.
Prints a JSON summary: files scanned and changed, replacements per kind.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from grammarrl.runs.paths import AFTER, CACHE, DATA, Rule, relativize

DEFAULT_PATHS = ("experiments/results", "benchmarks/results")
# what follows a checkout's root in the paths of its runs
CHECKOUT_DIRS = ("multirun", "outputs", "experiments", "benchmarks", "conf", "examples")
NAME = r"[\w.-]+"


def machine_rules() -> list[Rule]:
    """The rules of the machines that made committed results, most specific first."""
    data = [rf"(?:/{NAME})*/shared/data"]
    cache = [rf"/home/{NAME}/\.cache/grammarrl", r"/root/\.cache/grammarrl"]
    for variable, found in (("GRAMMARRL_DATA_DIR", data), ("GRAMMARRL_CACHE_DIR", cache)):
        if os.environ.get(variable):
            found.insert(0, re.escape(os.environ[variable].rstrip("/")))
    checkout = rf"/work/{NAME}(?=/(?:{'|'.join(CHECKOUT_DIRS)}){AFTER}|(?![\w./-]))"
    return [
        Rule("data", f"(?:{'|'.join(data)})", DATA),
        Rule("cache", f"(?:{'|'.join(cache)})", CACHE),
        Rule("repo", checkout, ""),
        Rule("tmp", "/tmp(?=/)", "<tmp>"),
        Rule("work", "/work(?=/)", "<work>"),
        Rule("home", rf"(?:/root|/home/{NAME})(?=/)", "<home>"),
    ]


def text_files(paths: Sequence[Path]) -> Iterator[tuple[Path, str]]:
    """Each UTF-8 file under the paths with its text (Markdown and others, e.g. images, are
    skipped)."""
    for top in paths:
        for path in sorted([top] if top.is_file() else top.rglob("*")):
            if path.is_file() and path.suffix != ".md":
                try:
                    yield path, path.read_bytes().decode("utf-8")
                except UnicodeDecodeError:
                    continue


def check_parses(path: Path, text: str) -> None:
    """Raise ValueError when a rewritten .json, .jsonl or .yaml file no longer parses."""
    try:
        if path.suffix == ".json":
            json.loads(text)
        elif path.suffix == ".jsonl":
            for line in text.splitlines():
                if line.strip():
                    json.loads(line)
        elif path.suffix in (".yaml", ".yml"):
            yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"{path}: no longer parses after the rewrite ({err})") from None


def rewrite(paths: Sequence[Path], rules: Sequence[Rule]) -> dict[str, Any]:
    """Rewrite the files in place (all checked before any is written); the summary."""
    scanned, changed, counts = 0, {}, Counter[str]()
    for path, text in text_files(paths):
        scanned += 1
        new, found = relativize(text, rules)
        if new != text:
            check_parses(path, new)
            changed[path] = new
            counts += found
    for path, new in changed.items():
        path.write_bytes(new.encode("utf-8"))
    return {"files_scanned": scanned, "files_changed": len(changed), "replacements": counts}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=DEFAULT_PATHS, help="files or folders")
    args = parser.parse_args(argv)
    summary = rewrite([Path(p) for p in args.paths], machine_rules())
    json.dump(summary, sys.stdout, indent=2, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
