"""Running the unchanged HF forward with components rescaled along their singular directions.

A *component* is one bias-augmented linear map of the model, batched over its groups (heads, KV
heads, or the layer), with its SVD ``M = U diag(S) V^T`` read from the view (``models.svds``: computed once
per view, signs fixed):

===========  =====================================  =======  ============================================
kind         matrix (view method)                   groups   what is rescaled
===========  =====================================  =======  ============================================
``qk``       ``[b_Q; W_Q] [b_K; W_K]^T`` (``qk``)    heads    the pre-softmax score (non-rotary models)
``q``        ``[b_Q; W_Q]`` (``q_map``)             heads    the query, before RoPE
``k``        ``[b_K; W_K]`` (``k_map``)             KV heads the key, before RoPE (one map per KV head)
``ov``       ``[b_V; W_V] W_O`` (``ov``)            heads    the head's output (``b_O`` untouched)
``mlp_in``   ``[b_in; W_in]`` (``mlp_in``)          layer    the MLP's (up) pre-activation
``mlp_gate`` ``[b_gate; W_gate]`` (``mlp_gate``)    layer    the gate pre-activation (gated MLPs)
``mlp_out``  ``[b_out; W_out]`` (``mlp_out``)       layer    the MLP's output
===========  =====================================  =======  ============================================

Running with scales ``lambda`` (one per direction) replaces ``M`` by ``U diag(S * lambda) V^T``. Every
kind but ``qk`` writes into the span of its ``V``, so the modification is a low-rank correction of
the site's own output: with ``c = out @ V`` (the direction's coefficient, ``sigma_k [1, x] u_k``, for
``ov`` attention-mixed over sources: ``c = z_h @ (W_O V)``),

    out' = out + ((c - c_ref) * (lambda - 1)) @ V^T

which is exact, needs no dense augmented matrix and no pseudo-inverse, and costs about one extra
projection. ``c_ref = 0`` is zero ablation; ``c_ref`` = the coefficient recorded on another (corrupted)
prompt is patching, ``c' = lambda c + (1 - lambda) c_ref``. Either acts at all positions or only at
one position per example (the answer position). ``qk`` (GPT-2) replaces query and key by
``q' = ([1, x] U) * S * lambda / scale`` and ``k' = [1, x] V`` so that the model's own attention
computes ``[1, x_i] U diag(S lambda) V^T [1, x_j]^T``; it always acts at all positions (zero ablation).
For rotary models a QK direction cannot be masked through the offset-dependent rotation, so the
query and key maps' own directions (``q``, ``k``) are masked instead. Hooks sit on
``view.site_module`` / ``view.block`` only, and on ``view.head_norm_module`` for models with per-head
query / key norms (Gemma-3 ``q_norm`` / ``k_norm``): there ``q`` and ``k`` are the maps to the
*normalised* query and key (gains folded), the hook rescales the norm's output, and the per-token factor
``1 / rms`` is the one the model computed from its unmodified query / key at that site: masking a
direction removes its coefficient without renormalising the rest, so all-ones scales are exact and
``out' = f (q + ((c - c_ref)(lambda - 1)) V^T)`` stays linear in the scales.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from lit_svd.addresses import DIRECTION_KINDS, Address
from lit_svd.choices import check_choice
from lit_svd.linalg import SVD
from lit_svd.models.base import ModelView
from lit_svd.models.hooks import Hook, first_input, hooks
from lit_svd.models.svds import view_svd

KINDS = DIRECTION_KINDS  # the maps whose directions are masked (addresses.DirectionKind)
ALIASES = {"mlp": "mlp_in, mlp_gate (gated MLPs), mlp_out", "qk": "qk (non-rotary) or q and k (rotary)"}
SITE_OF = {"qk": "q", "q": "q", "k": "k", "ov": "o", "mlp_in": "up", "mlp_gate": "gate", "mlp_out": "down"}
GROUP_OF = {
    "qk": "head",
    "q": "head",
    "k": "kv_head",
    "ov": "head",
    "mlp_in": "layer",
    "mlp_gate": "layer",
    "mlp_out": "layer",
}


@dataclass
class Component:
    """One map's SVD batched over groups: ``U: [G, d_in(+1), K]``, ``S: [G, K]``, ``V: [G, d_out, K]``.

    ``read`` (``ov`` only): ``W_O V`` ``[G, d_head, K]``, mapping the head's mixed value ``z`` to the
    coefficients. ``scale`` (``qk`` only): the attention's own score scale.
    """

    kind: str
    layer: int
    U: Float[Tensor, "G d_in K"]  # d_in(+1): the bias row first where the map reads [1, x]
    S: Float[Tensor, "G K"]
    V: Float[Tensor, "G d_out K"]
    read: Float[Tensor, "G d_head K"] | None = None
    scale: float = 1.0

    @property
    def name(self) -> str:
        return f"L{self.layer}.{self.kind}"

    @property
    def site(self) -> str:
        return SITE_OF[self.kind]

    def address(self, group: int, direction: int) -> Address:
        """The address of direction ``direction`` of group ``group`` (head, KV head, 0 for the layer)."""
        return Address(self.layer, self.kind, int(group), int(direction))

    @property
    def group(self) -> str:
        return GROUP_OF[self.kind]

    @property
    def shape(self) -> tuple[int, int]:
        """``(groups, directions per group)``: the shape of this component's scales."""
        G, K = self.S.shape
        return G, K

    @property
    def n_directions(self) -> int:
        return self.S.numel()

    def coefficients(self, x: Float[Tensor, "*batch d_site"]) -> Float[Tensor, "*batch G K"]:
        """Direction coefficients ``[..., G, K]`` of the site output (or, for ``ov``, of the o input ``z``)."""
        G = self.S.shape[0]
        x = x.reshape(*x.shape[:-1], G, -1).to(self.V.dtype)  # a bf16 / fp16 model's activations in float32
        return torch.einsum("...gd,gdk->...gk", x, self.read if self.kind == "ov" else self.V)

    def write(self, coef: Float[Tensor, "*batch G K"]) -> Float[Tensor, "*batch d_site"]:
        """``coef: [..., G, K]`` back to the site's output space ``[..., d_out]`` (``ov``: summed over heads)."""
        if self.kind == "ov":
            return torch.einsum("...gk,gdk->...d", coef, self.V)
        return torch.einsum("...gk,gdk->...gd", coef, self.V).flatten(-2)


