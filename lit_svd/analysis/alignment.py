"""SVF alignment of the toy head, as pure functions (no Lightning).

Conventions: feature directions ``W: [..., D, N]`` (column i is feature i), head weights
``W_Q, W_K: [..., H, D]``, ``Omega = W_Q^T W_K: [..., D, D]`` so that the logit is ``r^T Omega s``.
A template pair ``(i, j, target)`` asks the head to attend from query feature i to key feature j.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from lit_svd.linalg import SVD, abs_cosine, orthogonality_to_others, spearman, svd_dense, svd_factored


def unit_columns(X: Float[Tensor, "*batch D N"], eps: float = 1e-12) -> Float[Tensor, "*batch D N"]:
    return X / X.norm(dim=-2, keepdim=True).clamp_min(eps)


def interference(W: Float[Tensor, "*batch D N"]) -> Float[Tensor, "*batch"]:
    """``||E_X||_2``: spectral norm of the off-diagonal Gram matrix of the unit feature vectors.

    ``E_X = W_hat^T W_hat - I`` with ``W_hat`` the columns of ``W: [..., D, N]`` scaled to unit norm;
    its diagonal is zero, so this is the largest |eigenvalue| of the pairwise-cosine matrix.
    """
    Wn = unit_columns(W.double())
    E = Wn.mT @ Wn - torch.eye(W.shape[-1], dtype=torch.float64, device=W.device)
    return torch.linalg.matrix_norm(E, ord=2).to(W.dtype)


def omega_svd(W_Q: Float[Tensor, "*batch H D"], W_K: Float[Tensor, "*batch H D"]) -> SVD:
    """SVD of ``Omega = W_Q^T W_K`` from the factors (never formed densely): ``U, V: [..., D, k]``."""
    return svd_factored(W_Q.mT, W_K.mT)


def feature_singular_cosines(
    W: Float[Tensor, "*batch D N"], svd: SVD
) -> tuple[Float[Tensor, "*batch N k"], Float[Tensor, "*batch N k"]]:
    """``|cos(w_i, u_k)|`` and ``|cos(w_j, v_k)|``, each ``[..., N, k]``."""
    return abs_cosine(W, svd.U), abs_cosine(W, svd.V)


def match_pairs(
    cos_u: Float[Tensor, "N k"], cos_v: Float[Tensor, "N k"], pairs: list[tuple[int, int, float]]
) -> list[dict]:
    """For each pair (i, j, target) of one instance, the singular index k maximising
    ``|cos(w_i, u_k)| * |cos(w_j, v_k)|`` (each pair on its own, so two pairs may claim the same k)."""
    out = []
    for i, j, target in pairs:
        score = cos_u[i] * cos_v[j]
        k = int(score.argmax())
        out.append(
            {
                "query_feature": i,
                "key_feature": j,
                "target": float(target),
                "singular_index": k,
                "cos_query": float(cos_u[i, k]),
                "cos_key": float(cos_v[j, k]),
            }
        )
    return out


def pair_summary(matched: list[dict], S: Float[Tensor, " k"]) -> dict:
    """Mean |cos| over pairs (query and key sides), whether the indices are distinct, the highest index
    used, and the Spearman correlation between the occupied singular values and the targets."""
    idx = [m["singular_index"] for m in matched]
    cos = [c for m in matched for c in (m["cos_query"], m["cos_key"])]
    summary = {
        "mean_abs_cos": sum(cos) / len(cos),
        "distinct_indices": len(set(idx)) == len(idx),
        "max_singular_index": max(idx),
    }
    if len(matched) > 1:
        summary["spearman_sigma_target"] = spearman(S[idx], torch.tensor([m["target"] for m in matched]))
    return summary


def whitened_feature(X: Float[Tensor, "D N"], i: int) -> Float[Tensor, " D"]:
    """Theorem 1's direction ``Sigma_X^{-1} x_i`` with ``Sigma_X = X X^T`` (pseudo-inverse when singular)."""
    Xd = X.double()
    return (torch.linalg.pinv(Xd @ Xd.mT, hermitian=True) @ Xd[:, i]).to(X.dtype)


def cosine(a: Float[Tensor, " D"], b: Float[Tensor, " D"]) -> float:
    return float((a @ b).abs() / (a.norm() * b.norm()).clamp_min(1e-30))


def theorem1_report(svd: SVD, X: Float[Tensor, "D N"], Y: Float[Tensor, "D N"], i: int, j: int) -> dict:
    """Top singular vectors of one instance against Theorem 1's prediction and against the raw features.

    ``svd`` is one instance's Omega SVD, ``X`` / ``Y`` the query / key feature matrices ``[D, N]``. Every
    cosine is of singular index 0 (``u_1``, ``v_1``, the theorem's claim), recorded as ``singular_index``.
    """
    u1, v1 = svd.U[:, 0], svd.V[:, 0]
    return {
        "singular_index": 0,
        "query_feature": i,
        "key_feature": j,
        "cos_u1_prediction": cosine(u1, whitened_feature(X, i)),
        "cos_u1_raw": cosine(u1, X[:, i]),
        "cos_v1_prediction": cosine(v1, whitened_feature(Y, j)),
        "cos_v1_raw": cosine(v1, Y[:, j]),
    }


