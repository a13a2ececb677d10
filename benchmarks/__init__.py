"""Performance benchmarks (`make bench`): each compares two variants in one run, on the same
inputs, and reports their ratio against a goal. See benchmarks/README.md."""
