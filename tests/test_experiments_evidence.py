"""Evidence II aggregation (`python -m experiments.aggregate evidence2 TRAIN BASELINES [PROPOSAL]`)
on fixture sweeps written with the real results schema (grammarrl.runs.results) and the real
composed evidence2 configs: the dev-only choice, paired differences, combined rewards from the
σ's, the refusal of rows scored on other test sets, partial studies."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf

from experiments import aggregate as agg
from experiments import dev_selection, training_runs
from experiments.runs import AggregationError, metric_label
from grammarrl.rl.calibration import calibration_conditions
from grammarrl.runs.results import build_results, mean_std, write_results
from tests.conftest import compose_config
from tests.support.runs import make_run, md_rows

VAL_STEPS = (0, 10, 20)  # trained steps of the validations
TRAIN_STEPS = 25
SIGMAS = {"n3_b3": (2.0, 0.5), "n10_b3": (7.0, 7.0)}  # calibrated σ_direct, σ_reverse per key
CALIBRATION = "evidence2-fixture/calibration.json"  # relative: found from the runs' parents


@pytest.fixture(scope="module")
def base_config() -> dict[str, Any]:
    cfg = compose_config(["+experiment=evidence2_train_cpu"])
    config = OmegaConf.to_container(cfg, resolve=True)
    config["reward"]["calibration_file"] = CALIBRATION
    return config


def job_config(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """The composed config with dotted keys changed (`eval.decoding="beam"`)."""
    config = copy.deepcopy(base)
    for key, value in changes.items():
        *parents, last = key.split("__")
        node = config
        for part in parents:
            node = node[part]
        node[last] = value
    return config


def metrics_csv(dev_f1: list[float]) -> str:
    """Lightning's CSV: train rows per step (kl = 0.01·step, reward = -step), validation rows
    placed by val/dev_trained_steps (dev reward = -10 + F1, empty fields = 100·(1 - F1))."""
    header = (
        "step,train/reward,train/kl,train/validity,val/dev_micro_f1,val/dev_reward,"
        "val/dev_empty_field_rate,val/dev_trained_steps"
    )
    lines = [header]
    last = VAL_STEPS[len(dev_f1) - 1]
    for step in range(last + 5 if len(dev_f1) == len(VAL_STEPS) else last):
        lines.append(f"{step},{-step},{0.01 * step},1.0,,,,")
    for trained, f1 in zip(VAL_STEPS, dev_f1):
        lines.append(f"{max(trained - 1, 0)},,,,{f1},{-10 + f1},{100 * (1 - f1)},{trained}")
    return "\n".join(lines) + "\n"


def write_eval(
    path: Path,
    config: dict[str, Any],
    scores: list[float],
    *,
    rewards: tuple[list[float], list[float]] | None = None,
    name: str = "results",
    **extra: Any,
) -> None:
    """A results file as grammarrl.evaluation.evaluate / grammarrl.search.run write it (per-set rewards
    with eval.score_rewards)."""
    per_set = []
    for index, score in enumerate(scores):
        item = {
            "value": score,
            "size": config["eval"]["test_size"],
            "validity": 1.0,
            "truncated": 0.0,
            "task_validity": 1.0,
            "details": {},
        }
        if rewards is not None:
            item.update(
                reward_direct=rewards[0][index],
                reward_reverse=rewards[1][index],
                reward_scored=config["eval"]["test_size"],
            )
        per_set.append(item)
    extra.setdefault("decoding", config["eval"]["decoding"])
    record = build_results(
        task="conll",
        model="smollm2",
        metric="micro_f1",
        scores=scores,
        validity=1.0,
        truncated=0.0,
        examples_per_second=1.0,
        config=config,
        num_test_sets=len(scores),
        test_size=config["eval"]["test_size"],
        seed=config["seed"],
        dtype="float32",
        per_set=per_set,
        **extra,
    )
    write_results(path, record, [], name=name)


def train_run(
    root: Path,
    base: dict[str, Any],
    lam: float,
    n: int,
    dev_f1: list[float] | None,
    test: list[float] | None = None,
    rewards: tuple[list[float], list[float]] | None = None,
    **changes: Any,
) -> Path:
    config = job_config(base, mode="train", **{"lambda": lam, "rollout__num_samples": n, **changes})
    path = make_run(
        root,
        ",".join([f"lambda={lam},rollout.num_samples={n}", *map(str, changes.items())]),
        extra_config=config,
        metrics=metrics_csv(dev_f1) if dev_f1 else None,
    )
    if test is not None:
        write_eval(path, config, test, rewards=rewards, adapter=str((path / "adapter").absolute()))
    return path


def write_calibration(study: Path, base: dict[str, Any]) -> None:
    """The study's calibration file: an entry per key measured under the runs' conditions, and a
    decoy entry measured under others."""
    table = {}
    for key, (direct, reverse) in SIGMAS.items():
        n = int(key.split("_")[0][1:])
        cfg = OmegaConf.create(
            job_config(base, device="cpu", model__dtype="float32", rollout__num_samples=n)
        )
        conditions = calibration_conditions(cfg)
        decoy = {**conditions, "dev_size": 99, "sigma_direct": 100.0, "sigma_reverse": 100.0}
        table[f"conll/smollm2/{key}"] = [
            decoy,
            {"sigma_direct": direct, "sigma_reverse": reverse, **conditions},
        ]
    (study / CALIBRATION).parent.mkdir(parents=True, exist_ok=True)
    (study / CALIBRATION).write_text(json.dumps(table))


CHOSEN_TEST = [0.30, 0.30, 0.60]
CHOSEN_REWARDS = ([-4.0, -6.0, -5.0], [-1.0, -1.5, -0.5])
GREEDY_TEST = [0.2, 0.3, 0.4]
RERANK_TEST = [0.3, 0.35, 0.5]


def train_sweep(study: Path, base: dict[str, Any]) -> Path:
    """Six runs: λ=0.5 N=3 has the best *test* scores but not the best dev F1; λ=0.75 N=3 ties
    λ=1 on the last dev F1 but not on the last two; λ=1 N=3 and N=10 tie on both (smaller N
    wins); λ=0.5 N=10 has the best dev F1 so far but is unfinished; λ=0.75 N=10 failed."""
    root = study / "train"
    train_run(root, base, 0.5, 3, [0.20, 0.30, 0.38], [0.50, 0.55, 0.60], ([-3.0] * 3, [-1.0] * 3))
    train_run(root, base, 0.75, 3, [0.20, 0.30, 0.40], [0.1, 0.1, 0.1])
    train_run(root, base, 1.0, 3, [0.20, 0.36, 0.40], CHOSEN_TEST, CHOSEN_REWARDS)
    train_run(root, base, 1.0, 10, [0.20, 0.36, 0.40], [0.2, 0.2, 0.2])
    train_run(root, base, 0.5, 10, [0.20, 0.90])
    failed = train_run(root, base, 0.75, 10, None)
    (failed / "failed.json").write_text(json.dumps({"type": "RuntimeError", "error": "boom"}))
    return root


def baselines_sweep(study: Path, base: dict[str, Any], **greedy_changes: Any) -> Path:
    root = study / "baselines"
    greedy = job_config(base, mode="eval", **greedy_changes)
    write_eval(
        make_run(root, "0_baseline_greedy", extra_config=greedy),
        greedy,
        GREEDY_TEST,
        rewards=([-3.0] * 3, [-2.0] * 3),
    )
    beam = job_config(base, mode="eval", eval__decoding="beam")
    write_eval(
        make_run(root, "1_baseline_beam", extra_config=beam),
        beam,
        [0.25, 0.3, 0.45],
        rewards=([-2.0] * 3, [-2.0] * 3),
        beam_width=3,
    )
    rerank = job_config(base, mode="search", search__method="rerank")
    write_eval(
        make_run(root, "2_rerank", extra_config=rerank),
        rerank,
        RERANK_TEST,
        rewards=([-5.0] * 3, [-1.0] * 3),
        decoding="rerank",
        method="rerank",
        particles=10,
        selections={
            "is": {"scores": [0.28, 0.33, 0.52], "mean": 0.3767},
            "rerank": {"scores": RERANK_TEST, "mean": 0.3833},
        },
    )
    return root


@pytest.fixture
def study(tmp_path: Path, base_config: dict[str, Any]) -> Path:
    root = tmp_path / "study"
    train_sweep(root, base_config)
    baselines_sweep(root, base_config)
    write_calibration(tmp_path, base_config)
    return root


def tables_of(out: Path) -> dict[str, dict[str, list[str]]]:
    return {
        name: md_rows((out / f"{name}.md").read_text())
        for name in ("dev_selection", "comparison", "mechanism")
    }


def test_dev_selection_chooses_on_dev_numbers_only(study: Path, capsys):
    written = agg.aggregate("evidence2", [study / "train", study / "baselines"], out=study / "agg")
    assert {p.name for p in written} >= {
        "dev_selection.md",
        "dev_selection.tex",
        "comparison.md",
        "mechanism.tex",
        "training_curves_evidence2.png",
        "runs.md",
    }
    rows = tables_of(study / "agg")["dev_selection"]
    assert [label for label in rows if "(chosen)" in label] == ["λ=1, N=3 (chosen)"]
    chosen = rows["λ=1, N=3 (chosen)"]
    # F1 @0, last, last step, best (step), reward @0, last, KL over steps 5..24, empty, status
    assert chosen == [
        "0.200",
        "0.400",
        "no per-example record",  # a run from before validation.jsonl
        "20",
        "0.400 (step 20)",
        "-9.800",
        "-9.600",
        "0.145",
        "60.000",
        "done",
    ]
    assert rows["λ=0.5, N=10"][1:5] == ["0.900", "no per-example record", "10", "0.900 (step 10)"]
    assert rows["λ=0.5, N=10"][-1] == "unfinished"
    assert rows["λ=0.75, N=10"][0] == "–" and rows["λ=0.75, N=10"][-1] == "failed"
    assert "\\rowcolor" in (study / "agg" / "dev_selection.tex").read_text()
    listing = (study / "agg" / "runs.md").read_text()
    assert "**failed**: RuntimeError: boom" in listing and "**missing**" in listing
    assert (study / "agg" / "training_curves_evidence2.png").stat().st_size > 1000


def test_dev_selection_states_the_dev_interval_and_whether_the_choice_is_inside_it(
    study: Path,
):
    """With validation.jsonl, the chosen run's last dev score carries a bootstrap interval over
    its dev inputs, and the note says whether the runner-up lies inside it."""
    from experiments.intervals import f1_interval

    (chosen,) = (study / "train").glob("*lambda=1.0,rollout.num_samples=3")
    items = [{"tp": 1, "fp": 0, "fn": 0}] * 4 + [{"tp": 0, "fp": 1, "fn": 1}] * 6  # F1 0.4
    rows = [{"step": 0, "slice": "dev", "uid": "old", "scores": {"tp": 0, "fp": 9, "fn": 9}}]
    rows += [{"step": 20, "slice": "dev", "uid": str(i), "scores": s} for i, s in enumerate(items)]
    rows += [{"step": 20, "slice": "train", "uid": "t", "scores": {"tp": 0, "fp": 0, "fn": 5}}]
    (chosen / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    agg.aggregate("evidence2", [study / "train", study / "baselines"], out=study / "agg")
    low, high = f1_interval(np.array([[i["tp"], i["fp"], i["fn"]] for i in items]))
    assert low < 0.4 < high
    table = tables_of(study / "agg")["dev_selection"]
    assert table["λ=1, N=3 (chosen)"][2] == f"[{low:.3f}, {high:.3f}] (n=10)"
    note = (study / "agg" / "dev_selection.md").read_text()
    assert f"inside the chosen run's dev interval [{low:.3f}, {high:.3f}]" in note
    assert "within the noise of the dev slice" in note


def test_choice_tie_breaks(tmp_path: Path, base_config: dict[str, Any]):
    root = tmp_path / "train"
    train_run(root, base_config, 0.75, 3, [0.2, 0.3, 0.4], [0.1] * 3)
    train_run(root, base_config, 1.0, 10, [0.2, 0.36, 0.4], [0.1] * 3)
    runs = [training_runs.training_run(r) for r in agg.load_sweep([root]).runs]
    assert dev_selection.choose(runs).label == "λ=1, N=10"  # higher mean of the last two
    train_run(root, base_config, 1.0, 3, [0.2, 0.36, 0.4], [0.1] * 3)
    runs = [training_runs.training_run(r) for r in agg.load_sweep([root]).runs]
    assert dev_selection.choose(runs).label == "λ=1, N=3"  # same numbers: smaller N


def test_comparison_paired_differences(study: Path):
    agg.aggregate("evidence2", [study / "train", study / "baselines"])
    rows = tables_of(study / "train" / "aggregate")["comparison"]
    assert list(rows)[1:] == [
        "frozen greedy",
        "frozen beam(3)",
        "Sample-Rerank(10)",
        "Full IS(10), paired on the rerank particles",
        "GrammarRL greedy, dev-chosen (λ=1, N=3)",
        "GrammarRL greedy, λ=0.5, N=3",  # every other finished run, by λ and N
        "GrammarRL greedy, λ=0.75, N=3",
        "GrammarRL greedy, λ=1, N=10",
    ]
    header = rows["System"]
    assert header[2:6] == [
        "diff. vs frozen greedy",
        "per set",
        "diff. vs Sample-Rerank(10)",
        "per set",
    ]
    chosen = rows["GrammarRL greedy, dev-chosen (λ=1, N=3)"]
    assert chosen == [
        "0.400 ± 0.173",
        "0.300, 0.300, 0.600",
        "0.100 ± 0.100",
        "+0.100, +0.000, +0.200",
        "0.017 ± 0.076",
        "+0.000, -0.050, +0.100",
    ]
    paired = rows["Full IS(10), paired on the rerank particles"]
    assert paired[2:4] == ["0.077 ± 0.045", "+0.080, +0.030, +0.120"]
    assert rows["frozen greedy"][2:4] == ["–", "–"]  # no difference against itself
    # the test-best run (λ=0.5 N=3) has its own row, its test scores did not choose it
    assert rows["GrammarRL greedy, λ=0.5, N=3"][0] == "0.550 ± 0.050"


def test_runs_that_differ_in_beta_kl_penalty_or_training_seed_get_their_own_labelled_rows(
    study: Path, base_config: dict[str, Any]
):
    """More λ=0.5 N=3 runs, with β=0.1 in the reward and with another training seed: their own
    rows in the dev choice and in the comparison, named by what differs; the paper-setting runs
    keep their short labels."""
    changes = {"beta": 0.1, "kl_penalty": "reward"}
    train_run(study / "train", base_config, 0.5, 3, [0.2, 0.3, 0.3], [0.4] * 3, **changes)
    train_run(study / "train", base_config, 0.5, 3, [0.2, 0.3, 0.3], [0.45] * 3, train__seed=7)
    grammar_kl = {"beta": 1.0, "kl_penalty": "grammar"}
    train_run(study / "train", base_config, 0.5, 3, [0.2, 0.3, 0.3], [0.35] * 3, **grammar_kl)
    agg.aggregate("evidence2", [study / "train", study / "baselines"])
    tables = tables_of(study / "train" / "aggregate")
    assert "λ=0.5, N=3, β=0.1 in the reward" in tables["dev_selection"]
    rows = tables["comparison"]
    assert rows["GrammarRL greedy, λ=0.5, N=3"][0] == "0.550 ± 0.050"
    assert rows["GrammarRL greedy, λ=0.5, N=3, β=0.1 in the reward"][0] == "0.400 ± 0.000"
    assert rows["GrammarRL greedy, λ=0.5, N=3, training seed 7"][0] == "0.450 ± 0.000"
    assert rows["GrammarRL greedy, λ=0.5, N=3, β=1 in the reward, grammar KL"][0] == "0.350 ± 0.000"


def test_a_dev_best_step_evaluated_besides_the_last_gets_its_own_row(
    study: Path, base_config: dict[str, Any]
):
    """A run that kept and evaluated its dev-best step (results_best_dev.json, best_dev.json):
    a row of its own, named by the step, next to the run's last-step row."""
    config = job_config(base_config, mode="train", **{"lambda": 0.75, "rollout__num_samples": 3})
    (path,) = (study / "train").glob("*lambda=0.75,rollout.num_samples=3")
    write_eval(path, config, [0.5] * 3, name="results_best_dev", adapter="adapter-best-dev")
    (path / "best_dev.json").write_text(json.dumps({"step": 80, "value": 0.4}))
    agg.aggregate("evidence2", [study / "train", study / "baselines"])
    rows = tables_of(study / "train" / "aggregate")["comparison"]
    assert rows["GrammarRL greedy, λ=0.75, N=3"][0] == "0.100 ± 0.000"  # its last step
    assert rows["GrammarRL greedy, λ=0.75, N=3, dev-best step 80"][0] == "0.500 ± 0.000"


