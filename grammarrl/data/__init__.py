"""Data access: sources (local directory, bundled samples, hub), row readers, splits, hints."""
