"""Evaluation mode: greedy/beam evaluation of test sets, run summaries, training curves and plots."""
