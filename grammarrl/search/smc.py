"""Full SMC: resampling when ESS < `search.ess_threshold` · N, with the task potential on
prefixes; the output is the posterior mode."""

from __future__ import annotations

from grammarrl.search.methods import SearchMethod, posterior_mode

METHOD = SearchMethod("smc", posterior_mode, potential="task", resamples=True)