def test_runs_of_one_label_are_named_by_the_trained_keys_they_differ_in(
    study: Path, base_config: dict[str, Any]
):
    """A λ=0.75 N=3 run continued to more steps and one with another learning rate: each row
    names what differs from the runs of the same label; runs of other labels stay short."""
    train_run(
        study / "train", base_config, 0.75, 3, [0.2, 0.3, 0.3], [0.2] * 3, trainer__max_steps=400
    )
    train_run(study / "train", base_config, 0.75, 3, [0.2, 0.3, 0.3], [0.3] * 3, optim__lr=1e-4)
    train_run(study / "train", base_config, 0.75, 3, [0.2, 0.3, 0.3], [0.3] * 3, train__seed=1)
    agg.aggregate("evidence2", [study / "train", study / "baselines"])
    rows = tables_of(study / "train" / "aggregate")["comparison"]
    named = sorted(label for label in rows if "λ=0.75, N=3" in label)
    assert named == [
        "GrammarRL greedy, λ=0.75, N=3, optim.lr=0.0001, 200 steps",
        "GrammarRL greedy, λ=0.75, N=3, optim.lr=1e-05, 200 steps",
        "GrammarRL greedy, λ=0.75, N=3, optim.lr=1e-05, 200 steps, training seed 1",
        "GrammarRL greedy, λ=0.75, N=3, optim.lr=1e-05, 400 steps",
    ]
    assert "GrammarRL greedy, λ=0.5, N=3" in rows


