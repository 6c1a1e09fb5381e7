"""The one check of options with a fixed set of values (lit_svd/choices.py)."""

from typing import Literal

import pytest

from lit_svd.choices import check_choice, choices

Side = Literal["query", "key"]
Nested = Literal[Side, "both"]


def test_choices_are_the_literal_values_in_order():
    assert choices(Side) == ("query", "key")
    assert choices(Nested) == ("query", "key", "both")  # a Literal of Literals is flattened
    assert choices(Side | Literal[3]) == ("query", "key", 3)  # so is a union of Literals
    assert choices(("a", "b")) == ("a", "b")  # a subset computed at run time


def test_check_choice_returns_the_value_or_fails_in_one_line():
    assert check_choice("side", "key", Side) == "key"
    with pytest.raises(ValueError, match=r"^side='value' is unknown; choose one of query, key$"):
        check_choice("side", "value", Side)
    with pytest.raises(ValueError, match=r"^site='gate' is unknown for gpt2; choose one of q, up$"):
        check_choice("site", "gate", ("q", "up"), where=" for gpt2")
    for bad in (None, 1, ["query"], ("query",)):  # not a member, even where == or hashing could mislead
        with pytest.raises(ValueError, match="is unknown"):
            check_choice("side", bad, Side)
