"""mode=export: the merged Hugging Face folder, loaded with transformers and constrained by
Outlines with the exported grammar, decodes what our decoder decodes with the adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grammarrl.decoding import ConstrainedDecoder
from grammarrl.errors import ConfigError, GrammarRLError
from grammarrl.evaluation.evaluate import load_evaluated_model
from grammarrl.export import GRAMMAR_FILE, run_export
from grammarrl.job import validate
from grammarrl.models.chat import encode_prompt
from grammarrl.models.loading import add_lora, load_model
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
    from grammarrl.runs import rundir

    cfg = compose_config([*TINY, "model.dtype=float32", "mode=train"])
    run = tmp_path / "run"
    random_adapter(cfg, cache_dir, run / "adapter")
    rundir.commit(cfg, run, rundir.Plan())  # the run's record (job.json), as training writes it
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

    export = compose_config(
        [
            *TINY,
            "model.dtype=float32",
            "mode=export",
            f"eval.adapter={run / 'adapter'}",
            f"export.dir={tmp_path / 'm'}",
        ]
    )
    run_export(export)
    assert [o.text for o in api.load(tmp_path / "m").generate([ex.input for ex in examples])] == [
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