def test_training_seeds_repeat_a_setting_and_are_never_chosen(
    study: Path, base_config: dict[str, Any]
):
    """Seeds 1 and 2 of the chosen setting (λ=1, N=3), with better dev numbers than seed 0: the
    choice stays among the study's own seed, and the seeds table gives each seed's paired
    differences and the mean over seeds."""
    for seed, test in ((1, [0.4, 0.4, 0.4]), (2, [0.2, 0.2, 0.5])):
        train_run(study / "train", base_config, 1.0, 3, [0.2, 0.36, 0.9], test, train__seed=seed)
    agg.aggregate("evidence2", [study / "train", study / "baselines"])
    out = study / "train" / "aggregate"
    comparison = tables_of(out)["comparison"]
    assert "GrammarRL greedy, dev-chosen (λ=1, N=3)" in comparison
    assert comparison["GrammarRL greedy, λ=1, N=3, training seed 2"][0] == "0.300 ± 0.173"
    text = (out / "training_seeds.md").read_text()
    assert "λ=1, N=3" in text
    rows = md_rows(text)
    # test F1; vs greedy [0.2, 0.3, 0.4]: diff, sets above; vs rerank [0.3, 0.35, 0.5]: same
    assert rows["training seed 0"] == [
        "0.400 ± 0.173",
        "0.100 ± 0.100",
        "2/3",
        "0.017 ± 0.076",
        "1/3",
    ]
    assert rows["training seed 2"] == [
        "0.300 ± 0.173",
        "0.000 ± 0.100",
        "1/3",
        "-0.083 ± 0.076",
        "0/3",
    ]
    assert rows["mean over 3 seeds"] == [
        "0.367 ± 0.058",
        "0.067 ± 0.058",
        "5/9",
        "-0.017 ± 0.058",
        "3/9",
    ]
    assert "λ=0.5, N=3" not in text  # trained with one seed: no block


