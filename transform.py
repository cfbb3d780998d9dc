"""
Change the residual width of a trained GPT from d to m with one linear map T (m×d) and its
pseudo-inverse T⁺ (d×m).

    python transform.py --in_dir=out-shakespeare-char --out_dir=out-m96 --width=96 --kind=pca --porting=head

Two steps, both on float64 copies of the weights:

1. ``canonicalize`` (``--norms``) rewrites the model at width d. With ``fold`` it keeps the function
   exactly: per-dimension norm gains (and LayerNorm biases) are folded into the readers that follow,
   LayerNorm becomes RMSNorm by centring every residual writer (then every norm sees mean-free
   inputs, where the two agree), and every norm is left with one scalar gain. ``drop`` and ``scalar``
   replace per-dimension gains by 1 or by their mean (approximations, as in the paper).
2. ``port_weights`` (``--porting``) applies T:
   - ``head`` (ours): only the residual axis changes. Readers W → W·T⁺, writers W → T·W,
     embeddings E → E·Tᵀ; heads, head size, attention scale, RoPE and MLP width stay as they are.
   - ``sandwich`` (the paper): additionally Q, K, V, O → T·W·T⁺, with the heads re-split to
     m / n_head dimensions (which mixes heads: the function changes even for orthogonal T at m = d).
   An RMSNorm over m coordinates of T·h equals √(m/d)·T·norm_d(h) when T has orthonormal columns
   (and ε is scaled by d/m), so every scalar gain is multiplied by √(d/m).

With orthonormal columns (TᵀT = I, m ≥ d), ``head`` porting after ``fold`` reproduces the original
logits to float32 rounding. For m < d (shrink) nothing is exact; ``pca`` keeps the top-m principal
directions of the residual stream and loses far less than a random map.
"""
from __future__ import annotations

import copy
import math
import os
import sys
import warnings
from dataclasses import asdict, dataclass

import torch

from checkpoint import CheckpointError, load_checkpoint, model_from_checkpoint, save_checkpoint
from configurator import ConfigError, load_config
from dataset import BatchLoader, DataError, checkpoint_data, evaluate_loss
from model import GPT, GPTConfig

KINDS = ("gaussian", "rademacher", "sparse", "srht", "orthogonal", "pca", "truncate")
PORTINGS = ("head", "sandwich")
NORM_MODES = ("fold", "scalar", "drop")


@dataclass
class TransformConfig:
    in_dir: str = "out-shakespeare-char"  # the checkpoint to transform
    out_dir: str = ""  # where the transformed ckpt.pt goes (required)
    width: int = 0  # the new residual width m (required)
    kind: str = "orthogonal"  # one of KINDS
    porting: str = "head"  # 'head' (ours, exact for orthogonal T with m >= d) | 'sandwich' (the paper)
    norms: str = "fold"  # 'fold' (exact) | 'scalar' (gain → its mean) | 'drop' (gain → 1)
    seed: int = 0
    grow_noise: float = 0.0  # σ of the exact symmetry breaking T⁺ + σ·R·(I − T·T⁺) when m > d
    keep_layernorm: bool = False  # LayerNorm models, fold, orthogonal, m ≥ d: stay LayerNorm (GPT-2 exportable)
    # calibration: token embeddings + hidden states of every layer on training text (pca, JL bound)
    data_dir: str = ""  # '' → the data directory recorded in the input checkpoint
    calib_batches: int = 8
    calib_batch_size: int = 16
    pca_damping: float = 1e-6  # relative ridge added to the second-moment matrix before eigh
    jl_eps: float = 0.2  # distortion ε of the JL minimum width (Algorithm 1, line 1)
    jl_delta: float = 0.05  # failure probability δ
    eval_iters: int | None = None  # val batches for the before/after loss; None = the full val split; 0 = skip
    eval_reference: bool = True  # also evaluate the untransformed model (the "before" loss)
    device: str = "cpu"

    def validate(self) -> None:
        if not self.out_dir:
            raise ConfigError("out_dir is required: --out_dir=DIR (where the transformed ckpt.pt goes)")
        if self.width <= 0:
            raise ConfigError(f"width must be a positive integer (the new residual width m), got {self.width}")
        for name, allowed in (("kind", KINDS), ("porting", PORTINGS), ("norms", NORM_MODES)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}={getattr(self, name)!r} is not one of {allowed}")
        if not 0 < self.jl_eps < 1 or not 0 < self.jl_delta < 1:
            raise ConfigError("jl_eps and jl_delta must lie in (0, 1)")
        if self.grow_noise < 0:
            raise ConfigError(f"grow_noise must be >= 0, got {self.grow_noise}")