def expand_kinds(view: ModelView, kinds: Sequence[str]) -> list[str]:
    """Resolve the aliases ``qk`` and ``mlp`` for this architecture; unknown kinds fail in one line."""
    out: list[str] = []
    for kind in kinds:
        if kind == "qk":
            out += ["qk"] if view.rotary_dim == 0 else ["q", "k"]
        elif kind == "mlp":
            out += ["mlp_in", "mlp_gate", "mlp_out"] if view.gated_mlp else ["mlp_in", "mlp_out"]
        else:
            out.append(check_choice("components", kind, (*KINDS, "mlp")))
    for kind in out:
        if kind == "mlp_gate" and not view.gated_mlp:
            raise ValueError(f"components: 'mlp_gate' but {view.model_type} has no gated MLP; use mlp_in, mlp_out")
    return list(dict.fromkeys(out))


def _component(kind: str, layer: int, svd: SVD, **extra: Any) -> Component:
    """A component from its SVD, kept in float32."""
    svd = svd.to(torch.float32)
    return Component(kind, layer, svd.U, svd.S, svd.V, **extra)


@torch.no_grad()
def build_component(view: ModelView, kind: str, layer: int) -> Component:
    """The SVD of one component (all groups): the view's sign-fixed SVD of the map (``models.svds.view_svd``,
    computed once per view in float64 from the folded weights)."""
    view.check_layer(layer)
    if kind == "qk" and view.rotary_dim:
        raise ValueError(f"components: joint 'qk' cannot be masked on rotary {view.model_type}; use q and k")
    if kind not in KINDS:
        expand_kinds(view, [kind])  # raises the one-line error
    svd = view_svd(view, layer, kind).to(torch.float32)
    if kind == "qk":
        return _component(kind, layer, svd, scale=view.attn(layer).scale)
    if kind == "ov":
        return _component(kind, layer, svd, read=view.attn(layer).W_O.float() @ svd.V)  # read: [H, d_head, K]
    return _component(kind, layer, svd)