def test_mechanism_combines_rewards_with_the_chosen_runs_calibrated_sigmas(study: Path):
    agg.aggregate("evidence2", [study / "train", study / "baselines"])
    out = study / "train" / "aggregate"
    rows = tables_of(out)["mechanism"]
    assert rows["System"][3:] == ["combined, λ=0.5", "combined, λ=1 (chosen)"]
    assert "Full IS(10), paired on the rerank particles" not in rows
    # σ's of n3_b3 (2, 0.5): λ=0.5 → 0.25·d + r; λ=1 → r / 0.5
    chosen = rows["GrammarRL greedy, dev-chosen (λ=1, N=3)"]
    d, r = CHOSEN_REWARDS
    assert chosen[1:3] == ["-5.000 ± 1.000", "-1.000 ± 0.500"]
    half = mean_std([0.25 * a + b for a, b in zip(d, r)])
    assert chosen[3] == f"{half[0]:.3f} ± {half[1]:.3f}" == "-2.250 ± 0.661"
    assert chosen[4] == "-2.000 ± 1.000"
    assert rows["frozen greedy"][3:] == ["-2.750 ± 0.000", "-4.000 ± 0.000"]
    text = (out / "mechanism.md").read_text()
    assert "σ_direct=2.0000, σ_reverse=0.5000" in text and "conll/smollm2/n3_b3" in text
    assert (
        "minus frozen greedy (mean over test sets): micro-F1 +0.100, combined reward at "
        "λ=0.5 +0.500, combined reward at λ=1 +2.000."
    ) in text


