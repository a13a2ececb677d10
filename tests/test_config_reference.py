"""The generated config reference (docs/reference/config.md): every key described, the page
current, and its defaults read from conf/ per group option."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from grammarrl.config import reference as config_reference
from grammarrl.config.keys import Key, key
from grammarrl.config.schema import SCALARS, SCHEMAS


def test_every_key_has_a_description():
    assert config_reference.undescribed() == []


def test_a_key_without_a_description_is_reported():
    @dataclass
    class Group:
        described: int = key("A described key.")
        bare: int = 0
        blank: str = key("  ", default="")

    scalars = {**SCALARS, "plain": "not a Key", "empty": Key("")}
    missing = config_reference.undescribed({"group": Group}, scalars)
    assert missing == ["group.bare", "group.blank", "plain", "empty"]


def test_generate_refuses_an_undescribed_key(monkeypatch):
    @dataclass
    class Group:
        bare: int = 0

    monkeypatch.setattr(config_reference, "SCHEMAS", {**SCHEMAS, "extra": Group})
    with pytest.raises(ValueError, match="extra.bare"):
        config_reference.generate()


def test_committed_page_is_current():
    page = config_reference.generate()
    committed = config_reference.PAGE.read_text(encoding="utf-8")
    assert committed == page, (
        f"{config_reference.PAGE.name} is stale: run `{config_reference.COMMAND}` and commit it"
    )


def test_page_lists_every_key_with_defaults_per_option():
    page = config_reference.generate()
    for name in SCALARS:
        assert f"| `{name}` |" in page
    for group, schema in SCHEMAS.items():
        for name in schema.__dataclass_fields__:
            assert f"| `{group}.{name}` |" in page
    rows = {line.split(" | ")[0]: line for line in page.splitlines() if line.startswith("| `")}
    # conf/task/*.yaml differ on the learning rate; conf/model/tiny.yaml alone sets the shape.
    assert "conll, wos: `7e-07`<br>custom: `1e-05`<br>gloss: `3.3e-07`" in rows["| `task.lr`"]
    assert "| tiny: `64` |" in rows["| `model.hidden_size`"]
    # allowed values come from the schema's declaration, shared with validation
    assert "`greedy`, `beam`" in rows["| `eval.decoding`"]
    assert "`rerank`, `is`, `smc`" in rows["| `search.method`"]


def test_check_flag_reports_a_stale_page(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "config.md"
    stale.write_text("# old\n", encoding="utf-8")
    monkeypatch.setattr(config_reference, "PAGE", stale)
    assert config_reference.main(["--check"]) == 1
    assert config_reference.COMMAND in capsys.readouterr().err
    assert config_reference.main([]) == 0
    assert config_reference.main(["--check"]) == 0
