"""Singular-value spectra of a model's maps (pure functions of a view).

Per layer: every head's QK (bias-augmented, scale included, at key offset 0 for rotary models) and OV
circuits, from the views' factored matrices (``view.qk``, ``view.ov``: QR of the thin factors, the dense
``d_model x d_model`` product is never formed), and the MLP's input (``up``), gate (gated MLPs) and
output maps (``view.mlp_in``, ``view.mlp_gate``, ``view.mlp_out``). Singular values are numbered from 1
(``sigma_1 >= sigma_2 >= ...``) everywhere a person reads them: TensorBoard tags, figure axes, docs; lists in
results.json are plain arrays (position 0 holds sigma_1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from lit_svd.linalg import SVD, FactoredABt, svd_dense
from lit_svd.models.base import ModelView

EPS = 1e-30


def effective_rank(S: Float[Tensor, "*batch k"]) -> Float[Tensor, "*batch"]:
    """Roy & Vetterli's effective rank ``exp(H(p))``, ``p_i = s_i / sum s`` (over the last dim);
    between 1 (one direction) and the number of singular values (a flat spectrum)."""
    S = S.double().clamp_min(0)
    p = S / S.sum(-1, keepdim=True).clamp_min(EPS)
    return torch.exp(-(p * torch.log(p.clamp_min(EPS))).sum(-1))


def top_k_energy(S: Float[Tensor, "*batch n"], k: int) -> Float[Tensor, "*batch"]:
    """Fraction ``sum_{i<=k} s_i^2 / sum_i s_i^2`` of the squared Frobenius norm in the top ``k`` values."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"top_k={k!r}: must be a positive integer")
    E = S.double() ** 2
    return E[..., :k].sum(-1) / E.sum(-1).clamp_min(EPS)


def layer_kinds(view: ModelView) -> list[str]:
    """The matrices ``layer_svds`` gives for this model, in its order."""
    return ["qk", "ov", "mlp_in", *(["mlp_gate"] if view.gated_mlp else []), "mlp_out"]


def layer_svds(view: ModelView, layer: int, kinds: Sequence[str] | None = None) -> dict[str, SVD]:
    """Thin SVDs (descending, float64) of one layer's maps (``kinds``, default all of ``layer_kinds``):
    ``qk`` and ``ov`` batched over heads (``S: [n_heads, k]``); ``mlp_in``, ``mlp_gate`` (gated MLPs only) and
    ``mlp_out`` unbatched."""
    build = {
        "qk": lambda: _factored_svd(view.qk(layer, 0 if view.rotary_dim else None)),
        "ov": lambda: _factored_svd(view.ov(layer)),
        "mlp_in": lambda: svd_dense(view.mlp_in(layer).double()),
        "mlp_gate": lambda: svd_dense(view.mlp_gate(layer).double()),
        "mlp_out": lambda: svd_dense(view.mlp_out(layer).double()),
    }
    return {k: build[k]() for k in (layer_kinds(view) if kinds is None else kinds)}


def layer_spectra(view: ModelView, layer: int) -> dict[str, Tensor]:
    """Singular values (descending, float64) of one layer's maps: ``qk`` and ``ov`` ``[n_heads, k]``;
    ``mlp_in``, ``mlp_gate`` (gated MLPs only) and ``mlp_out`` ``[k]``."""
    return {k: svd.S for k, svd in layer_svds(view, layer).items()}


def _factored_svd(fm: FactoredABt) -> SVD:
    return FactoredABt(fm.A.double(), fm.B.double()).svd()


def row_key(row: dict) -> tuple:
    """``(matrix, layer, head)``: what a row (and its tracked directions) is about."""
    return row["matrix"], row["layer"], row["head"]


def spectrum_rows(view: ModelView, layers: list[int], top_k: int, svds: dict | None = None) -> list[dict]:
    """One row per (matrix, layer, head): ``matrix`` (qk, ov, mlp_in, mlp_gate, mlp_out), ``layer``,
    ``head`` (None for MLP maps), ``name`` (``L<l>H<h>`` / ``L<l>``), ``S`` (list), ``effective_rank``,
    ``top_k_energy``. ``svds``: a dict that receives each row's unbatched SVD under ``row_key(row)``."""
    rows = []
    for layer in layers:
        for matrix, svd in layer_svds(view, layer).items():
            S = svd.S
            per = S if S.dim() == 2 else S.unsqueeze(0)
            er, en = effective_rank(per), top_k_energy(per, top_k)
            for i in range(per.shape[0]):
                head = i if S.dim() == 2 else None
                rows.append(
                    {
                        "matrix": matrix,
                        "layer": layer,
                        "head": head,
                        "name": f"L{layer}H{i}" if head is not None else f"L{layer}",
                        "S": per[i].tolist(),
                        "effective_rank": er[i].item(),
                        "top_k_energy": en[i].item(),
                    }
                )
                if svds is not None:
                    svds[row_key(rows[-1])] = svd if head is None else SVD(svd.U[i], svd.S[i], svd.V[i])
    return rows
