"""Grammar-constrained decoding: llguidance matchers over a HF causal LM (greedy, sampling, beam,
group rollouts), with per-token unconstrained / constrained log-probs and allowed mass; and
teacher-forced scoring of given outputs (`scoring.py`)."""

from grammarrl.decoding.decoder import ConstrainedDecoder
from grammarrl.decoding.grammar import CompiledGrammar, GrammarError
from grammarrl.decoding.types import BeamResult, Generation

__all__ = ["BeamResult", "CompiledGrammar", "ConstrainedDecoder", "Generation", "GrammarError"]
