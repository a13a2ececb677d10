"""Training mode: the Lightning module, the data module, callbacks, the run itself and its final test evaluations."""
