"""Job console hygiene: known third-party noise is dropped by its text, nothing else."""

from __future__ import annotations

import logging
import warnings

from grammarrl.logs import quiet_third_party


def test_known_noise_is_dropped_and_other_messages_kept(caplog):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party()
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
        warnings.warn("Found 397 module(s) in eval mode at the start of training.", UserWarning)
        warnings.warn("a library warning we do not know", FutureWarning)
        warnings.warn("our own warning", UserWarning)
    assert [str(w.message) for w in caught] == ["a library warning we do not know",
                                                "our own warning"]
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO):
        rank_zero.info("💡 Tip: For seamless cloud logging, try installing X")
        rank_zero.info("GPU available: False, used: False")
        logging.getLogger("grammarrl").warning("our warning")
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False",
                                                        "our warning"]


def test_lightning_console_handler_removed_when_the_root_logs(monkeypatch):
    lightning = logging.getLogger("lightning.pytorch")
    extra = logging.StreamHandler()
    monkeypatch.setattr(lightning, "handlers", [extra])
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [logging.NullHandler()])
    quiet_third_party()
    assert extra not in lightning.handlers  # records still reach the root's handlers
