"""Edge ablation (``analysis/edge_ablation.py``) against the HF forward and hand-written hooks, on float64 tiny
models of every architecture (RMSNorms in float64: ``exact_rms_norms``).

* every edge kept is the clean forward, none the corrupted one, and every edge dropped but those into the logits
  also the corrupted one (every reader upstream then reads the corrupted residual, so every writer writes its
  corrupted value): the answer logits within ``TOL`` of the largest;
* dropping every edge into one reader unit (a head's query, a KV head's key, a head's value input, an MLP's input,
  the logits) equals a hook that feeds that unit the corrupted run's residual through the model's own modules;
* dropping one writer's edges to every reader (the embedding, a head, an MLP, one OV direction) equals a hook that
  replaces the writer's write in the residual by its corrupted write (the node ablation; Gemma: the write after
  the post norm, each with its own run's post-norm factor);
* the sparse sums over kept or dropped edges equal the dense one, and every path (dense, sparse over the kept or the
  dropped edges, gains formed per forward or precomputed) equals a brute-force correction that forms every writer
  direction's ``corrupted - live`` write and sums them per reader direction as the module docstring defines;
* a head-level circuit given as whole blocks (``block_keep``) equals the same circuit given as a mask of direction
  edges; a circuit given as levels (``KeepLevels``) equals the brute-force correction of its mask.
"""

from __future__ import annotations

import pytest
import torch

from lit_svd.analysis import edge_ablation
from lit_svd.analysis.edge_ablation import (
    AllEdges,
    DropWriters,
    EdgeAblation,
    KeepLevels,
    NoEdges,
    UnitKeep,
    UnitMasks,
)
from lit_svd.analysis.edges import EdgeUniverse
from lit_svd.linalg import svd_factored
from lit_svd.metrics import forward_answer_logits
from lit_svd.models import view as make_view
from lit_svd.models.hooks import Hook, capture, first_input, hooks, output_tensor
from lit_svd.models.points import eager_attention
from lit_svd.models.tiny import ARCHITECTURES, HEAD_NORM_ARCHITECTURES, tiny_causal_lm
from tests.helpers import exact_rms_norms

ALL = ARCHITECTURES + HEAD_NORM_ARCHITECTURES
TOL = 1e-9
VOCAB = 64


def edge_batch(B: int = 4, T: int = 7, seed: int = 0) -> dict:
    """Random clean prompts; the corrupted ones differ at two positions (same length). IOI-style keys."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(5, VOCAB, (B, T), generator=g)
    corrupt = clean.clone()
    for t in (2, 4):
        corrupt[:, t] = torch.randint(5, VOCAB, (B,), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    return {
        "clean_ids": clean,
        "corrupt_ids": corrupt,
        "attention_mask": mask,
        "answer_pos": torch.full((B,), T - 1),
        "correct_id": torch.randint(0, VOCAB, (B,), generator=g),
        "wrong_id": torch.randint(0, VOCAB, (B,), generator=g),
    }


class Setup:
    def __init__(self, model):
        self.model = model
        self.view = make_view(model)
        self.universe = EdgeUniverse(self.view)
        self.ablation = EdgeAblation(self.universe, "ioi")
        self.batch = edge_batch()
        self.ref = self.ablation.reference(self.batch)
        self.corrupt = self.run_hf(ids=self.batch["corrupt_ids"])
        self.clean = self.run_hf()
        self.corrupt_points = self.capture_corrupt()

    def run_hf(self, *specs: Hook, ids=None) -> torch.Tensor:
        b = self.batch
        with torch.no_grad(), eager_attention(self.model), hooks(*specs):
            ids = b["clean_ids"] if ids is None else ids
            return forward_answer_logits(self.model, ids, b["attention_mask"], b["answer_pos"])

    def run_edges(self, circuit) -> torch.Tensor:
        b = self.batch
        with torch.no_grad(), self.ablation.patched(b, circuit, self.ref):
            return forward_answer_logits(self.model, b["clean_ids"], b["attention_mask"], b["answer_pos"])

    def capture_corrupt(self) -> dict:
        """The corrupted run's norm inputs, value site outputs, o-projection inputs and sub-layer outputs."""
        v = self.view
        mods = {("final", None): v.norm_module("final", None)}
        for l in range(v.n_layers):
            mods |= {("attn", l): v.norm_module("attn", l), ("mlp", l): v.norm_module("mlp", l)}
            mods |= {("z", l): v.site_module(l, "o")}
        outs = {("attn_out", l): v.attention_module(l) for l in range(v.n_layers)}
        outs |= {("down", l): v.site_module(l, "down") for l in range(v.n_layers)}
        outs |= {("v", l): v.site_module(l, "v") for l in range(v.n_layers)}
        with capture(mods, "pre") as pre, capture(outs, "post") as post:
            self.run_hf(ids=self.batch["corrupt_ids"])
        got = {**pre, **post}
        for l in range(v.n_layers):
            got["v", l] = v.site_output(l, "v", got["v", l])
            got["down", l] = v.site_output(l, "down", got["down", l])
        return got


