"""Node circuits of singular directions, patched at the cost of the directions that differ from a whole component.

A circuit keeps a set of directions of some components (``keep[name]: [G, K]`` bool; a component not named is
kept whole); every other direction's coefficient is patched to its value on the corrupted prompt, at every
position. For a component with site output ``own``, *coefficient source* ``src`` and the corrupted run's
``own_ref`` and ``src_ref`` (``CircuitPatch.record``), with ``R`` the map from the source to the coefficients:

    own' = own_ref + ((src - src_ref) R[K]) V[K]^T      (kept route: |K| directions)
         = own     - ((src - src_ref) R[~K]) V[~K]^T    (dropped route: |~K| directions)

Both equal ``Intervention.apply`` with scales 1 on ``K`` and 0 elsewhere and the corrupted coefficients as
reference, ``own + ((c - c_ref)(lambda - 1)) V^T``, because ``own - own_ref`` lies in the span of ``V`` (every
map of the universe writes ``[1, x] U S V^T``); up to rounding (the SVDs are float32, and a zero singular value's
direction carries only the map's rounding residue). Each site takes the cheaper route: its cost is
``min(|K|, |~K|) (d_src + d_out)`` per token. A component kept whole is not hooked; one dropped whole writes
``own_ref``; a layer whose ``mlp_out`` is dropped whole does not run its MLP at all (the MLP module gets zero
positions and returns the recorded output), since nothing inside it can reach its output.

**Input route** (``input_route=True``, the default): where a site's module computes that site alone (a separate
linear map ``own = x W + b``, no head norm after it), the kept route can read its coefficients from the module's
input ``x`` instead, ``own' = own_ref + ((x - x_ref) W V[K]) V[K]^T``, and the module itself is skipped (it gets
zero positions): the site then costs ``|K| (d_in + d_out)`` per token *instead of* the map's ``d_in d_out``, not on
top of it. A site takes it where that is cheaper than computing the map and the cheaper of the two routes above;
``ov``, ``mlp_in`` and ``mlp_gate`` read their module's input already, ``q``, ``k`` and ``mlp_out`` use
``W V`` with ``W`` the module's own weight (``ModelView.site_weight``) and the corrupted run's module input. Such a
module dropped whole is not run either.

Sources (``source_kind``): ``ov`` reads the head's mixed value ``z`` (the o-projection's input, ``R = W_O V``,
``d_head`` wide); ``mlp_in`` and ``mlp_gate`` read the MLP's input (``R = W V`` with ``W`` the site's own
weight, ``d_model`` wide instead of ``d_mlp``); every other kind reads its own output (``R = V``). Only
differences of coefficients are ever needed, so biases (``b V``) cancel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from lit_svd.models.base import ModelView
from lit_svd.models.hooks import Hook, first_input, hooks
from lit_svd.models.intervene import Component, by_site, site_io

SourceKind = Literal["own", "z", "mlp_input"]
INPUT_ROUTE = ("mlp_in", "mlp_gate")  # kinds whose coefficients are read from the MLP's (narrower) input


def source_kind(kind: str) -> SourceKind:
    """Where a kind's coefficients are read: its own output, the head's mixed value ``z``, or the MLP input."""
    if kind == "ov":
        return "z"
    return "mlp_input" if kind in INPUT_ROUTE else "own"


@dataclass
class Reference:
    """The corrupted run of one batch: per component name its site output ``own[name]: [B, T, d_out]`` and, where
    the coefficients are read elsewhere, its source ``src[name]: [B, T, d_src]`` (``mlp_in`` and ``mlp_gate`` of
    a layer share one tensor)."""

    own: dict[str, Tensor] = field(default_factory=dict)
    src: dict[str, Tensor] = field(default_factory=dict)
    inp: dict[str, Tensor] = field(default_factory=dict)  # the module input of the input route's own-source sites

    def source(self, name: str) -> Tensor:
        return self.src.get(name, self.own[name])

    def module_input(self, name: str) -> Tensor:
        """What the site's module read on the corrupted run (the input route's ``x_ref``)."""
        return self.inp[name] if name in self.inp else self.src[name]


@dataclass
class _Plan:
    """What one component's hook does for one circuit: ``whole`` (write ``own_ref``), or a route (``kept``: add the
    kept directions' change to ``own_ref``; else subtract the dropped ones' from ``own``) with the gathered
    ``R[:, :, idx]`` and ``V[:, :, idx]`` (padding columns zero)."""

    whole: bool
    kept: bool = False
    R: Tensor | None = None
    V: Tensor | None = None
    skip: bool = False  # the module is not run: dropped whole, or the input route (R reads the module's input)


class CircuitPatch:
    """Hooks that run ``view.model`` with a circuit of directions kept and every other direction patched toward a
    recorded corrupted run (module docstring). ``components``: the universe's (no joint ``qk``)."""

    def __init__(self, view: ModelView, components: Sequence[Component], input_route: bool = True):
        joint = [c.name for c in components if c.kind == "qk"]
        if joint:
            raise ValueError(f"components: {joint[0]} is a joint qk component; patching needs the q and k maps")
        self.view = view
        self.components = {c.name: c for c in components}
        if len(self.components) != len(components):
            raise ValueError("components: the same (layer, kind) is listed twice")
        self.sites = {key: comps[0] for key, comps in by_site(components).items()}
        self.io = {key: site_io(view, key[0], key[1], [c]) for key, c in self.sites.items()}
        self.R = {c.name: self._read_map(c) for c in components}
        # per site whose module computes it alone: the read map from the module's input, and the module's cost
        self.R_in = {c.name: self._input_map(c) for key, c in self.sites.items() if input_route and self._alone(key)}
        self.module_cost = {c.name: self._module_cost(c) for c in self.components.values() if c.name in self.R_in}

    def _alone(self, key: tuple[int, str]) -> bool:
        """Whether ``key``'s hooked module is a separate linear map computing that site alone."""
        layer, site = key
        module = self.view.site_module(layer, site)
        return self.io[key][0] is module and self.view.site_is_whole_output(layer, site)

    @torch.no_grad()
    def _input_map(self, c: Component) -> Float[Tensor, "G d_in K"]:
        if source_kind(c.kind) != "own":  # ov, mlp_in, mlp_gate read their module's input already
            return self.R[c.name]
        W, _ = self.view.site_weight(c.layer, c.site)  # [d_in, d_out]: site output = input @ W + b
        W = W.to(device=c.V.device, dtype=c.V.dtype)
        G, d_group, _ = c.V.shape
        return torch.einsum("igo,gok->gik", W.reshape(W.shape[0], G, d_group), c.V)

    def _module_cost(self, c: Component) -> int:
        W, _ = self.view.site_weight(c.layer, c.site)
        return W.shape[0] * W.shape[1]

    @torch.no_grad()
    def _read_map(self, c: Component) -> Float[Tensor, "G d_src K"]:
        kind = source_kind(c.kind)
        if kind == "z":
            assert c.read is not None
            return c.read
        if kind == "mlp_input":
            W, _ = self.view.site_weight(c.layer, c.site)  # [d_model, d_mlp]: site output = input @ W + b
            return (W.to(device=c.V.device, dtype=c.V.dtype) @ c.V[0])[None]
        return c.V

    def to(self, device: torch.device | str) -> CircuitPatch:
        """Move the components' SVDs and read maps to ``device`` (in place)."""
        for c in self.components.values():
            for attr in ("U", "S", "V", "read"):
                t = getattr(c, attr)
                if t is not None:
                    setattr(c, attr, t.to(device))
        self.R = {n: r.to(device) for n, r in self.R.items()}
        self.R_in = {n: r.to(device) for n, r in self.R_in.items()}
        return self

    # --- coefficients ---------------------------------------------------------------------------------------
    def source(self, c: Component, args: tuple, kwargs: dict, own: Tensor) -> Tensor:
        """The tensor the coefficients of ``c`` are read from, inside a hook on its site."""
        return own if source_kind(c.kind) == "own" else first_input(args, kwargs)

    def delta_coefficients(
        self, c: Component, src: Tensor, src_ref: Tensor, R: Tensor | None = None, shared: bool = False
    ) -> Float[Tensor, "*batch G m"]:
        """``(src - src_ref) R``: the coefficients' change ``[..., G, m]`` (``R``: default all of ``c``'s; ``shared``:
        every group reads all of ``src``, the input route of ``q`` and ``k``; else group ``g`` reads its slice)."""
        R = self.R[c.name] if R is None else R
        G = R.shape[0]
        diff = (src - src_ref).to(R.dtype)
        if shared:
            return torch.einsum("...d,gdm->...gm", diff, R)
        return torch.einsum("...gd,gdm->...gm", diff.reshape(*diff.shape[:-1], G, -1), R)

    @staticmethod
    def write(c: Component, coef: Float[Tensor, "*batch G m"], V: Tensor) -> Float[Tensor, "*batch d_out"]:
        """``coef`` back to the site output space (``ov``: summed over heads)."""
        if c.kind == "ov":
            return torch.einsum("...gm,gdm->...d", coef, V)
        return torch.einsum("...gm,gdm->...gd", coef, V).flatten(-2)

    # --- the corrupted run ----------------------------------------------------------------------------------
    @torch.no_grad()
    def record(self, input_ids: Tensor, attention_mask: Tensor) -> Reference:
        """One forward of the (corrupted) prompts keeping every component's site output and source."""
        ref = Reference()
        specs = []
        for key, c in self.sites.items():
            module, read, _ = self.io[key]

            def hook(module, args, kwargs, out, c=c, read=read):
                ref.own[c.name] = read(out).detach()
                if source_kind(c.kind) != "own":  # the up and gate sites' inputs are one tensor: stored once
                    ref.src[c.name] = first_input(args, kwargs).detach()
                elif c.name in self.R_in:  # q and k read one tensor too (detach shares its storage)
                    ref.inp[c.name] = first_input(args, kwargs).detach()

            specs.append(Hook(module, hook, "post"))
        with hooks(*specs):
            self.view.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=1)
        return ref

    # --- the patched run ------------------------------------------------------------------------------------
    def plan(self, c: Component, keep: Bool[Tensor, "G K"]) -> _Plan | None:
        """The hook's plan for ``c`` under ``keep`` (None: kept whole, not hooked)."""
        if tuple(keep.shape) != c.shape:
            raise ValueError(f"keep[{c.name!r}] has shape {tuple(keep.shape)}; expected {c.shape}")
        n_keep = int(keep.sum())
        if n_keep == keep.numel():
            return None
        if n_keep == 0:  # the module is not run where it computes the site alone
            return _Plan(whole=True, skip=c.name in self.R_in)
        kept = n_keep <= keep.numel() - n_keep
        R, V = self.R[c.name], c.V
        skip = c.name in self.R_in and self._input_route_is_cheaper(c, n_keep, keep.numel() - n_keep)
        if skip:
            kept, R = True, self.R_in[c.name]
        chosen = keep if kept else ~keep
        width = int(chosen.sum(1).max())
        # per group the chosen indices first (stable), padded with columns that are zeroed
        order = torch.sort((~chosen).to(torch.int8), dim=1, stable=True).indices[:, :width]
        valid = torch.gather(chosen, 1, order).to(c.V.device)
        order = order.to(c.V.device)

        def pick(M: Tensor) -> Tensor:
            cols = torch.gather(M, 2, order[:, None, :].expand(-1, M.shape[1], -1))
            return cols * valid[:, None, :].to(cols.dtype)

        return _Plan(whole=False, kept=kept, R=pick(R), V=pick(V), skip=skip)

    def _input_route_is_cheaper(self, c: Component, n_keep: int, n_drop: int) -> bool:
        """Per token: ``|K|`` directions through the input route against the module plus the cheaper other route."""
        width = c.V.shape[1]
        other = self.module_cost[c.name] + min(n_keep, n_drop) * (self.R[c.name].shape[1] + width)
        return n_keep * (self.R_in[c.name].shape[1] + width) <= other

    @contextmanager
    def apply(self, keep: Mapping[str, Tensor], reference: Reference) -> Iterator[None]:
        """Within the block the model runs with the circuit ``keep`` (``{name: [G, K] bool}``; components not
        named are kept whole) and every other direction patched to ``reference`` (``record`` of the corrupted
        prompts, the same batch)."""
        unknown = [n for n in keep if n not in self.components]
        if unknown:
            raise KeyError(f"keep: no component {unknown[0]!r}")
        plans = {n: self.plan(self.components[n], k.to(torch.bool).cpu()) for n, k in keep.items()}
        skipped = {
            c.layer for n, c in self.components.items() if c.kind == "mlp_out" and (p := plans.get(n)) and p.whole
        }
        specs = []
        for key, c in self.sites.items():
            p = plans.get(c.name)
            if p is None or (c.kind.startswith("mlp_") and c.layer in skipped):
                continue
            if p.skip:
                specs += self._input_route(c, p, key, reference)
            else:
                specs.append(Hook(self.io[key][0], self._hook(c, p, key, reference), "post"))
        for layer in sorted(skipped):
            specs += self._skip_mlp(layer, reference.own[f"L{layer}.mlp_out"])
        with hooks(*specs):
            yield

    def _hook(self, c: Component, p: _Plan, key: tuple[int, str], reference: Reference) -> Callable[..., Tensor]:
        _, read, write = self.io[key]
        own_ref, src_ref = reference.own[c.name], reference.source(c.name)

        def hook(module, args, kwargs, out):
            own = read(out)
            if p.whole:
                return write(out, own_ref.to(own.dtype))
            assert p.R is not None and p.V is not None
            src = self.source(c, args, kwargs, own)
            change = self.write(c, self.delta_coefficients(c, src, src_ref, p.R), p.V).to(own.dtype)
            return write(out, own_ref + change if p.kept else own - change)

        return hook

    def _input_route(self, c: Component, p: _Plan, key: tuple[int, str], reference: Reference) -> list[Hook]:
        """Hooks that run ``c``'s module on zero positions and write ``own_ref + ((x - x_ref) R[K]) V[K]^T`` from
        the input ``x`` it was called with (module docstring, input route), or ``own_ref`` for a site dropped whole."""
        module, _, write = self.io[key]
        own_ref = reference.own[c.name]
        x_ref = None if p.whole else reference.module_input(c.name)
        seen: list[Tensor] = []

        def pre(module, args, kwargs):
            seen[:] = [first_input(args, kwargs)]
            return _no_positions(args, kwargs)

        def post(module, args, kwargs, out):
            x = seen.pop()
            if p.whole:
                return write(out, own_ref.to(out.dtype))
            assert p.R is not None and p.V is not None and x_ref is not None
            coef = self.delta_coefficients(c, x, x_ref, p.R, shared=source_kind(c.kind) == "own")
            return write(out, own_ref.to(out.dtype) + self.write(c, coef, p.V).to(out.dtype))

        return [Hook(module, pre, "pre"), Hook(module, post, "post")]

    def _skip_mlp(self, layer: int, out_ref: Tensor) -> list[Hook]:
        """Hooks that run ``layer``'s MLP on zero positions and return the recorded output instead."""
        module = self.view.mlp_module(layer)

        def pre(module, args, kwargs):
            return _no_positions(args, kwargs)

        def post(module, args, kwargs, out):
            return out_ref.to(out.dtype)

        return [Hook(module, pre, "pre"), Hook(module, post, "post")]


def _no_positions(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A pre hook's ``(args, kwargs)`` with the hidden states cut to zero positions (the module computes nothing)."""
    if args:
        return (args[0][..., :0, :], *args[1:]), kwargs
    key = "hidden_states" if "hidden_states" in kwargs else next(iter(kwargs))
    return args, {**kwargs, key: kwargs[key][..., :0, :]}
