"""
What T is: the width map T (m×d) and its pseudo-inverse T⁺ (d×m), for every kind.

- Random (Johnson–Lindenstrauss) maps: ``gaussian`` (the paper's Algorithm 1), ``rademacher``, ``sparse``
  (Achlioptas), ``srht`` (subsampled randomized Hadamard); ``jl_min_width`` is the bound they come with.
- ``orthogonal`` (Haar), ``hadamard`` (a randomized Hadamard rotation at m = d, QuaRot's) and ``truncate`` (the
  first m coordinates).
- ``pca``: the top-m directions of the residual stream's second moment, from ``collect_calibration``.
- Adjustments of a drawn map: ``mean_preserving`` (LayerNorm kept at m ≥ d), ``symmetry_breaking_pinv``
  (growth), ``read_map_file`` (a user's own T); ``starting_map`` picks among them. ``refit.learn_map`` learns one.

Nothing here touches a weight: porting.py and paper_rules.py do, through ``PortMaps``.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from lgpt.plumbing.dataset import BatchLoader, calibration_seed
from lgpt.plumbing.errors import TransformError
from lgpt.plumbing.logger import progress
from model import GPT, GPTConfig

KINDS = ("gaussian", "rademacher", "sparse", "srht", "orthogonal", "hadamard", "pca", "truncate", "split")
JL_KINDS = ("gaussian", "rademacher", "sparse", "srht")  # random maps: the JL bound is what they guarantee


@dataclass(frozen=True)
class Coordinates:
    """Residual coordinates a PCA map treats apart (``--pca_exclude``, ``--pca_keep``): ``exclude`` kept out of
    range(T) (‖T·e_i‖ = 0), ``keep`` kept in it as rows of their own (T has the row e_iᵀ, so T·D = D′·T on them
    for any diagonal D: the map commutes with a per-dimension gain there)."""
    exclude: tuple[int, ...] = ()
    keep: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.exclude or self.keep)

    def normalized(self) -> Coordinates:
        """Each set sorted and de-duplicated: one form for every record."""
        return Coordinates(tuple(sorted(set(self.exclude))), tuple(sorted(set(self.keep))))


NO_COORDINATES = Coordinates()  # every coordinate treated alike (the default)


@dataclass
class Calibration:
    """The uncentred second moment M = (1/N)·Σ x xᵀ of N calibration vectors (float64)."""
    second_moment: torch.Tensor
    count: int

    @classmethod
    def from_points(cls, points: torch.Tensor) -> Calibration:
        x = points.double()
        return cls(x.T @ x / len(x), len(x))


def jl_min_width(n_points: int, eps: float, delta: float) -> int:
    """Smallest m for which a Gaussian JL map keeps all N(N−1)/2 pairwise squared distances within
    1 ± ε with probability ≥ 1 − δ (Dasgupta–Gupta tail and a union bound):
        m ≥ (4·ln N + 2·ln(1/δ)) / (ε²/2 − ε³/3)."""
    return math.ceil((4 * math.log(max(n_points, 2)) + 2 * math.log(1 / delta)) / (eps**2 / 2 - eps**3 / 3))


def pseudo_inverse(T: torch.Tensor) -> torch.Tensor:
    """Moore–Penrose T⁺ of a full-rank T (m×d), in float64 through a Cholesky factor:
    T⁺ = Tᵀ(TTᵀ)⁻¹ when m ≤ d (a right inverse), (TᵀT)⁻¹Tᵀ when m > d (a left inverse)."""
    T = T.double()
    m, d = T.shape
    gram = T @ T.T if m <= d else T.T @ T
    factor, info = torch.linalg.cholesky_ex(gram)
    if info.item() != 0:
        raise TransformError(f"T ({m}×{d}) is rank-deficient; use another seed or kind")
    if m <= d:
        return torch.cholesky_solve(T, factor).T  # Tᵀ (TTᵀ)⁻¹
    return torch.cholesky_solve(T.T, factor)  # (TᵀT)⁻¹ Tᵀ


def hadamard_transform(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal fast Walsh–Hadamard transform along the last axis (its length a power of two), O(n log n)."""
    n = x.shape[-1]
    if n & (n - 1):
        raise TransformError(f"the Hadamard transform needs a power-of-two length, got {n}")
    y = x.clone()
    h = 1
    while h < n:
        y = y.view(*x.shape[:-1], n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2).view(*x.shape[:-1], n)
        h *= 2
    return y / math.sqrt(n)