def test_sigmas_recorded_in_the_checkpoint_come_first(study: Path):
    import torch

    run = study / "train" / "lambda=1.0,rollout.num_samples=3"
    (run / "checkpoints").mkdir()
    torch.save(
        {
            "state_dict": {},
            "global_step": TRAIN_STEPS,
            "grammarrl_run": {"config": {}, "sigmas": [4.0, 1.0]},
        },
        run / "checkpoints" / "last.ckpt",
    )
    agg.aggregate("evidence2", [study / "train", study / "baselines"])
    rows = tables_of(study / "train" / "aggregate")["mechanism"]
    assert rows["GrammarRL greedy, dev-chosen (λ=1, N=3)"][4] == "-1.000 ± 0.500"  # r / 1


def test_calibration_archived_beside_the_runs_is_found_by_name(study: Path):
    """Committed results keep calibration.json beside the sweeps, not at the launch path."""
    (study.parent / CALIBRATION).rename(study / "calibration.json")
    agg.aggregate("evidence2", [study / "train", study / "baselines"])
    text = (study / "train" / "aggregate" / "mechanism.md").read_text()
    assert "σ_direct=2.0000, σ_reverse=0.5000" in text and "no σ's found" not in text


def test_runs_recorded_before_the_calibration_seed_existed_find_their_sigmas(study: Path):
    """Their calibration samples were seeded by `seed`: read as `reward.calibration_seed`."""
    for path in (study / "train").glob("*/results.json"):
        results = json.loads(path.read_text())
        del results["config"]["reward"]["calibration_seed"]
        path.write_text(json.dumps(results))
    agg.aggregate("evidence2", [study / "train", study / "baselines"])
    text = (study / "train" / "aggregate" / "mechanism.md").read_text()
    assert "σ_direct=2.0000, σ_reverse=0.5000" in text and "no σ's found" not in text


