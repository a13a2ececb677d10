"""Sweeps that reproduce the paper's tables and figures: run discovery (runs), the table model
and its Markdown/LaTeX renderings (table_format), the paper's tables (paper_tables), prediction
and metric statistics (analysis), figures (figures), the aggregation CLI (aggregate), sweep
listing (jobs) and a W&B report definition (wandb_report). See experiments/README.md."""