def build_components(
    view: ModelView,
    kinds: Sequence[str] = ("qk", "ov", "mlp"),
    layers: Sequence[int] | None = None,
    progress: bool = False,
) -> list[Component]:
    """Every requested component of every layer (default all), ordered by layer then kind."""
    kinds = expand_kinds(view, kinds)
    layers = range(view.n_layers) if layers is None else [view.check_layer(int(l)) for l in layers]
    todo = [(layer, kind) for layer in layers for kind in kinds]
    if progress:
        from tqdm.auto import tqdm

        todo = tqdm(todo, desc="component SVDs")
    return [build_component(view, kind, layer) for layer, kind in todo]


def rows_at(out: Float[Tensor, "B T *rest"], positions: Int[Tensor, " B"] | None) -> Float[Tensor, " B *row"]:
    """``out[b, positions[b]]`` for every example ``b`` (``positions`` None: ``out`` itself)."""
    return out if positions is None else out[torch.arange(out.shape[0], device=out.device), positions]


def put_rows_at(
    out: Float[Tensor, "B T *rest"], positions: Int[Tensor, " B"] | None, rows: Float[Tensor, " B *row"]
) -> Float[Tensor, "B T *rest"]:
    """``out`` with ``rows_at(out, positions)`` replaced by ``rows`` (not in place, differentiable)."""
    if positions is None:
        return rows
    return out.index_put((torch.arange(out.shape[0], device=out.device), positions), rows)