def test_rows_on_other_test_sets_are_refused_naming_the_runs(
    tmp_path: Path, base_config: dict[str, Any]
):
    study = tmp_path / "study"
    train_sweep(study, base_config)
    baselines_sweep(study, base_config, eval__test_size=50)
    with pytest.raises(AggregationError, match="different test sets") as err:
        agg.aggregate("evidence2", [study / "train", study / "baselines"])
    assert "0_baseline_greedy" in str(err.value) and "1_baseline_beam" in str(err.value)
    assert "eval.test_size=50" in str(err.value)
    assert not (study / "train" / "aggregate").exists()


def test_rows_of_another_test_set_drawing_are_never_paired_by_index(
    tmp_path: Path, base_config: dict[str, Any]
):
    """Same seed and sizes, but the frozen greedy row drawn under the old seed_plus_index drawing
    and the other rows under the disjoint one: set i is not the same set."""
    study = tmp_path / "study"
    train_sweep(study, base_config)
    baselines_sweep(study, base_config, eval__test_set_drawing="seed_plus_index")
    with pytest.raises(AggregationError, match="different test sets") as err:
        agg.aggregate("evidence2", [study / "train", study / "baselines"])
    assert "eval.test_set_drawing=disjoint" in str(err.value)
    assert "eval.test_set_drawing=seed_plus_index" in str(err.value)


def test_rows_computed_in_another_dtype_are_refused(tmp_path: Path, base_config: dict[str, Any]):
    """A beam row from a machine where model.dtype=auto meant bfloat16, beside float32 rows."""
    study = tmp_path / "study"
    train_sweep(study, base_config)
    baselines_sweep(study, base_config)
    rerank = study / "baselines" / "2_rerank" / "results.json"
    unrecorded = {k: v for k, v in json.loads(rerank.read_text()).items() if k != "dtype"}
    rerank.write_text(json.dumps(unrecorded))  # older search results: no dtype, compatible
    agg.aggregate("evidence2", [study / "train", study / "baselines"])
    path = study / "baselines" / "1_baseline_beam" / "results.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "dtype": "bfloat16"}))
    with pytest.raises(AggregationError, match="another dtype") as err:
        agg.aggregate("evidence2", [study / "train", study / "baselines"])
    assert "dtype=bfloat16: frozen beam(3)" in str(err.value)


def test_partial_study_says_missing(tmp_path: Path, base_config: dict[str, Any]):
    study = tmp_path / "study"
    root = study / "train"
    train_run(root, base_config, 0.5, 10, [0.2, 0.9])  # still training
    greedy = job_config(base_config, mode="eval")
    write_eval(
        make_run(study / "baselines", "0_baseline_greedy", extra_config=greedy),
        greedy,
        GREEDY_TEST,
        rewards=([-3.0] * 3, [-2.0] * 3),
    )
    make_run(
        study / "baselines",
        "2_rerank",
        extra_config=job_config(base_config, mode="search", search__method="rerank"),
    )  # not finished
    agg.aggregate("evidence2", [root, study / "baselines"])
    out = root / "aggregate"
    found = tables_of(out)
    assert found["comparison"]["frozen greedy"][0] == "0.300 ± 0.100"
    for label in (
        "frozen beam",
        "Sample-Rerank",
        "Full IS, paired on the rerank particles",
        "GrammarRL greedy, dev-chosen",
        "GrammarRL greedy, λ=0.5, N=3",
    ):
        assert found["comparison"][label][0] == "missing"
    assert found["dev_selection"]["λ=0.5, N=10"][-1] == "unfinished"
    assert found["mechanism"]["frozen greedy"][1:] == ["-3.000 ± 0.000", "-2.000 ± 0.000", "–"]
    assert "no training run has finished" in (out / "mechanism.md").read_text()
    assert "| 2_rerank | **missing** |" in (out / "runs.md").read_text()


