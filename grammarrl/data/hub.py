"""Public Hugging Face hub datasets (`data.source=hub`; needs internet, not used offline).

Each task's `read_hub` turns its dataset into the same `Row`s as its local reader.
"""

from __future__ import annotations

from typing import Any

from grammarrl.errors import DataError


def load_hub_dataset(name: str, **kwargs: Any) -> Any:
    """`datasets.load_dataset(name, **kwargs)`; any failure is a DataError naming the dataset."""
    try:
        from datasets import load_dataset

        return load_dataset(name, **kwargs)
    except Exception as err:  # network, auth or format errors all mean: no data
        raise DataError(f"cannot load the hub dataset {name}: {err}") from err