class Intervention:
    """Hooks that run ``view.model`` with components rescaled (``apply``) or read (``record``)."""

    def __init__(self, view: ModelView, components: Sequence[Component]):
        self.view = view
        self.components = {c.name: c for c in components}
        if len(self.components) != len(components):
            raise ValueError("components: the same (layer, kind) is listed twice")

    def ones(self) -> dict[str, Tensor]:
        """Scales that leave the model unchanged."""
        return {name: torch.ones(c.shape, device=c.S.device) for name, c in self.components.items()}

    def _check(self, scales: dict[str, Tensor]) -> None:
        for name, lam in scales.items():
            if name not in self.components:
                raise KeyError(f"scales: no component {name!r}; known: {', '.join(list(self.components)[:6])}, ...")
            if tuple(lam.shape) != self.components[name].shape:
                raise ValueError(
                    f"scales[{name!r}] has shape {tuple(lam.shape)}; expected {self.components[name].shape}"
                )

    def _by_site(self, names: Iterable[str]) -> dict[tuple[int, str], list[Component]]:
        out: dict[tuple[int, str], list[Component]] = {}
        for name in names:
            c = self.components[name]
            out.setdefault((c.layer, c.site), []).append(c)
            if c.kind == "qk":
                out.setdefault((c.layer, "k"), []).append(c)
        return out

    @contextmanager
    def apply(
        self, scales: dict[str, Tensor], *, positions: Tensor | None = None, reference: dict[str, Tensor] | None = None
    ) -> Iterator[None]:
        """Within the block, the model runs with ``scales[name]: [G, K]`` on each named component.

        ``positions``: None (every position) or ``[batch]`` long, one position per example, for all
        kinds but ``qk``. ``reference``: coefficients from ``record`` (same ``positions`` layout) to
        patch toward; None is zero ablation. Differentiable in the scales.
        """
        self._check(scales)
        view = self.view
        normalized: dict[int, Tensor] = {}
        specs = []
        for (layer, site), comps in self._by_site(scales).items():
            if any(c.kind == "qk" for c in comps) and site == "q":
                specs.append(Hook(view.block(layer), self._stash_normalized(layer, normalized), "pre"))
            module, read, write = self._site_io(layer, site, comps)
            hook = self._apply_hook(layer, site, comps, scales, positions, reference, normalized, read, write)
            specs.append(Hook(module, hook, "post"))
        try:
            with hooks(*specs):
                yield
        finally:
            normalized.clear()

    def _site_io(
        self, layer: int, site: str, comps: Sequence[Component]
    ) -> tuple[nn.Module, Callable[[Tensor], Tensor], Callable[[Tensor, Tensor], Tensor]]:
        """``(module, read, write)`` for the hook of ``site``: ``read(out)`` is the site's own output
        ``[batch, pos, d_out]`` inside the module's output, ``write(out, value)`` puts it back. Query / key
        components of models with head norms hook the norm (``view.head_norm_output`` reads it)."""
        view = self.view
        norm = None
        if site in ("q", "k") and all(c.kind in ("q", "k") for c in comps):
            norm = view.head_norm_module(layer, "q" if site == "q" else "k")
        if norm is not None:
            return norm, view.head_norm_output, view.with_head_norm_output
        return (
            view.site_module(layer, site),
            lambda out: view.site_output(layer, site, out),
            lambda out, value: view.with_site_output(layer, site, out, value),
        )

    def _apply_hook(self, layer, site, comps, scales, positions, reference, normalized, read, write):
        view = self.view

        def hook(module, args, kwargs, out):
            for c in comps:
                lam = scales[c.name].to(c.S.dtype)  # the masks' maths in the analysis dtype, the write in the model's
                if c.kind == "qk":
                    out = view.with_site_output(layer, site, out, self._qk_site(c, site, normalized[layer], lam, out))
                    continue
                own = read(out)
                rows = rows_at(own, positions)
                ref = None if reference is None else reference[c.name]
                src = rows_at(first_input(args, kwargs), positions) if c.kind == "ov" else rows
                coef = c.coefficients(src)
                rows = rows + c.write((coef if ref is None else coef - ref) * (lam - 1)).to(rows.dtype)
                out = write(out, put_rows_at(own, positions, rows))
            return out

        return hook

    def _qk_site(self, c: Component, site: str, x: Tensor, lam: Tensor, out: Tensor) -> Tensor:
        """Query or key replacement for a joint QK component (``[..., H * d_head]``)."""
        basis = c.U if site == "q" else c.V  # [H, d+1, K]
        proj = torch.einsum("...d,hdk->...hk", x.to(basis.dtype), basis[:, 1:]) + basis[:, 0]
        if site == "q":
            proj = proj * (c.S * lam) / c.scale
        d_head = self.view.d_head
        if proj.shape[-1] < d_head:
            proj = torch.nn.functional.pad(proj, (0, d_head - proj.shape[-1]))
        return proj.flatten(-2).to(out.dtype)

    def _stash_normalized(self, layer: int, store: dict[int, Tensor]) -> Callable[[nn.Module, tuple, dict], None]:
        """A pre-hook on ``layer``'s block keeping its attention input, normalized, in ``store[layer]``."""
        view = self.view

        def pre(module, args, kwargs):
            store[layer] = view.normalized("attn", layer, first_input(args, kwargs))

        return pre

    @contextmanager
    def record(self, names: Sequence[str] | None = None, *, positions: Tensor | None = None) -> Iterator[dict]:
        """Within the block, forward passes store each component's coefficients ``[batch, (pos,) G, K]``
        (at ``positions`` if given) into the yielded dict: the ``reference`` for patching."""
        names = list(self.components) if names is None else list(names)
        store: dict[str, Tensor] = {}
        specs = []
        for (layer, site), comps in self._by_site(names).items():
            comps = [c for c in comps if c.kind != "qk"]  # joint QK masks only zero-ablate
            if not comps:
                continue
            module, read, _ = self._site_io(layer, site, comps)

            def hook(module, args, kwargs, out, comps=comps, read=read):
                for c in comps:
                    src = first_input(args, kwargs) if c.kind == "ov" else read(out)
                    store[c.name] = c.coefficients(rows_at(src, positions)).detach()

            specs.append(Hook(module, hook, "post"))
        with hooks(*specs):
            yield store
