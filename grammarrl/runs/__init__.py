"""Run bookkeeping: run directories and their records, results files, atomic writes, W&B tracking, logs, progress bars, RNG states and the phase clock."""