class TransformError(ValueError):
    """A transform that cannot be done as asked; the message names the fix."""


# ----------------------------------------------------------------------------------------------
# Projections


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
                    damping: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, T⁺) in float64, T of shape (m, d), for every projection kind:

    gaussian    T_ij ~ N(0, 1/m) (the paper's Algorithm 1)
    rademacher  T_ij = ±1/√m
    sparse      Achlioptas: √(3/m)·{+1 w.p. 1/6, 0 w.p. 2/3, −1 w.p. 1/6}
    srht        √(n/m)·S·H·D·P: pad d to n = 2^k ≥ max(d, m), random signs D, orthonormal Hadamard H,
                m rows S drawn without replacement (orthonormal rows or columns when m or d equals n)
    orthogonal  Haar-random orthonormal rows (m ≤ d) or columns (m ≥ d), from the QR of a Gaussian
    pca         the top-m eigenvectors of the calibration set's uncentred second moment (m ≤ d)
    truncate    the first m coordinates
    """
    if m <= 0 or d <= 0:
        raise TransformError(f"widths must be positive, got d={d}, m={m}")
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
    elif kind == "truncate":
        T = torch.eye(m, d, dtype=torch.float64)
        return T, T.T.clone()
    elif kind == "pca":
        if m > d:
            raise TransformError(f"kind='pca' shrinks or keeps the width (m ≤ d), got m={m} > d={d}; "
                                 "use kind='orthogonal' to grow")
        if calibration is None:
            raise TransformError("kind='pca' needs calibration data (hidden states of the model)")
        if not isinstance(calibration, Calibration):
            calibration = Calibration.from_points(calibration)
        M = calibration.second_moment.double()
        M = M + damping * torch.trace(M) / d * torch.eye(d, dtype=torch.float64)
        _, vectors = torch.linalg.eigh(M)  # ascending eigenvalues
        T = vectors[:, -m:].flip(-1).T.contiguous()  # top-m directions, largest first
        return T, T.T.clone()
    else:
        raise TransformError(f"kind={kind!r} is not one of {KINDS}")
    return T, pseudo_inverse(T)


# ----------------------------------------------------------------------------------------------
# Where each parameter sits relative to the residual stream


def input_norms(cfg: GPTConfig) -> list[tuple[str, list[str]]]:
    """(norm, the readers that consume its output) for every norm on the residual stream."""
    pairs = []
    for i in range(cfg.n_layer):
        block = f"transformer.h.{i}"
        pairs += [(f"{block}.ln_1", [f"{block}.attn.c_attn"]), (f"{block}.ln_2", [f"{block}.mlp.c_fc"])]
    return pairs + [("transformer.ln_f", ["lm_head"])]


def output_norms(cfg: GPTConfig) -> list[str]:
    """peri-LN's norms on each sublayer's output, whose result is added to the residual."""
    if cfg.norm_placement != "peri":
        return []
    return [f"transformer.h.{i}.{n}" for i in range(cfg.n_layer) for n in ("ln_1_out", "ln_2_out")]


def writers(cfg: GPTConfig) -> list[str]:
    return [f"transformer.h.{i}.{s}.c_proj" for i in range(cfg.n_layer) for s in ("attn", "mlp")]


# ----------------------------------------------------------------------------------------------
# Step 1: canonical form at width d


def canonicalize(sd: dict, cfg: GPTConfig, norms: str) -> tuple[dict, GPTConfig, list[str]]:
    """Rewrite (state_dict, config) at the same width so that every norm has one scalar gain.

    ``fold`` preserves the function: a reader after a norm with gain γ and bias β computes
    W(γ⊙n(x) + β) + b = (W·diag γ)·n(x) + (W·β + b), so γ and β move into W and b. A LayerNorm whose
    input is mean-free equals an RMSNorm; centring (C = I − 11ᵀ/d) the token and position embeddings
    and every writer W → C·W makes the whole residual stream mean-free. Exceptions, recorded in the
    returned notes: peri-LN output norms with per-dimension gains (they write to the residual
    directly: their gain is replaced by its mean), a tied head under a per-dimension final gain
    (untied), a KNN head under one (rewritten as the equal linear head 2·e_j·h − ‖e_j‖² + b_j; logits
    then differ by the per-position constant −‖h‖², log-probabilities are exact).
    """
    sd = {k: v.detach() for k, v in sd.items()}  # every change below makes a new tensor: no copies needed
    cfg = copy.deepcopy(cfg)
    notes: list[str] = []
    d = cfg.n_embd
    vector = cfg.norm_gain == "vector"
    E = sd["transformer.wte.weight"]

    def one() -> torch.Tensor:
        return torch.ones(1, dtype=E.dtype, device=E.device)

    if norms == "fold":
        if vector and cfg.head == "tied":
            sd["lm_head.weight"] = E.clone()
            cfg.head = "linear"
            notes.append("tied head untied: the final norm's per-dimension gain is folded into it")
        elif vector and cfg.head == "knn":
            sd["lm_head.bias"] = sd["lm_head.bias"] - E.pow(2).sum(1)
            sd["lm_head.weight"] = 2 * E
            cfg.head, cfg.head_bias = "linear", True
            notes.append("knn head rewritten as the equivalent linear head 2·e_j·h − ‖e_j‖² + b_j (logits shift "
                         "by the per-position constant −‖h‖²; log-probabilities are exact)")
        for norm, readers in input_norms(cfg):
            if vector:
                gamma, beta = sd.pop(f"{norm}.weight"), sd.pop(f"{norm}.bias", None)
                for reader in readers:
                    if reader == "lm_head" and cfg.head != "linear":
                        continue  # scalar final gain: nothing to fold
                    W = sd[f"{reader}.weight"]
                    if beta is not None:
                        bias = sd.get(f"{reader}.bias", torch.zeros(W.shape[0], dtype=W.dtype, device=W.device))
                        sd[f"{reader}.bias"] = bias + W @ beta
                        if reader == "lm_head":
                            cfg.head_bias = True
                    sd[f"{reader}.weight"] = W * gamma
                sd[f"{norm}.weight"] = one()
            elif cfg.norm_gain == "none":
                sd[f"{norm}.weight"] = one()
        for norm in output_norms(cfg):
            if vector:
                gamma = sd.pop(f"{norm}.weight")
                sd.pop(f"{norm}.bias", None)
                sd[f"{norm}.weight"] = gamma.mean().reshape(1)
            elif cfg.norm_gain == "none":
                sd[f"{norm}.weight"] = one()
        if vector and output_norms(cfg):
            notes.append("APPROXIMATE: peri-LN output norms with per-dimension gains cannot fold (they write to "
                         "the residual directly); their gains were replaced by their means and biases dropped")
        if cfg.norm_type == "layernorm":
            if cfg.head == "knn":  # ‖h − e_j‖² = ‖h − C·e_j‖² + (1ᵀe_j)²/d when h is mean-free
                sd["lm_head.bias"] = sd["lm_head.bias"] - E.sum(1).pow(2) / d
            for name in ("transformer.wte.weight", "transformer.wpe.weight"):
                if name in sd:
                    sd[name] = sd[name] - sd[name].mean(1, keepdim=True)
            if cfg.head == "tied":
                sd["lm_head.weight"] = sd["transformer.wte.weight"]
            for writer in writers(cfg):
                sd[f"{writer}.weight"] = sd[f"{writer}.weight"] - sd[f"{writer}.weight"].mean(0, keepdim=True)
                if f"{writer}.bias" in sd:
                    sd[f"{writer}.bias"] = sd[f"{writer}.bias"] - sd[f"{writer}.bias"].mean()
            cfg.norm_type = "rmsnorm"
            notes.append("LayerNorm → RMSNorm: residual writers and embeddings centred")
    else:
        for norm in [n for n, _ in input_norms(cfg)] + output_norms(cfg):
            gain = sd.pop(f"{norm}.weight", None)
            sd.pop(f"{norm}.bias", None)
            if vector and norms == "scalar":
                sd[f"{norm}.weight"] = gain.mean().reshape(1)
            elif gain is not None and gain.numel() == 1:
                sd[f"{norm}.weight"] = gain
            else:
                sd[f"{norm}.weight"] = one()
        if vector:
            replacement = "their means" if norms == "scalar" else "1"
            notes.append(f"APPROXIMATE: per-dimension norm gains replaced by {replacement}, LayerNorm biases dropped")
    cfg.norm_gain = "scalar"
    return sd, cfg, notes


# ----------------------------------------------------------------------------------------------
# Step 2: apply T


def check_porting(cfg: GPTConfig, m: int, porting: str) -> None:
    """Raise TransformError when ``porting`` cannot map a model of config ``cfg`` to width m."""
    d, inner = cfg.n_embd, cfg.n_head * cfg.head_dim
    if porting == "sandwich":
        if inner != d:
            raise TransformError(f"porting='sandwich' needs n_head*head_dim == n_embd (got {inner} vs {d}); "
                                 "use porting='head'")
        if m % cfg.n_head:
            raise TransformError(f"porting='sandwich' re-splits the heads: width m={m} must be divisible by "
                                 f"n_head={cfg.n_head}; choose such a width or use porting='head'")
        if cfg.pos == "rope" and (m // cfg.n_head) % 2:
            raise TransformError("porting='sandwich' with RoPE needs an even head size m/n_head, "
                                 f"got {m // cfg.n_head}")
    elif porting != "head":
        raise TransformError(f"porting={porting!r} is not one of {PORTINGS}")


def port_weights(sd: dict, cfg: GPTConfig, T: torch.Tensor, T_pinv: torch.Tensor, porting: str,
                 reader_pinv: torch.Tensor | None = None) -> tuple[dict, GPTConfig]:
    """Map a canonical (state_dict, config) of width d to width m = T.shape[0]. ``sd`` is consumed: its
    entries are removed as they are ported, so peak memory stays near two copies of the model.

    ``head``: readers W·T⁺, writers T·W (and T·b), embeddings E·Tᵀ, untied head W·T⁺, tied and KNN
    heads follow the embeddings. ``sandwich``: as ``head`` plus T·W·T⁺ on each of Q, K, V and O, with
    head_dim = m / n_head. Scalar gains × √(d/m), norm ε × d/m. ``reader_pinv`` replaces T⁺ in the
    readers (grow symmetry breaking).
    """
    m, d = T.shape
    if cfg.norm_gain == "vector":
        raise TransformError("port_weights needs scalar norm gains; run canonicalize first")
    check_porting(cfg, m, porting)
    dtype = sd["transformer.wte.weight"].dtype if sd else torch.float32
    T, P = T.to(dtype), T_pinv.to(dtype)  # T⁺ was computed in float64; applying it in float32 is exact enough
    P_read = P if reader_pinv is None else reader_pinv.to(dtype)
    gain_scale = math.sqrt(d / m)
    reader_names = {f"{r}.weight" for _, readers in input_norms(cfg) for r in readers}
    writer_names = set(writers(cfg))
    out = {}
    for name in list(sd):
        W = sd.pop(name)
        module, _, leaf = name.rpartition(".")
        if name in ("transformer.wte.weight", "transformer.wpe.weight"):
            out[name] = W @ T.T
        elif name == "lm_head.weight":
            out[name] = W @ P_read if cfg.head == "linear" else None  # tied/knn: filled in below
        elif porting == "sandwich" and module.endswith("attn.c_attn"):
            parts = W.split(d, dim=0)  # Q, K, V (each d×d, or d for the bias)
            out[name] = torch.cat([T @ p @ P if leaf == "weight" else T @ p for p in parts])
        elif porting == "sandwich" and module.endswith("attn.c_proj") and leaf == "weight":
            out[name] = T @ W @ P
        elif name in reader_names:
            out[name] = W @ P_read
        elif module in writer_names:
            out[name] = T @ W
        elif ".ln_" in name or name.startswith("transformer.ln_f"):
            out[name] = W * gain_scale
        else:
            out[name] = W.clone()  # reader biases, head bias: outside the residual space (cloned: no aliasing)
    if cfg.head == "tied":
        out["lm_head.weight"] = out["transformer.wte.weight"]
    elif cfg.head == "knn":
        out.pop("lm_head.weight", None)
    cfg = copy.deepcopy(cfg)
    cfg.n_embd = m
    cfg.norm_eps = cfg.norm_eps * d / m
    if porting == "sandwich":
        cfg.head_dim = m // cfg.n_head
    return out, cfg


def mean_preserving(T: torch.Tensor) -> torch.Tensor:
    """Householder-correct an orthonormal-column T (m×d, m ≥ d) so that T·1_d/√d = 1_m/√m. Then T maps
    mean-free vectors to mean-free vectors, so after ``fold`` every norm input stays mean-free at width m,
    where LayerNorm equals RMSNorm: the transformed model can remain a LayerNorm (GPT-2) model, exactly."""
    m, d = T.shape
    target = torch.full((m,), 1 / math.sqrt(m), dtype=T.dtype)
    v = T @ torch.full((d,), 1 / math.sqrt(d), dtype=T.dtype) - target
    if v.norm() < 1e-12:
        return T
    return T - 2 * torch.outer(v, v @ T) / (v @ v)  # (I − 2vvᵀ/‖v‖²)·T


def restore_layernorm(sd: dict, cfg: GPTConfig, original: GPT, T: torch.Tensor) -> None:
    """After a ``mean_preserving`` port every norm input is mean-free, so LayerNorm computes what RMSNorm
    did: switch back. If the original final LayerNorm had a bias β (folded into a head bias W·β), move it
    back into the final norm as β' = T·(β/γ): the new head W·diag(γ)·T⁺ gives W·diag(γ)·T⁺·β' = W·β as
    T⁺T = I. Then all norms carry per-dimension gains (all equal) and biases, as in GPT-2."""
    cfg.norm_type = "layernorm"
    src = original.config
    if not (src.norm_gain == "vector" and src.bias and src.norm_placement == "pre"):
        return
    gamma = original.transformer.ln_f.weight.detach().double()
    beta = original.transformer.ln_f.bias.detach().double()
    if gamma.abs().min() < 1e-6:
        raise TransformError("keep_layernorm: the final LayerNorm gain has (near-)zero entries, so its bias "
                             "cannot move back into the norm; use keep_layernorm=False")
    m = T.shape[0]
    for name in [n for n in sd if n.endswith(".weight") and (".ln_" in n or "ln_f" in n)]:
        sd[name] = sd[name].expand(m).clone()
        sd[name[: -len("weight")] + "bias"] = torch.zeros(m, dtype=sd[name].dtype)
    sd["transformer.ln_f.bias"] = (T @ (beta / gamma)).to(sd["transformer.ln_f.weight"].dtype)
    if src.head_bias:
        sd["lm_head.bias"] = original.lm_head.bias.detach().clone()
    else:
        sd.pop("lm_head.bias", None)
        cfg.head_bias = False
    cfg.norm_gain = "vector"


def symmetry_breaking_pinv(T: torch.Tensor, T_pinv: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    """T⁺ + σ·R·(I − T·T⁺): readers then also see the new directions, yet on range(T), where the
    ported residual stream lives, they act as T⁺ did, so the function is unchanged (m > d)."""
    m, d = T.shape
    g = torch.Generator().manual_seed(seed + 1)
    R = torch.randn(d, m, generator=g, dtype=torch.float64) / math.sqrt(m)
    return T_pinv + sigma * R @ (torch.eye(m, dtype=torch.float64) - T @ T_pinv)


def build_model(sd: dict, cfg: GPTConfig) -> GPT:
    """A GPT using the tensors of ``sd`` as its parameters (no copy)."""
    return GPT.from_state_dict(GPTConfig(**asdict(cfg)), sd).eval()


def port_model(model: GPT, T: torch.Tensor, T_pinv: torch.Tensor, porting: str = "head", norms: str = "fold",
               reader_pinv: torch.Tensor | None = None) -> GPT:
    """A new GPT of width m = T.shape[0] from ``model`` and a given (T, T⁺): canonicalize, then port.
    (``transform_model`` also builds T, calibrates PCA and writes the record.)"""
    d = model.config.n_embd
    if T.shape[1] != d or tuple(T_pinv.shape) != (d, T.shape[0]):
        raise TransformError(f"T must be m×d and T⁺ d×m for d={d}, got {tuple(T.shape)} and {tuple(T_pinv.shape)}")
    sd, cfg, _ = canonicalize(model.state_dict(), model.config, norms)
    return build_model(*port_weights(sd, cfg, T.double(), T_pinv.double(), porting, reader_pinv))


def canonical_model(model: GPT, norms: str = "fold") -> tuple[GPT, list[str]]:
    """The same-width model after ``canonicalize`` (equal function with ``fold``)."""
    sd, cfg, notes = canonicalize(model.state_dict(), model.config, norms)
    return build_model({k: v.clone() for k, v in sd.items()}, cfg), notes


# ----------------------------------------------------------------------------------------------
# Calibration


@torch.no_grad()
def collect_calibration(model: GPT, loader: BatchLoader, batches: int, seed: int = 0) -> Calibration:
    """Second moment of the calibration set: every token embedding plus the residual-stream hidden
    states of every layer (after the embedding and after each block) on ``batches`` training batches.
    Each vector is scaled to unit length first: norms are scale-invariant, so what the readers need
    is the direction of h, and unscaled late layers would otherwise dominate."""
    d = model.config.n_embd
    M = torch.zeros(d, d, dtype=torch.float64)
    count = 0

    def add(x: torch.Tensor) -> None:
        nonlocal M, count
        x = x.reshape(-1, d).double()
        x = x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
        M += x.T @ x
        count += len(x)

    add(model.transformer.wte.weight)
    model.eval()
    for k in range(batches):
        x, _ = loader.get_batch("train", seed=seed + k)
        _, _, hidden = model(x, return_hidden=True)
        for h in hidden:
            add(h)
    return Calibration(M / count, count)


# ----------------------------------------------------------------------------------------------
# The whole transform


def transform_model(model: GPT, width: int, kind: str = "orthogonal", porting: str = "head", norms: str = "fold",
                    seed: int = 0, calibration_loader: BatchLoader | None = None, calib_batches: int = 8,
                    grow_noise: float = 0.0, jl_eps: float = 0.2, jl_delta: float = 0.05,
                    pca_damping: float = 1e-6, keep_layernorm: bool = False) -> tuple[GPT, dict]:
    """Transform ``model`` to residual width ``width``; returns (new model, transform record)."""
    if keep_layernorm and not (model.config.norm_type == "layernorm" and norms == "fold" and kind == "orthogonal"
                               and width >= model.config.n_embd):
        raise TransformError("keep_layernorm needs a LayerNorm model, norms='fold', kind='orthogonal' and "
                             f"width ≥ d={model.config.n_embd} (a mean-preserving isometry exists only then)")
    d, m = model.config.n_embd, width
    if m <= 0:
        raise TransformError(f"width must be positive, got {m}")
    if kind not in KINDS:
        raise TransformError(f"kind={kind!r} is not one of {KINDS}")
    if kind == "pca" and m > d:
        raise TransformError(f"kind='pca' shrinks or keeps the width (m ≤ d), got m={m} > d={d}; "
                             "use kind='orthogonal' to grow")
    if norms not in NORM_MODES:
        raise TransformError(f"norms={norms!r} is not one of {NORM_MODES}")
    sd, cfg, notes = canonicalize(model.state_dict(), model.config, norms)
    check_porting(cfg, m, porting)  # before any work
    calibration = None
    if calibration_loader is not None:
        calibration = collect_calibration(build_model(dict(sd), cfg), calibration_loader, calib_batches, seed)
    elif kind == "pca":
        raise TransformError("kind='pca' needs calibration data: pass calibration_loader (the CLI uses the "
                             "checkpoint's training data, or --data_dir)")
    T, T_pinv = make_projection(kind, d, m, seed, calibration, pca_damping)
    if keep_layernorm:
        T = mean_preserving(T)
        T_pinv = T.T.clone()
    reader_pinv = None
    if grow_noise > 0:
        if m <= d:
            raise TransformError(f"grow_noise applies when growing (m > d), got m={m}, d={d}")
        reader_pinv = symmetry_breaking_pinv(T, T_pinv, grow_noise, seed)
    new_sd, new_cfg = port_weights(sd, cfg, T, T_pinv, porting, reader_pinv)
    if keep_layernorm:
        restore_layernorm(new_sd, new_cfg, model, T)
        notes.append("kept LayerNorm: T maps the all-ones direction to the all-ones direction")
    new_model = build_model(new_sd, new_cfg)
    n_points = calibration.count if calibration is not None else model.config.vocab_size
    min_width = jl_min_width(n_points, jl_eps, jl_delta)
    if m < min_width and kind in ("gaussian", "rademacher", "sparse", "srht"):
        warnings.warn(f"width m={m} is below the JL minimum width {min_width} for N={n_points} points at "
                      f"ε={jl_eps}, δ={jl_delta}: pairwise distances are not guaranteed", stacklevel=2)
    orthonormal = bool(torch.allclose(T.T @ T, torch.eye(d, dtype=torch.float64), atol=1e-9)) if m >= d else False
    exact = (porting == "head" and orthonormal and norms == "fold" and not any(n.startswith("APPROX") for n in notes))
    record = {"kind": kind, "d": d, "m": m, "seed": seed, "porting": porting, "norms": norms,
              "grow_noise": grow_noise, "jl_eps": jl_eps, "jl_delta": jl_delta, "jl_points": n_points,
              "jl_min_width": min_width, "exact": exact, "notes": notes,
              "T": T.float(), "T_pinv": T_pinv.float()}
    return new_model, record


def run(cfg: TransformConfig) -> dict:
    """The CLI: read in_dir/ckpt.pt, transform, evaluate before/after, write out_dir/ckpt.pt."""
    ckpt = load_checkpoint(cfg.in_dir)
    model = model_from_checkpoint(ckpt).to(cfg.device).eval()
    d = model.config.n_embd
    if cfg.kind == "pca" and cfg.width > d:
        raise TransformError(f"kind='pca' shrinks or keeps the width (m ≤ d), got width={cfg.width} > d={d}; "
                             "use kind='orthogonal' to grow")
    data_dir, _ = checkpoint_data(ckpt, cfg.data_dir)
    loader = None
    if data_dir and os.path.exists(os.path.join(data_dir, "train.bin")):
        loader = BatchLoader(data_dir, model.config.block_size, cfg.calib_batch_size, cfg.device)
    elif cfg.kind == "pca" or cfg.eval_iters != 0:
        raise DataError(f"no prepared data at '{data_dir}' for calibration/evaluation; pass --data_dir=DIR "
                        "(a prepared dataset) or --eval_iters=0 with a data-free kind")
    new_model, record = transform_model(
        model, cfg.width, cfg.kind, cfg.porting, cfg.norms, cfg.seed, loader, cfg.calib_batches, cfg.grow_noise,
        cfg.jl_eps, cfg.jl_delta, cfg.pca_damping, cfg.keep_layernorm)
    record["source"] = os.path.abspath(cfg.in_dir)
    if loader is not None and cfg.eval_iters != 0:
        if cfg.eval_reference:
            record["val_loss_before"] = evaluate_loss(model, loader, "val", cfg.eval_iters)
        record["val_loss_after"] = evaluate_loss(new_model, loader, "val", cfg.eval_iters)
    out = {"model": new_model.state_dict(), "model_args": new_model.config.to_dict(),
           "config": dict(ckpt.get("config", {}), **{f"transform_{k}": v for k, v in asdict(cfg).items()}),
           "iter_num": 0, "best_val_loss": record.get("val_loss_after", float("inf")), "optimizer": None,
           "meta": ckpt.get("meta"), "transform": record}
    save_checkpoint(out, cfg.out_dir)
    return record


def main(argv: list[str]) -> None:
    cfg = load_config(TransformConfig, argv)
    record = run(cfg)
    print(f"{record['kind']} {record['porting']} d={record['d']} → m={record['m']} (norms={record['norms']}); "
          f"JL minimum width {record['jl_min_width']} for N={record['jl_points']}; exact: {record['exact']}")
    for note in record["notes"]:
        print(f"  note: {note}")
    if "val_loss_after" in record:
        before = f"{record['val_loss_before']:.4f} → " if "val_loss_before" in record else ""
        print(f"val loss {before}{record['val_loss_after']:.4f}")
    print(f"wrote {os.path.join(cfg.out_dir, 'ckpt.pt')}")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ConfigError, TransformError, CheckpointError, DataError) as e:
        sys.exit(f"error: {e}")
