"""Full IS: importance sampling without resampling; the output is the posterior mode. Paired
with the reverse potential; draws the same particles as Sample-Rerank (so each reports both)."""

from __future__ import annotations

from grammarrl.search.methods import SearchMethod, posterior_mode

METHOD = SearchMethod("is", posterior_mode, potential="reverse", selections=("rerank", "is"))
