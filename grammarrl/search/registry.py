"""The search methods by name (`search.method`). Each built-in method is one module of this
package defining its `METHOD` (a `grammarrl.search.methods.SearchMethod`), listed in `BUILTIN`;
`register` adds one from elsewhere. The config's allowed values, `SEARCH_METHODS` in
`grammarrl/config/schema_evaluation.py`, must name the built-ins (tested)."""

from __future__ import annotations

from grammarrl.errors import ConfigError
from grammarrl.search import importance, rerank, smc
from grammarrl.search.methods import SearchMethod

BUILTIN = (rerank.METHOD, importance.METHOD, smc.METHOD)
METHODS: dict[str, SearchMethod] = {method.name: method for method in BUILTIN}


def register(method: SearchMethod) -> SearchMethod:
    """Make `method` selectable by its name; a name is registered once."""
    if method.name in METHODS:
        raise ValueError(f"search method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def search_method(name: str) -> SearchMethod:
    """The method registered as `name`."""
    if name not in METHODS:
        raise ConfigError(f"search.method={name!r}: expected one of {', '.join(METHODS)}")
    return METHODS[name]
