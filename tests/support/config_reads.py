"""Which config keys a piece of code reads: `recording()` notes every leaf read from a
`DictConfig` (attribute, item, `get`, `OmegaConf.select`, and `OmegaConf.to_container` of a
sub-config) while it is active. Converting the whole config (the run records, `config_dict(cfg)`)
is not a read: it copies every key whether or not anything uses it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf


def _leaves(data: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(data, dict) and data:
        for key, value in data.items():
            yield from _leaves(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1]


def _full_key(node: DictConfig, key: Any) -> str:
    return node._get_full_key(key)


@contextlib.contextmanager
def recording() -> Iterator[set[str]]:
    """The dotted keys read while the block runs (lists are leaves)."""
    read: set[str] = set()
    getattr_, getitem_, get_ = DictConfig.__getattr__, DictConfig.__getitem__, DictConfig.get
    select_, to_container_ = OmegaConf.select, OmegaConf.to_container

    def note(node: DictConfig, key: Any, value: Any) -> Any:
        if not isinstance(value, DictConfig):
            read.add(_full_key(node, key))
        return value

    def getattr_recorded(self: DictConfig, key: str) -> Any:
        value = getattr_(self, key)
        return value if key.startswith("__") else note(self, key, value)

    def select_recorded(cfg: Any, key: str, **kwargs: Any) -> Any:
        value = select_(cfg, key, **kwargs)
        if not isinstance(value, DictConfig):
            parent = cfg._get_full_key(None) if cfg._get_parent() is not None else ""
            read.add(f"{parent}.{key}" if parent else key)
        return value

    def to_container_recorded(cfg: Any, **kwargs: Any) -> Any:
        if isinstance(cfg, DictConfig) and cfg._get_parent() is not None:
            parent = cfg._get_full_key(None)
            read.update(f"{parent}.{k}" for k in _leaves(to_container_(cfg, resolve=True)))
        return to_container_(cfg, **kwargs)

    DictConfig.__getattr__ = getattr_recorded
    DictConfig.__getitem__ = lambda self, key: note(self, key, getitem_(self, key))
    DictConfig.get = lambda self, key, default_value=None: note(
        self, key, get_(self, key, default_value)
    )
    OmegaConf.select = staticmethod(select_recorded)
    OmegaConf.to_container = staticmethod(to_container_recorded)
    try:
        yield read
    finally:
        DictConfig.__getattr__, DictConfig.__getitem__, DictConfig.get = getattr_, getitem_, get_
        OmegaConf.select, OmegaConf.to_container = (
            staticmethod(select_),
            staticmethod(to_container_),
        )
