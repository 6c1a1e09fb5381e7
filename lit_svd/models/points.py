"""Named activation points of a causal LM, and one cached forward that returns them.

A point is ``Point(name, layer)`` (``layer`` None for the points outside the blocks). ``B`` prompts, ``T``
positions, ``H`` query heads; everything is the model's own value at that place of its forward (hooks on the
view's modules, ``lit_svd.models.hooks``), except the ``*_normalized`` / ``*_factor`` points, which the view
computes from the residual the norm received (``view.normalized``, ``view.norm_factor``,
``view.post_norm_factor``) and ``head_out`` (``z_h W_O[h]`` from the captured ``z``).

===================  =====================  ==================================================================
name                 shape                  what it is
===================  =====================  ==================================================================
``embed``            [B, T, d_model]        the residual entering block 0 (Gemma: scaled; GPT-2: + positions)
``resid_pre``        [B, T, d_model]        block input
``resid_mid``        [B, T, d_model]        after the attention's write, before the MLP; none under GPT-NeoX's
                                            parallel residual (there the MLP reads the block input)
``resid_post``       [B, T, d_model]        block output (= the next block's ``resid_pre``)
``attn_normalized``  [B, T, d_model]        what the attention's folded weights read: the norm of ``resid_pre``
                                            without its affine part (``view.normalized("attn", l, .)``)
``attn_factor``      [B, T, 1]              that norm's per-token factor ``1 / rms`` (``view.norm_factor``)
``pattern``          [B, H, T, T]           attention weights, ``[query, key]`` (the forward runs eager for it)
``z``                [B, T, H, d_head]      each head's mixed value ``sum_s A[., s] v_s`` (the o projection's input)
``head_out``         [B, T, H, d_model]     what each head writes: ``z_h W_O[h]`` (no ``b_O``, before a post norm)
``attn_out``         [B, T, d_model]        ``sum_h head_out + b_O`` (the o projection's output)
``attn_post_factor`` [B, T, 1]              Gemma: the post-attention norm's per-token factor
``attn_write``       [B, T, d_model]        what the attention adds to the residual (Gemma: post-normed)
``mlp_normalized``   [B, T, d_model]        what the MLP's folded weights read (of ``resid_mid``; parallel
                                            residual: of ``resid_pre``)
``mlp_factor``       [B, T, 1]              its per-token factor
``mlp_hidden``       [B, T, d_mlp]          the MLP's hidden activation (the down projection's input)
``mlp_out``          [B, T, d_model]        the MLP output (before a post norm)
``mlp_post_factor``  [B, T, 1]              Gemma: the post-feed-forward norm's per-token factor
``mlp_write``        [B, T, d_model]        what the MLP adds to the residual
``final_resid``      [B, T, d_model]        the residual entering the final norm (the last ``resid_post``)
``final_normalized`` [B, T, d_model]        what the folded unembedding reads
``final_factor``     [B, T, 1]              the final norm's per-token factor
``logits``           [B, T, vocab]          the model's logits (Gemma-2: soft-capped)
===================  =====================  ==================================================================

Gemma's sandwich norms: ``attn_write = attn_out * attn_post_factor * gain`` (``view.post_norm_affine``), so
with the factor frozen at its clean value a head's write into the residual is linear in ``head_out``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Int, Shaped
from torch import Tensor, nn

from lit_svd.choices import check_choice, choices
from lit_svd.models.hooks import HookKind, capture

# A Hugging Face module (the model, a decoder block, its attention): its submodules and config keys are named per
# architecture, and only the views read them, so the type checker takes them as they come.
HFModule = Any
# A ``lit_svd.models.base.ModelView``: base imports this module (``view.run_with_cache``), so the type is not
# imported here; the accessors used are the view's generic ones (block, norm_module, site_module, ...).
ModelView = Any
NormPoint = Literal["attn", "mlp", "final"]  # the norm a point reads (``view.norm_module``)
PostNormPoint = Literal["attn", "mlp"]  # Gemma's norms after each sub-layer

LayerPoint = Literal[
    "resid_pre",
    "resid_mid",
    "resid_post",
    "attn_normalized",
    "attn_factor",
    "pattern",
    "z",
    "head_out",
    "attn_out",
    "attn_post_factor",
    "attn_write",
    "mlp_normalized",
    "mlp_factor",
    "mlp_hidden",
    "mlp_out",
    "mlp_post_factor",
    "mlp_write",
]
ModelPoint = Literal["embed", "final_resid", "final_normalized", "final_factor", "logits"]
LAYER_POINTS: tuple[LayerPoint, ...] = choices(LayerPoint)
MODEL_POINTS: tuple[ModelPoint, ...] = choices(ModelPoint)


def _norm_of(name: str) -> NormPoint:
    """The norm a point's name starts with (``attn_normalized`` -> ``attn``)."""
    return check_choice("point", name.split("_")[0], NormPoint)


