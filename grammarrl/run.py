"""Hydra entry point: `python -m grammarrl.run [mode=...] [task=...] [model=...] [overrides]`.

Thin on purpose: validate the config, then hand it to the mode's function in the package.
"""

from __future__ import annotations

import importlib
import logging
import sys

import hydra
from omegaconf import DictConfig

from grammarrl.config import validate
from grammarrl.errors import GrammarRLError

log = logging.getLogger("grammarrl")

# mode -> "module:function"; each function takes the composed config.
MODE_HANDLERS = {
    "prepare": "grammarrl.prepare:run_prepare",
    "eval": "grammarrl.evaluate:run_eval",
    "calibrate": "grammarrl.calibration:run_calibrate",
    "train": "grammarrl.train:run_train",
    "search": "grammarrl.search.run:run_search",
}


def dispatch(cfg: DictConfig) -> object:
    """Validate the config and run its mode; raises GrammarRLError on user errors."""
    validate(cfg)
    module_name, func_name = MODE_HANDLERS[cfg.mode].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            raise
        raise GrammarRLError(f"mode={cfg.mode} is not built yet in this version of GrammarRL")
    return getattr(module, func_name)(cfg)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> object:
    try:
        return dispatch(cfg)
    except GrammarRLError as err:
        log.error("%s", err)
        if _in_multirun():
            raise  # Hydra records the job as failed and the sweep's other jobs still run
        sys.exit(2)


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


if __name__ == "__main__":
    main()
