"""The one direction address: string form round trip, blocks against ``linalg.direction_blocks``, the report
columns, and one-line errors."""

from __future__ import annotations

import pytest
import torch

from lit_svd.addresses import Address
from lit_svd.linalg import direction_blocks


@pytest.mark.parametrize(
    "text",
    ["L3.ov.h2.d0", "L3.ov.h2.d0-3", "L5.mlp_out.d17", "L0.k.h1.d4", "L3.b_V.h2", "L3.b_O", "embed", "L2.b_U"],
)
def test_string_round_trip(text):
    a = Address.parse(text)
    assert str(a) == text and Address.parse(str(a)) == a and hash(a) == hash(Address.parse(text))


def test_block_and_whole_against_direction_blocks():
    S = torch.tensor([[10.0, 9.9, 9.8, 5.0, 1.0], [4.0, 2.0, 1.99, 1.0, 0.5]])
    blocks = direction_blocks(S, 0.05)
    assert Address(1, "ov", 0, 1).block(blocks) == Address(1, "ov", 0, 0, 3)  # 10, 9.9, 9.8 chain
    assert Address(1, "ov", 0, 3).block(blocks) == Address(1, "ov", 0, 3)  # isolated: itself
    assert Address(1, "ov", 1, 2).block(blocks) == Address(1, "ov", 1, 1, 2)
    assert Address(1, "ov", 1, 2).whole(5) == Address(1, "ov", 1, 0, 5) and list(
        Address.parse("L1.q.h0.d1-2").directions
    ) == [1, 2]


def test_row_columns_and_errors():
    a = Address(4, "ov", 2, 7)
    assert a.row() == {"component": "L4.ov", "kind": "ov", "layer": 4, "head": 2, "direction": 7}
    assert a.row("group")["group"] == 2 and a.is_direction and not Address(4, "b_O").is_direction
    with pytest.raises(ValueError, match="^kind='o' is unknown for an address; choose one of qk, q, k, ov, "):
        Address(0, "o")
    with pytest.raises(ValueError, match="not of the form"):
        Address.parse("layer3.ov")
    assert sorted([Address(2, "ov"), Address(0, "mlp_out"), Address(0, "embed")])[0] == Address(0, "embed")
