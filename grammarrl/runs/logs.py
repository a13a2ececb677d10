"""Console hygiene for jobs: third-party messages users cannot act on are dropped, each matched
by its own text (never by module or category alone), so our warnings and errors, and every other
library warning, still show; and the job's log file (Hydra's `run.log`) names paths as run
records do (`grammarrl.runs.paths`). Called once per job by the entry point."""

from __future__ import annotations

import logging
import warnings

from grammarrl.runs.paths import Roots, portable

# (message regex, why it is noise for a GrammarRL user)
THIRD_PARTY_WARNINGS = (
    (
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        "Lightning's own pytree helper against newer torch; nothing to change on our side",
    ),
    (
        r"Found \d+ module\(s\) in eval mode at the start of training",
        "by design: rollouts and the policy pass keep dropout layers in eval mode",
    ),
    (
        r"You're resuming from a checkpoint that ended before the epoch ended",
        "our batches are indexed by step, so a resumed run replays the same inputs exactly",
    ),
    (
        r"Experiment logs directory .* exists and is not empty\. Previous log files",
        "a resumed run keeps the earlier metrics rows (grammarrl.training.train merges them back)",
    ),
)
THIRD_PARTY_INFO = (
    "💡 Tip:",  # Lightning advertising other products
    "GPU available:",
    "TPU available:",
    "HPU available:",  # our own log names the device
    "Seed set to",  # our seed is in the config and the run record
    "`Trainer.fit` stopped:",  # the progress bar and the summary say where training ended
)
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")  # each may own one


class _DropMessages(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


class _PortablePaths(logging.Formatter):
    """A log file's lines with this machine's paths relative to the repository, `<data>` and
    `<cache>`, as run records name them."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return portable(self.inner.format(record), Roots.here())


def portable_log_files() -> None:
    """Give the root logger's file handlers (the job's log file) `_PortablePaths` lines."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and not isinstance(
            handler.formatter, _PortablePaths
        ):
            handler.setFormatter(_PortablePaths(handler.formatter))


def quiet_third_party() -> None:
    """Drop the known third-party noise, and Lightning's own console handlers: importing
    `lightning` adds one (and `lightning.pytorch`/`lightning.fabric` one each when logging is
    not configured yet), so under Hydra (which logs to the console and the job's log file) every
    Lightning line was printed twice. The job's log file gets portable paths too
    (`portable_log_files`)."""
    import lightning  # noqa: F401  (adds its console handlers on import: import it first)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Loading weights": a second-long bar per load
    portable_log_files()

    for pattern, _why in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    drop = _DropMessages(THIRD_PARTY_INFO)
    root_has_handlers = logging.getLogger().hasHandlers()
    for name in LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if root_has_handlers and type(handler) is logging.StreamHandler:
                logger.removeHandler(handler)
                logger.propagate = True  # to the root's handlers, which print it once
        for child in (name, f"{name}.utilities.rank_zero", f"{name}.utilities.seed"):
            if not any(isinstance(f, _DropMessages) for f in logging.getLogger(child).filters):
                logging.getLogger(child).addFilter(drop)