def _post_norm_of(name: str) -> PostNormPoint:
    """The sub-layer of a post-norm point (``attn_post_factor`` -> ``attn``)."""
    return check_choice("point", name.split("_")[0], PostNormPoint)


@dataclass(frozen=True, order=True)
class Point:
    """One activation point: ``name`` (``LAYER_POINTS`` or ``MODEL_POINTS``) and its ``layer`` (None for
    model points)."""

    name: str
    layer: int | None = None

    def __str__(self) -> str:
        return self.name if self.layer is None else f"L{self.layer}.{self.name}"


def check_point(view: ModelView, point: Point) -> Point:
    """The point if ``view``'s model has it; one-line errors otherwise."""
    if point.name in MODEL_POINTS:
        if point.layer is not None:
            raise ValueError(f"point {point.name!r} is outside the blocks; give it without a layer")
        return point
    check_choice("point", point.name, LAYER_POINTS + MODEL_POINTS)
    if point.layer is None:
        raise ValueError(f"point {point.name!r} is per layer; give (name, layer)")
    view.check_layer(point.layer)
    if point.name == "resid_mid" and view.parallel_residual:
        raise ValueError(
            f"resid_mid: {view.model_type} uses a parallel residual (attention and MLP both read the block input);"
            " there is no residual between them (use resid_pre, attn_write, mlp_write)"
        )
    if point.name.endswith("_post_factor") and view.post_norm_module(_post_norm_of(point.name), point.layer) is None:
        raise ValueError(f"{point.name}: {view.model_type} adds sub-layer outputs without a post norm")
    return point


def resolve_points(view: ModelView, points: Iterable[str | tuple[str, int] | Point]) -> list[Point]:
    """``points`` as ``Point``s: a bare per-layer name means every layer; duplicates dropped, order kept."""
    out: list[Point] = []
    for p in [points] if isinstance(points, (str, Point)) else points:
        if isinstance(p, Point):
            out.append(check_point(view, p))
        elif isinstance(p, str):
            if p in LAYER_POINTS:
                out += [check_point(view, Point(p, l)) for l in range(view.n_layers)]
            else:
                out.append(check_point(view, Point(p)))
        else:
            name, layer = p
            out.append(check_point(view, Point(name, None if layer is None else int(layer))))
    return list(dict.fromkeys(out))


class ActivationCache(dict):
    """``Point -> Tensor`` from one forward; also indexed by ``(name, layer)`` or a model point's name."""

    def __getitem__(self, key: str | tuple[str, int | None] | Point) -> Tensor:
        if isinstance(key, str):
            key = Point(key)
        elif isinstance(key, tuple):
            key = Point(*key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, (str, tuple, Point)):
            return False
        try:
            self[key]
        except KeyError:
            return False
        return True

    def stack(self, name: str) -> Tensor:
        """A per-layer point over all cached layers, ``[n_layers_cached, ...]`` in layer order."""
        layers = sorted(p.layer for p in self if p.name == name)
        if not layers:
            raise KeyError(f"no {name!r} in this cache")
        return torch.stack([self[name, l] for l in layers])


# what each point is computed from: a raw capture (module, "pre"/"post", part) keyed (what, layer)
_RAW = {
    "resid_pre": "block_in",
    "resid_post": "block_out",
    "resid_mid": "mlp_norm_in",
    "attn_normalized": "attn_norm_in",
    "attn_factor": "attn_norm_in",
    "mlp_normalized": "mlp_norm_in",
    "mlp_factor": "mlp_norm_in",
    "pattern": "pattern",
    "z": "o_in",
    "head_out": "o_in",
    "attn_out": "o_out",
    "attn_post_factor": "o_out",
    "attn_write": "attn_post_out",
    "mlp_hidden": "down_in",
    "mlp_out": "down_out",
    "mlp_post_factor": "down_out",
    "mlp_write": "mlp_post_out",
    "embed": "block_in",
    "final_resid": "final_in",
    "final_normalized": "final_in",
    "final_factor": "final_in",
}


