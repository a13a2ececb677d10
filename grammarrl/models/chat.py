"""Chat-template encoding shared by decoding, rewards and evaluation."""

from __future__ import annotations

from typing import Any

from grammarrl.types import Message


def encode_prompt(tokenizer: Any, messages: list[Message]) -> list[int]:
    """Token ids of a chat prompt ending with the assistant header (generation prompt)."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers returns BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def end_of_turn_id(tokenizer: Any) -> int:
    """The token that ends an assistant turn (SmolLM2: <|im_end|>; Llama 3: <|eot_id|>)."""
    for token in ("<|eot_id|>", "<|im_end|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            return token_id
    return tokenizer.eos_token_id
