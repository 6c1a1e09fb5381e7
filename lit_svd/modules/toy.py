"""The toy SVF-alignment model: a sparse-feature autoencoder trained jointly with one attention head.

Per instance (all batched over a leading instance dimension ``I``):
    tokens          r = W f(r),  s_j = W f(s_j)                   W: [D, N]
    reconstruction  f' = ReLU(W^T x + b)                          b: [N]
    head logits     l_j = r^T W_Q^T W_K s_j                        W_Q, W_K: [H, D]
    target logits   t_j = f(r)^T T f(s_j),  p_target = softmax(t / tau) over the m keys
    loss            L = L_recon + lambda * L_attn,  L_recon = mean_n imp_n (f_n - f'_n)^2,
                    L_attn = cross-entropy(p_target, softmax(l))
The ensemble loss is the sum of the instances' losses; Adam(W) updates each element on its own, so every
instance trains exactly as it would alone. In frozen-feature mode W is fixed at initialisation with a
chosen interference ||E_X||_2 (``toy_features``) and only W_Q, W_K train (the loss is lambda * L_attn).
"""

from __future__ import annotations

from inspect import signature
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from jsonargparse.typing import NonNegativeFloat, PositiveFloat
from torch import Tensor, nn

from lit_svd.analysis.alignment import omega_svd
from lit_svd.analysis.toy_options import check_toy_options
from lit_svd.linalg import SVD
from lit_svd.modules.toy_features import features_with_interference
from lit_svd.modules.toy_templates import build_template, template_pairs


