"""mode=export: a trained policy as a standard Hugging Face model folder.

    python -m grammarrl.run mode=export task=... eval.adapter=<run>/adapter [export.dir=DIR]

The LoRA adapter is merged into the base weights (`merge_and_unload`), and the folder holds the
merged model (safetensors), its tokenizer, a generation config that stops at the end of the
assistant turn and decodes greedily, the task's grammar (`grammar.lark`, the Lark dialect that
llguidance and Outlines' `CFG` compile), one rendered prompt of the task (`example_prompt.json`)
and a model card (`README.md`) saying how the policy was trained. Loaded with `transformers` and
constrained by Outlines with that grammar, it decodes what our decoder does with the adapter.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from grammarrl.models.chat import end_of_turn_id
from grammarrl.runs.atomic import write_json
from grammarrl.runs.results import config_dict
from grammarrl.runs.rundir import read_record, run_dir

log = logging.getLogger(__name__)

GRAMMAR_FILE = "grammar.lark"
EXAMPLE_FILE = "example_prompt.json"
TRAINED_KEYS = (
    "lambda",
    "beta",
    "kl_penalty",
    "train.seed",
    "rollout.num_samples",
    "rollout.beam_width",
    "optim.lr",
    "optim.batch_size",
    "trainer.max_steps",
    "lora.r",
    "lora.alpha",
)


def export_dir(cfg: DictConfig) -> Path:
    """`export.dir`, else `<run dir>/model`."""
    return Path(cfg.export.dir) if cfg.export.dir else run_dir(cfg) / "model"


def training_record(adapter: Path) -> dict[str, Any] | None:
    """The resolved config of the run that trained the adapter (its run directory's record,
    the adapter's parent), or None when the adapter was copied elsewhere."""
    record = read_record(adapter.resolve().parent)
    return record["config"] if record is not None and record["mode"] == "train" else None


def _lookup(config: dict[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def model_card(cfg: DictConfig, adapter: Path, trained: dict[str, Any] | None) -> str:
    """A short README: base model, task, how the adapter was trained, how to use the folder."""
    if trained is None:
        training = (
            f"The adapter ({adapter}) holds no record of its training run, so its "
            "settings are not listed here."
        )
    else:
        settings = ", ".join(f"`{k}={_lookup(trained, k)}`" for k in TRAINED_KEYS)
        training = (
            "Trained with GrammarRL: label-free RLOO over grammar-constrained rollouts "
            "(N samples and the beam top-B per input), rewarded by the frozen base "
            "model's own likelihoods, direct and reverse, mixed by λ, with a KL penalty "
            f"β to the base model. Settings: {settings}."
        )
    base = cfg.model.get("path") or cfg.model.name
    return f"""# GrammarRL policy: {cfg.task.name} on {cfg.model.name}

Base model: `{base}`, with the GrammarRL LoRA adapter `{adapter}` merged into its weights.

{training}

## Use

Decode greedily under the task's grammar (`{GRAMMAR_FILE}`), with prompts built as
`{EXAMPLE_FILE}` shows (chat messages; the template adds the assistant header):

```python
import outlines, transformers
from outlines.types import CFG

model = transformers.AutoModelForCausalLM.from_pretrained(FOLDER)
tokenizer = transformers.AutoTokenizer.from_pretrained(FOLDER)
generate = outlines.Generator(outlines.from_transformers(model, tokenizer),
                              CFG(open(f"{{FOLDER}}/{GRAMMAR_FILE}").read()), backend="llguidance")
print(generate(outlines.inputs.Chat(messages), max_new_tokens={cfg.task.max_new_tokens}))
```

Exported with `python -m grammarrl.run mode=export task={cfg.task.name} model={cfg.model.name}
eval.adapter=...`.
"""


def run_export(cfg: DictConfig) -> dict[str, Any]:
    """Merge `eval.adapter` into the base model and write the folder (module docstring)."""
    from grammarrl.evaluation.evaluate import load_evaluated_model
    from grammarrl.tasks import load_task

    out = export_dir(cfg)
    adapter = Path(cfg.eval.adapter)
    task = load_task(cfg)
    policy, tokenizer = load_evaluated_model(cfg.model, cfg.cache_dir, cfg.device, cfg.eval.adapter)
    merged = policy.merge_and_unload()
    stop = end_of_turn_id(tokenizer)
    merged.generation_config.update(
        eos_token_id=stop,
        pad_token_id=stop,
        do_sample=False,
        max_new_tokens=cfg.task.max_new_tokens,
    )
    merged.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / GRAMMAR_FILE).write_text(task.grammar(), encoding="utf-8")
    splits = task.splits()
    example = next(iter(splits.test_pool or splits.dev or splits.train))
    write_json(
        out / EXAMPLE_FILE,
        {
            "input": example.input,
            "gold": example.target or None,
            "messages": task.forward_messages(example),
        },
    )
    (out / "README.md").write_text(
        model_card(cfg, adapter, training_record(adapter)), encoding="utf-8"
    )
    write_json(
        out / "grammarrl_export.json",
        {"adapter": str(adapter), "task": cfg.task.name, "config": config_dict(cfg)},
    )
    log.info("exported %s merged with %s to %s", cfg.model.name, adapter, out)
    print(f"exported: {out}")
    return {"export_dir": str(out), "adapter": str(adapter), "task": cfg.task.name}
