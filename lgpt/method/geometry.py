"""
Geometry metrics, as pure functions on tensors (eval_geometry.py collects the inputs and writes reports).

Probe matrices are row-aligned: row i of X (N×d, the reference) and of Y (N×m, after the transform)
describe the same token, position and layer. Pairwise metrics run over all pairs i < j in row chunks,
so memory stays O(chunk·N) even for N = 4096 probes; rank statistics use a seeded sample of pairs.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

PAIR_BLOCK = 256  # probe rows per block of the pairwise statistics (AE, HC): a block holds PAIR_BLOCK × n cosines


def _unit(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x.double(), dim=1, eps=1e-12)


def _pair_chunks(X: torch.Tensor, Y: torch.Tensor, chunk: int):
    """Yield (cos_X, cos_Y) for pairs (i, j), i < j, one block of rows i at a time."""
    Xu, Yu = _unit(X), _unit(Y)
    n = len(Xu)
    for start in range(0, n - 1, chunk):
        stop = min(start + chunk, n - 1)
        cx = Xu[start:stop] @ Xu.T
        cy = Yu[start:stop] @ Yu.T
        rows = torch.arange(start, stop, device=Xu.device)[:, None]
        mask = torch.arange(n, device=Xu.device)[None, :] > rows  # j > i
        yield cx[mask].clamp(-1, 1), cy[mask].clamp(-1, 1)


def angular_error(X: torch.Tensor, Y: torch.Tensor, chunk: int = PAIR_BLOCK) -> float:
    """AE = mean over pairs i<j of |∠(x_i, x_j) − ∠(y_i, y_j)|, in radians (∠ = arccos of the cosine)."""
    total, count = 0.0, 0
    for cx, cy in _pair_chunks(X, Y, chunk):
        total += (torch.arccos(cx) - torch.arccos(cy)).abs().sum().item()
        count += cx.numel()
    return total / max(count, 1)


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Average ranks (ties share the mean rank), as scipy.stats.rankdata."""
    order = torch.argsort(x)
    sorted_x = x[order]
    ranks = torch.empty_like(x, dtype=torch.float64)
    ranks[order] = torch.arange(1, len(x) + 1, dtype=torch.float64, device=x.device)
    _, inverse, counts = torch.unique_consecutive(sorted_x, return_inverse=True, return_counts=True)
    if len(counts) < len(x):  # ties: replace by the group's mean rank
        sums = torch.zeros(len(counts), dtype=torch.float64, device=x.device).index_add_(0, inverse, ranks[order])
        ranks[order] = (sums / counts)[inverse]
    return ranks


def pair_cosines(U: torch.Tensor, i: torch.Tensor, j: torch.Tensor, chunk: int = 16384) -> torch.Tensor:
    """cos(u_i, u_j) for index pairs, in chunks (U has unit rows), so memory stays O(chunk·d)."""
    return torch.cat([(U[i[k:k + chunk]] * U[j[k:k + chunk]]).sum(1) for k in range(0, len(i), chunk)])


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    denom = (a.norm() * b.norm()).item()
    return (a @ b).item() / denom if denom > 0 else float("nan")


def hyperspherical_concordance(X: torch.Tensor, Y: torch.Tensor, chunk: int = PAIR_BLOCK, spearman_pairs: int = 200_000,
                               seed: int = 0) -> dict:
    """HC: Pearson correlation, over all pairs i<j, of cos(x_i, x_j) against cos(y_i, y_j) (from streamed
    sums), and Spearman's rank correlation on a seeded sample of ``spearman_pairs`` pairs."""
    s = torch.zeros(5, dtype=torch.float64, device=X.device)  # Σa, Σb, Σa², Σb², Σab
    n = 0
    for cx, cy in _pair_chunks(X, Y, chunk):
        s += torch.stack([cx.sum(), cy.sum(), (cx * cx).sum(), (cy * cy).sum(), (cx * cy).sum()])
        n += cx.numel()
    sa, sb, saa, sbb, sab = s.tolist()
    cov = sab / n - sa * sb / n**2
    var_a, var_b = saa / n - (sa / n) ** 2, sbb / n - (sb / n) ** 2
    hc = cov / math.sqrt(var_a * var_b) if var_a > 0 and var_b > 0 else float("nan")
    i, j = sample_pairs(len(X), spearman_pairs, seed)
    ca, cb = pair_cosines(_unit(X), i, j), pair_cosines(_unit(Y), i, j)
    return {"pearson": hc, "spearman": pearson(_ranks(ca), _ranks(cb)), "pairs": n}