class ToyAlignmentModule(pl.LightningModule):
    """Batched ensemble of toy models; see the module docstring for the model.

    Args:
        n_features: N, the number of sparse features.
        d_model: D, the embedding width, one value or one per instance (sweeps N/D in one ensemble: the
            largest is allocated, dimensions beyond an instance's D are masked to zero).
        d_head: H, one value or one per instance (the largest is allocated, rows beyond an instance's H are
            masked to zero); null: H = D per instance.
        grid: a sweep as ``{key: [values]}`` over d_model, d_head, interference, lambda_attn, expanded to one
            instance per combination and seed; the keys it sets must not also be given as lists.
        grid_seeds: seeds per grid cell (``seed .. seed + grid_seeds - 1``, the same in every cell).
        template: attention template spec (``toy_templates.build_template``).
        lambda_attn: weight of L_attn, one value or one per instance.
        temperature: tau of the target softmax.
        n_instances: ensemble size (else inferred from the per-instance lists, else 1).
        seed: instance i is initialised from ``seed + i`` unless ``seeds`` lists them.
        seeds: one initialisation seed per instance (overrides ``seed``).
        importance_decay: reconstruction weight of feature n is ``importance_decay ** n`` (1 = uniform).
        frozen_features: fix W at initialisation with ``interference``.
        interference: with ``frozen_features``, the target ||E_X||_2 of the fixed features (one value or one
            per instance; null: the base directions as drawn, orthonormal for N <= D, random unit vectors
            otherwise).
        init_scale: std of W_Q, W_K at initialisation is ``init_scale / sqrt(D)``.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay, on W_Q and W_K only.
    """

    # the options judged before anything is built (the command line's fast check calls it too, before torch)
    options_check = "lit_svd.analysis.toy_options:check_toy_options"

    def __init__(
        self,
        n_features: int = 20,
        d_model: int | list[int] = 10,
        d_head: int | list[int] | None = 10,
        template: dict[str, Any] | None = None,
        lambda_attn: float | list[float] = 1.0,
        temperature: PositiveFloat = 0.1,
        n_instances: int | None = None,
        seed: int = 0,
        seeds: list[int] | None = None,
        importance_decay: float = 1.0,
        frozen_features: bool = False,
        interference: float | list[float | None] | None = None,
        init_scale: PositiveFloat = 0.1,
        lr: PositiveFloat = 1e-3,
        weight_decay: NonNegativeFloat = 0.0,
        grid: dict[str, list] | None = None,
        grid_seeds: int = 1,
    ):
        super().__init__()
        self.save_hyperparameters()
        # the options' checks (the command line's fast check runs the same function before torch is imported)
        inst = check_toy_options(**{k: self.hparams[k] for k in signature(check_toy_options).parameters})
        n, dims, heads, lambdas = len(inst.seeds), inst.d_models, inst.d_heads, inst.lambdas
        T = build_template(template if template is not None else {"pair": [0, 1, 1.0]}, n_features)

        self.n_instances, self.n_features, self.d_model, self.d_models = n, n_features, max(dims), dims
        self.frozen_features, self.temperature = frozen_features, float(temperature)
        self.seeds = inst.seeds
        self.d_heads, self.lambdas = heads, lambdas
        self.pairs = template_pairs(T)
        self.register_buffer("template", T)
        self.register_buffer("lambda_attn", torch.tensor(lambdas))
        self.register_buffer("importance", importance_decay ** torch.arange(n_features, dtype=torch.float32))
        h_max, d_max = max(heads), max(dims)
        self.register_buffer("head_mask", (torch.arange(h_max)[None, :] < torch.tensor(heads)[:, None]).float())
        self.register_buffer("model_mask", (torch.arange(d_max)[None, :] < torch.tensor(dims)[:, None]).float())

        W, W_Q, W_K, reached = [], [], [], []
        targets = inst.interference
        for i, s in enumerate(self.seeds):
            g, D = torch.Generator().manual_seed(int(s)), dims[i]
            if frozen_features:
                target = None if targets[i] is None else float(targets[i])
                X, e = features_with_interference(n_features, D, target, g)
                reached.append(e)
            else:  # Xavier-normal feature directions
                X = torch.randn(D, n_features, generator=g) * (2.0 / (D + n_features)) ** 0.5
            W.append(F.pad(X, (0, 0, 0, d_max - D)))
            for head in (W_Q, W_K):  # drawn at the instance's own H and D, so its init is the same in any ensemble
                w = torch.randn(heads[i], D, generator=g) * init_scale / D**0.5
                head.append(F.pad(w, (0, d_max - D, 0, h_max - heads[i])))
        self.interference = reached if frozen_features else None
        self.interference_targets = targets
        self.W = nn.Parameter(torch.stack(W), requires_grad=not frozen_features)  # [I, D, N]
        self.b = nn.Parameter(torch.zeros(n, n_features), requires_grad=not frozen_features)  # [I, N]
        self.W_Q = nn.Parameter(torch.stack(W_Q) * self.head_mask[..., None])  # [I, H, D]
        self.W_K = nn.Parameter(torch.stack(W_K) * self.head_mask[..., None])  # [I, H, D]

    # ---- the model view the callbacks read -------------------------------------------------------
    def head_weights(self) -> tuple[Tensor, Tensor]:
        """Masked ``W_Q, W_K: [I, H, D]`` (detached)."""
        m = self.head_mask[..., None] * self.model_mask[:, None, :]
        return (self.W_Q * m).detach(), (self.W_K * m).detach()

    def omega_svd(self) -> SVD:
        """Batched SVD of ``Omega = W_Q^T W_K`` per instance (``U, V: [I, D, k]``, ``S: [I, k]``)."""
        return omega_svd(*(w.float().cpu() for w in self.head_weights()))

    def features(self) -> Tensor:
        """``W: [I, D, N]`` with the dimensions beyond each instance's D held at zero."""
        return self.W * self.model_mask[..., None]

    def feature_directions(self) -> Tensor:
        return self.features().detach().float().cpu()

    # ---- training ----------------------------------------------------------------------------------
    def losses(self, feats: Tensor) -> tuple[Tensor, Tensor]:
        """Per-instance ``(L_recon, L_attn)``, each ``[I]``, for a batch ``[I, B, 1 + m, N]``."""
        W = self.features()
        x = torch.einsum("ibtn,idn->ibtd", feats, W)
        if self.frozen_features:
            recon = feats.new_zeros(self.n_instances)
        else:
            f_hat = F.relu(torch.einsum("ibtd,idn->ibtn", x, W) + self.b[:, None, None, :])
            recon = (self.importance * (f_hat - feats) ** 2).mean(dim=(1, 2, 3))
        W_Q, W_K = self.W_Q * self.head_mask[..., None], self.W_K * self.head_mask[..., None]
        q = torch.einsum("ibd,ihd->ibh", x[:, :, 0], W_Q)
        k = torch.einsum("ibjd,ihd->ibjh", x[:, :, 1:], W_K)
        logits = torch.einsum("ibh,ibjh->ibj", q, k)
        target = torch.einsum("ibm,ibjm->ibj", feats[:, :, 0] @ self.template, feats[:, :, 1:])
        p_target = torch.softmax(target / self.temperature, dim=-1)
        attn = -(p_target * torch.log_softmax(logits, dim=-1)).sum(-1).mean(-1)
        return recon, attn

    def check_batch(self, feats: Tensor) -> None:
        if (
            feats.dim() != 4
            or feats.shape[0] != self.n_instances
            or feats.shape[-1] != self.n_features
            or feats.shape[2] < 2
        ):
            raise ValueError(
                f"batch shape {tuple(feats.shape)}: expected [n_instances={self.n_instances}, batch, "
                f"1 + n_keys, n_features={self.n_features}]; match the datamodule to the model"
            )

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        for key in ("n_features", "n_instances"):
            if dm is not None and hasattr(dm, key) and getattr(dm, key) != getattr(self, key):
                raise ValueError(f"data.{key}={getattr(dm, key)} but model.{key}={getattr(self, key)}: they must match")

    def training_step(self, feats: Tensor, batch_idx: int) -> Tensor:
        self.check_batch(feats)
        recon, attn = self.losses(feats)
        loss = (recon + self.lambda_attn * attn).sum()
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"loss became {float(loss)} at step {self.global_step}; lower lr or temperature-scaled targets"
            )
        if self.global_step % self.trainer.log_every_n_steps == 0:  # logging every step costs ~1/3 of a step
            self.log_dict(
                {
                    "train/loss": loss.detach() / self.n_instances,
                    "train/recon": recon.detach().mean(),
                    "train/attn": attn.detach().mean(),
                },
                prog_bar=True,
                on_step=True,
                on_epoch=False,
            )
        return loss

    def configure_optimizers(self):
        groups = [{"params": [self.W_Q, self.W_K], "weight_decay": self.hparams.weight_decay}]
        if not self.frozen_features:
            groups.append({"params": [self.W, self.b], "weight_decay": 0.0})
        return torch.optim.AdamW(groups, lr=self.hparams.lr)
