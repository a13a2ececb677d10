"""The commands the docs show exist as written.

README and getting started: every `make` target is in the Makefile, and every `python -m
grammarrl.run` or `grammarrl.plan` command's overrides compose and pass validation (the checks a
run makes before loading any model). The tutorials (docs/tutorials/): every command composes and
validates, every `make` target runs the commands the page shows, and (slow) every command and
Python block of each page runs in order on the `tiny` model."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
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


# ------------------------------------------------------------------------------ the tutorials
# Every command of docs/tutorials/*.md, parsed from the pages' fenced blocks (nothing here
# repeats them). Fast tests compose and validate each `python -m grammarrl.run` command as the
# page writes it (the default model) and as the tests run it; the slow tests run every block of
# each page in order, in a scratch directory, on the random `tiny` model.

TUTORIALS = ("custom-task.md", "sweep-wandb.md", "paper-table.md")
TUTORIAL_DIR = ROOT / "docs" / "tutorials"
RUN = ("python", "-m", "grammarrl.run")
AGGREGATE = ("python", "-m", "experiments.aggregate")
JOBS = ("python", "-m", "experiments.jobs")  # lists (composes and validates) a sweep's jobs


def tiny_overrides(work: Path) -> list[str]:
    """The one mapping from a page's command to the test's: appended to every `python -m
    grammarrl.run` (and `experiments.jobs`) command. The pages run the default model (SmolLM2) at their sizes; the tests
    run the random `tiny` model on the bundled samples, with a calibration file of their own and
    small sizes (sweeps and the choices they make stay as written). `wandb sync` needs the
    network and an account: the tests run it with `--dry-run` (it lists what it would upload);
    `make` targets are checked against the Makefile, not run (their commands are on the page)."""
    return [
        "model=tiny",
        "data.dir=null",
        f"reward.calibration_file={work}/calibration.json",
        "task.dev_size=2",
        "task.max_new_tokens=12",
        "trainer.max_steps=2",
        "trainer.val_check_interval=1",
        "train.val_size=2",
        "eval.test_size=4",
        "diagnose.num_inputs=2",
        "diagnose.num_labelled=2",
        "diagnose.num_samples=2",
    ]


def blocks(page: str) -> list[tuple[str, str]]:
    """(language, text) of a tutorial's bash and python blocks, in page order."""
    text = (TUTORIAL_DIR / page).read_text(encoding="utf-8")
    return re.findall(r"^```(bash|python)\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """A command's leading `NAME=value` assignments, and the command."""
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, words


def tutorial_commands(page: str) -> list[list[str]]:
    """A tutorial's shell commands as argument lists (environment assignments kept)."""
    return [
        shlex.split(command)
        for lang, text in blocks(page)
        if lang == "bash"
        for command in shell_commands(f"```bash\n{text}```")
    ]


def program(words: list[str]) -> tuple[str, ...]:
    _, command = split_env(list(words))
    return tuple(command[:3]) if command[:2] == ["python", "-m"] else tuple(command[:2])


TUTORIAL_COMMANDS = [(page, words) for page in TUTORIALS for words in tutorial_commands(page)]
KNOWN = {RUN, JOBS, AGGREGATE, ("wandb", "sync")}


def test_each_tutorial_shows_commands_the_tests_know():
    for page in TUTORIALS:
        assert tutorial_commands(page), f"docs/tutorials/{page} shows no bash command"
    for page, words in TUTORIAL_COMMANDS:
        kind = program(words)
        assert kind in KNOWN or kind[0] == "make", f"{page}: no test runs `{shlex.join(words)}`"
    shown = {program(words) for _, words in TUTORIAL_COMMANDS}
    assert KNOWN <= shown


def job_overrides(words: list[str]) -> list[list[str]]:
    """The override lists of a `python -m grammarrl.run` command's jobs: one, or every job of a
    sweep (`-m`, and `experiments.jobs`), expanded as Hydra's sweeper does."""
    from experiments.jobs import expand

    _, command = split_env(list(words))
    overrides = [w for w in command[3:] if not w.startswith("-")]
    sweep = "-m" in command or tuple(command[:3]) == JOBS
    return expand(overrides) if sweep else [overrides]


@pytest.mark.parametrize(
    "page,words", [c for c in TUTORIAL_COMMANDS if program(c[1]) in (RUN, JOBS)], ids=str
)
def test_tutorial_run_commands_compose_and_validate(page, words, tmp_path):
    """As the page writes it (the default model) and as the slow test runs it (`tiny`)."""
    for overrides in job_overrides(words):
        for extra in ([], tiny_overrides(tmp_path)):
            validate(compose_job_config([*overrides, *extra]))


@pytest.mark.parametrize(
    "page,words", [c for c in TUTORIAL_COMMANDS if program(c[1]) == AGGREGATE], ids=str
)
def test_tutorial_aggregate_commands_name_a_report(page, words):
    from experiments.aggregate import REPORTS

    assert words[3] in REPORTS, f"{page}: `{shlex.join(words)}`: no such report"


def make_recipe(target: str) -> list[str]:
    """The commands of a Makefile target, its `:=` variables expanded, with `nice -n 10` and the
    virtualenv's python written as the pages write them (`python`)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    variables = dict(re.findall(r"^(\w+)\s*[:?]?=\s*(.*)$", makefile, flags=re.MULTILINE))
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", makefile, flags=re.MULTILINE)
    assert match, f"`make {target}` is not a Makefile target"
    commands = []
    for line in match.group(1).splitlines():
        for _ in range(5):  # variables inside variables
            line = re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), m.group(0)), line)
        line = line.strip().replace("nice -n 10 ", "").replace(variables["VENV"] + "/bin/", "")
        commands.append(line)
    return commands


@pytest.mark.parametrize("page,words", [c for c in TUTORIAL_COMMANDS if c[1][0] == "make"], ids=str)
def test_tutorial_make_targets_run_the_commands_shown(page, words):
    """A `make` target a tutorial names exists and runs the commands the page shows for it."""
    shown = {shlex.join(w) for p, w in TUTORIAL_COMMANDS if p == page}
    for target in [w for w in words[1:] if "=" not in w]:
        for command in make_recipe(target):
            assert shlex.join(shlex.split(command)) in shown, (
                f"{page}: `make {target}` runs `{command}`, which the page does not show"
            )


@pytest.mark.parametrize("page", TUTORIALS)
def test_tutorial_python_blocks_compile(page):
    for lang, text in blocks(page):
        if lang == "python":
            compile(text, f"docs/tutorials/{page}", "exec")


def runnable(words: list[str], work: Path) -> tuple[dict[str, str], list[str]]:
    """(environment, argv) of a page's command as the slow test runs it (`tiny_overrides`);
    glob patterns are expanded in `work` as a shell would, and must match something."""
    env, command = split_env(list(words))
    if tuple(command[:3]) in (RUN, JOBS):
        command = [sys.executable, *command[1:], *tiny_overrides(work)]
    elif command[0] == "python":
        command = [sys.executable, *command[1:]]
    elif command[:2] == ["wandb", "sync"]:
        command = [str(Path(sys.executable).with_name("wandb")), "sync", "--dry-run", *command[2:]]
    argv = []
    for word in command:
        found = sorted(str(p.relative_to(work)) for p in work.glob(word)) if "*" in word else []
        assert found or "*" not in word, f"`{shlex.join(words)}`: {word} matches nothing"
        argv += found or [word]
    return env, argv


# Files each tutorial's commands leave in the working directory (beside exit status 0).
WRITES = {
    "custom-task.md": [
        "runs/triage/diagnose/diagnosis.md",
        "runs/triage/train/adapter/adapter_config.json",
        "runs/triage/train/summary.md",
        "runs/triage/eval-beam/results.json",
        "triage-model/grammar.lark",
    ],
    "sweep-wandb.md": [
        "multirun/triage-lambda/aggregate/sweep.md",
        "multirun/triage-lambda/comparison/comparison.md",
    ],
    "paper-table.md": ["multirun/cpu/main/aggregate/main_results.md"],
}


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("page", TUTORIALS)
def test_tutorial_runs_on_tiny(page, tmp_path, cache_dir):
    """Every bash command and python block of the page, in order, in a scratch directory (the
    repository's docs/ linked in, since the pages' paths start there), on `tiny`."""
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    base = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "GRAMMARRL_CACHE_DIR": str(cache_dir),
    }
    base.pop("GRAMMARRL_DATA_DIR", None)
    for number, (lang, text) in enumerate(blocks(page)):
        if lang == "python":
            script = tmp_path / f"block{number}.py"
            script.write_text(text, encoding="utf-8")
            steps = [({}, [sys.executable, str(script)])]
        else:
            commands = [shlex.split(c) for c in shell_commands(f"```bash\n{text}```")]
            steps = [runnable(w, tmp_path) for w in commands if w[0] != "make"]
        for env, argv in steps:
            done = subprocess.run(
                argv,
                cwd=tmp_path,
                env={**base, **env},
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert done.returncode == 0, f"{shlex.join(argv)}\n{done.stderr[-3000:]}"
    for name in WRITES[page]:
        assert (tmp_path / name).is_file(), f"{page}: {name} not written"
