"""Tiled-SVD mounts of every linear site of a frozen LM, scored on a text stream (``python -m lit_svd test``).

Forward hooks (``lit_svd.models.hooks``) capture each layer's site inputs and outputs and reduce them to
token sums as soon as the layer finishes (``lit_svd.analysis.mounts.site_sums``), so memory holds one
layer's activations of one batch. Sums live in named torchmetrics states (``NamedSums``,
``dist_reduce_fx="sum"``), so a DDP run over sharded tokens gives the same table as one process.

Bounded memory: the layers are scored ``layers_per_pass`` at a time. The first pass runs in Lightning's test
loop (which also keeps this rank's token ids: a few bytes a token); each later pass runs over the same ids
at the end of the epoch, starting from the recorded residual stream before its first layer and stopping
after its last (``lit_svd.models.layer_passes``), so all passes together cost one forward pass. A pass's
plans and sums are reduced to its rows (steering included) before the next pass builds its own, so memory
holds the weights, one batch's activations and one group of layers' plans and sums.

Controls per site-layer: the *data ceiling* (top-``n`` principal directions of the site's own outputs,
same tokens) and, with ``null_control=True``, the *structureless null*: a matrix with the site's singular values
and Haar-random singular vectors, scored on the same inputs (every ``null_stride``-th token) by the same
rules, steering included; its checks sit beside the real ones (``row["null"]``).

Effective paths (``effective_paths=True``): ``up`` is mounted on ``diag(mean gate activation) W_up``
and scored on the gated product; ``v`` on a ridge map from the v input to the per-head mixed value
(the o input). Their data statistics (mean gate, ridge sufficient statistics) are gathered on the first
``fit_fraction`` of each rank's batches and the paths are scored only on the remaining batches, so the
fit never sees a scored token.
"""

from __future__ import annotations

import copy
import gc
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor
from torchmetrics import Metric
from tqdm.auto import tqdm

from lit_svd.analysis import mounts as M
from lit_svd.analysis.mounts import RESIDUAL_SITES
from lit_svd.analysis.mounts_options import check_mounts_options
from lit_svd.choices import check_choice
from lit_svd.models.base import SITES
from lit_svd.models.fanout import cache_kwarg, returned_cache
from lit_svd.models.hooks import Hook, first_input, hooks
from lit_svd.models.layer_passes import layer_groups, pass_bounds, run_blocks
from lit_svd.modules.pretrained import PretrainedLMModule
from lit_svd.option_checks import check_indices

DEFAULT_TILE_WIDTHS = M.PAPER_TILE_WIDTHS  # "fixed": the paper's absolute widths
NULL_SEED, NULL_LAYER_STRIDE = M.NULL_SEED, M.NULL_LAYER_STRIDE  # the null of (layer, site): M.null_seed


class NamedSums(Metric):
    """Float64 token sums under their own names (shapes from a dict), summed over batches and DDP ranks."""

    full_state_update = False

    def __init__(self, shapes: dict[str, tuple[int, ...]], device: torch.device | str | None = None):
        super().__init__()
        self.names = tuple(shapes)
        for name, shape in shapes.items():
            self.add_state(name, torch.zeros(shape, dtype=torch.float64, device=device), dist_reduce_fx="sum")
            # torchmetrics keeps a copy of every default for reset(); a broadcast zero resets to the same
            # zeros (reset clones it into a full tensor) without holding a second d x d Gram per site-layer
            self._defaults[name] = torch.zeros((), dtype=torch.float64, device=device).expand(shape)

    def update(self, sums: dict[str, Tensor]) -> None:
        for name, value in sums.items():
            state = getattr(self, name)
            state += value.to(state)

    def compute(self) -> dict[str, Tensor]:
        return {name: getattr(self, name) for name in self.names}


@dataclass(frozen=True)
class SteerContext:
    """The unsteered state every steered site-layer shares: the texts, the key / value cache of their
    prefix (``steer_positions="last"``; None for ``"all"``) and the unsteered last-token logits."""

    texts: Tensor
    cache: Any
    base: Tensor


def _tokens(t: Tensor, mask: Tensor | None) -> Tensor:
    """``[batch, pos, d] -> [tokens, d]`` keeping positions where ``mask`` is 1."""
    t = t.reshape(-1, t.shape[-1])
    return t if mask is None else t[mask]