def close(ours, ref, what):
    err = (ours - ref).abs().max().item()
    bound = TOL * ref.abs().max().item()
    assert err <= bound, f"{what}: max abs diff {err:.3g} > {bound:.3g}"


@pytest.fixture(params=ALL, scope="module")
def s(request):
    model = tiny_causal_lm(request.param, vocab_size=VOCAB).double()
    with exact_rms_norms(model):
        yield Setup(model)


def replace_input(new: torch.Tensor):
    """A pre-hook feeding a module ``new`` as its hidden states."""

    def pre(module, args, kwargs):
        if args:
            return (new, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": new}

    return pre


def test_ends_are_the_clean_and_the_corrupted_forward(s):
    assert (s.clean - s.corrupt).abs().max() > 1e-3  # the prompts differ where it matters
    close(s.run_edges(AllEdges()), s.clean, "all edges kept")
    close(s.run_edges(NoEdges(s.universe)), s.corrupt, "no edge kept")
    logits = s.universe.readers[-1]
    everything_but_logits = UnitMasks(
        {r.index: torch.zeros(r.size, r.n_cols, dtype=torch.bool) for r in s.universe.readers if r is not logits}
    )
    close(s.run_edges(everything_but_logits), s.corrupt, "only the logits' edges kept")


def _unit(s, kind: str, layer: int, group: int = 0):
    return next(r for r in s.universe.readers if r.kind == kind and r.layer == layer and r.group == group)


def _reader_hook(s, kind: str, layer: int, group: int) -> list[Hook]:
    """Hooks that feed one reader unit the corrupted residual through the model's own modules."""
    v, got = s.view, s.corrupt_points
    if kind == "mlp":
        return [Hook(v.norm_module("mlp", layer), replace_input(got["mlp", layer]), "pre")]
    if kind == "logits":
        return [Hook(v.norm_module("final", None), replace_input(got["final", None]), "pre")]
    normed = v.norm_module("attn", layer)(got["attn", layer])
    dh = v.d_head
    if kind in ("q", "k"):
        site = kind
        want = v.site_output(layer, site, v.site_module(layer, site)(normed))[..., group * dh : (group + 1) * dh]

        def replace(module, args, kwargs, out):
            own = v.site_output(layer, site, out).clone()
            own[..., group * dh : (group + 1) * dh] = want
            return v.with_site_output(layer, site, out, own)

        return [Hook(v.site_module(layer, site), replace, "post")]
    # the value input of query head `group`: its output gains sum_s A[d, s] (v_corrupt(s) - v_live(s)) W_O[h]
    kv = group // (v.n_heads // v.n_kv_heads)
    value_corrupt = v.site_output(layer, "v", v.site_module(layer, "v")(normed))[..., kv * dh : (kv + 1) * dh]
    W_O = v.attn(layer).W_O[group]
    live = {}

    def keep_value(module, args, kwargs, out):
        live["v"] = v.site_output(layer, "v", out)[..., kv * dh : (kv + 1) * dh]

    def add(module, args, kwargs, out):
        A = output_tensor(out, 1)[:, group]
        change = torch.einsum("bds,bsc->bdc", A, value_corrupt - live["v"]) @ W_O
        return (output_tensor(out) + change, *out[1:])

    return [Hook(v.site_module(layer, "v"), keep_value, "post"), Hook(v.attention_module(layer), add, "post")]


@pytest.mark.parametrize("kind", ["q", "k", "v", "mlp", "logits"])
def test_dropping_a_readers_edges_is_feeding_it_the_corrupted_residual(s, kind):
    layer = s.view.n_layers if kind == "logits" else 1
    group = 1 if kind in ("q", "v") and s.view.n_heads > 1 else 0
    r = _unit(s, kind, layer, group)
    ours = s.run_edges(UnitMasks({r.index: torch.zeros(r.size, r.n_cols, dtype=torch.bool)}))
    hand = s.run_hf(*_reader_hook(s, kind, layer, group))
    assert (hand - s.clean).abs().max() > 1e-6, f"{kind}: the corrupted input changes nothing here"
    close(ours, hand, f"every edge into {r} dropped")


def _write_hook(s, layer: int, site: str, change) -> Hook:
    """A hook adding ``change(out) [B, T, d]`` to what the sub-layer writes into the residual (after Gemma's post
    norm: on the post norm's output; elsewhere on the sub-layer's output)."""
    v = s.view
    post = v.post_norm_module("attn" if site == "attn" else "mlp", layer)
    module = post
    if module is None:
        module = v.attention_module(layer) if site == "attn" else v.site_module(layer, "down")

    def hook(m, args, kwargs, out):
        own = output_tensor(out)
        new = own + change()
        return (new, *out[1:]) if isinstance(out, tuple) else new

    return Hook(module, hook, "post")


def _head_write(s, layer: int, z: torch.Tensor, out: torch.Tensor, head: int, k: int | None = None) -> torch.Tensor:
    """What head ``head`` (or its OV direction ``k``) writes into the residual given the o-projection input ``z`` and
    the attention output ``out`` (Gemma: through the post norm with ``out``'s factor)."""
    v = s.view
    B, T, _ = z.shape
    zh = z.reshape(B, T, v.n_heads, v.d_head)[:, :, head]
    write = zh @ v.attn(layer).W_O[head]
    if k is not None:
        fm = v.ov(layer)
        vk = svd_factored(fm.A.double(), fm.B.double()).V[head][:, k]
        write = (write @ vk)[..., None] * vk
    post = v.post_norm_factor("attn", layer, out)
    if post is not None:
        write = write * post * v.post_norm_affine("attn", layer).scale
    return write


@pytest.mark.parametrize("writer", ["embed", "head", "direction", "mlp"])
def test_dropping_a_writers_edges_is_its_node_ablation(s, writer):
    v, u, got = s.view, s.universe, s.corrupt_points
    layer = 0
    if writer == "embed":
        cols = torch.tensor([0])
        hand = [Hook(v.block(0), replace_input(got["attn", 0]), "pre")]
    elif writer == "mlp":
        w = u.writer_units(layer, "mlp")[0]
        cols = torch.arange(w.offset, w.offset + w.size)
        live = {}
        keep = Hook(v.site_module(layer, "down"), lambda m, a, k, o: live.update(out=v.site_output(layer, "down", o)))

        def change():
            if v.post_norm_module("mlp", layer) is None:
                return got["down", layer] - live["out"]
            gain = v.post_norm_affine("mlp", layer).scale
            f_corrupt, f_live = (v.post_norm_factor("mlp", layer, x) for x in (got["down", layer], live["out"]))
            return (got["down", layer] * f_corrupt - live["out"] * f_live) * gain

        hand = [keep, _write_hook(s, layer, "mlp", change)]
    else:
        head = 1
        w = u.writer_units(layer, "head")[head]
        k = 2 if writer == "direction" else None
        cols = torch.tensor([w.offset + k]) if k is not None else torch.arange(w.offset, w.offset + w.size)
        live = {}
        keep = [
            Hook(v.site_module(layer, "o"), lambda m, a, kw: live.update(z=first_input(a, kw)), "pre"),
            Hook(v.attention_module(layer), lambda m, a, kw, o: live.update(out=output_tensor(o)), "post"),
        ]

        def change():
            corrupt = _head_write(s, layer, got["z", layer], got["attn_out", layer], head, k)
            return corrupt - _head_write(s, layer, live["z"], live["out"], head, k)

        hand = [*keep, _write_hook(s, layer, "attn", change)]
    ours = s.run_edges(DropWriters(u, cols))
    ref = s.run_hf(*hand)
    assert (ref - s.clean).abs().max() > 1e-6, f"{writer}: its corrupted write changes nothing here"
    close(ours, ref, f"the {writer}'s edges dropped")


@pytest.mark.parametrize("density", [0.02, 0.5, 0.98])
def test_sparse_and_dense_partial_sums_agree(s, density, monkeypatch):
    """A random direction circuit at three densities (the logits' edges kept, so that what reaches them counts): the
    edge-by-edge sums (``SPARSE`` paths) equal the dense one."""
    g = torch.Generator().manual_seed(1)
    readers = s.universe.readers[:-1]
    masks = {r.index: torch.rand(r.size, r.n_cols, generator=g) < density for r in readers}
    circuit = UnitMasks(masks)
    monkeypatch.setattr(edge_ablation, "SPARSE", 0.0)
    dense = s.run_edges(circuit)
    monkeypatch.setattr(edge_ablation, "SPARSE", 0.5)
    sparse = s.run_edges(circuit)
    assert (dense - s.clean).abs().max() > 1e-6 and (dense - s.corrupt).abs().max() > 1e-6
    close(sparse, dense, f"density {density}: sparse vs dense")


def brute_correction(self, r, keep: UnitKeep, R, D, Dr, plan, live):
    """The correction of reader unit ``r`` from its definition: every upstream writer direction's ``corrupted -
    live`` write formed on its own (the embedding: its whole write); the unit's input adds those that no direction
    keeps, each direction adds its own dropped ones through the unit's factor."""
    u, v = self.u, self.view
    M = (
        keep.columns()
        if keep.any_col is not None
        else (keep.state == edge_ablation.FULL)[u.col_unit[: r.n_cols]].expand(r.size, -1)
    )
    writes = live.dcT[: r.n_cols, :, None] * u.W[: r.n_cols, None, :]  # [n_cols, P, d]
    writes[0] = live.delta[0]
    y = R + writes[~M.any(0)].sum(0)
    raw = torch.einsum("kj,jpd,kd->kp", (~M).to(R.dtype), writes, u.basis(r).Rc)
    f = v.norm_factor(r.point, r.layer, y).reshape(-1)
    return raw.T * f[:, None], f / v.norm_factor(r.point, r.layer, R).reshape(-1)


@pytest.mark.parametrize("density, whole", [(0.003, True), (0.3, True), (0.997, True), (0.3, False)])
def test_every_partial_path_equals_the_brute_force_correction(s, density, whole, monkeypatch):
    """Random direction circuits with whole blocks kept and dropped beside partial ones (``whole``; else every block
    partial: the partial columns are one run, read as a slice), a few reader units kept whole: the dense path, the
    sparse paths over the kept and the dropped edges, with gains formed per forward and precomputed
    (``EdgeAblation(gains=...)``), the dense products per unit and per read point (``GATHER``), all equal the
    brute-force correction (1e-9 of the largest logit)."""
    u = s.universe
    g = torch.Generator().manual_seed(2)
    masks = {}
    for r in u.readers[:-1]:
        block = torch.rand(r.n_up, generator=g)  # < 0.2: dropped whole, > 0.8: kept whole, else partial
        m = torch.rand(r.size, r.n_cols, generator=g) < density
        if whole:
            at = block[u.col_unit[: r.n_cols]]
            m = torch.where(at < 0.2, False, torch.where(at > 0.8, True, m))
        else:
            m[0, 1:] = True  # every column kept by some direction and dropped by another: every block partial
            m[1, 1:] = False
        if r.index % 5 != 4:
            masks[r.index] = m
    circuit = UnitMasks(masks)
    monkeypatch.setattr(EdgeAblation, "correction", brute_correction)
    brute = s.run_edges(circuit)
    monkeypatch.undo()
    assert (brute - s.clean).abs().max() > 1e-6 and (brute - s.corrupt).abs().max() > 1e-6
    gains = {r.index: u.basis(r).Rc @ u.W[: r.n_cols].T for r in u.readers[:-1]}
    for sparse, gather in ((0.0, 0), (0.0, 10**9), (0.5, edge_ablation.GATHER)):
        monkeypatch.setattr(edge_ablation, "SPARSE", sparse)
        monkeypatch.setattr(edge_ablation, "GATHER", gather)  # the dense products per unit / per read point
        for given, as_levels in ((None, False), (gains, False), (gains, True)):
            s.ablation.gains = given
            try:
                got = s.run_edges(Leveled(u, masks, g) if as_levels else circuit)
            finally:
                s.ablation.gains = None
            how = f"SPARSE {sparse}, GATHER {gather}, gains {'given' if given else 'formed'}, {as_levels=}"
            close(got, brute, f"density {density}, {how}, {whole=}")


class Leveled:
    """``masks`` given as levels (``KeepLevels``): random levels 2-4 where kept, 0-1 where dropped, need 2."""

    def __init__(self, u, masks, g):
        self.levels_of = {}
        for r in u.readers:
            m = masks.get(r.index, torch.ones(r.size, r.n_cols, dtype=torch.bool))
            level = torch.where(m, torch.randint(2, 5, m.shape, generator=g), torch.randint(0, 2, m.shape, generator=g))
            level = level.to(torch.uint8)
            self.levels_of[r.index] = KeepLevels(level, level.amin(0), level.amax(0), 2)

    def keep(self, r):
        raise AssertionError("a leveled circuit is read through its levels")

    def levels(self, r):
        return self.levels_of[r.index]


@pytest.mark.parametrize("as_levels", [False, True])
def test_kept_edges_of_the_mixed_columns(as_levels):
    """``_kept`` (the plan's count of kept edges in the mixed columns, over their span where it is narrow) equals the
    count of their mask, for mixed columns in one run, close together and spread out."""
    g = torch.Generator().manual_seed(4)
    K, n = 6, 400
    kind = torch.randint(0, 3, (n,), generator=g)  # 0: no direction keeps the column, 1: every one, 2: mixed
    kind[100:200] = torch.where(torch.arange(100) % 5 == 0, torch.arange(100) % 2, 2)  # mostly mixed
    mask = torch.where(kind[None] == 2, torch.rand(K, n, generator=g) < 0.4, (kind == 1)[None].expand(K, n))
    mask[0, kind == 2], mask[1, kind == 2] = True, False  # really mixed
    if as_levels:
        high, low = torch.randint(2, 5, mask.shape, generator=g), torch.randint(0, 2, mask.shape, generator=g)
        level = torch.where(mask, high, low)
        L = KeepLevels(level.to(torch.uint8), level.amin(0).to(torch.uint8), level.amax(0).to(torch.uint8), 2)
        keep = UnitKeep(torch.zeros(1), None, L.high >= 2, L, L.low >= 2)
    else:
        keep = UnitKeep(torch.zeros(1), mask, mask.any(0), None, mask.all(0))
    mixed = torch.nonzero(kind == 2).flatten()
    near, spread = mixed[(mixed >= 100) & (mixed < 200)], mixed[::7]
    assert len(near) * 2 >= int(near[-1] - near[0]) + 1 and len(spread) * 2 < int(spread[-1] - spread[0]) + 1
    for cols in (near, spread, slice(100, 104), mixed[:0]):
        want = int(keep.columns(cols).count_nonzero())
        assert want > 0 or not edge_ablation._length(cols)
        assert edge_ablation._kept(keep, cols, K) == want


def test_whole_blocks_equal_their_mask():
    """A circuit giving whole blocks (``block_keep``) runs as the same circuit given as masks of direction edges."""
    model = tiny_causal_lm("gpt2", vocab_size=VOCAB).double()
    setup = Setup(model)
    u = setup.universe
    g = torch.Generator().manual_seed(3)
    blocks = {r.index: torch.rand(r.n_up, generator=g) < 0.5 for r in u.readers}

    class Blocks:
        def keep(self, r):
            return blocks[r.index][u.col_unit[: r.n_cols]].expand(r.size, -1)

        def block_keep(self, r):
            return blocks[r.index]

    masks = UnitMasks({r.index: Blocks().keep(r) for r in u.readers})
    ours = setup.run_edges(Blocks())
    assert (ours - setup.clean).abs().max() > 1e-6 and (ours - setup.corrupt).abs().max() > 1e-6
    close(ours, setup.run_edges(masks), "whole blocks vs their mask")


def test_bad_prompts_fail_in_one_line():
    model = tiny_causal_lm("llama", vocab_size=VOCAB).double()
    ablation = EdgeAblation(EdgeUniverse(make_view(model)), "ioi")
    batch = edge_batch()
    batch["corrupt_ids"] = batch["corrupt_ids"][:, :-1]
    with pytest.raises(ValueError, match="same token length"):
        ablation.reference(batch)


def test_inactive_positions_change_nothing(s, monkeypatch):
    """Prompts whose answer comes before the last position, one padded, all with a shared prefix: the ablation over
    the active positions only (``active_rows``) equals the same ablation computed at every position, and the active
    positions are those from the first differing token to the answer, padding excluded."""
    ablation = s.ablation
    b = edge_batch(B=3, T=8)
    b["answer_pos"] = torch.tensor([5, 6, 4])
    b["attention_mask"][2, 5:] = 0
    rows = edge_ablation.active_rows(b)
    assert rows is not None
    assert rows.tolist() == [2, 3, 4, 5, 10, 11, 12, 13, 14, 18, 19, 20]
    ref = ablation.reference(b)
    g = torch.Generator().manual_seed(5)
    circuit = UnitMasks({r.index: torch.rand(r.size, r.n_cols, generator=g) < 0.4 for r in s.universe.readers[:-1]})
    active = ablation.metric(b, circuit, ref)
    assert (active - ablation.metric(b, AllEdges(), ref)).abs().max() > 1e-6
    monkeypatch.setattr(edge_ablation, "active_rows", lambda batch: None)
    close(active, ablation.metric(b, circuit, ref), "active positions vs every position")