def sample_pairs(n: int, count: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` random pairs (i, j) with i ≠ j (all pairs i < j when there are fewer)."""
    total = n * (n - 1) // 2
    if total <= count:
        i, j = torch.triu_indices(n, n, offset=1)
        return i, j
    g = torch.Generator().manual_seed(seed)
    i = torch.randint(0, n, (count,), generator=g)
    j = (i + torch.randint(1, n, (count,), generator=g)) % n
    return i, j


def feature_alignment(W: torch.Tensor, T: torch.Tensor, T_pinv: torch.Tensor) -> float:
    """FA = mean_k cos(w_k, T⁺·T·w_k): how much of each feature direction w_k (a row of W, in the
    reference space) survives the round trip through the new space. (w_k and T·w_k live in spaces of
    different dimension, so the comparison is made after mapping back with T⁺.) For any full-rank T with
    m ≥ d, T⁺T = I and FA ≡ 1: it measures only shrinking (see ``reader_alignment``)."""
    W = W.double()
    round_trip = W @ T.to(W).T @ T_pinv.to(W).T  # T comes from a record (host): meet W where it is
    return F.cosine_similarity(W, round_trip, dim=1).mean().item()


def principal_directions(states: list[torch.Tensor], k: int) -> torch.Tensor:
    """The top-k principal directions (rows, largest variance first) of all rows of ``states`` stacked, from their
    d×d covariance accumulated one tensor at a time and ``eigh``: the right singular vectors of the centred stack
    (up to sign), without forming it — for GPT-2's probes an SVD of the (13·65536 × 768) float64 stack took
    most of eval_geometry's 31 GiB on an H100."""
    d = states[0].shape[-1]
    total = torch.zeros(d, dtype=torch.float64, device=states[0].device)
    moment = torch.zeros(d, d, dtype=torch.float64, device=states[0].device)
    count = 0
    for h in states:
        x = h.reshape(-1, d).double()
        total += x.sum(0)
        moment += x.T @ x
        count += len(x)
    mean = total / count
    _, vectors = torch.linalg.eigh(moment / count - torch.outer(mean, mean))  # ascending eigenvalues
    return vectors[:, -k:].flip(-1).T


def reader_alignment(W_ref: torch.Tensor, W_new: torch.Tensor, T: torch.Tensor) -> float:
    """FA_readers = mean_k cos(w'_k, T·w_k): does the transformed model read its residual stream along the
    images T·w_k of the original readers' directions (rows w_k of W_ref, d wide; w'_k the same rows of the new
    model, m wide)? Unlike FA, which is identically 1 for every full-rank T at m ≥ d, this measures something
    there: a Gaussian T with readers W·T⁺ gives (T⁺)ᵀw ≠ T·w, and finetuning moves readers away."""
    mapped = W_ref.double() @ T.to(W_ref.device, torch.float64).T
    return F.cosine_similarity(W_new.double(), mapped, dim=1).mean().item()


def excess_kurtosis(x: torch.Tensor) -> float:
    """E[(x − μ)⁴] / σ⁴ − 3 over all entries (0 for a Gaussian; large for outlier-heavy weights)."""
    x = x.double().flatten()
    centred = x - x.mean()
    var = centred.pow(2).mean()
    return (centred.pow(4).mean() / var.pow(2) - 3).item() if var > 0 else float("nan")


def rtn_quantize(W: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Symmetric per-output-channel round-to-nearest: scale_r = max|W_r| / (2^(b−1) − 1)."""
    qmax = 2 ** (bits - 1) - 1
    scale = W.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / qmax
    return (W / scale).round().clamp(-qmax, qmax) * scale


def rtn_error(W: torch.Tensor, bits: int = 8) -> float:
    """Relative Frobenius error ‖W − Q(W)‖ / ‖W‖ of per-channel round-to-nearest quantization."""
    W = W.double()
    return ((W - rtn_quantize(W, bits)).norm() / W.norm()).item()


def jl_distortion(X: torch.Tensor, T: torch.Tensor, pairs: int = 200_000, seed: int = 0) -> dict:
    """Empirical ε of the map T on the probes: |‖Tu − Tv‖² / ‖u − v‖² − 1| over sampled pairs."""
    X = X.double()
    T = T.to(X)
    i, j = sample_pairs(len(X), pairs, seed)
    parts = []
    for k in range(0, len(i), 16384):  # chunks keep memory O(chunk·d)
        diff = X[i[k:k + 16384]] - X[j[k:k + 16384]]
        squared = diff.pow(2).sum(1)
        keep = squared > 1e-24
        parts.append(((diff[keep] @ T.T).pow(2).sum(1) / squared[keep] - 1).abs())
    eps = torch.cat(parts)
    q = torch.quantile(eps, torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64, device=eps.device)).tolist()
    return {"max": eps.max().item(), "median": q[0], "q90": q[1], "q99": q[2], "pairs": len(eps)}


def jl_epsilon_bound(n_points: int, m: int, delta: float = 0.05) -> float | None:
    """The ε the JL lemma guarantees at width m for N points with probability 1 − δ: the root in (0, 1)
    of (ε²/2 − ε³/3)·m = 4·ln N + 2·ln(1/δ) (bisection); None when even ε → 1 is not guaranteed."""
    need = 4 * math.log(max(n_points, 2)) + 2 * math.log(1 / delta)
    f = lambda e: (e**2 / 2 - e**3 / 3) * m - need
    if f(1.0) < 0:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return hi


def intrinsic_dimension(H: torch.Tensor, threshold: float = 0.95) -> int:
    """The number of principal components (of the centred H) that explain ``threshold`` of its variance."""
    H = H.double() - H.double().mean(0)
    var = torch.linalg.svdvals(H).pow(2)
    cumulative = var.cumsum(0) / var.sum()
    return int((cumulative < threshold).sum().item()) + 1


def twonn_dimension(X: torch.Tensor, discard: float = 0.1, chunk: int = 1024) -> float:
    """TwoNN intrinsic dimension (Facco et al. 2017): with r1, r2 each point's two nearest-neighbour distances,
    μ = r2/r1 is Pareto with exponent d, so −log(1 − F(μ)) = d·log μ; d is the slope through the origin of that
    line over the empirical F, after discarding the largest ``discard`` fraction of μ (noise-dominated)."""
    X = X.double()
    n = len(X)
    nearest = []
    for start in range(0, n, chunk):
        dist = torch.cdist(X[start:start + chunk], X)
        own = torch.arange(len(dist), device=X.device)
        dist[own, own + start] = float("inf")  # not itself
        nearest.append(dist.topk(2, largest=False).values)
    r = torch.cat(nearest)
    keep = r[:, 0] > 0  # duplicates have no defined ratio
    mu = (r[keep, 1] / r[keep, 0]).sort().values
    count = int(len(mu) * (1 - discard))
    F_emp = torch.arange(1, len(mu) + 1, dtype=torch.float64, device=mu.device) / len(mu)
    x, y = mu[:count].log(), -torch.log1p(-F_emp[:count])
    return ((x * y).sum() / (x * x).sum()).item()


def head_circuits(c_attn: torch.Tensor, c_proj: torch.Tensor, gain: torch.Tensor | None, n_head: int,
                  head_dim: int, n_kv_head: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per (query) head, the bilinear QK form and the OV map in residual space, on unit-RMS norm outputs:
    W_QK = n·(W_Q·G)ᵀ(W_K·G) and W_OV = √n·W_O·W_V·G, with G = diag(gain) the input norm's gain and n the width
    (so the forms of a model and of its exact port to another width have equal spectra). With grouped-query
    attention, query head h reads key/value head h // (n_head / n_kv_head)."""
    n = c_attn.shape[1]
    G = torch.ones(n, dtype=torch.float64, device=c_attn.device) if gain is None else gain.double().expand(n)
    kv_heads = n_kv_head or n_head
    Wq, Wk, Wv = (w.double() * G for w in c_attn.split((n_head * head_dim, kv_heads * head_dim, kv_heads * head_dim)))
    Wo = c_proj.double()
    group = n_head // kv_heads
    out = []
    for h in range(n_head):
        rows = slice(h * head_dim, (h + 1) * head_dim)
        kv = slice((h // group) * head_dim, (h // group + 1) * head_dim)
        out.append((n * Wq[rows].T @ Wk[kv], math.sqrt(n) * Wo[:, rows] @ Wv[kv]))
    return out


def decoded_tokens(vector: torch.Tensor, E: torch.Tensor, k: int) -> list[int]:
    """The k tokens whose embeddings have the largest |e·v| (a singular vector's sign is arbitrary)."""
    return (E.double() @ vector.double()).abs().topk(k).indices.tolist()


def circuit_stability(ref: tuple[torch.Tensor, torch.Tensor], new: tuple[torch.Tensor, torch.Tensor],
                      E_ref: torch.Tensor, E_new: torch.Tensor, rank: int, k: int = 10) -> dict:
    """How much of one head's circuits survives a transform: for W_QK and W_OV, the relative distance of the top
    ``rank`` singular values, and the overlap (fraction of k) of the top tokens decoded from the top singular
    vectors (QK: query and key sides; OV: input side; through each model's own embeddings)."""
    out = {}
    for name, A, B in (("qk", ref[0], new[0]), ("ov", ref[1], new[1])):
        Ua, Sa, Vha = torch.linalg.svd(A)
        Ub, Sb, Vhb = torch.linalg.svd(B)
        out[f"{name}_spectrum_distance"] = ((Sa[:rank] - Sb[:rank]).norm() / Sa[:rank].norm().clamp_min(1e-30)).item()
        sides = [(Ua[:, 0], Ub[:, 0]), (Vha[0], Vhb[0])] if name == "qk" else [(Vha[0], Vhb[0])]
        overlaps = [len(set(decoded_tokens(a, E_ref, k)) & set(decoded_tokens(b, E_new, k))) / k for a, b in sides]
        out[f"{name}_token_overlap"] = sum(overlaps) / len(overlaps)
        out[f"{name}_top_tokens"] = {"ref": decoded_tokens(sides[0][0], E_ref, k),
                                     "new": decoded_tokens(sides[0][1], E_new, k)}
    return out


def similarity_scores(h: torch.Tensor, E: torch.Tensor, kind: str) -> torch.Tensor:
    """Similarity of hidden states h (N×d) to every token embedding E (V×d): 'neg_euclidean' −‖h−e‖,
    'inv_euclidean' 1/‖h−e‖, 'cosine', 'dot'."""
    h, E = h.double(), E.double()
    if kind == "dot":
        return h @ E.T
    if kind == "cosine":
        return _unit(h) @ _unit(E).T
    dist = torch.cdist(h, E)
    if kind == "neg_euclidean":
        return -dist
    if kind == "inv_euclidean":
        return 1.0 / dist.clamp_min(1e-12)
    raise ValueError(f"unknown similarity {kind!r}")


def ndcg_at_k(scores: torch.Tensor, relevance: torch.Tensor, k: int) -> float:
    """Mean over rows of DCG@k(ranking by ``scores``) / DCG@k(ideal ranking), with graded relevance
    (here: the model's next-token probabilities), gain 2^rel − 1 and discount 1/log2(rank + 1) (thesis eq. 5.7)."""
    k = min(k, scores.shape[1])
    discount = 1.0 / torch.log2(torch.arange(2, k + 2, dtype=torch.float64, device=scores.device))
    gain = torch.exp2(relevance.double()) - 1
    top = scores.topk(k, dim=1).indices
    dcg = (gain.gather(1, top) * discount).sum(1)
    ideal = (gain.topk(k, dim=1).values * discount).sum(1)
    return (dcg / ideal.clamp_min(1e-300)).mean().item()


def kl_and_agreement(logits_ref: torch.Tensor, logits_new: torch.Tensor) -> dict:
    """Mean KL(p_ref ‖ p_new) of next-token distributions (nats) and top-1 agreement, over positions."""
    lp = F.log_softmax(logits_ref.double().flatten(0, -2), dim=-1)
    lq = F.log_softmax(logits_new.double().flatten(0, -2), dim=-1)
    kl = (lp.exp() * (lp - lq)).sum(-1).mean().item()
    agree = (lp.argmax(-1) == lq.argmax(-1)).double().mean().item()
    return {"kl": kl, "top1_agreement": agree}


def energy_outside_range(H: torch.Tensor, T: torch.Tensor) -> float:
    """1 − ‖H·T·Tᵀ‖² / ‖H‖²: the share of the rows' energy (H: N×m) outside range(T), the directions a model grown
    by T (m×d, orthonormal columns) did not have before; 0 right after an exact growth."""
    H, T = H.double(), T.double().to(H.device)
    return 1.0 - ((H @ T).pow(2).sum() / H.pow(2).sum()).item()


def energy_outside_top(H: torch.Tensor, k: int) -> float:
    """The share of the rows' energy (H: N×m) outside the best k-dimensional subspace (the top-k eigenvectors of
    HᵀH): the least any map T with k orthonormal columns can leave outside range(T)."""
    eigenvalues = torch.linalg.eigvalsh(H.double().T @ H.double())  # ascending
    return 1.0 - (eigenvalues[-k:].sum() / eigenvalues.sum()).item()
