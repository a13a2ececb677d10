"""Studies built from the experiments' building blocks: what is specific to one study (which
sweeps by role, which rows, which tables and file names) lives in its module here."""
