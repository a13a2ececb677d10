"""The commands the README and the getting-started page show exist as written: every `make`
target is in the Makefile, and every `python -m grammarrl.run` or `grammarrl.plan` command's
overrides compose and pass validation (the checks a run makes before loading any model)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from grammarrl.job import compose_job_config, validate

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/getting-started.md")
CONFIG_MODULES = ("grammarrl.run", "grammarrl.plan")


def shell_commands(text: str) -> list[str]:
    """The commands of a page's bash blocks: continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def documented(page: str) -> list[list[str]]:
    """A page's commands as argument lists, environment assignments dropped."""
    out = []
    for command in shell_commands((ROOT / page).read_text(encoding="utf-8")):
        words = shlex.split(command)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words = words[1:]
        out.append(words)
    return out


def overrides_of(words: list[str]) -> list[str]:
    """The Hydra overrides of a `python -m <module> ...` command: flags dropped, a sweep's
    comma-separated values reduced to their first (one job of the sweep)."""
    overrides = [w for w in words[3:] if not w.startswith("-") and w not in ("job",)]
    return [re.sub(r"^([^=]+=[^,\[]*),.*$", r"\1", w) for w in overrides]


COMMANDS = [(page, words) for page in PAGES for words in documented(page)]


def test_the_pages_show_commands():
    shown = {tuple(words[:3]) for _, words in COMMANDS}
    assert ("python", "-m", "grammarrl.run") in shown
    assert ("make", "run") in {tuple(words[:2]) for _, words in COMMANDS}


@pytest.mark.parametrize(
    "page,words", [c for c in COMMANDS if c[1][0] == "make"], ids=lambda c: str(c)
)
def test_make_targets_exist(page, words):
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w.-]+):", makefile, flags=re.MULTILINE))
    for target in [w for w in words[1:] if "=" not in w]:
        assert target in targets, f"{page}: `make {target}` is not a Makefile target"


@pytest.mark.parametrize(
    "page,words",
    [c for c in COMMANDS if c[1][:2] == ["python", "-m"] and c[1][2] in CONFIG_MODULES],
    ids=lambda c: str(c),
)
def test_run_commands_compose_and_validate(page, words):
    cfg = compose_job_config(overrides_of(words))
    validate(cfg)


def test_overrides_of_reduces_a_sweep_to_one_job():
    words = shlex.split("python -m grammarrl.run -m lambda=0,0.5 'eval.sampler_seeds=[0,1]'")
    assert overrides_of(words) == ["lambda=0", "eval.sampler_seeds=[0,1]"]
