"""One name for a singular direction (or a block of them, or a constant node): the frozen, hashable
``Address`` every method uses.

``Address(layer, kind, group, index, size)``:

* ``kind``: a component kind (``lit_svd.models.intervene.KINDS``: ``qk``, ``q``, ``k``, ``ov``, ``mlp_in``,
  ``mlp_gate``, ``mlp_out``): a singular direction of that bias-augmented map; or a constant node of the
  decomposition of reads into writes (``CONSTANT_KINDS``: the embedding, a bias, a LayerNorm's bias);
* ``group``: the head (``qk``, ``q``, ``ov``, ``b_Q``, ``b_K``, ``b_V``), the KV head (``k``), 0 for maps of the
  whole layer (MLP maps, ``b_O``, ``b_out``, norm biases);
* ``index``, ``size``: directions ``index .. index + size - 1`` of the group's descending spectrum (0-based).
  ``size > 1`` names a block of near-equal singular values (``lit_svd.linalg.direction_blocks``): inside it
  the single vectors are arbitrary, only the block's subspace is a claim (``block``). ``whole(n)`` is the
  whole group (a head-level unit).

``str(a)`` is ``L3.ov.h2.d0`` (a direction), ``L3.ov.h2.d0-3`` (a block), ``L5.mlp_out.d17``, ``L3.b_V.h2``,
``L3.b_O``, ``embed``; ``Address.parse`` reads it back. The embedding has layer -1; reads of the final norm
(the unembedding) have layer ``n_layers``.

Not an address: ``analysis.tracking.DirectionTrack``'s names ``d1, d2, ...`` (numbered from 1) are identities
followed over training steps; where such a direction sits at one step (``TrackStep.position``) is an index here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from lit_svd.choices import check_choice, choices

DirectionKind = Literal["qk", "q", "k", "ov", "mlp_in", "mlp_gate", "mlp_out"]
DIRECTION_KINDS: tuple[DirectionKind, ...] = choices(DirectionKind)
ConstantKind = Literal[
    "embed",  # the residual entering block 0
    "b_Q",  # a head's query bias row (the query side of its QK score)
    "b_K",  # a head's key bias row
    "b_V",  # a head's value bias: b_V W_O written into the residual; the bias row of its OV map when read
    "b_O",  # the attention output bias of a layer
    "b_in",  # the MLP (up) input bias
    "b_gate",  # the gate bias of a gated MLP
    "b_out",  # the MLP output bias
    "b_U",  # the unembedding bias
    "attn_norm_bias",  # LayerNorm bias of the attention's input norm (folded into every reader's bias row)
    "mlp_norm_bias",
    "final_norm_bias",
]
CONSTANT_KINDS: tuple[ConstantKind, ...] = choices(ConstantKind)
PER_HEAD_CONSTANTS = ("b_Q", "b_K", "b_V")
EMBED_LAYER = -1


@dataclass(frozen=True, order=True)
class Address:
    """A direction (``size`` 1), a block of directions, or a constant node (module docstring)."""

    layer: int
    kind: str
    group: int = 0
    index: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, DIRECTION_KINDS + CONSTANT_KINDS, where=" for an address")
        if self.index < 0 or self.size < 1 or self.group < 0:
            raise ValueError(f"address {self!r}: group and index must be >= 0, size >= 1")

    @property
    def is_direction(self) -> bool:
        """A singular direction or block (not a constant node)."""
        return self.kind in DIRECTION_KINDS

    @property
    def is_block(self) -> bool:
        return self.size > 1

    @property
    def last(self) -> int:
        return self.index + self.size - 1

    @property
    def directions(self) -> range:
        return range(self.index, self.index + self.size)

    @property
    def component(self) -> str:
        """The component's name, as ``Component.name`` (``L3.ov``)."""
        return f"L{self.layer}.{self.kind}"

    def block(self, blocks) -> Address:
        """The block of near-equal singular values this direction lies in (``blocks``: the
        ``linalg.DirectionBlocks`` of its component, ``[groups, K]``); itself when isolated."""
        first = int(blocks.first[self.group, self.index])
        return Address(self.layer, self.kind, self.group, first, int(blocks.size[self.group, self.index]))

    def whole(self, n_directions: int) -> Address:
        """The whole group (head) as one unit: directions ``0 .. n_directions - 1``."""
        return Address(self.layer, self.kind, self.group, 0, n_directions)

    def __repr__(self) -> str:
        return f"Address.parse({str(self)!r})"

    def __str__(self) -> str:
        if self.kind == "embed":
            return "embed"
        head = f".h{self.group}" if self.kind in ("qk", "q", "k", "ov") + PER_HEAD_CONSTANTS else ""
        if not self.is_direction:
            return f"L{self.layer}.{self.kind}{head}"
        span = f"d{self.index}" if self.size == 1 else f"d{self.index}-{self.last}"
        return f"L{self.layer}.{self.kind}{head}.{span}"

    @classmethod
    def parse(cls, text: str) -> Address:
        """The address ``str`` wrote."""
        if text == "embed":
            return cls(EMBED_LAYER, "embed")
        m = re.fullmatch(r"L(\d+)\.([a-z_QKVUO]+?)(?:\.h(\d+))?(?:\.d(\d+)(?:-(\d+))?)?", text)
        if m is None:
            raise ValueError(f"address {text!r} is not of the form L<layer>.<kind>[.h<head>][.d<i>[-<j>]] or embed")
        layer, kind, group, first, last = m.groups()
        first = int(first or 0)
        return cls(int(layer), kind, int(group or 0), first, int(last) - first + 1 if last else 1)

    def row(self, group_key: str = "head") -> dict:
        """The columns the reports give a direction: ``component``, ``kind``, ``layer``, ``<group_key>``,
        ``direction`` (the block's first direction)."""
        return {"component": self.component, "kind": self.kind, "layer": self.layer, group_key: self.group,
                "direction": self.index}  # fmt: skip