def test_trained_proposal_rows(study: Path, base_config: dict[str, Any]):
    adapter = (study / "train" / "lambda=1.0,rollout.num_samples=3" / "adapter").absolute()
    for particles, scores in ((1, [0.1, 0.2, 0.3]), (10, [0.4, 0.4, 0.4])):
        config = job_config(
            base_config,
            mode="search",
            search__method="is",
            search__particles=particles,
            eval__adapter=str(adapter),
        )
        write_eval(
            make_run(study / "proposal", f"is_{particles}", extra_config=config),
            config,
            scores,
            rewards=([-1.0] * 3, [-1.0] * 3),
            decoding="is",
            method="is",
            particles=particles,
            adapter=str(adapter),
        )
    frozen = job_config(base_config, mode="search", search__method="is", search__particles=3)
    write_eval(
        make_run(study / "proposal", "is_3_frozen", extra_config=frozen),
        frozen,
        [0.2] * 3,
        decoding="is",
        method="is",
        particles=3,
        adapter=None,
    )
    agg.aggregate("evidence2", [study / "train", study / "baselines", study / "proposal"])
    found = tables_of(study / "train" / "aggregate")
    assert found["comparison"]["IS(3) with the frozen proposal"][0] == "0.200 ± 0.000"
    assert found["mechanism"]["IS(3) with the frozen proposal"][1] == "not scored"
    row = found["comparison"]["IS(10) with the trained proposal (λ=1, N=3)"]
    assert row[:4] == [
        "0.400 ± 0.000",
        "0.400, 0.400, 0.400",
        "0.100 ± 0.100",
        "+0.200, +0.100, +0.000",
    ]
    assert "IS(1) with the trained proposal (λ=1, N=3)" in found["comparison"]
    assert found["mechanism"]["IS(10) with the trained proposal (λ=1, N=3)"][1] == "-1.000 ± 0.000"


def test_a_proposal_adapter_outside_the_training_runs_is_named_by_its_directory(tmp_path: Path):
    from experiments.training_runs import adapter_owner as _adapter_owner

    assert _adapter_owner([], str(tmp_path / "run7" / "adapter")) == "run7"
    assert (
        _adapter_owner([], str(tmp_path / "results" / "adapter-lambda0.75")) == "adapter-lambda0.75"
    )


def test_an_adapter_evaluated_on_other_test_sets_is_compared_with_the_frozen_rows_there(
    tmp_path: Path, base_config: dict[str, Any]
):
    """Held-out test sets: TRAIN holds only an adapter's own evaluation (mode=eval)."""
    study = tmp_path / "held_out"
    baselines = baselines_sweep(study, base_config)
    adapter = tmp_path / "results" / "adapter-lambda0.75-360steps"
    config = job_config(
        base_config,
        mode="eval",
        eval__adapter=str(adapter),
        reward__sigma_direct=2.0,  # the training calibration's σ's, set explicitly
        reward__sigma_reverse=0.5,
    )
    trained = study / "trained"
    write_eval(
        make_run(trained, "grammarrl_360steps", extra_config=config),
        config,
        [0.35, 0.30, 0.55],
        rewards=([-2.5] * 3, [-1.2] * 3),
        adapter=str(adapter),
    )
    agg.aggregate("evidence2", [trained, baselines])
    out = trained / "aggregate"
    assert not (out / "dev_selection.md").exists()
    comparison = md_rows((out / "comparison.md").read_text())
    row = comparison["GrammarRL greedy, adapter adapter-lambda0.75-360steps"]
    assert row[1] == "0.350, 0.300, 0.550"
    assert row[5] == "+0.050, -0.050, +0.050"  # vs Sample-Rerank(10), per set
    assert not any("dev-chosen" in label or "λ=0.5" in label for label in comparison)
    text = (out / "mechanism.md").read_text()
    mechanism = md_rows(text)
    # 0.5 * -2.5 / 2.0 + 0.5 * -1.2 / 0.5, with the σ's the adapter's run sets
    assert mechanism["GrammarRL greedy, adapter adapter-lambda0.75-360steps"][1:4] == [
        "-2.500 ± 0.000",
        "-1.200 ± 0.000",
        "-1.825 ± 0.000",
    ]
    assert "σ_direct=2.0000, σ_reverse=0.5000 (set in the run's config)" in text
    assert "adapter-lambda0.75-360steps minus frozen greedy" in text