def _is_prime(q: int) -> bool:
    return q > 1 and all(q % p for p in range(2, math.isqrt(q) + 1))


def _paley_conference(q: int) -> torch.Tensor:
    """The (q+1)×(q+1) Paley conference matrix C = [[0, 1ᵀ], [±1, Q]] with Q_ij = χ(j − i), χ the quadratic
    character mod the prime q: skew (C = −Cᵀ) for q ≡ 3 mod 4, symmetric for q ≡ 1 mod 4; C·Cᵀ = q·I."""
    squares = {(i * i) % q for i in range(1, q)}
    chi = torch.tensor([0.0] + [1.0 if r in squares else -1.0 for r in range(1, q)], dtype=torch.float64)
    index = torch.arange(q)
    C = torch.zeros(q + 1, q + 1, dtype=torch.float64)
    C[0, 1:] = 1.0
    C[1:, 0] = -1.0 if q % 4 == 3 else 1.0
    C[1:, 1:] = chi[(index[None, :] - index[:, None]) % q]
    return C


def hadamard_matrix(n: int) -> torch.Tensor:
    """A Hadamard matrix of order n (entries ±1, H·Hᵀ = n·I): Sylvester's doubling of a core of order b, n = 2^k·b,
    the core being [1], Paley I (b = q + 1, q prime ≡ 3 mod 4: H = I + C) or Paley II (b = 2(q + 1), q prime ≡ 1
    mod 4: H = C ⊗ [[1, 1], [1, −1]] + I ⊗ [[1, −1], [−1, −1]]). That covers the usual model widths (576 = 16·36,
    640 = 32·20, 768 = 64·12, 960 = 32·30, 2^k), not every order (52 and 100 need other constructions)."""
    for k in range(n.bit_length(), -1, -1):
        b, rest = divmod(n, 1 << k)
        if rest:
            continue
        if b == 1:
            core = torch.ones(1, 1, dtype=torch.float64)
        elif _is_prime(b - 1) and (b - 1) % 4 == 3:
            core = torch.eye(b, dtype=torch.float64) + _paley_conference(b - 1)
        elif b % 2 == 0 and _is_prime(b // 2 - 1) and (b // 2 - 1) % 4 == 1:
            C = _paley_conference(b // 2 - 1)
            core = (torch.kron(C, torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64))
                    + torch.kron(torch.eye(b // 2, dtype=torch.float64),
                                 torch.tensor([[1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)))
        else:
            continue
        H = core
        for _ in range(k):
            H = torch.cat((torch.cat((H, H), 1), torch.cat((H, -H), 1)), 0)
        return H
    raise TransformError(f"no Hadamard matrix of order {n} here (orders 2^k·b with b = 1, q + 1 for a prime q ≡ 3 "
                         "mod 4, or 2(q + 1) for a prime q ≡ 1 mod 4); use kind='orthogonal'")


def _srht(d: int, m: int, g: torch.Generator, max_tries: int = 100) -> torch.Tensor:
    """√(n/m)·S·H·D·P with n = 2^k ≥ max(d, m): P places the d coordinates at random positions among n,
    D flips random signs, H is the orthonormal Hadamard transform, S keeps m of the n rows. A row subset
    of a Hadamard matrix can be singular when m is close to d, so such draws are redrawn (seeded)."""
    n = 1 << (max(d, m) - 1).bit_length()
    for _ in range(max_tries):
        signs = torch.randint(0, 2, (d,), generator=g).double() * 2 - 1
        slots = torch.randperm(n, generator=g)[:d]
        DP = torch.zeros(d, n, dtype=torch.float64)
        DP[torch.arange(d), slots] = signs  # row i = D·P·e_i
        HDP = hadamard_transform(DP).T  # (n, d): columns H·D·P·e_i
        rows = torch.randperm(n, generator=g)[:m].sort().values
        T = math.sqrt(n / m) * HDP[rows]
        if torch.linalg.matrix_rank(T).item() == min(m, d):
            return T
    raise TransformError(f"no full-rank SRHT of shape {m}×{d} in {max_tries} draws; use kind='orthogonal'")


def make_projection(kind: str, d: int, m: int, seed: int = 0,
                    calibration: Calibration | torch.Tensor | None = None,
                    damping: float = 1e-6, coordinates: Coordinates = NO_COORDINATES,
                    gains: torch.Tensor | None = None, groups: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, T⁺) in float64 on the CPU, T of shape (m, d), for every projection kind (a seed gives the same T on every
    machine; ``transform_model`` moves it to the model's device, once):

    gaussian    T_ij ~ N(0, 1/m) (the paper's Algorithm 1)
    rademacher  T_ij = ±1/√m
    sparse      Achlioptas: √(3/m)·{+1 w.p. 1/6, 0 w.p. 2/3, −1 w.p. 1/6}
    srht        √(n/m)·S·H·D·P: pad d to n = 2^k ≥ max(d, m), random signs D, orthonormal Hadamard H,
                m rows S drawn without replacement (orthonormal rows or columns when m or d equals n)
    orthogonal  Haar-random orthonormal rows (m ≤ d) or columns (m ≥ d), from the QR of a Gaussian
    hadamard    H·D/√d at m = d: a Hadamard matrix of order d (``hadamard_matrix``), random signs D (QuaRot's
                rotation; spreads every coordinate over all d, so no single one carries an outlier)
    pca         the top-m eigenvectors of the calibration set's uncentred second moment (m ≤ d); with
                ``coordinates`` some kept out of range(T) or in it as rows of their own (``pca_map``)
    truncate    the first m coordinates
    split       growth (d < m ≤ 3d/2) by m − d coordinate pairs, each mixed into three rows (``split_map``, which
                reads ``gains``, the peri-LN output gains): orthonormal columns, exact for per-dimension gains
    """
    if m <= 0 or d <= 0:
        raise TransformError(f"widths must be positive, got d={d}, m={m}")
    check_coordinates(coordinates, d, m, kind)
    g = torch.Generator().manual_seed(seed)
    if kind == "gaussian":
        T = torch.randn(m, d, generator=g, dtype=torch.float64) / math.sqrt(m)
    elif kind == "rademacher":
        T = (torch.randint(0, 2, (m, d), generator=g).double() * 2 - 1) / math.sqrt(m)
    elif kind == "sparse":
        u = torch.rand(m, d, generator=g, dtype=torch.float64)
        T = math.sqrt(3 / m) * ((u < 1 / 6).double() - (u > 5 / 6).double())
    elif kind == "srht":
        T = _srht(d, m, g)
    elif kind == "orthogonal":
        A = torch.randn(max(m, d), min(m, d), generator=g, dtype=torch.float64)
        Q, R = torch.linalg.qr(A)
        Q = Q * torch.sign(torch.diagonal(R))  # Haar measure: fix the signs of the QR factor
        T = Q if m >= d else Q.T
        return T, T.T.clone()
    elif kind == "hadamard":
        if m != d:
            raise TransformError(f"kind='hadamard' rotates at the same width (m = d = {d}), got m={m}; "
                                 "use kind='srht' to change the width")
        signs = torch.randint(0, 2, (d,), generator=g).double() * 2 - 1
        T = hadamard_matrix(d) * signs / math.sqrt(d)
        return T, T.T.clone()
    elif kind == "truncate":
        T = torch.eye(m, d, dtype=torch.float64)
        return T, T.T.clone()
    elif kind == "pca":
        labels = gain_groups(gains, groups) if groups > 1 and gains is not None else None
        T = pca_map(calibration, d, m, damping, coordinates, labels)
        return T, T.T.clone()
    elif kind == "split":
        T = split_map(d, m, gains, seed)
        return T, T.T.clone()
    else:
        raise TransformError(f"kind={kind!r} is not one of {KINDS}")
    return T, pseudo_inverse(T)


def split_map(d: int, m: int, gains: torch.Tensor | None = None, seed: int = 0) -> torch.Tensor:
    """A growth map that mixes coordinates and still carries per-dimension gains exactly (``porting.length_fit``
    has residual 0 for it). r = m − d coordinate pairs (j, k), drawn by ``seed``, each become three rows p, q, u:

        T[p] = (e_j + s·e_k)/√2,   T[q] = (e_j − s·e_k)/√2,   T[u] = t·e_k,   t = √(1 − s²),

    and every other coordinate keeps a row e_i. The columns are orthonormal (TᵀT = I) and rows p, q mix two
    coordinates, so T is no coordinate map. A diagonal a with Tᵀ·diag(a)·T = diag(b) exists for every b:
    a_p = a_q = b_j, a_u = (b_k − s²·b_j)/t². A peri-LN output norm needs a = 1/γ'² > 0, i.e. s² < b_k/b_j =
    γ_j²/γ_k² for every output gain γ (``gains``, one row per norm): s² is half the smallest such ratio (at most
    1/2), and each pair is ordered to make it largest; the pairs are those of closest gain profiles
    (``split_pairs``), so s stays as large as the gains allow. Without gains (pre-LN) s = 1/√2. Needs d < m ≤ 3d/2: a
    pair gives one new row. Why nothing denser works: ``docs/transform.md`` (exact growth of a peri-LN model)."""
    r = m - d
    if not 0 < r <= d // 2:
        raise TransformError(f"kind='split' grows by pairs of coordinates, one new row each: it needs "
                             f"d < m ≤ d + d//2 = {d + d // 2} (d={d}), got m={m}; grow in two steps, or use "
                             "kind='orthogonal' (approximate for peri-LN) / zero-padding")
    squares = None if gains is None else gains.detach().double().cpu().reshape(-1, d).pow(2)
    if squares is not None:
        squares = squares[squares.amax(1) > 0]  # a norm whose gains are all 0 writes nothing: it sets no s
        squares = squares if len(squares) else None
    pairs = split_pairs(squares, d, r, seed)
    paired = {c for pair in pairs for c in pair}
    T = torch.zeros(m, d, dtype=torch.float64)
    row = 0
    for i in range(d):  # the unpaired coordinates keep their rows, in order
        if i not in paired:
            T[row, i] = 1.0
            row += 1
    for j, k in pairs:
        s2 = 0.5
        if squares is not None:
            forward = float((squares[:, j] / squares[:, k]).min())
            backward = float((squares[:, k] / squares[:, j]).min())
            if backward > forward:
                j, k, forward = k, j, backward
            s2 = min(0.5, forward / 2)
        s, t = math.sqrt(s2), math.sqrt(1 - s2)
        T[row, j], T[row, k] = 1 / math.sqrt(2), s / math.sqrt(2)
        T[row + 1, j], T[row + 1, k] = 1 / math.sqrt(2), -s / math.sqrt(2)
        T[row + 2, k] = t
        row += 3
    return T


def split_pairs(squares: torch.Tensor | None, d: int, r: int, seed: int) -> list[tuple[int, int]]:
    """``split_map``'s r coordinate pairs. Without gains: random (``seed``). With the squared output gains (one row
    per norm): the r disjoint pairs whose gain profiles are closest, max_ℓ |log γ_jℓ² − log γ_kℓ²| smallest first —
    the bound that sets s — among coordinates whose gains are all non-zero (a zero gain stays in a row of its own)."""
    if squares is None:
        order = torch.randperm(d, generator=torch.Generator().manual_seed(seed)).tolist()
        return [(order[2 * i], order[2 * i + 1]) for i in range(r)]
    usable = torch.nonzero((squares > 1e-12 * squares.amax(1, keepdim=True)).all(0)).flatten()
    if len(usable) < 2 * r:
        raise TransformError(f"kind='split' needs {2 * r} coordinates with non-zero output gains in every norm; "
                             f"this model has {len(usable)}: grow by less")
    logs = squares[:, usable].log().T  # one profile per usable coordinate
    distance = torch.cdist(logs, logs, p=float("inf"))
    upper = torch.ones_like(distance, dtype=torch.bool).triu(1)  # each pair once; a zero distance (equal gains) first
    pairs, taken = [], torch.zeros(len(usable), dtype=torch.bool)
    for flat in torch.argsort(distance.where(upper, torch.tensor(float("inf"), dtype=distance.dtype)).flatten(),
                              stable=True):
        a, b = divmod(int(flat), len(usable))
        if a < b and not taken[a] and not taken[b]:
            pairs.append((int(usable[a]), int(usable[b])))
            taken[a] = taken[b] = True
            if len(pairs) == r:
                break
    return pairs


def gain_groups(gains: torch.Tensor, count: int, iterations: int = 50) -> torch.Tensor:
    """A group label per coordinate: k-means (``count`` groups) of the coordinates' output-gain profiles on a log
    scale, log|γ_ℓj| over the norms ℓ; started from the quantiles of each profile's mean, so it is deterministic.
    Within a group the gains are near equal, so a map whose rows stay inside groups nearly commutes with every
    diag(γ_ℓ) (``pca_map``'s ``groups``)."""
    logs = gains.detach().double().cpu().abs().clamp_min(1e-12).log().T  # d × norms
    order = torch.argsort(logs.mean(1), stable=True)
    centres = torch.stack([logs[chunk].mean(0) for chunk in torch.tensor_split(order, count)])
    labels = torch.zeros(len(logs), dtype=torch.long)
    for _ in range(iterations):
        labels = torch.cdist(logs, centres).argmin(1)
        moved = torch.stack([logs[labels == g].mean(0) if bool((labels == g).any()) else centres[g]
                             for g in range(count)])
        if torch.allclose(moved, centres):
            break
        centres = moved
    return labels


def pca_map(calibration: Calibration | torch.Tensor | None, d: int, m: int, damping: float = 1e-6,
            coordinates: Coordinates = NO_COORDINATES, groups: torch.Tensor | None = None) -> torch.Tensor:
    """T = the top-m eigenvectors (rows, largest first) of M_δ = M + δ·tr(M)/d·I, M the calibration's uncentred
    second moment. With ``coordinates`` E = exclude, K = keep and Q = I − Σ_{i∈E∪K} e_i e_iᵀ: the rows e_iᵀ
    (i ∈ K) and the top m − |K| eigenvectors of Q·M_δ·Q, ordered by their variance tᵀ·M_δ·t (largest first), so
    range(T) ⟂ e_i for i ∈ E and ∋ e_i for i ∈ K; the rest is the PCA of the stream without those coordinates.
    With ``groups`` (a label per coordinate, ``gain_groups``): M's entries between groups are set to 0 before the
    eigendecomposition, so every row of T reads one group only — the top m of all the groups' own principal
    directions (``--gain_groups``: blocks of near-equal peri-LN output gain)."""
    if m > d:
        raise TransformError(f"kind='pca' shrinks or keeps the width (m ≤ d), got m={m} > d={d}; "
                             "use kind='orthogonal' to grow")
    if calibration is None:
        raise TransformError("kind='pca' needs calibration data (hidden states of the model)")
    if not isinstance(calibration, Calibration):
        calibration = Calibration.from_points(calibration)
    M = calibration.second_moment.double().cpu()  # eigh on the host: the same directions on every device
    M = M + damping * torch.trace(M) / d * torch.eye(d, dtype=torch.float64)
    check_coordinates(coordinates, d, m)
    apart = sorted(set(coordinates.exclude) | set(coordinates.keep))
    masked = M
    if groups is not None:
        masked = M * (groups[:, None] == groups[None, :]).double()
    if apart:
        inside = torch.ones(d, dtype=torch.float64)
        inside[apart] = 0
        masked = masked * inside[:, None] * inside[None, :]
        masked[apart, apart] = -1.0  # below every other eigenvalue (≥ 0), whatever the damping
    _, vectors = torch.linalg.eigh(masked)  # ascending eigenvalues
    free = m - len(coordinates.keep)
    T = vectors[:, d - free:].flip(-1).T  # top directions, largest first (none when K fills all m rows)
    if coordinates.keep:
        T = torch.cat([torch.eye(d, dtype=torch.float64)[list(coordinates.keep)], T])
        T = T[torch.argsort(torch.einsum("id,de,ie->i", T, M, T), descending=True, stable=True)]
    return T.contiguous()


def check_coordinates(coordinates: Coordinates, d: int, m: int, kind: str = "pca", given_map: bool = False) -> None:
    """Raise TransformError unless --pca_exclude / --pca_keep can apply: a PCA map drawn here (not a map file),
    every coordinate in [0, d), none both kept and excluded, m directions left outside the excluded ones and at
    least as many as are kept."""
    if not coordinates:
        return
    named = [name for name in ("exclude", "keep") if getattr(coordinates, name)]
    options = " and ".join(f"pca_{name}" for name in named)
    if kind != "pca" or given_map:
        raise TransformError(f"{options} choose{'s' if len(named) == 1 else ''} coordinates of a PCA map's range: "
                             f"use kind='pca' without a map file, or drop {options}")
    for name in named:
        outside = [i for i in getattr(coordinates, name) if not 0 <= i < d]
        if outside:
            raise TransformError(f"pca_{name} names coordinates {outside} outside this model's residual stream "
                                 f"(0 … {d - 1}); give coordinates below d={d}")
    both = sorted(set(coordinates.exclude) & set(coordinates.keep))
    if both:
        raise TransformError(f"coordinates {both} are both in pca_exclude and in pca_keep: name each in one")
    excluded, kept = len(set(coordinates.exclude)), len(set(coordinates.keep))
    if m > d - excluded:
        raise TransformError(f"pca_exclude keeps {excluded} of d={d} coordinates out of range(T), which "
                             f"leaves {d - excluded} directions for m={m}: exclude fewer or shrink more")
    if kept > m:
        raise TransformError(f"pca_keep (with tie_keep's coordinates) keeps {kept} coordinates as rows of T, more "
                             f"than its m={m} rows: keep fewer or shrink less")


def mean_preserving(T: torch.Tensor) -> torch.Tensor:
    """Householder-correct an orthonormal-column T (m×d, m ≥ d) so that T·1_d/√d = 1_m/√m. Then T maps
    mean-free vectors to mean-free vectors, so after ``fold`` every norm input stays mean-free at width m,
    where LayerNorm equals RMSNorm: the transformed model can remain a LayerNorm (GPT-2) model, exactly."""
    m, d = T.shape
    target = torch.full((m,), 1 / math.sqrt(m), dtype=T.dtype, device=T.device)
    v = T @ torch.full((d,), 1 / math.sqrt(d), dtype=T.dtype, device=T.device) - target
    if v.norm() < 1e-12:
        return T
    return T - 2 * torch.outer(v, v @ T) / (v @ v)  # (I − 2vvᵀ/‖v‖²)·T


def symmetry_breaking_pinv(T: torch.Tensor, T_pinv: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    """T⁺ + σ·R·(I − T·T⁺): readers then also see the new directions, yet on range(T), where the
    ported residual stream lives, they act as T⁺ did, so the function is unchanged (m > d)."""
    m, d = T.shape
    g = torch.Generator().manual_seed(seed + 1)  # drawn on the CPU: the same R on every device
    R = (torch.randn(d, m, generator=g, dtype=torch.float64) / math.sqrt(m)).to(T.device)
    return T_pinv + sigma * R @ (torch.eye(m, dtype=torch.float64, device=T.device) - T @ T_pinv)


def read_map_file(path: str, m: int, d: int) -> torch.Tensor:
    """A map T saved with torch.save: one finite floating m×d tensor (or a one-tensor dict), checked before work."""
    if not os.path.isfile(path):
        raise TransformError(f"map_file '{path}' does not exist; give a file written by torch.save(T) with T of shape "
                             f"(width, d) = ({m}, {d})")
    try:
        T = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise TransformError(f"map_file '{path}' is not a readable torch.save file ({e.__class__.__name__}); give "
                             f"torch.save(T) of a ({m}, {d}) tensor") from None
    if isinstance(T, dict) and len(T) == 1:
        T = next(iter(T.values()))
    if not torch.is_tensor(T) or not T.is_floating_point() or tuple(T.shape) != (m, d):
        what = f"a tensor of shape {tuple(T.shape)}, {T.dtype}" if torch.is_tensor(T) else f"a {type(T).__name__}"
        raise TransformError(f"map_file '{path}' holds {what}; it must be a floating ({m}, {d}) tensor: "
                             f"--width={m} and this model's d={d}")
    if not torch.isfinite(T).all() or torch.linalg.matrix_rank(T.double()) < min(m, d):
        raise TransformError(f"map_file '{path}' holds a map with non-finite entries or rank below {min(m, d)}; T "
                             "must be finite and of full rank")
    return T


def starting_map(given_map: torch.Tensor | None, kind: str, d: int, m: int, seed: int,
                 calibration: Calibration | None, damping: float, keep_layernorm: bool,
                 coordinates: Coordinates = NO_COORDINATES, gains: torch.Tensor | None = None,
                 groups: int = 0) -> tuple[torch.Tensor, ...]:
    """(T, T⁺) before any learning: a given map as it is, else the one ``kind`` samples; mean-preserving when the
    model keeps its LayerNorm."""
    if given_map is not None:
        T = given_map.detach().cpu().double()
        T_pinv = pseudo_inverse(T)
    else:
        T, T_pinv = make_projection(kind, d, m, seed, calibration, damping, coordinates, gains, groups)
    if keep_layernorm:
        T = mean_preserving(T)
        T_pinv = T.T.clone()
    return T, T_pinv


CALIB_WEIGHTINGS = ("unit", "raw")


def unit_second_moment(x: torch.Tensor, weighting: str = "unit") -> tuple[torch.Tensor, int]:
    """(Σ u uᵀ, N) over the rows u of ``x`` in float64: scaled to unit length (``unit``: every state counts
    alike, as the norms after it see it) or as they are (``raw``: SliceGPT's PCA of the residual stream, where
    large states — massive activations — dominate)."""
    u = x.reshape(-1, x.shape[-1]).double()
    if weighting == "unit":
        u = u / u.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return u.T @ u, len(u)


@torch.no_grad()
def collect_calibration(model: GPT, loader: BatchLoader, batches: int, seed: int = 0,
                        weighting: str = "unit", vocabulary: bool = True) -> Calibration:
    """Second moment of the calibration set: every token embedding plus the residual-stream hidden
    states of every layer (after the embedding and after each block) on ``batches`` training batches.
    Each vector is scaled to unit length first: norms are scale-invariant, so what the readers need
    is the direction of h, and unscaled late layers would otherwise dominate (``weighting='raw'`` keeps them as
    they are, for comparison with SliceGPT's PCA). ``vocabulary=False`` leaves out the rows of tokens the
    calibration text does not use (SliceGPT's: only the text's own embeddings, the first hidden state, count)."""
    model.eval()
    total, count = vocabulary_moment(model, weighting, vocabulary)
    for k in progress(range(batches), "calibrate", unit="batch"):
        x, _ = loader.get_batch("train", seed=calibration_seed(seed, k))
        for h in model(x, return_hidden=True)[2]:
            moment, n = unit_second_moment(h, weighting)
            total += moment
            count += n
    return Calibration(total / count, count)


def vocabulary_moment(model: GPT, weighting: str, vocabulary: bool) -> tuple[torch.Tensor | int, int]:
    """Every token embedding's term of the first site's moment, or (0, 0) where ``vocabulary`` is off."""
    if not vocabulary:
        return 0, 0
    return unit_second_moment(model.transformer.wte.weight, weighting)


def calibration_points(cfg: GPTConfig, loader: BatchLoader | None, batches: int, vocabulary: bool = True) -> int:
    """How many vectors ``collect_calibration`` would see (the N of the JL bound), without running the model:
    the token embeddings (unless ``vocabulary`` is off) plus n_layer + 1 hidden states per calibration token."""
    words = cfg.vocab_size if vocabulary or loader is None else 0
    if loader is None:
        return words
    return words + batches * loader.batch_size * loader.block_size * (cfg.n_layer + 1)


@dataclass
class PortMaps:
    """The maps a porting rule may use: T (m×d), T⁺ (d×m), the readers' T⁺ (T⁺ itself, or with growth
    symmetry breaking), and the width d of the source."""
    T: torch.Tensor
    T_pinv: torch.Tensor
    reader_T_pinv: torch.Tensor

    @property
    def d(self) -> int:
        return self.T.shape[1]

    @property
    def m(self) -> int:
        return self.T.shape[0]