def _module(view: ModelView, what: str, layer: int | None) -> tuple[nn.Module, HookKind, int]:
    """``(module, kind, part)`` of one raw capture."""
    if what == "final_in":
        return view.norm_module("final", None), "pre", 0
    assert layer is not None, what  # every other capture is per layer
    if what == "block_in":
        return view.block(layer), "pre", 0
    if what == "block_out":
        return view.block(layer), "post", 0
    if what in ("attn_norm_in", "mlp_norm_in"):
        return view.norm_module(_norm_of(what), layer), "pre", 0
    if what == "pattern":
        return view.attention_module(layer), "post", 1
    if what in ("o_in", "o_out", "down_in", "down_out"):
        site = "o" if what.startswith("o") else "down"
        return view.site_module(layer, site), "pre" if what.endswith("_in") else "post", 0
    if what in ("attn_post_out", "mlp_post_out"):
        post = view.post_norm_module(_post_norm_of(what), layer)
        if post is None:  # added to the residual as it is: the write is the sub-layer's output
            return _module(view, "o_out" if what == "attn_post_out" else "down_out", layer)
        return post, "post", 0
    raise AssertionError(what)


@contextmanager
def eager_attention(model: HFModule) -> Iterator[None]:
    """Within the block the model uses HF's eager attention (the implementation that returns the pattern)."""
    before = getattr(model.config, "_attn_implementation", "eager")
    if before == "eager":
        yield
        return
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def _derive(view: ModelView, point: Point, raw: dict) -> Tensor:
    l, name = point.layer, point.name
    if name == "embed":
        return raw["block_in", 0]
    t = raw[_RAW[name], l]
    if name in ("attn_normalized", "mlp_normalized", "final_normalized"):
        return view.normalized(_norm_of(name), l, t)
    if name in ("attn_factor", "mlp_factor", "final_factor"):
        return view.norm_factor(_norm_of(name), l, t)
    if name.endswith("_post_factor"):
        assert l is not None, name  # a per-layer point
        factor = view.post_norm_factor(_post_norm_of(name), l, t)
        assert factor is not None, name  # check_point refuses a post factor without post norms
        return factor
    if name in ("z", "head_out"):
        assert l is not None, name  # a per-layer point
        z = t.reshape(*t.shape[:-1], view.n_heads, view.d_head)
        return z if name == "z" else torch.einsum("bthc,hcd->bthd", z, view.attn(l).W_O.to(z.dtype))
    return t


@torch.no_grad()
def run_with_cache(
    view: ModelView,
    points: Iterable[str | tuple[str, int] | Point],
    input_ids: Int[Tensor, "B T"],
    attention_mask: Shaped[Tensor, "B T"] | None = None,
) -> ActivationCache:
    """One forward of ``view.model`` on ``input_ids: [B, T]`` (right-padded; ``attention_mask`` ``[B, T]``)
    returning every requested point (``resolve_points``). The logits are projected only when asked for."""
    wanted = resolve_points(view, points)
    raw_keys = {("block_in", 0) if p.name == "embed" else (_RAW[p.name], p.layer) for p in wanted if p.name != "logits"}
    groups: dict[tuple[HookKind, int], dict] = {}
    for what, layer in raw_keys:
        module, kind, part = _module(view, what, layer)
        groups.setdefault((kind, part), {})[(what, layer)] = module
    want_logits = any(p.name == "logits" for p in wanted)
    with ExitStack() as stack:
        if any(p.name == "pattern" for p in wanted):
            stack.enter_context(eager_attention(view.model))
        got = [stack.enter_context(capture(mods, kind, index=part)) for (kind, part), mods in groups.items()]
        out = view.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            use_cache=False,
            **({} if want_logits else {"logits_to_keep": 1}),
        )
    raw = {k: v for g in got for k, v in g.items()}
    if want_logits:
        raw["logits", None] = out.logits.detach()
    cache = ActivationCache()
    for p in wanted:
        cache[p] = raw["logits", None] if p.name == "logits" else _derive(view, p, raw)
    return cache
