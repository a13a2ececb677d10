"""One home per config key: a key's range, choices and role, declared once
(`grammarrl.config.keys.Key`), give its validation, which keys a run record compares and a resume
may change (`grammarrl.runs.rundir`), and its row of the config reference."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
from omegaconf import OmegaConf

from grammarrl.config import checks, roles
from grammarrl.config import reference as config_reference
from grammarrl.config.keys import BOOKKEEPING, CONTINUABLE, Key, constrained, key
from grammarrl.config.schema import SCALARS, SCHEMAS
from grammarrl.errors import ConfigError
from grammarrl.runs import rundir
from tests.conftest import compose_config


@dataclass
class ExtraSchema:
    size: int = key("A size declared with its range alone.", at_least=2)
    share: float | None = key("A share, or null.", above=0, below=1, role=CONTINUABLE)
    note: str = key("Bookkeeping.", role=BOOKKEEPING, modes=("search",))


def _with_extra(monkeypatch, **values):
    """The default config with an `extra` group and a top-level `gamma`, both declared only
    in the schema (no code of checks.py names them)."""
    monkeypatch.setattr(checks, "SCHEMAS", {**SCHEMAS, "extra": ExtraSchema})
    gamma = Key("A scalar declared with its range alone.", type="float", at_least=0, at_most=1)
    monkeypatch.setattr(checks, "SCALARS", {**SCALARS, "gamma": gamma})
    cfg = compose_config(["model=tiny", "logger=none"])
    OmegaConf.set_struct(cfg, False)
    cfg.extra = {"size": 2, "share": None, "note": "x", **values.get("extra", {})}
    cfg.gamma = values.get("gamma", 0.5)
    return cfg


def test_a_declared_range_is_checked_without_code_for_the_key(monkeypatch):
    checks.check_values(_with_extra(monkeypatch))
    checks.check_values(_with_extra(monkeypatch, extra={"share": 0.5}))
    refused = {
        "extra.size=1 is invalid: expected an integer >= 2": {"extra": {"size": 1}},
        "extra.share=1.0 is invalid: expected a number in (0, 1) or null": {"extra": {"share": 1}},
        "gamma=1.5 is invalid: expected a number in [0, 1]": {"gamma": 1.5},
        "gamma='high' is invalid: expected a number in [0, 1]": {"gamma": "high"},
    }
    for message, values in refused.items():
        with pytest.raises(ConfigError) as err:
            checks.check_values(_with_extra(monkeypatch, **values))
        assert str(err.value) == message


def _outside(declared: Key):
    """A value just outside what the key declares."""
    if declared.choices or declared.rule:
        return "no-such-value"
    if declared.at_least is not None:
        value = declared.at_least - 1
    elif declared.above is not None:
        value = declared.above
    elif declared.at_most is not None:
        value = declared.at_most + 1
    else:
        value = declared.below
    return [value] if declared.unique else value


BOUNDED = [name for name, declared in roles.declared().items() if constrained(declared)]


def test_every_declared_range_and_choice_is_enforced_naming_its_key():
    assert {"lambda", "optim.lr", "lora.dropout", "eval.decoding", "diagnose.lambdas"} <= {*BOUNDED}
    base = compose_config(["model=tiny", "logger=none"])
    for name in BOUNDED:
        cfg = copy.deepcopy(base)
        OmegaConf.update(cfg, name, _outside(roles.declared()[name]), force_add=True)
        with pytest.raises(ConfigError) as err:
            checks.check_values(cfg)
        assert str(err.value).startswith(f"{name}="), (name, str(err.value))


def test_rundir_sets_are_derived_from_the_declared_roles():
    assert rundir.BOOKKEEPING == roles.bookkeeping()
    assert rundir.CONTINUABLE == roles.continuable()
    # a group whose every key shares the role is named whole (its undeclared keys share it)
    assert {"logger", "skip_completed", "overwrite", "train.resume"} <= {*rundir.BOOKKEEPING}
    assert {"trainer.max_steps", "eval", "cache_dir"} <= {*rundir.CONTINUABLE}
    assert "trainer" not in rundir.CONTINUABLE and "lambda" not in rundir.CONTINUABLE
    diagnose, train = rundir.MODE_UNUSED["diagnose"], rundir.MODE_UNUSED["train"]
    assert {"optim.lr", "trainer", "lora", "beta"} <= {*diagnose}
    assert "optim.batch_size" not in diagnose and "rollout" not in diagnose
    assert {"diagnose", "eval.sampler_seeds"} <= {*train} and "optim.lr" not in train
    # what tests/test_mode_keys.py measures: eval and search never read training's keys
    for mode in ("eval", "search"):
        unused = {*rundir.MODE_UNUSED[mode]}
        assert {"lora", "trainer", "train.val_size", "rollout", "lambda"} <= unused
        assert "eval.test_size" not in unused and "task.num_hints" not in unused
    assert "search" in rundir.MODE_UNUSED["eval"]  # the group whole
    assert "search.method" not in rundir.MODE_UNUSED["search"]
    assert rundir.ADDED["kl_penalty"] == "loss" and rundir.ADDED["eval.sampler_seeds"] is None
    assert "lambda" not in rundir.ADDED
    assert rundir.SPLIT_FROM == {"train.seed": "seed", "reward.calibration_seed": "seed"}


def test_a_new_key_joins_the_sets_its_declaration_names(monkeypatch):
    monkeypatch.setattr(roles, "SCHEMAS", {**SCHEMAS, "extra": ExtraSchema})
    assert "extra.share" in roles.continuable() and "extra" not in roles.continuable()
    assert "extra.note" in roles.bookkeeping()
    assert "extra.note" in roles.unused_by("train") and "extra.note" not in roles.unused_by(
        "search"
    )


def test_a_declaration_with_an_unknown_role_or_mode_is_refused():
    with pytest.raises(ValueError, match="role='results'"):
        Key("A key.", role="results")
    with pytest.raises(ValueError, match="modes="):
        Key("A key.", modes=("training",))


def test_the_reference_shows_each_keys_range_and_role():
    page = config_reference.generate()
    rows = {line.split(" | ")[0]: line for line in page.splitlines() if line.startswith("| `")}
    assert "| `>= 1` | continuable<br>train only |" in rows["| `trainer.max_steps`"]
    assert "| `[0, 1)` | result<br>train only |" in rows["| `lora.dropout`"]
    assert "older records: `loss`" in rows["| `kl_penalty`"]
    assert "| bookkeeping |" in rows["| `logger.name`"]
    assert "search only" in rows["| `eval.sampler_seeds`"]
    assert "non-empty, distinct, each `[0, 1]`" in rows["| `diagnose.lambdas`"]
