"""A small Python API for notebooks: load a trained policy, generate, evaluate.

    from grammarrl.api import load

    policy = load("outputs/2026-11-24/12-00-00_conll_smollm2_train")  # a training run
    policy = load("tickets-model")                 # or a folder written by mode=export
    out = policy.generate(["EU rejects German call to boycott British lamb ."])  # or one str
    out[0].text, out[0].value                      # the output and its parsed value
    policy.evaluate([{"input": "...", "output": "..."}])   # the task metric on labelled rows

The task, prompts and decoding settings are the run's own (its recorded config); `overrides`
(dotted `key=value` strings, as on the command line) change them, e.g. `device=cpu`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grammarrl.errors import GrammarRLError

EXPORT_RECORD = "grammarrl_export.json"


@dataclass(frozen=True)
class Output:
    """One constrained output: its text, the task's parsed value (None when it does not parse
    or did not finish) and whether it is valid (ended in an accepting state and parses)."""

    text: str
    """The decoded output, without the end-of-turn token."""
    value: Any
    """The task's parse of `text` (`Task.parse`: a dict for JSON tasks, a label, a gloss
    string); None when it does not parse or the output did not finish."""
    valid: bool
    """The output ended in an accepting state of the grammar and parses."""


@dataclass(frozen=True)
class Evaluation:
    """The task metric on labelled rows, with the outputs it scored."""

    metric: str
    """The task metric's name (`micro_f1`, `accuracy`, `json_fields_f1`, ...)."""
    value: float
    """The metric over the labelled rows."""
    validity: float
    """The share of outputs that are valid."""
    outputs: list[Output]
    """The outputs scored, in the order of the rows given."""


class Policy:
    """A loaded policy (the base model with its adapter, or an exported folder) and its task."""

    def __init__(self, cfg: DictConfig, model: Any, tokenizer: Any, task: Any):
        from grammarrl.decoding import ConstrainedDecoder

        self.cfg, self.model, self.tokenizer, self.task = cfg, model, tokenizer, task
        self.decoder = ConstrainedDecoder(model, tokenizer, task.grammar(), cfg.task.max_new_tokens)

    def generate(
        self,
        inputs: str | Sequence[str],
        decoding: str = "greedy",
        beam_width: int | None = None,
        progress: bool = False,
    ) -> list[Output]:
        """Constrained outputs for raw inputs (one string is one input), greedy (the trained
        policy's setting) or beam; one output per input."""
        from grammarrl.tasks import Example

        texts = [inputs] if isinstance(inputs, str) else inputs
        examples = [
            Example(uid=f"input:{i}", input=text, target="") for i, text in enumerate(texts)
        ]
        return self._decode(examples, decoding, beam_width, progress)

    def evaluate(
        self,
        rows: Sequence[Mapping[str, str]],
        decoding: str = "greedy",
        beam_width: int | None = None,
        progress: bool = False,
    ) -> Evaluation:
        """The task metric on rows `{"input": ..., "output": gold}` (gold in the grammar's exact
        form, as the task's data files give it)."""
        from grammarrl.tasks import Example

        examples = []
        for i, row in enumerate(rows):
            missing = [key for key in ("input", "output") if key not in row]
            if missing:
                raise GrammarRLError(
                    f"evaluate: row {i} lacks {', '.join(missing)} "
                    f"(has {', '.join(row) or 'nothing'})"
                )
            examples.append(Example(uid=f"row:{i}", input=row["input"], target=row["output"]))
        outputs = self._decode(examples, decoding, beam_width, progress)
        scores = self.task.score([o.text for o in outputs], examples)
        return Evaluation(scores.metric, scores.value, scores.validity, outputs)

    def _decode(
        self, examples: list, decoding: str, beam_width: int | None, progress: bool
    ) -> list[Output]:
        import torch

        from grammarrl.evaluation.evaluate import decode_examples

        with torch.no_grad():
            gens = decode_examples(
                self.decoder,
                self.tokenizer,
                self.task,
                examples,
                decoding,
                beam_width or self.cfg.eval.beam_width,
                self.cfg.eval.batch_size,
                progress,
                self.cfg.eval.length_penalty,
            )
        return [self._output(gens[ex.uid]) for ex in examples]

    def _output(self, gen: Any) -> Output:
        from grammarrl.evaluation.evaluate import is_valid

        valid = is_valid(self.task, gen)
        return Output(gen.text, self.task.parse(gen.text) if valid else None, valid)


def run_config(path: Path) -> tuple[dict[str, Any], Path | None]:
    """(recorded config, adapter to attach or None) of a training run directory, its adapter
    directory, or a folder written by mode=export; a GrammarRLError says what was expected.
    The config is read as run directories read their records (`rundir.read_record`): a key
    added or moved since takes its name of now and the value the run ran with."""
    import json

    from grammarrl.runs.rundir import current_names, read_record

    if (path / EXPORT_RECORD).is_file():
        config = current_names(json.loads((path / EXPORT_RECORD).read_text())["config"])
        config["model"] = {**config["model"], "source": "hub", "path": str(path)}
        return config, None
    run = path.parent if (path / "adapter_config.json").is_file() else path
    record, adapter = read_record(run), run / "adapter"
    if record is not None and (adapter / "adapter_config.json").is_file():
        return record["config"], adapter
    raise GrammarRLError(
        f"{path}: not a training run directory (job.json and adapter/), an "
        f"adapter directory inside one, or a folder written by mode=export "
        f"({EXPORT_RECORD})"
    )


def load(path: str | Path, overrides: Sequence[str] = ()) -> Policy:
    """Load a policy from a training run, its adapter directory or an exported folder."""
    from grammarrl.job import validate
    from grammarrl.models.loading import load_adapter, load_model
    from grammarrl.tasks import load_task

    config, adapter = run_config(Path(path))
    cfg = OmegaConf.merge(OmegaConf.create(config), OmegaConf.from_dotlist(list(overrides)))
    cfg.mode, cfg.eval.adapter = "eval", str(adapter) if adapter else None
    validate(cfg)
    model, tokenizer = load_model(cfg.model, cfg.cache_dir, cfg.device)
    if adapter is not None:
        model = load_adapter(model, adapter)
    model.eval()
    return Policy(cfg, model, tokenizer, load_task(cfg))
