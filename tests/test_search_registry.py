"""The search-method registry: a method is one `SearchMethod` plus its registration, and the
search entry point runs whatever is registered."""

from __future__ import annotations

import json

import pytest

from grammarrl.config.schema_evaluation import SEARCH_METHODS
from grammarrl.decoding.smc import ParticleSet
from grammarrl.errors import ConfigError
from grammarrl.evaluation.settings import EvalSettings
from grammarrl.search.methods import SearchMethod
from grammarrl.search.potentials import default_potential
from grammarrl.search.registry import BUILTIN, METHODS, register
from grammarrl.search.run import search
from grammarrl.search.settings import SearchSettings
from grammarrl.tasks import load_task
from tests.conftest import compose_config


def last_particle(particles: ParticleSet) -> int:
    """A throwaway selection: the last particle, whatever its weight."""
    return len(particles.generations) - 1


LAST = SearchMethod("last", last_particle, potential="none")


@pytest.fixture
def last():
    """LAST registered for one test."""
    register(LAST)
    yield LAST
    del METHODS[LAST.name]


def _cfg(tmp_path, method: str):
    return compose_config(
        ["mode=search", "model=tiny", "task=conll", "logger=none", f"search.method={method}",
         "search.potential=none", "search.particles=3", "search.posterior_draws=2",
         "search.greedy_baseline=false", "eval.num_test_sets=1", "eval.test_size=2",
         "eval.sampler_seeds=[0]", "task.max_new_tokens=24", f"cache_dir={tmp_path}/cache"]
    )  # fmt: skip


def test_the_config_choices_name_the_builtin_methods():
    assert SEARCH_METHODS == tuple(method.name for method in BUILTIN)
    assert all(METHODS[name].name == name for name in SEARCH_METHODS)


def test_each_method_brings_its_potential_and_resampling():
    settings = {m: SearchSettings.from_config(compose_config([f"search.method={m}"]).search)
                for m in SEARCH_METHODS}  # fmt: skip
    assert {m: s.potential for m, s in settings.items()} == {
        "rerank": "reverse",
        "is": "reverse",
        "smc": "task",
    }
    assert settings["smc"].ess_threshold == pytest.approx(1 / 3)
    assert settings["is"].ess_threshold == settings["rerank"].ess_threshold == 0.0
    assert default_potential("smc") == "task"


def test_a_name_is_registered_once_and_an_unknown_one_is_refused(last):
    with pytest.raises(ValueError, match="already registered"):
        register(SearchMethod("is", last_particle, potential="none"))
    with pytest.raises(ConfigError, match="search.method='nope': expected one of rerank, is"):
        SearchSettings.from_config(compose_config(["search.method=nope"]).search)


def test_a_registered_method_runs_through_search(last, tiny, tmp_path):
    """One SearchMethod and its registration: selectable by name, its picks kept and scored, on
    the same particles as IS (neither resamples)."""
    model, tok = tiny
    runs = {}
    for method in ("is", "last"):
        cfg = _cfg(tmp_path, method)
        settings = SearchSettings.from_config(cfg.search)
        out = tmp_path / method
        res = search(EvalSettings.from_config(cfg), settings, model, tok, load_task(cfg), out,
                     progress=False)  # fmt: skip
        rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        runs[method] = (res, rows)
    res, rows = runs["last"]
    assert res["method"] == res["decoding"] == "last" and res["potential"] == "none"
    assert list(res["selections"]) == ["last"] and len(rows) == 2
    assert [row["particles"] for row in rows] == [row["particles"] for row in runs["is"][1]]
    assert [row["selected"] for row in rows] == [2, 2]
    assert [row["prediction"] for row in rows] == [row["particles"][2]["text"] for row in rows]
    assert [row["selected"] for row in runs["is"][1]] != [2, 2]  # not IS's picks
