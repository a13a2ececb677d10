"""mode=export: the merged Hugging Face folder, loaded with transformers and constrained by
Outlines with the exported grammar, decodes what our decoder decodes with the adapter."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from grammarrl.api import EXPORT_RECORD
from grammarrl.config.schema_training import OBJECTIVES
from grammarrl.decoding import ConstrainedDecoder
from grammarrl.errors import ConfigError, GrammarRLError
from grammarrl.evaluation.evaluate import load_evaluated_model
from grammarrl.export import GRAMMAR_FILE, model_card, run_export
from grammarrl.job import validate
from grammarrl.models.chat import encode_prompt
from grammarrl.models.loading import add_lora, load_model
from grammarrl.runs import rundir
from grammarrl.runs.results import config_dict
from grammarrl.tasks import load_task
from tests.conftest import compose_config

TINY = ["model=tiny", "task=conll", "data.dir=null", "logger=none", "task.max_new_tokens=48"]


def random_adapter(cfg, cache_dir: Path, out: Path) -> Path:
    """A LoRA adapter with random (non-zero) weights, so that merging changes the outputs."""
    model, _ = load_model(cfg.model, cache_dir, device="cpu")
    policy = add_lora(model, cfg.lora)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    policy.save_pretrained(out)
    return out


def trained_run(cache_dir: Path, run: Path, settings: list[str]) -> Path:
    """A training run directory as training leaves it for export and the API: its record
    (job.json) and a random adapter."""
    cfg = compose_config([*TINY, "model.dtype=float32", "mode=train", *settings])
    random_adapter(cfg, cache_dir, run / "adapter")
    rundir.commit(cfg, run, rundir.Plan())
    return run


def export(run: Path, folder: Path, settings: Sequence[str] = ()) -> Path:
    """mode=export of the run's adapter into `folder`, with the export command's `settings`."""
    cfg = compose_config(
        [
            *TINY,
            "model.dtype=float32",
            "mode=export",
            f"eval.adapter={run / 'adapter'}",
            f"export.dir={folder}",
            *settings,
        ]
    )
    validate(cfg)
    return Path(run_export(cfg)["export_dir"])


def outlines_greedy(folder: Path, messages: list[dict[str, str]], max_new_tokens: int) -> str:
    """Greedy decoding of the exported folder through Outlines with its grammar file."""
    import outlines
    from outlines.types import CFG
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    generate = outlines.Generator(
        outlines.from_transformers(model, tokenizer),
        CFG((folder / GRAMMAR_FILE).read_text()),
        backend="llguidance",
    )
    return generate(outlines.inputs.Chat(messages), max_new_tokens=max_new_tokens)


@pytest.mark.parametrize(
    "model", ["tiny", pytest.param("smollm2", marks=pytest.mark.slow)]
)  # float32: merged = unmerged
def test_exported_folder_decodes_like_our_decoder_with_the_adapter(tmp_path, cache_dir, model):
    # two inputs, 24 tokens: enough for the merged weights and the adapter to show in the text
    settings = [*TINY, f"model={model}", "model.dtype=float32", "task.max_new_tokens=24"]
    adapter = random_adapter(compose_config(settings), cache_dir, tmp_path / "run" / "adapter")
    cfg = compose_config(
        [*settings, "mode=export", f"eval.adapter={adapter}", f"export.dir={tmp_path / 'model'}"]
    )
    validate(cfg)
    result = run_export(cfg)
    folder = Path(result["export_dir"])
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert "GrammarRL" in (folder / "README.md").read_text()

    task = load_task(cfg)
    policy, tokenizer = load_evaluated_model(  # the base model with the adapter attached
        cfg.model, cfg.cache_dir, cfg.device, cfg.eval.adapter
    )
    decoder = ConstrainedDecoder(policy, tokenizer, task.grammar(), cfg.task.max_new_tokens)
    examples = task.splits().test_pool[:2]
    ours = decoder.greedy([encode_prompt(tokenizer, task.forward_messages(ex)) for ex in examples])
    theirs = [
        outlines_greedy(folder, task.forward_messages(ex), cfg.task.max_new_tokens)
        for ex in examples
    ]
    assert [g.text for g in ours] == theirs
    with torch.no_grad(), policy.disable_adapter():  # the adapter matters: not a vacuous match
        frozen = decoder.greedy(
            [encode_prompt(tokenizer, task.forward_messages(ex)) for ex in examples]
        )
    assert [g.text for g in frozen] != theirs

    example = json.loads((folder / "example_prompt.json").read_text())
    assert example["messages"] == task.forward_messages(task.splits().test_pool[0])


def test_export_needs_an_adapter():
    with pytest.raises(ConfigError, match="eval.adapter"):
        validate(compose_config([*TINY, "mode=export"]))


# --- the Python API -----------------------------------------------------------------------------


def test_api_loads_a_run_and_its_export_and_generates_what_the_decoder_does(tmp_path, cache_dir):
    from grammarrl import api

    run = trained_run(cache_dir, tmp_path / "run", [])
    from_run = api.load(run)
    task = from_run.task
    examples = task.splits().test_pool[:3]
    outputs = from_run.generate([ex.input for ex in examples])

    expected = from_run.decoder.greedy(
        [encode_prompt(from_run.tokenizer, task.forward_messages(ex)) for ex in examples]
    )
    assert [o.text for o in outputs] == [g.text for g in expected]
    for out in outputs:
        assert out.valid == (out.value is not None)
        if out.valid:
            assert out.value == task.parse(out.text)
    assert [o.text for o in api.load(run / "adapter").generate([examples[0].input])] == [
        outputs[0].text
    ]
    # one string is one input, not a sequence of one-character inputs
    assert [o.text for o in from_run.generate(examples[0].input)] == [outputs[0].text]

    folder = export(run, tmp_path / "m")
    assert [o.text for o in api.load(folder).generate([ex.input for ex in examples])] == [
        o.text for o in outputs
    ]

    rows = [{"input": ex.input, "output": ex.target} for ex in examples]
    evaluation = from_run.evaluate(rows)
    scores = task.score([o.text for o in outputs], examples)
    assert (evaluation.metric, evaluation.value) == (scores.metric, scores.value)
    with pytest.raises(GrammarRLError, match="row 1 lacks output"):
        from_run.evaluate([rows[0], {"input": "x"}])


def test_api_names_what_a_path_lacks(tmp_path):
    from grammarrl import api

    with pytest.raises(GrammarRLError, match="not a training run directory"):
        api.load(tmp_path)


def test_export_records_the_training_runs_prompts_not_the_export_commands(tmp_path, cache_dir):
    from grammarrl import api

    run = trained_run(cache_dir, tmp_path / "run", ["task.num_fewshot=2", "data.split_seed=1"])
    command = ["task.num_fewshot=4", "data.split_seed=0"]  # what the export command passes
    folder = export(run, tmp_path / "m", command)

    from_run, from_export = api.load(run), api.load(folder)
    recorded = json.loads((folder / EXPORT_RECORD).read_text())["config"]
    assert (recorded["task"]["num_fewshot"], recorded["data"]["split_seed"]) == (2, 1)
    examples = from_run.task.splits().test_pool[:2]
    prompts = [from_run.task.forward_messages(ex) for ex in examples]
    assert [from_export.task.forward_messages(ex) for ex in examples] == prompts
    exported = json.loads((folder / "example_prompt.json").read_text())
    assert exported["messages"] == prompts[0]
    other = load_task(compose_config([*TINY, *command]))  # the command's settings would differ
    assert [other.forward_messages(ex) for ex in examples] != prompts


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_model_card_names_the_objective_the_run_was_trained_with(objective):
    cfg = compose_config([*TINY, "mode=train", f"train.objective={objective}"])
    card = model_card(cfg, Path("run/adapter"), config_dict(cfg))
    assert f"`train.objective={objective}`" in card
    named = {"rloo": "RLOO", "amortised_is": "amortised IS"}
    assert [name for name in named.values() if name in card] == [named[objective]]


def test_api_loads_a_run_and_an_export_recorded_before_keys_were_added_or_moved(
    tmp_path, cache_dir
):
    """Records are read as run directories read them (`rundir.read_record`): `kl_penalty`
    (added since) takes the value older runs ran with, `optim.max_steps` its name of now."""
    from grammarrl import api

    run = trained_run(cache_dir, tmp_path / "run", ["trainer.max_steps=7"])
    record = json.loads((run / "job.json").read_text())
    old = record["config"]
    del old["kl_penalty"]
    old["optim"]["max_steps"] = old["trainer"].pop("max_steps")
    (run / "job.json").write_text(json.dumps(record))

    policy = api.load(run)
    assert (policy.cfg.kl_penalty, policy.cfg.trainer.max_steps) == ("loss", 7)
    sentence = "EU rejects German call to boycott British lamb ."
    (output,) = policy.generate(sentence)
    assert output.valid == (output.value is not None)

    folder = export(run, tmp_path / "m")
    record = json.loads((folder / EXPORT_RECORD).read_text())
    del record["config"]["kl_penalty"]  # a folder exported before the key existed
    (folder / EXPORT_RECORD).write_text(json.dumps(record))
    assert [o.text for o in api.load(folder).generate(sentence)] == [output.text]