def least_squares_omega(
    X: Float[Tensor, "D N"], Y: Float[Tensor, "D N"], T: Float[Tensor, "N N"]
) -> Float[Tensor, "D D"]:
    """The Omega minimising ``sum (f^T X^T Omega Y g - f^T T g)^2`` over all feature vectors f, g:
    ``pinv(X)^T T pinv(Y)``; for one pair its singular vectors are Theorem 1's whitened features."""
    Xd, Yd = X.double(), Y.double()
    return (torch.linalg.pinv(Xd).mT @ T.double() @ torch.linalg.pinv(Yd)).to(X.dtype)


def prediction_cosines(
    svd: SVD, X: Float[Tensor, "D N"], Y: Float[Tensor, "D N"], T: Float[Tensor, "N N"], matched: list[dict]
) -> list[dict]:
    """Per matched pair: the least-squares optimum's own index for the pair (``prediction_index``, the same
    matching rule on the optimum's SVD, restricted to its rank(T) non-zero directions) and |cos| of the learnt
    ``u_k, v_k`` at the pair's recorded ``singular_index`` k with the optimum's at ``prediction_index``.
    Comparing index k of     both would pair unrelated directions once the learnt order differs from the optimum's."""
    opt = svd_dense(least_squares_omega(X, Y, T)).truncate(int(torch.linalg.matrix_rank(T.double())))  # rank of T
    cos_u, cos_v = feature_singular_cosines(X, opt)
    pairs = [(m["query_feature"], m["key_feature"], m["target"]) for m in matched]
    out = []
    for m, o in zip(matched, match_pairs(cos_u, cos_v, pairs)):
        k, j = m["singular_index"], o["singular_index"]
        out.append(
            {
                "prediction_index": j,
                "cos_query_prediction": cosine(svd.U[:, k], opt.U[:, j]),
                "cos_key_prediction": cosine(svd.V[:, k], opt.V[:, j]),
            }
        )
    return out


def attended_orthogonality(W: Float[Tensor, "D N"], attended: list[int]) -> dict:
    """Theorem 3: attended features orthogonalise against the rest.

    Returns the mean over attended features of their max |cos| with any non-attended feature, and for
    comparison the mean over non-attended features of their max |cos| with another non-attended one.
    """
    n = W.shape[-1]
    chosen = torch.tensor(sorted(set(attended)), dtype=torch.long)
    others = torch.tensor([k for k in range(n) if k not in set(attended)], dtype=torch.long)
    report = {"attended_max_cos_to_others": float(orthogonality_to_others(W, chosen).mean())}
    if len(others) > 1:
        cos = abs_cosine(W[:, others], W[:, others])
        cos.fill_diagonal_(0.0)
        report["unattended_max_cos_to_unattended"] = float(cos.max(dim=-1).values.mean())
    return report


def alignment_report(
    W: Float[Tensor, "I D N"],
    W_Q: Float[Tensor, "I H D"],
    W_K: Float[Tensor, "I H D"],
    T: Float[Tensor, "N N"],
    pairs: list[tuple[int, int, float]],
    frozen: bool = False,
) -> list[dict]:
    """Everything the toy experiment reports, per instance of ``W: [I, D, N]``, ``W_Q, W_K: [I, H, D]``.

    Per instance: singular values, each pair's singular index and |cos| (``match_pairs``), their summary
    (``pair_summary``), sigma_1 / sigma_2, Theorem 3 orthogonality, Theorem 1 for the first pair (with the
    features as they are: fixed when ``frozen``, learnt otherwise) and, when ``frozen``, per-pair cosines
    with the least-squares optimum's singular vectors.
    """
    svd = omega_svd(W_Q, W_K)
    cos_u, cos_v = feature_singular_cosines(W, svd)
    attended = [i for i, _, _ in pairs] + [j for _, j, _ in pairs]
    reports = []
    for n in range(W.shape[0]):
        one = SVD(svd.U[n], svd.S[n], svd.V[n])
        matched = match_pairs(cos_u[n], cos_v[n], pairs)
        S = one.S
        rep = {
            "singular_values": S,
            "pairs": matched,
            **pair_summary(matched, S),
            "sigma_ratio": float(S[0] / S[1]) if len(S) > 1 and S[1] > 0 else float("inf"),
            "theorem3": attended_orthogonality(W[n], attended),
        }
        if frozen:
            for m, pred in zip(matched, prediction_cosines(one, W[n], W[n], T, matched)):
                m.update(pred)
        i, j, _ = pairs[0]
        rep["theorem1"] = theorem1_report(one, W[n], W[n], i, j)
        reports.append(rep)
    return reports


def theorem1_groups(instances: list[dict]) -> list[dict]:
    """Theorem 1 over seeds: instances grouped by ``(d_model, interference_target)``; per group the seed
    count, the mean reached ``||E_X||_2`` and the mean and worst (smallest) |cos(u_1, whitened prediction)|
    and |cos(u_1, x_1)|."""
    groups: dict[tuple, list[dict]] = {}
    for inst in instances:
        groups.setdefault((inst.get("d_model"), inst.get("interference_target")), []).append(inst)
    rows = []
    for (d, target), members in groups.items():
        pred = [m["theorem1"]["cos_u1_prediction"] for m in members]
        raw = [m["theorem1"]["cos_u1_raw"] for m in members]
        reached = [m["interference"] for m in members if m.get("interference") is not None]
        rows.append(
            {
                "d_model": d,
                "interference_target": target,
                "n_seeds": len(members),
                "interference_mean": sum(reached) / len(reached) if reached else None,
                "cos_u1_prediction_mean": sum(pred) / len(pred),
                "cos_u1_prediction_worst": min(pred),
                "cos_u1_raw_mean": sum(raw) / len(raw),
                "cos_u1_raw_worst": min(raw),
            }
        )
    return rows
