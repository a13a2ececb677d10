"""mode=search: the inference-time baselines (Sample-Rerank, Full IS, Full SMC): their methods,
potentials, the picks from particle sets and the search job."""
