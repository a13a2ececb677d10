"""The output constraint of `task=custom` as a Lark grammar (llguidance's dialect).

`constraint_grammar` turns a `json_schema`, `regex`, `lark` or `choices` value into the Lark
source llguidance compiles, `check_lark` reports a source llguidance cannot compile, and
`ByteGrammarChecker` accepts whole strings by their bytes (no model tokenizer needed).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from grammarrl.data.sources import read_text
from grammarrl.errors import ConfigError
from grammarrl.tasks.grammar_check import GrammarChecker, alternation

# One-line JSON in the separators of json.dumps: the canonical gold form, natural BPE tokens.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def constraint_grammar(kind: str, value: Any) -> tuple[dict | None, tuple[str, ...], str, str]:
    """(schema, choices, Lark source, default output-format line) of the constraint `kind`
    (`task.<kind>`) given `value` (plain data; a Lark file already read)."""
    key = f"task.{kind}"
    if kind == "json_schema":
        schema = _schema(value, key)
        layout = {**JSON_LAYOUT, **schema.get("x-guidance", {})}
        source = json.dumps({**closed(schema), "x-guidance": layout}, ensure_ascii=False)
        shown = json.dumps(
            {k: v for k, v in schema.items() if k != "x-guidance"}, ensure_ascii=False
        )
        return (
            schema,
            (),
            f"start: %json {source}\n",
            (f"Output format: one JSON object on one line, matching this JSON schema: {shown}"),
        )
    if kind == "choices":
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(c, str) and c for c in value)
        ):
            raise ConfigError(f"{key}={value!r} is invalid: expected a list of non-empty strings")
        choices = tuple(dict.fromkeys(value))
        return (
            None,
            choices,
            f"start: {alternation(choices)}\n",
            (f"Answer with exactly one of: {' | '.join(choices)}"),
        )
    if not isinstance(value, str):
        raise ConfigError(f"{key}={value!r} is invalid: expected a string")
    if kind == "regex":
        import llguidance

        return (
            None,
            (),
            f"start: /{llguidance.regex_to_lark(value)}/\n",
            (f"Output format: text matching the regular expression {value}"),
        )
    return None, (), value, ""


def _schema(value: Any, key: str) -> dict[str, Any]:
    """A JSON schema given inline (a mapping or JSON text) or as a file path."""
    if isinstance(value, str) and not value.lstrip().startswith("{"):
        path = Path(value).expanduser()
        if not path.is_file():
            raise ConfigError(f"{key}={value}: no such file (a JSON schema, or give it inline)")
        where, text = str(path), read_text(path)
    else:
        where, text = "inline", value
    if isinstance(text, str):
        try:
            text = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{key} ({where}): not valid JSON: {err}") from None
    if not isinstance(text, dict):
        raise ConfigError(
            f"{key} ({where}): expected a JSON schema object, got {type(text).__name__}"
        )
    return text


def closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` added to every object that lists its
    `properties` and says nothing about other keys (JSON Schema would allow any key there)."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def check_lark(source: str, key: str) -> None:
    """ConfigError naming `key` with llguidance's message if the Lark source does not compile."""
    import llguidance

    spec = llguidance.LLMatcher.grammar_from_lark(source)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(spec, None)
    if is_error:
        raise ConfigError(
            f"{key}: llguidance cannot compile it: "
            f"{one_line(messages[0] if messages else '?', key != 'task.lark')}"
        )


def one_line(message: str, drop_position: bool) -> str:
    """llguidance's message on one line, without its excerpt of the grammar; the position
    (`at 1(8): `) is dropped where it points into the Lark source we generated."""
    lines = []
    for line in message.splitlines():
        if re.match(r"\s*\d+ \| ", line):  # the excerpt: `   1 | start: ...` and its caret
            break
        lines.append(line.strip())
    text = " ".join(line for line in lines if line)
    return re.sub(r"^at \d+\(\d+\): ", "", text) if drop_position else text


# ---------------------------------------------------------------------- acceptance by bytes


class ByteTokenizer:
    """Token i is byte i; token 256 ends the text. Lets llguidance check whole strings against
    a grammar without a model's tokenizer (the language a grammar accepts is over bytes)."""

    eos_token_id = 256
    bos_token_id = None
    special_token_ids: ClassVar[list[int]] = [256]
    tokens: ClassVar[list[bytes]] = [bytes([i]) for i in range(256)] + [b"<|end|>"]

    def __call__(self, data: bytes) -> list[int]:
        return list(data)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))


@lru_cache(maxsize=1)
def _byte_ll_tokenizer() -> Any:
    import llguidance

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteTokenizer()))


class ByteGrammarChecker(GrammarChecker):
    """`GrammarChecker` over bytes: accepts exactly the strings of the grammar's language."""

    def __init__(self, lark: str) -> None:
        import llguidance

        self.tokenizer = ByteTokenizer()
        spec = llguidance.grammar_from("lark", lark)
        self._start = llguidance.LLMatcher(_byte_ll_tokenizer(), spec, log_level=0)
        if self._start.is_error():
            raise ValueError(f"the grammar does not compile: {self._start.get_error()[:500]}")
