"""Sweeps that reproduce the paper's tables and figures, and the building blocks studies reuse:
run discovery (runs), tables (table_format), paired comparisons (paired, systems, compare), dev
selection (dev_selection, training_runs), mechanism and outputs (mechanism, outputs, sigmas),
curves (curves), the paper's tables (paper_tables) and the aggregation CLI (aggregate); what is
specific to one study lives in `experiments/studies/`. See experiments/README.md."""
