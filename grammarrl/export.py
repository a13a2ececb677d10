"""mode=export: a trained policy as a standard Hugging Face model folder.

    python -m grammarrl.run mode=export task=... eval.adapter=<run>/adapter [export.dir=DIR]

The LoRA adapter is merged into the base weights (`merge_and_unload`), and the folder holds the
merged model (safetensors), its tokenizer, a generation config that stops at the end of the
assistant turn and decodes greedily, the task's grammar (`grammar.lark`, the Lark dialect that
llguidance and Outlines' `CFG` compile), one rendered prompt of the task (`example_prompt.json`)
and a model card (`README.md`) saying how the policy was trained. Loaded with `transformers` and
constrained by Outlines with that grammar, it decodes what our decoder does with the adapter.
The folder is built with, and records (`grammarrl_export.json`, read by `grammarrl.api.load`),
the training run's settings: its task, data, prompts and model, not the export command's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grammarrl.api import EXPORT_RECORD
from grammarrl.models.chat import end_of_turn_id
from grammarrl.runs.atomic import write_json
from grammarrl.runs.results import config_dict
from grammarrl.runs.rundir import BOOKKEEPING, describe, differing_keys, read_record, run_dir

log = logging.getLogger(__name__)

GRAMMAR_FILE = "grammar.lark"
EXAMPLE_FILE = "example_prompt.json"
# Keys the export job decides; the folder takes every other setting from the training run.
EXPORT_KEYS = ("mode", "device", "cache_dir", "eval.adapter", "export")
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
# What each `train.objective` trains, and the settings of its own the model card lists too.
OBJECTIVES = {
    "rloo": (
        (
            "label-free RLOO over grammar-constrained rollouts (N samples and the beam top-B "
            "per input), rewarded by the frozen base model's own likelihoods, direct and "
            "reverse, mixed by λ, with a KL penalty β to the base model"
        ),
        (),
    ),
    "amortised_is": (
        (
            "label-free amortised IS: trained towards the outputs of Full IS, whose "
            "grammar-constrained particles are weighted towards the frozen base model's "
            "likelihood times a potential and resampled into N targets per input, with β's "
            "KL term to the base model under `kl_penalty=loss`"
        ),
        ("train.proposal", "search.particles", "search.potential"),
    ),
}


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


def export_config(cfg: DictConfig, trained: dict[str, Any] | None) -> DictConfig:
    """The config the folder is built with and records: the training run's (task, data,
    prompts, model, train.*) with this job's `EXPORT_KEYS`; this job's own when the adapter
    holds no record of its run. Settings of this job that differ from the run's are logged."""
    if trained is None:
        return cfg
    config = OmegaConf.create(trained)
    for key in EXPORT_KEYS:
        OmegaConf.update(config, key, OmegaConf.select(cfg, key), merge=False)
    ignored = differing_keys(trained, config_dict(cfg), (*BOOKKEEPING, *EXPORT_KEYS))
    if ignored:
        log.info(
            "mode=export: the training run's settings are exported, not this job's: %s",
            describe(trained, config_dict(cfg), ignored),
        )
    return config


def model_card(cfg: DictConfig, adapter: Path, trained: dict[str, Any] | None) -> str:
    """A short README: base model, task, how the adapter was trained, how to use the folder."""
    if trained is None:
        training = (
            f"The adapter ({adapter}) holds no record of its training run, so its "
            "settings are not listed here."
        )
    else:
        what, keys = OBJECTIVES[_lookup(trained, "train.objective")]
        listed = ("train.objective", *TRAINED_KEYS, *keys)
        settings = ", ".join(f"`{k}={_lookup(trained, k)}`" for k in listed)
        training = f"Trained with GrammarRL: {what}. Settings: {settings}."
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
    trained = training_record(adapter)
    cfg = export_config(cfg, trained)
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
    (out / "README.md").write_text(model_card(cfg, adapter, trained), encoding="utf-8")
    write_json(
        out / EXPORT_RECORD,
        {"adapter": str(adapter), "task": cfg.task.name, "config": config_dict(cfg)},
    )
    log.info("exported %s merged with %s to %s", cfg.model.name, adapter, out)
    print(f"exported: {out}")
    return {"export_dir": str(out), "adapter": str(adapter), "task": cfg.task.name}
