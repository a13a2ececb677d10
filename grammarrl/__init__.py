"""GrammarRL: label-free RL that makes greedy grammar-constrained decoding good, not only valid."""

__version__ = "0.1.0"