def test_wrong_sweeps_are_errors(study: Path, capsys):
    assert agg.main(["evidence2", str(study / "train")]) == 2
    assert "TRAIN_SWEEP BASELINES_SWEEP" in capsys.readouterr().err
    with pytest.raises(AggregationError, match="no mode=train runs"):
        agg.aggregate("evidence2", [study / "baselines", study / "train"])


@pytest.mark.parametrize(
    ("task", "fewshot", "hints"), [("conll", 3, 5), ("gloss", 5, 15), ("wos", 1, 0)]
)
def test_the_study_on_each_task_composes_its_own_prompts(task, fewshot, hints):
    """`+experiment/evidence2_task=T` switches the task and its prompt lengths on top of the
    study's shared settings, and the CoNLL-chosen training setting comes with the transfer sweep."""
    extra = [] if task == "conll" else [f"+experiment/evidence2_task={task}"]
    cfg = compose_config(["+experiment=evidence2_transfer_cpu", *extra])
    assert (cfg.task.name, cfg.task.num_fewshot, cfg.task.num_hints) == (task, fewshot, hints)
    assert (cfg.eval.test_size, cfg.eval.num_test_sets, cfg.task.max_new_tokens) == (100, 3, 64)
    assert (cfg.beta, cfg.kl_penalty, cfg.trainer.max_steps) == (0.1, "reward", 120)


def test_every_task_metric_has_a_table_label():
    from grammarrl.tasks import builtin_task_names, task_class, task_targets

    for name in builtin_task_names():
        metric = task_class({"_target_": task_targets()[name]}).metric_name
        assert metric_label(metric) != metric, name


def write_predictions(run: Path, outputs: dict[tuple[int, str], tuple[str, int, int, int]]) -> None:
    """predictions.jsonl: (set, uid) -> (prediction, tp, fp, fn)."""
    lines = [
        json.dumps(
            {"set": s, "uid": uid, "prediction": text, "scores": {"tp": tp, "fp": fp, "fn": fn}}
        )
        for (s, uid), (text, tp, fp, fn) in outputs.items()
    ]
    (run / "predictions.jsonl").write_text("\n".join(lines) + "\n")


def test_outputs_table_counts_entities_and_identical_outputs(study: Path):
    """Precision, recall and entities per output from the predictions' tp/fp/fn per test set,
    and the share of outputs identical to frozen greedy's and Sample-Rerank's; systems without
    a predictions file are named, not dropped silently."""
    keys = [(s, uid) for s in range(3) for uid in ("a", "b")]
    write_predictions(study / "baselines" / "0_baseline_greedy", {k: ("g", 1, 1, 1) for k in keys})
    rerank = {k: ("g" if k == (0, "a") else f"r{k}", 2, 0, 0) for k in keys}
    write_predictions(study / "baselines" / "2_rerank", rerank)
    chosen = study / "train" / "lambda=1.0,rollout.num_samples=3"
    write_predictions(chosen, {k: (text, 2, 1, 0) for k, (text, _, _, _) in rerank.items()})
    agg.aggregate("evidence2", [study / "train", study / "baselines"])
    text = (study / "train" / "aggregate" / "outputs.md").read_text()
    rows = md_rows(text)
    assert rows["frozen greedy"] == ["0.500 ± 0.000", "0.500 ± 0.000", "2.000 ± 0.000"] + [
        "1.000 ± 0.000",
        "0.167 ± 0.289",
    ]
    assert rows["GrammarRL greedy, dev-chosen (λ=1, N=3)"] == [
        "0.667 ± 0.000",
        "1.000 ± 0.000",
        "3.000 ± 0.000",
        "0.167 ± 0.289",
        "1.000 ± 0.000",
    ]
    assert (
        "frozen beam(3)" not in rows and "No predictions with entity counts: frozen beam(3)" in text
    )
    assert "the gold outputs hold 2.00" in text
    boot = md_rows((study / "train" / "aggregate" / "paired_bootstrap.md").read_text())
    assert boot["GrammarRL greedy, dev-chosen (λ=1, N=3)"] == [
        "+0.300",  # F1 0.8 against frozen greedy's 0.5 on every example of every set
        "[+0.300, +0.300]",
        "1.000",
        "-0.200",  # against Sample-Rerank's 1.0
        "[-0.200, -0.200]",
        "0.000",
    ]