class MountsAnalysisModule(PretrainedLMModule):
    """Scores tiled-SVD mounts against whole-matrix SVD, column sampling and random directions on every
    requested site-layer, with the data ceiling and the structureless null beside them; the results
    (``self.rows``) are written by ``lit_svd.callbacks.MountsReport``. The model's loading options are
    ``PretrainedLMModule``'s.

    Args:
        sites: linear sites among q, k, v, o, gate, up, down (null: all the model has).
        layers: layers to score (null: every layer).
        tile_widths: column-tile width per site: "scaled" (the paper's number of tiles per site for this
            model's input sizes, ``lit_svd.analysis.mounts.scaled_tile_width``), "fixed" (the paper's
            absolute Gemma-2-2B widths) or a dict of widths per site (sites left out: the fixed width).
        modes_per_tile: singular modes kept per tile (k).
        modes_sweep: mode counts of the coverage-saturation sweep.
        k_active: atoms per token fitted by least squares in the coverage score.
        seed: seeds column sampling, random mounts (seed, seed + 1) and random dictionaries (seed + 2).
        effective_paths: score up on diag(mean gate) W_up and v through a ridge map to the mixed value.
        fit_fraction: fraction of the batches that fits the effective maps (the rest scores them).
        v_ridge: ridge strength of the v map, relative to trace(X^T X) / d.
        steer_alpha: steering strength alpha (u added with alpha times the residual norm scale).
        steer_mounts: tiled mounts of highest tile-local lift steered per residual site-layer.
        steer_texts: text windows used for steering (the first ones of the stream).
        steer_tokens: tokens of each steering window.
        steer_positions: "last" (alpha * u at the read-out token, prefix cached) or "all" (every position).
        rules: thresholds of the pass rule (null: the paper's values; see configs/mounts/*.yaml).
        null_control: also score each site-layer's structureless null (same singular values, Haar-random
            singular vectors) by the same rules, steering included.
        null_stride: the null sees every so many-th token of the same stream (1: every token, exact; the shipped
            configs use 8, which bench/mounts_bench.py and the SmolLM2 run show changes no verdict).
        layers_per_pass: score this many layers per pass over the tokens (null: all layers in one pass); memory
            holds one group's plans and sums (SmolLM2: about 0.15 GB a layer), the table does not change.
    """

    # the options judged before anything loads (the command line's fast check calls it too, before torch)
    options_check = "lit_svd.analysis.mounts_options:check_mounts_options"

    def __init__(
        self,
        sites: list[str] | None = None,
        layers: list[int] | None = None,
        tile_widths: dict[str, int] | Literal["scaled", "fixed"] = "scaled",
        modes_per_tile: int = 2,
        modes_sweep: list[int] = (1, 2, 4, 8, 16),
        k_active: int = 8,
        seed: int = 0,
        effective_paths: bool = True,
        fit_fraction: float = 0.5,
        v_ridge: float = 1e-3,
        steer_alpha: float = 2.0,
        steer_mounts: int = 8,
        steer_texts: int = 8,
        steer_tokens: int = 32,
        steer_positions: Literal["last", "all"] = "last",
        rules: dict | None = None,
        null_control: bool = True,
        null_stride: int = 1,
        layers_per_pass: int | None = None,
        **loading,
    ):
        check_mounts_options(
            sites,
            layers,
            modes_per_tile,
            modes_sweep,
            k_active,
            fit_fraction,
            steer_mounts,
            steer_texts,
            steer_tokens,
            steer_positions,
            null_stride,
            layers_per_pass,
        )
        super().__init__(**loading)
        self.save_hyperparameters()
        view = self.view
        self.sites = list(sites) if sites is not None else [s for s in SITES if s != "gate" or view.gated_mlp]
        for s in self.sites:
            view.check_site(s)
        check_indices("layers", "layer", layers or (), view.n_layers)
        layers = range(view.n_layers) if layers is None else [int(l) for l in layers]
        self.passes = layer_groups(list(layers), layers_per_pass)  # groups of sorted layers, one per pass
        self.layers = [l for group in self.passes for l in group]
        self.rules = M.MountRules.from_dict(rules)
        self.effective = {s for s in ("v", "up") if effective_paths and s in self.sites}
        if "up" in self.effective and not view.gated_mlp:
            self.effective.discard("up")  # ungated MLPs: up is scored on its own output
        self.tile_widths = self._tile_widths(tile_widths)
        # validate every tile width and mode count against the site shapes now (one clear line each)
        for s in self.sites:
            d_in, d_out = self._site_shape(s)
            bounds = M.tile_bounds(d_in, self.tile_widths[s], f"tile_widths.{s}")
            for m in (modes_per_tile, *modes_sweep):
                M.check_modes(
                    m, bounds[0][1] - bounds[0][0], d_out, "modes_per_tile" if m == modes_per_tile else "modes_sweep"
                )
        # the current pass's plans and sums (after a run: the last pass's)
        self.plans: dict[str, M.SitePlan] = {}
        self.null_plans: dict[str, M.SitePlan] = {}
        self.sums = torch.nn.ModuleDict()
        self.null_sums = torch.nn.ModuleDict()
        self.fit = torch.nn.ModuleDict()
        self.rows: list[dict] = []
        self.first_ids: Tensor | None = None
        self._batches: list[tuple[Tensor, Tensor | None]] = []  # this rank's token ids, for passes after the first
        self._resume: dict[int, Any] = {}  # per batch: the residual stream the next pass starts from

    # --- shapes and plans --------------------------------------------------------------------------
    def _tile_widths(self, tile_widths) -> dict[str, int]:
        return M.tile_widths_for(tile_widths, {s: self._site_shape(s)[0] for s in self.sites})

    def _site_shape(self, site: str) -> tuple[int, int]:
        """``(d_in, d_out)`` of the matrix mounts are taken from (effective map on effective paths)."""
        v = self.view
        if site == "v" and site in self.effective:
            return v.d_model, v.n_heads * v.d_head
        if site == "up" and site in self.effective:
            return v.d_model, v.d_mlp
        W, _ = v.site_weight(self.layers[0], site)
        return W.shape

    def _shapes(self, site: str, ceiling: bool) -> dict[str, tuple[int, ...]]:
        d_in, d_out = self._site_shape(site)
        hp = self.hparams
        n = M.mount_count(d_in, d_out, self.tile_widths[site], hp.modes_per_tile)
        return M.sum_shapes(n, len(hp.modes_sweep), M.ceiling_dim(d_in, d_out, site not in self.effective), ceiling)

    @staticmethod
    def key(layer: int, site: str) -> str:
        return f"L{layer}_{site}"

    def _plan(self, W_out_in: Tensor, site: str, bias: Tensor | None = None) -> M.SitePlan:
        hp = self.hparams
        return M.plan_site(
            W_out_in,
            self.tile_widths[site],
            hp.modes_per_tile,
            list(hp.modes_sweep),
            hp.k_active,
            hp.seed,
            f"tile_widths.{site}",
            linear=site not in self.effective,
            bias=bias,
        )

    def _add_plans(self, layer: int, site: str, W_out_in: Tensor, bias: Tensor | None = None) -> None:
        """The site-layer's plan and, with ``null``, its structureless null's plan (module sites score
        ``x W^T + bias`` exactly, so their ceiling may be summed on the input side)."""
        k = self.key(layer, site)
        self.plans[k] = self._plan(W_out_in, site, bias).to(self.device)  # built on the CPU, scored here
        if self.hparams.null_control:
            self.null_plans[k] = self._plan(M.haar_null(W_out_in, M.null_seed(layer, site)), site).to(self.device)

    def _start_pass(self, p: int) -> None:
        """Plans and empty sums of pass ``p``'s layers (those of the previous pass are dropped first)."""
        for d in (self.plans, self.null_plans, self.sums, self.null_sums, self.fit):
            d.clear()
        gc.collect()  # torchmetrics states sit in reference cycles: free them now, not at some later collection
        layers = self.passes[p]
        jobs = [(l, s) for l in layers for s in self.sites if s not in self.effective]
        where = f" (layers {layers[0]}-{layers[-1]})" if len(self.passes) > 1 else ""
        for l, s in tqdm(jobs, desc=f"mount plans{where}", disable=not self._is_zero()):
            W, b = self.view.site_weight(l, s)
            self._add_plans(l, s, W.mT, b)
        # every state exists from the start (sizes follow from the shapes); effective plans come after the fit
        v, dev = self.view, self.device
        fit_shapes = {"count": ()}
        if "up" in self.effective:
            fit_shapes["gate"] = (v.d_mlp,)
        if "v" in self.effective:
            fit_shapes.update(xtx=(v.d_model, v.d_model), xtz=(v.d_model, v.n_heads * v.d_head))
        for l in layers:
            for s in self.sites:
                self.sums[self.key(l, s)] = NamedSums(self._shapes(s, ceiling=True), dev)
                if self.hparams.null_control:
                    self.null_sums[self.key(l, s)] = NamedSums(self._shapes(s, ceiling=False), dev)
            if self.effective:
                self.fit[f"L{l}"] = NamedSums(fit_shapes, dev)
        self._effective_built = False

    # --- the forward pass with taps ----------------------------------------------------------------
    def _n_fit_batches(self) -> int:
        """How many of each rank's first batches fit the effective paths: ``fit_fraction`` of the
        smallest per-rank batch count, so every rank switches (and syncs) at the same batch."""
        n = self.trainer.num_test_batches[0]
        if n == float("inf"):
            raise ValueError("effective paths need a test stream of known length (a sized DataLoader)")
        n = int(n)
        if self.trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            t = torch.tensor([n], device=self.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
            n = int(t.item())
        if n < 2:
            raise ValueError(
                f"the test stream has {n} batch(es) per process; effective paths need at least 2"
                " (one to fit, one to score): give more tokens or a smaller batch size"
            )
        return max(1, min(n - 1, int(round(self.hparams.fit_fraction * n))))

    def _taps(self, layers: list[int], mask: Tensor | None, fitting: bool) -> list[Hook]:
        """Hooks on every site module of ``layers``; each layer is reduced to sums when its block finishes."""
        v = self.view
        needed = (
            set(self.sites)
            | ({"o"} if "v" in self.effective else set())
            | ({"gate", "down"} if "up" in self.effective else set())
        )
        taps = []
        for l in layers:
            store: dict = {}

            def tap(mod, args, kwargs, out, store=store):
                store[id(mod)] = (first_input(args, kwargs), out)

            mods = {id(m): m for m in (v.site_module(l, s) for s in needed)}  # fused qkv: one hook
            taps += [Hook(m, tap) for m in mods.values()]

            def done(mod, args, kwargs, out, l=l, store=store):
                self._reduce_layer(l, store, mask, fitting)
                store.clear()

            taps.append(Hook(v.block(l), done))
        return taps

    def _site_io(self, l: int, s: str, store: dict) -> tuple[Tensor, Tensor]:
        mod = self.view.site_module(l, s)
        x, out = store[id(mod)]
        return x, self.view.site_output(l, s, out)

    def _score(self, k: str, x: Tensor, dh: Tensor) -> None:
        """Add one batch of site-layer ``k`` (tokens ``x``, writes ``dh``) to its sums and its null's."""
        self.sums[k].update(M.site_sums(self.plans[k], x, dh))
        if self.hparams.null_control:
            null, xs = self.null_plans[k], x[:: self.hparams.null_stride]
            self.null_sums[k].update(M.site_sums(null, xs, None, ceiling=False))  # its writes: xs W0^T

    def _reduce_layer(self, l: int, store: dict, mask: Tensor | None, fitting: bool) -> None:
        for s in self.sites:
            if s not in self.effective:
                x, dh = self._site_io(l, s, store)
                self._score(self.key(l, s), _tokens(x, mask), _tokens(dh, mask))
        if not self.effective:
            return
        v = self.view
        if fitting:
            stats: dict[str, Tensor] = {}
            if "up" in self.effective:
                _, g = self._site_io(l, "gate", store)
                gate = v.mlp(l).act(_tokens(g, mask)).double()
                stats.update(count=torch.tensor(float(gate.shape[0]), device=gate.device), gate=gate.sum(0))
            if "v" in self.effective:
                X = _tokens(self._site_io(l, "v", store)[0], mask).double()
                Z = _tokens(self._site_io(l, "o", store)[0], mask).double()
                stats.update(count=torch.tensor(float(X.shape[0]), device=X.device), xtx=X.mT @ X, xtz=X.mT @ Z)
            self.fit[f"L{l}"].update(stats)
            return
        if "v" in self.effective:  # the v input against the mixed value (what o reads)
            x_v, z = self._site_io(l, "v", store)[0], self._site_io(l, "o", store)[0]
            self._score(self.key(l, "v"), _tokens(x_v, mask), _tokens(z, mask))
        if "up" in self.effective:  # the up input against the gated product (what down reads)
            x_up, p = self._site_io(l, "up", store)[0], self._site_io(l, "down", store)[0]
            self._score(self.key(l, "up"), _tokens(x_up, mask), _tokens(p, mask))

    def _build_effective(self, layers: list[int]) -> None:
        """Reduce the fit statistics of ``layers`` over ranks and mount their effective maps."""
        v = self.view
        for l in layers:
            f = {k: t.double().cpu() for k, t in self.fit[f"L{l}"].compute().items()}
            if f["count"] <= 0:
                raise ValueError("no tokens reached the effective-path fit; raise fit_fraction or the token budget")
            if "up" in self.effective:
                W_up, _ = v.site_weight(l, "up")
                self._add_plans(l, "up", M.gate_weighted(W_up.mT.double(), f["gate"] / f["count"]))
            if "v" in self.effective:
                self._add_plans(l, "v", M.ridge_map(f["xtx"], f["xtz"], self.hparams.v_ridge))

    @staticmethod
    def _unpack(batch) -> tuple[Tensor, Tensor | None]:
        if isinstance(batch, Tensor):
            return batch, None
        if isinstance(batch, dict):
            return batch["input_ids"], batch.get("attention_mask")
        return batch[0], (batch[1] if len(batch) > 1 else None)

    def _score_batch(self, p: int, batch_idx: int, ids: Tensor, attn: Tensor | None) -> None:
        """One batch through pass ``p``: its layers' sums (or, before the switch, their effective-path fit),
        running only the blocks the pass needs and keeping the residual stream the next pass starts from."""
        layers = self.passes[p]
        if self.effective and batch_idx == self._n_fit and not self._effective_built:
            self._build_effective(layers)
            self._effective_built = True
        fitting = bool(self.effective) and not self._effective_built
        mask = None if attn is None else attn.reshape(-1).bool()
        start, stop, record = pass_bounds(self.passes, p)

        def forward():  # only the taps are read
            self.lm(input_ids=ids, attention_mask=attn, logits_to_keep=1)

        with torch.no_grad(), hooks(*self._taps(layers, mask, fitting)):
            out = run_blocks(self.view, forward, start, self._resume.pop(batch_idx, None), stop, record)
        if record is not None:
            self._resume[batch_idx] = out

    def test_step(self, batch, batch_idx: int) -> None:
        ids, attn = self._unpack(batch)
        if batch_idx == 0:
            self.first_ids = ids[: self.hparams.steer_texts, : self.hparams.steer_tokens].clone()
        if len(self.passes) > 1:
            self._batches.append((ids, attn))
        self._score_batch(0, batch_idx, ids, attn)

    def on_test_epoch_start(self) -> None:
        self._n_fit = self._n_fit_batches() if self.effective else 0
        self._batches, self._resume, self.rows = [], {}, []
        self._start_pass(0)

    # --- the end: summaries, steering, pass rules ----------------------------------------------------
    def on_test_epoch_end(self) -> None:
        ctx = self._steer_context(self._steer_texts())
        reading_W = self.view.unembed()[0]  # float32: the readings take float64 products a slice at a time
        rows = []
        for p in range(len(self.passes)):
            if p > 0:
                self._start_pass(p)
                where = f"mounts pass {p + 1}/{len(self.passes)} (layers {self.passes[p][0]}-{self.passes[p][-1]})"
                for i, (ids, attn) in enumerate(tqdm(self._batches, desc=where, disable=not self._is_zero())):
                    self._score_batch(p, i, ids, attn)
            if self.effective and not self._effective_built:
                raise ValueError("the test stream ended before the effective-path fit finished")
            rows += self._pass_rows(p, ctx, reading_W)
        self._batches, self._resume = [], {}
        for row in rows:
            judge_row(row, self.rules)
        self.rows = rows
        self.log("mounts/pass_fraction", sum(r["pass"] for r in rows) / len(rows), sync_dist=False)

    def _pass_rows(self, p: int, ctx: SteerContext, reading_W: Tensor) -> list[dict]:
        """The rows of pass ``p``'s site-layers from their sums, steered (residual writes), not yet judged."""
        rows = []
        for l in self.passes[p]:
            for s in self.sites:
                k = self.key(l, s)
                null = self.null_plans[k] if self.hparams.null_control else None
                rows.append(
                    site_row(
                        l,
                        s,
                        "effective" if s in self.effective else "module",
                        self.tile_widths[s],
                        M.summarize(self.plans[k], self.sums[k].compute()),
                        None if null is None else M.summarize(null, self.null_sums[k].compute()),
                    )
                )
        steer_rows = [r for r in rows if r["residual"]]
        for row in tqdm(steer_rows, desc="steering", disable=not self._is_zero()):
            k = self.key(row["layer"], row["site"])
            row.update(self._steer(ctx, self.plans[k], row, reading_W))
            if self.hparams.null_control:
                row["null"].update(self._steer(ctx, self.null_plans[k], row["null"], reading_W, row))
        return rows

    def _steer_texts(self) -> Tensor:
        """The first ``steer_texts`` windows of the stream in global order, identical on every rank: the
        ranks' first batches gathered and interleaved (a distributed sampler deals window ``i`` to rank
        ``i % world_size``), so one process and DDP steer with the same texts."""
        ids = self.first_ids.to(self.device)
        if self.trainer.world_size > 1:
            ids = self.all_gather(ids).transpose(0, 1).reshape(-1, ids.shape[-1])
        return ids[: self.hparams.steer_texts]

    @torch.no_grad()
    def _steer_context(self, texts: Tensor) -> SteerContext:
        """With ``steer_positions="last"`` the key / value cache of each text's prefix (the steer touches
        only the last position, so the prefix is the same for every mount), and the unsteered logits."""
        return steer_context(self.lm, texts, self.hparams.steer_positions)

    @torch.no_grad()
    def _steer(
        self, ctx: SteerContext, plan: M.SitePlan, figures: dict, W_U: Tensor, where: dict | None = None
    ) -> dict:
        """Add ``alpha * u`` to the residual after the sub-layer (at the last position, or at every
        position) for the ``steer_mounts`` tiled mounts of ``plan`` of highest tile-local lift
        (``figures["tile_lift"]``); compare the mean last-token logit change with ``u``'s unembedding
        reading (Spearman rho, top-20 Jaccard). ``where``: the row giving layer and site (default ``figures``)."""
        where = where or figures
        return steer_scores(
            self.view,
            self.lm,
            ctx,
            plan,
            figures["tile_lift"],
            where["layer"],
            where["site"],
            W_U,
            self.hparams.steer_alpha,
            self.hparams.steer_mounts,
        )


def site_row(
    layer: int, site: str, path: str, tile_width: int, summary: dict, null_summary: dict | None = None
) -> dict:
    """One site-layer's row of a mounts run (the test run's ``sites``, the training callback's rows):
    ``summary`` is ``analysis.mounts.summarize`` of its sums, ``null_summary`` its structureless null's."""
    row = {
        "site": site,
        "layer": layer,
        "residual": site in RESIDUAL_SITES,
        "path": path,
        "tile_width": tile_width,
        **summary,
    }
    if null_summary is not None:
        row["null"] = {"layer": layer, **null_summary}
    return row


def judge_row(row: dict, rules: M.MountRules) -> None:
    """Add ``checks`` and ``pass`` (``analysis.mounts.judge``) to a row and to its null."""
    for r in [row, row["null"]] if "null" in row else [row]:
        r["checks"] = M.judge(r, rules, residual=row["residual"], effective=row["path"] == "effective")
        r["pass"] = r["checks"]["pass"]


@torch.no_grad()
def steer_context(lm, texts: Tensor, positions: str = "last") -> SteerContext:
    """The unsteered state: with ``positions="last"`` the key / value cache of each text's prefix (the steer
    touches only the last position, so the prefix is the same for every mount), and the unsteered logits."""
    cache = None
    if positions == "last":
        cache = returned_cache(lm(input_ids=texts[:, :-1], use_cache=True, logits_to_keep=1))
    return SteerContext(texts, cache, last_logits(lm, texts, cache))


@torch.no_grad()
def steer_scores(
    view,
    lm,
    ctx: SteerContext,
    plan: M.SitePlan,
    tile_lift: list[float],
    layer: int,
    site: str,
    W_U: Tensor,
    alpha: float,
    n_mounts: int,
) -> dict:
    """Check C1 of one site-layer: add ``alpha * u`` to the residual after the sub-layer (at the steered
    positions of ``ctx``) for the ``n_mounts`` tiled mounts of ``plan`` of highest ``tile_lift``; compare the
    mean last-token logit change with ``u``'s unembedding reading (Spearman rho, top-20 Jaccard)."""
    U = plan.strategies["tiled"].U
    top = torch.tensor(tile_lift, device=U.device).argsort(descending=True)[:n_mounts]
    U = U[:, top].mT.float()  # [m, d_model]
    point = "attn" if site == "o" else "mlp"  # read through what follows the write (Gemma's post norms)
    read = unembed_reading(view, view.post_norm(point, layer, U.double()), W_U)
    device = ctx.texts.device
    rhos, jacs = [], []
    for j in range(U.shape[0]):
        with steering(view, layer, site, alpha * U[j].to(device)):
            delta = (last_logits(lm, ctx.texts, ctx.cache) - ctx.base).mean(0).double().cpu()
        rhos.append(M.spearman(delta, read[j]))
        jacs.append(M.topk_jaccard(delta, read[j], 20))
    return {
        "steer_rho": sum(rhos) / len(rhos),
        "steer_jaccard": sum(jacs) / len(jacs),
        "steer_rho_per_mount": rhos,
        "steer_jaccard_per_mount": jacs,
    }


def last_logits(lm, texts: Tensor, cache=None) -> Tensor:
    """Last-position logits ``[batch, vocab]`` of ``texts``; with ``cache`` (the key / value cache of
    ``texts[:, :-1]``) only the last token is run, on a copy of the cache so that it can be reused."""
    if cache is None:
        return lm(input_ids=texts, logits_to_keep=1).logits[:, -1].float()
    out = lm(input_ids=texts[:, -1:], **{cache_kwarg(lm): copy.deepcopy(cache)}, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1].float()


READING_SLICE = 16384  # vocabulary columns per product in unembed_reading


def unembed_reading(view, U: Tensor, W_U: Tensor | None = None) -> Tensor:
    """How the unembedding reads write directions ``U: [n, d_model]``: the logit change of each
    direction through the model's own final norm, ``(norm(u) - norm(0)) W_U`` -> ``[n, vocab]``.

    ``norm`` is ``view.normalized("final", ...)`` paired with ``view.unembed()``: the model's exact
    convention (Gemma: ``1 + w``; LayerNorm bias removed by the ``- norm(0)`` term). Gemma-2's final
    soft-cap is monotone, so rank statistics of the reading do not depend on it."""
    if W_U is None:
        W_U = view.unembed()[0]
    normed = view.normalized("final", None, U.to(W_U.device))
    zero = view.normalized("final", None, torch.zeros_like(U[:1]).to(W_U.device))
    d = normed - zero
    out = torch.empty(d.shape[0], W_U.shape[1], dtype=d.dtype, device="cpu")  # the readings leave the device
    for s in range(0, W_U.shape[1], READING_SLICE):  # no whole-vocabulary copy in U's dtype (Gemma-2: 4.7 GB float64)
        out[:, s : s + READING_SLICE] = (d @ W_U[:, s : s + READING_SLICE].to(d.dtype)).cpu()
    return out


@contextmanager
def steering(view, layer: int, site: str, add: Tensor):
    """Add ``add: [d_model]`` (or ``[batch, d_model]``) to the write of ``site``'s sub-layer of ``layer``
    (``o``: the attention output, ``down``: the MLP output), before whatever the model applies to that
    write (Gemma's post-attention / post-feed-forward norm), so that it reaches the residual stream as
    the sub-layer's own writes do. Without post norms this is adding it to the residual right after the
    sub-layer (the MLP's norm and every later layer see it)."""
    check_choice("site", site, RESIDUAL_SITES, where=" as a residual write (steering)")
    add3 = add if add.dim() == 1 else add.unsqueeze(1)

    def out_hook(mod, args, kwargs, out):
        return out + add3.to(out.dtype)

    with hooks(Hook(view.site_module(layer, site), out_hook, "post")):
        yield
