"""
Change the residual width of a trained GPT from d to m with one linear map T (m×d) and its
pseudo-inverse T⁺ (d×m).

    python transform.py --in_dir=out-shakespeare-char --out_dir=out-m96 --width=96 --kind=pca --porting=residual

Two steps, both on float64 copies of the weights, each a short loop over a role table
(``residual_roles``: which tensors read the residual stream, which write it, which are embeddings,
which are norm gains and which norm feeds which reader) calling one small named function per rule:

1. ``canonicalize`` (``--norms``) rewrites the model at width d. With ``fold`` it keeps the function
   exactly (SliceGPT's / QuaRot's computational invariance): ``untie_head`` / ``knn_to_linear`` where a
   per-dimension final gain must move into the head, ``fold_gain_into_readers`` (W·diag γ, b + W·β),
   then LayerNorm becomes RMSNorm by ``center_embeddings`` and ``center_writers`` (C·W, C = I − 11ᵀ/d:
   every norm then sees mean-free inputs, where the two agree); every norm keeps one scalar gain.
   ``drop`` and ``scalar`` replace per-dimension gains by 1 or by their mean (approximations, as in the paper).
2. ``port_weights`` (``--porting``) applies T:
   - ``residual`` (ours; ``head`` is accepted as its old name): only the residual axis changes —
     ``port_reader`` W·T⁺, ``port_writer`` T·W and T·b, ``port_embedding`` E·Tᵀ; heads, head size,
     attention scale, RoPE and MLP width stay as they are.
   - ``sandwich`` (the paper's equations): additionally ``sandwich_attention`` T·W·T⁺ on Q, K, V and O,
     with the heads re-split to m / n_head dimensions (which mixes heads: the function changes even for
     orthogonal T at m = d).
   - ``paper_code`` (the paper's public implementation, re-implemented from its description): no
     canonicalization; ``paper_code_map`` maps every axis of length d by shape (last axis t·Tᵀ, first axis
     T·t, so readers get Tᵀ rather than T⁺ and d×d matrices T·W·Tᵀ), per-dimension gains become T·γ, ε stays,
     heads are re-split, and its orthogonal map is Qᵀ/√m.
   ``restore_attn_scale`` (sandwich, paper_code) multiplies Q by √(m/d) so the attention logits keep their
   original 1/√(d/n_head) scale: it isolates the part of the sandwich's loss due to the scale update.
   An RMSNorm over m coordinates of T·h equals √(m/d)·T·norm_d(h) when T has orthonormal columns
   (and ε is scaled by d/m), so ``scale_gain`` multiplies every scalar gain by √(d/m).

With orthonormal columns (TᵀT = I, m ≥ d), ``residual`` porting after ``fold`` reproduces the original
logits to float32 rounding. For m < d (shrink) nothing is exact; ``pca`` keeps the top-m principal
directions of the residual stream and loses far less than a random map.

Adding a porting rule: write one function of (tensor, maps) with its equation in the docstring, and
give it the roles it applies to in ``porting_plan``.
"""
from __future__ import annotations

import copy
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from checkpoint import (
    check_output_dir,
    hold_run_dir,
    is_interrupted,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    weights_fingerprint,
)
from cli import run_cli
from configurator import load_config
from dataset import BatchLoader, check_tokenizer, data_dir_for_checkpoint, evaluate_loss, loss_basis, window_size
from devices import announce_threads, resolve_device
from errors import ConfigError, TransformError
from grow import (
    DEPTH_MODES,
    GROW_MODES,
    GrowthRamp,
    attach_ramp,
    check_depth,
    check_growth,
    fresh_null_readers,
    grow_depth,
    grow_heads,
    grow_mlp,
    grown_kv_heads,
    masked_growth,
    raw_state_dict,
    weight_growth,
)
from logger import progress
from model import GPT, GPTConfig
from refit import REFIT_MODES, calibration_batches, fit_gains, kl_to_original, learn_map, refit_layers

KINDS = ("gaussian", "rademacher", "sparse", "srht", "orthogonal", "pca", "truncate")
JL_KINDS = ("gaussian", "rademacher", "sparse", "srht")  # random maps: the JL bound is what they guarantee
PORTINGS = ("residual", "sandwich", "paper_code")
PAPER_CODE_KINDS = ("gaussian", "orthogonal")  # the JL maps of the paper's public code
PORTING_ALIASES = {"head": "residual"}  # the old name, kept so existing commands and records still work
NORM_MODES = ("fold", "scalar", "drop")


def resolve_porting(porting: str) -> str:
    """The canonical name of a porting rule (``head`` → ``residual``); raises for an unknown one."""
    porting = PORTING_ALIASES.get(porting, porting)
    if porting not in PORTINGS:
        raise TransformError(f"porting={porting!r} is not one of {PORTINGS} (or the alias 'head')")
    return porting


@dataclass
class TransformConfig:
    # the transform
    in_dir: str = "out-shakespeare-char"  # the checkpoint to transform
    out_dir: str = ""  # where the transformed ckpt.pt goes (required)
    width: int = 0  # the new residual width m (required)
    kind: str = "orthogonal"  # the map T: gaussian | rademacher | sparse | srht | orthogonal | pca | truncate
    porting: str = "residual"  # 'residual' (ours; alias 'head') | 'sandwich' (paper's eqs) | 'paper_code' (its code)
    restore_attn_scale: bool = False  # sandwich / paper_code: Q × √(m/d) keeps the attention scale 1/√(d/n_head)
    norms: str = "fold"  # 'fold' (exact) | 'scalar' (gain → its mean) | 'drop' (gain → 1)
    rescale_gains: bool = True  # norm gains × √(d/m), ε × d/m (an RMSNorm over m coordinates needs it); False
    #                             leaves them as they are, as the paper's Algorithm 1 does (residual, sandwich)
    seed: int = 0  # seed of the random map (and of the growth symmetry breaking)
    map_file: str = ""  # a saved T (torch.save of an m×d tensor, e.g. the paper script's --proj_out) used as it is,
    #                     instead of sampling kind: to compare rules, or our code with another's, on one T
    grow_noise: float = 0.0  # σ of the exact symmetry breaking T⁺ + σ·R·(I − T·T⁺) when m > d
    grow_reader_std: float = 0.0  # m > d: readers also read the new directions with fresh N(0, std²) weights
    #                               (0.02: the scratch init's scale); exact (the stream has no part there yet)
    grow_mask_iters: int = 0  # > 0: MSG masks: writers' new parts and new units start at the scratch scale behind
    #                           masks that training opens linearly over this many steps; exact at the switch
    rms_preserve: bool = False  # m > d: the stream × √(m/d) so its per-coordinate RMS is kept (SPARKLING); exact
    keep_layernorm: bool = False  # LayerNorm models, fold, orthogonal, m ≥ d: stay LayerNorm (GPT-2 exportable)
    # growing heads and MLP too (grow.py), function-preserving; 0 keeps the model's
    n_head: int = 0  # more attention heads (same head size); key/value heads keep their ratio to them
    n_kv_head: int = 0  # key/value heads after growth (0: the ratio kept), e.g. n_kv_head=n_head turns GQA into MHA
    mlp_hidden: int = 0  # more MLP neurons
    grow_mode: str = "zero"  # 'zero' (fresh inputs, zero outputs) | 'clone' (copies, split outputs, ± noise)
    n_layer: int = 0  # more blocks (0 keeps the model's): copies of old blocks with zero writers, function-preserving
    depth_mode: str = "interleave"  # 'interleave' (each copy after its block) | 'stack' (copies appended) |
    #                                 'gstack' (G_stack: the stack repeated, writers kept; not function-preserving)
    clone_noise: float = 0.0  # σ of the cancelling noise on cloned output columns
    carry_optimizer: bool = False  # map the AdamW moments (carry.py); finetune.py --init_state continues them
    # corrections after porting (refit.py), fitted on the calibration text; porting='residual'
    refit: str = "none"  # 'none' | 'gains' (LS norm gains) | 'readers' (sequential LS readers) | 'all' (+ writers)
    refit_ridge: float = 1e-4  # ridge of the least-squares refit, relative to the input's mean energy
    learn_steps: int = 0  # > 0: learn T (orthonormal rows, m < d) for this many steps of KL(original ‖ new)
    learn_lr: float = 1e-3  # Adam learning rate of the learned map
    # calibration: token embeddings + hidden states of every layer on training text (pca, JL bound)
    data_dir: str = ""  # '' → the data directory recorded in the input checkpoint
    calib_batches: int = 8  # training batches whose hidden states calibrate PCA and the JL bound
    calib_batch_size: int = 16  # sequences per calibration batch
    block_size: int = 0  # tokens per calibration / evaluation window (0: the model's context, which for an imported
    #                      Llama or Qwen, 32k–128k, can exceed a small corpus)
    pca_damping: float = 1e-6  # relative ridge added to the second-moment matrix before eigh
    jl_eps: float = 0.2  # distortion ε of the JL minimum width (Algorithm 1, line 1)
    jl_delta: float = 0.05  # failure probability δ
    # evaluation and system
    eval_iters: int | None = None  # val batches for the before/after loss; None = the full val split; 0 = skip
    eval_reference: bool = True  # also evaluate the untransformed model (the "before" loss)
    device: str = "cpu"  # where the transform and its evaluation run: 'cpu' | 'cuda' | 'cuda:N' | 'mps' | 'auto'
    overwrite: bool = False  # replace a checkpoint already in out_dir (never the input checkpoint itself)

    def validate(self) -> None:
        if not self.out_dir:
            raise ConfigError("out_dir is required: --out_dir=DIR (where the transformed ckpt.pt goes)")
        if self.width <= 0:
            raise ConfigError(f"width must be a positive integer (the new residual width m), got {self.width}")
        for name, allowed in (("kind", KINDS), ("norms", NORM_MODES), ("refit", REFIT_MODES),
                              ("grow_mode", GROW_MODES), ("depth_mode", DEPTH_MODES)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}={getattr(self, name)!r} is not one of {allowed}")
        if PORTING_ALIASES.get(self.porting, self.porting) not in PORTINGS:
            raise ConfigError(f"porting={self.porting!r} is not one of {PORTINGS} (or the alias 'head')")
        if not 0 < self.jl_eps < 1 or not 0 < self.jl_delta < 1 or self.learn_lr <= 0:
            raise ConfigError("jl_eps and jl_delta must lie in (0, 1), learn_lr must be > 0")
        for name in ("block_size", "grow_noise", "n_head", "n_kv_head", "mlp_hidden", "clone_noise", "learn_steps",
                     "refit_ridge", "n_layer", "grow_reader_std", "grow_mask_iters"):
            if getattr(self, name) < 0:  # 0: off (n_head, mlp_hidden: keep the model's; learn_steps: keep T)
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("calib_batches", "calib_batch_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.eval_iters is not None and self.eval_iters < 0:
            raise ConfigError(f"eval_iters must be >= 0 (0 skips evaluation) or None (full val split), "
                              f"got {self.eval_iters}")
        if not self.rescale_gains and (self.porting == "paper_code" or self.carry_optimizer):
            raise ConfigError("rescale_gains=False applies to porting='residual' or 'sandwich' without "
                              "carry_optimizer (paper_code never rescales; carried moments need the exact port); "
                              "drop --rescale_gains=False")


def check_transform(cfg: GPTConfig, width: int, kind: str, porting: str, norms: str,
                    keep_layernorm: bool = False, grow_noise: float = 0.0, restore_attn_scale: bool = False,
                    refit: str = "none", learn_steps: int = 0, n_head: int = 0, mlp_hidden: int = 0,
                    grow_mode: str = "zero", n_kv_head: int = 0, n_layer: int = 0,
                    depth_mode: str = "interleave") -> str:
    """Every check of a transform request against the model it applies to, in one place (every path calls
    it before any work). Returns the canonical porting name."""
    d, m = cfg.n_embd, width
    if m <= 0:
        raise TransformError(f"width must be positive, got {m}")
    if kind not in KINDS:
        raise TransformError(f"kind={kind!r} is not one of {KINDS}")
    if norms not in NORM_MODES:
        raise TransformError(f"norms={norms!r} is not one of {NORM_MODES}")
    porting = resolve_porting(porting)
    if kind == "pca" and m > d:
        raise TransformError(f"kind='pca' shrinks or keeps the width (m ≤ d), got width={m} > d={d}; "
                             "use kind='orthogonal' to grow")
    if grow_noise > 0 and m <= d:
        raise TransformError(f"grow_noise applies when growing (m > d), got width={m}, d={d}")
    if porting == "paper_code":
        if kind not in PAPER_CODE_KINDS:
            raise TransformError(f"porting='paper_code' reproduces the paper's code, whose maps are "
                                 f"{PAPER_CODE_KINDS}; got kind={kind!r}")
        if keep_layernorm or grow_noise > 0:
            raise TransformError("porting='paper_code' takes no keep_layernorm or grow_noise (the paper's code has "
                                 "neither); drop them")
    check_corrections(cfg.n_embd, width, porting, refit, learn_steps, keep_layernorm)
    check_growth(cfg, n_head, mlp_hidden, grow_mode, n_kv_head)
    check_depth(cfg, n_layer, depth_mode)
    if n_layer > cfg.n_layer and (porting == "paper_code" or keep_layernorm):
        raise TransformError("n_layer grows depth on the canonical model (RMSNorm, folded gains), so a zero writer "
                             "adds exactly 0; drop --porting=paper_code / --keep_layernorm, or --n_layer")
    if (n_head or n_kv_head or mlp_hidden) and keep_layernorm:
        raise TransformError("keep_layernorm exports to GPT-2, whose attention width equals its residual width; "
                             "grow heads/MLP without --keep_layernorm")
    if restore_attn_scale and porting == "residual":
        raise TransformError("restore_attn_scale applies to porting='sandwich' or 'paper_code' (porting='residual' "
                             "keeps the head size, so the scale never changes); drop --restore_attn_scale")
    if keep_layernorm:
        needs = {"a LayerNorm model": cfg.norm_type == "layernorm", "norms='fold'": norms == "fold",
                 "kind='orthogonal'": kind == "orthogonal", f"width ≥ d={d}": m >= d}
        failed = [what for what, ok in needs.items() if not ok]
        if failed:
            raise TransformError(f"keep_layernorm needs {' and '.join(failed)} (a mean-preserving isometry exists "
                                 "only then); drop --keep_layernorm or change those settings")
    check_porting(cfg, m, porting)
    if m > 64 * d:
        warnings.warn(f"width m={m} is more than 64× d={d}: the transformed model is {m // d}× as wide "
                      "(was that meant?)", stacklevel=2)
    return porting


def check_corrections(d: int, m: int, porting: str, refit: str, learn_steps: int, keep_layernorm: bool) -> None:
    """Raise TransformError for a refit / learned-map request that cannot apply."""
    if refit not in REFIT_MODES:
        raise TransformError(f"refit={refit!r} is not one of {REFIT_MODES}")
    if learn_steps < 0:
        raise TransformError(f"learn_steps must be >= 0, got {learn_steps}")
    if refit == "none" and learn_steps == 0:
        return
    if porting != "residual":
        raise TransformError(f"refit and learn_steps need porting='residual' (porting={porting!r} re-splits the "
                             "heads, so its Q/K/V outputs have no original counterpart to fit); use "
                             "--porting=residual")
    if keep_layernorm:
        raise TransformError("keep_layernorm ports exactly (orthogonal, m ≥ d): there is nothing to refit; drop "
                             "--refit / --learn_steps")
    if learn_steps > 0 and m >= d:
        raise TransformError(f"learn_steps learns a map with orthonormal rows for a shrink (m < d), got width={m}, "
                             f"d={d}; at m ≥ d an orthogonal T is already exact")


def check_porting(cfg: GPTConfig, m: int, porting: str) -> None:
    """Raise TransformError when the (canonical) ``porting`` rule cannot map a model of config ``cfg`` to width m."""
    d = cfg.n_embd
    if porting in ("sandwich", "paper_code") and cfg.kv_heads != cfg.n_head:
        if porting == "sandwich":
            raise TransformError(f"porting='sandwich' maps Q, K and V as square d×d blocks (T·W·T⁺), but with grouped-"
                                 f"query attention (n_kv_head={cfg.n_kv_head} < n_head={cfg.n_head}) K and V are "
                                 f"{cfg.kv_heads * cfg.head_dim}×{d}; use porting='residual' (exact at m ≥ d)")
        raise TransformError(f"porting='paper_code' with grouped-query attention: the published code maps Q "
                             f"({d}×{d}) on both axes but K and V ({cfg.kv_heads * cfg.head_dim}×{d}) on their input "
                             f"axis only, so query heads of m/n_head dimensions would meet key heads of "
                             f"{cfg.head_dim}: no attention can pair them. Use porting='residual'")
    if porting in ("sandwich", "paper_code"):
        inner = cfg.n_head * cfg.head_dim
        if inner != d:
            raise TransformError(f"porting={porting!r} needs n_head*head_dim == n_embd (got {inner} vs {d}); "
                                 "use porting='residual'")
        if m % cfg.n_head:
            raise TransformError(f"porting={porting!r} re-splits the heads: width m={m} must be divisible by "
                                 f"n_head={cfg.n_head}; choose such a width or use porting='residual'")
        if cfg.pos == "rope" and (m // cfg.n_head) % 2:
            raise TransformError(f"porting={porting!r} with RoPE needs an even head size m/n_head, "
                                 f"got {m // cfg.n_head}")
    if porting == "paper_code" and d in (cfg.vocab_size, cfg.mlp_hidden):
        axis = "vocab_size" if d == cfg.vocab_size else "mlp_hidden"
        raise TransformError(f"porting='paper_code' maps every axis of length d={d} by shape, and this model's "
                             f"{axis} is {d} too: the published code would map that axis as well and leave no model "
                             "that runs; use porting='sandwich' (the paper's equations) or 'residual'")

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
    """(T, T⁺) in float64 on the CPU, T of shape (m, d), for every projection kind (a seed gives the same T on every
    machine; ``transform_model`` moves it to the model's device, once):

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
        M = calibration.second_moment.double().cpu()  # eigh on the host: the same directions on every device
        M = M + damping * torch.trace(M) / d * torch.eye(d, dtype=torch.float64)
        _, vectors = torch.linalg.eigh(M)  # ascending eigenvalues
        T = vectors[:, -m:].flip(-1).T.contiguous()  # top-m directions, largest first
        return T, T.T.clone()
    else:
        raise TransformError(f"kind={kind!r} is not one of {KINDS}")
    return T, pseudo_inverse(T)


# ----------------------------------------------------------------------------------------------
# The role table: where each tensor sits relative to the residual stream


@dataclass(frozen=True)
class ResidualRoles:
    """Built once from a config: which modules read the residual (through which norm), which write it, which
    tensors are embeddings and which norms carry gains. Names are module names (``transformer.h.0.attn.c_attn``)."""
    embeddings: tuple[str, ...]  # parameters whose rows live in the residual: E → E·Tᵀ
    norm_readers: tuple[tuple[str, tuple[str, ...]], ...]  # (input norm, the readers that consume its output)
    output_norms: tuple[str, ...]  # peri-LN's norms on each sublayer's output, added to the residual
    writers: tuple[str, ...]  # modules whose output is added to the residual: W → T·W, b → T·b
    attention: tuple[str, ...]  # attention modules (the sandwich rule's T·W·T⁺)

    @property
    def readers(self) -> tuple[str, ...]:
        return tuple(r for _, readers in self.norm_readers for r in readers)

    @property
    def norms(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.norm_readers) + self.output_norms


def residual_roles(cfg: GPTConfig) -> ResidualRoles:
    """The role table of a GPT of config ``cfg`` (see ``ResidualRoles``)."""
    blocks = [f"transformer.h.{i}" for i in range(cfg.n_layer)]
    norm_readers = [pair for b in blocks for pair in ((f"{b}.ln_1", (f"{b}.attn.c_attn",)),
                                                      (f"{b}.ln_2", (f"{b}.mlp.c_fc",)))]
    norm_readers.append(("transformer.ln_f", ("lm_head",)))
    peri = cfg.norm_placement == "peri"
    return ResidualRoles(
        embeddings=("transformer.wte.weight",) + (("transformer.wpe.weight",) if cfg.pos == "learned" else ()),
        norm_readers=tuple(norm_readers),
        output_norms=tuple(f"{b}.{n}" for b in blocks for n in ("ln_1_out", "ln_2_out")) if peri else (),
        writers=tuple(f"{b}.{s}.c_proj" for b in blocks for s in ("attn", "mlp")),
        attention=tuple(f"{b}.attn" for b in blocks),
    )


# ----------------------------------------------------------------------------------------------
# Step 1: canonical form at width d, one rule per function


def untie_head(sd: dict, cfg: GPTConfig) -> str:
    """A tied head W = E gets its own copy, so the final norm's per-dimension gain can fold into it."""
    sd["lm_head.weight"] = sd["transformer.wte.weight"].clone()
    cfg.head = "linear"
    return "tied head untied: the final norm's per-dimension gain is folded into it"


def knn_to_linear(sd: dict, cfg: GPTConfig) -> str:
    """−‖h − e_j‖² + b_j = 2·e_j·h − ‖e_j‖² + b_j − ‖h‖²: the KNN head as the linear head W = 2E with bias
    b − ‖e_j‖² (logits shift by the per-position constant −‖h‖², so log-probabilities are exact)."""
    E = sd["transformer.wte.weight"]
    sd["lm_head.bias"] = sd["lm_head.bias"] - E.pow(2).sum(1)
    sd["lm_head.weight"] = 2 * E
    cfg.head, cfg.head_bias = "linear", True
    return ("knn head rewritten as the equivalent linear head 2·e_j·h − ‖e_j‖² + b_j (logits shift by the "
            "per-position constant −‖h‖²; log-probabilities are exact)")


def fold_gain_into_readers(sd: dict, cfg: GPTConfig, norm: str, readers: tuple[str, ...]) -> None:
    """W(γ⊙n(x) + β) + b = (W·diag γ)·n(x) + (W·β + b): the norm's gain γ and bias β move into each reader;
    the norm keeps the scalar gain 1. A tied or KNN head has nothing to fold into (its norm's gain is scalar)."""
    gamma, beta = sd.pop(f"{norm}.weight"), sd.pop(f"{norm}.bias", None)
    for reader in readers:
        if reader == "lm_head" and cfg.head != "linear":
            continue
        W = sd[f"{reader}.weight"]
        if beta is not None:
            bias = sd.get(f"{reader}.bias", torch.zeros(W.shape[0], dtype=W.dtype, device=W.device))
            sd[f"{reader}.bias"] = bias + W @ beta
            if reader == "lm_head":
                cfg.head_bias = True
            elif reader.endswith("attn.c_attn") and not cfg.attn_bias:  # qkv_bias=False beside bias=True
                cfg.qkv_bias = None if cfg.bias else True
        sd[f"{reader}.weight"] = W * gamma
    sd[f"{norm}.weight"] = _one(gamma)


def average_gain(sd: dict, norm: str) -> None:
    """γ → mean(γ) (one scalar), bias dropped: the paper's approximation, and the only option for peri-LN's
    output norms, which write to the residual directly."""
    gamma = sd.pop(f"{norm}.weight")
    sd.pop(f"{norm}.bias", None)
    sd[f"{norm}.weight"] = gamma.mean().reshape(1)


def drop_gain(sd: dict, norm: str) -> None:
    """γ → 1 (one scalar), bias dropped; a scalar gain is kept as it is."""
    gain = sd.pop(f"{norm}.weight", None)
    sd.pop(f"{norm}.bias", None)
    sd[f"{norm}.weight"] = gain if gain is not None and gain.numel() == 1 else _one(sd["transformer.wte.weight"])


def center_embeddings(sd: dict, cfg: GPTConfig, roles: ResidualRoles) -> None:
    """E → E·C (each row made mean-free, C = I − 11ᵀ/d), so the residual stream starts mean-free. A KNN head's
    bias absorbs what centring its embeddings changes: ‖h − e_j‖² = ‖h − C·e_j‖² + (1ᵀe_j)²/d for mean-free h."""
    d = cfg.n_embd
    if cfg.head == "knn":
        sd["lm_head.bias"] = sd["lm_head.bias"] - sd["transformer.wte.weight"].sum(1).pow(2) / d
    for name in roles.embeddings:
        sd[name] = sd[name] - sd[name].mean(1, keepdim=True)
    if cfg.head == "tied":
        sd["lm_head.weight"] = sd["transformer.wte.weight"]


def center_writers(sd: dict, roles: ResidualRoles) -> None:
    """W → C·W, b → C·b for every residual writer: whatever they add to the residual stream is mean-free."""
    for writer in roles.writers:
        sd[f"{writer}.weight"] = sd[f"{writer}.weight"] - sd[f"{writer}.weight"].mean(0, keepdim=True)
        if f"{writer}.bias" in sd:
            sd[f"{writer}.bias"] = sd[f"{writer}.bias"] - sd[f"{writer}.bias"].mean()


def _one(like: torch.Tensor) -> torch.Tensor:
    return torch.ones(1, dtype=like.dtype, device=like.device)


def canonicalize(sd: dict, cfg: GPTConfig, norms: str) -> tuple[dict, GPTConfig, list[str]]:
    """Rewrite (state_dict, config) at the same width so that every norm has one scalar gain; returns the notes
    of what changed. ``fold`` preserves the function except for peri-LN output norms with per-dimension gains
    (averaged: recorded as APPROXIMATE); ``scalar`` and ``drop`` average or drop every per-dimension gain."""
    if norms not in NORM_MODES:
        raise TransformError(f"norms={norms!r} is not one of {NORM_MODES}")
    sd = {k: v.detach() for k, v in sd.items()}  # every rule makes new tensors: no copies needed
    cfg = copy.deepcopy(cfg)
    roles = residual_roles(cfg)
    vector = cfg.norm_gain == "vector"
    notes: list[str] = []
    if norms != "fold":
        for norm in roles.norms:
            (average_gain if vector and norms == "scalar" else drop_gain)(sd, norm)
        if vector:
            replacement = "their means" if norms == "scalar" else "1"
            notes.append(f"APPROXIMATE: per-dimension norm gains replaced by {replacement}, LayerNorm biases dropped")
        cfg.norm_gain = "scalar"
        return sd, cfg, notes
    if vector and cfg.head == "tied":
        notes.append(untie_head(sd, cfg))
    elif vector and cfg.head == "knn":
        notes.append(knn_to_linear(sd, cfg))
    for norm, readers in roles.norm_readers:
        if vector:
            fold_gain_into_readers(sd, cfg, norm, readers)
        elif cfg.norm_gain == "none":
            drop_gain(sd, norm)
    for norm in roles.output_norms:
        (average_gain if vector else drop_gain)(sd, norm)
    if vector and roles.output_norms:
        notes.append("APPROXIMATE: peri-LN output norms with per-dimension gains cannot fold (they write to "
                     "the residual directly); their gains were replaced by their means and biases dropped")
    if cfg.norm_type == "layernorm":
        center_embeddings(sd, cfg, roles)
        center_writers(sd, roles)
        cfg.norm_type = "rmsnorm"
        notes.append("LayerNorm → RMSNorm: residual writers and embeddings centred")
    cfg.norm_gain = "scalar"
    return sd, cfg, notes


# ----------------------------------------------------------------------------------------------
# Step 2: apply T, one rule per function


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


def port_embedding(E: torch.Tensor, maps: PortMaps) -> torch.Tensor:
    """E → E·Tᵀ: each embedding row e becomes T·e."""
    return E @ maps.T.T


def port_reader(W: torch.Tensor, maps: PortMaps) -> torch.Tensor:
    """W → W·T⁺: a reader of the residual sees T·h and recovers W·h (exactly where T⁺T = I)."""
    return W @ maps.reader_T_pinv


def port_writer(W: torch.Tensor, maps: PortMaps) -> torch.Tensor:
    """W → T·W and b → T·b: what a writer adds to the residual lands in range(T)."""
    return maps.T @ W


def scale_gain(g: torch.Tensor, maps: PortMaps) -> torch.Tensor:
    """g → g·√(d/m): RMSNorm over m coordinates of T·h is √(m/d)·T·norm_d(h) for orthonormal-column T."""
    return g * math.sqrt(maps.d / maps.m)


def sandwich_attention(W: torch.Tensor, maps: PortMaps) -> torch.Tensor:
    """The paper's Q, K, V → T·W·T⁺ (each d×d block of c_attn; biases T·b), heads re-split to m / n_head."""
    if W.dim() == 1:
        return torch.cat([maps.T @ p for p in W.split(maps.d)])
    return torch.cat([maps.T @ p @ maps.T_pinv for p in W.split(maps.d, dim=0)])


def sandwich_output(W: torch.Tensor, maps: PortMaps) -> torch.Tensor:
    """The paper's O → T·W·T⁺ (the attention output projection, d×d)."""
    return maps.T @ W @ maps.T_pinv


def keep(W: torch.Tensor, maps: PortMaps) -> torch.Tensor:
    """Outside the residual space (reader biases, head bias): unchanged (cloned, so nothing aliases)."""
    return W.clone()


PortRule = Callable[[torch.Tensor, PortMaps], torch.Tensor]


def porting_plan(names: list[str], cfg: GPTConfig, porting: str, rescale_gains: bool = True) -> dict[str, PortRule]:
    """The rule that ports each parameter, from the role table: the only place that says which rule applies where.
    ``rescale_gains=False`` keeps the norm gains (the paper's Algorithm 1 does not rescale them)."""
    roles = residual_roles(cfg)
    plan: dict[str, PortRule] = {name: port_embedding for name in roles.embeddings}
    plan.update({f"{r}.weight": port_reader for r in roles.readers})
    for writer in roles.writers:
        plan.update({f"{writer}.weight": port_writer, f"{writer}.bias": port_writer})
    plan.update({f"{norm}.weight": scale_gain if rescale_gains else keep for norm in roles.norms})
    if porting == "sandwich":
        for attn in roles.attention:
            plan.update({f"{attn}.c_attn.weight": sandwich_attention, f"{attn}.c_attn.bias": sandwich_attention,
                         f"{attn}.c_proj.weight": sandwich_output})
    return {name: plan.get(name, keep) for name in names}


def port_weights(sd: dict, cfg: GPTConfig, T: torch.Tensor, T_pinv: torch.Tensor, porting: str,
                 reader_T_pinv: torch.Tensor | None = None, rescale_gains: bool = True) -> tuple[dict, GPTConfig]:
    """Map a canonical (state_dict, config) of width d to width m = T.shape[0] by ``porting_plan``. ``sd`` is
    consumed (entries removed as they are ported, so peak memory stays near two copies of the model). Tied and
    KNN heads follow the embeddings; norm ε × d/m (unless ``rescale_gains=False``, which keeps gains and ε);
    ``sandwich`` sets head_dim = m / n_head. ``reader_T_pinv`` replaces T⁺ in the readers (grow symmetry breaking)."""
    if cfg.norm_gain == "vector":
        raise TransformError("port_weights needs scalar norm gains; run canonicalize first")
    m, d = T.shape
    porting = resolve_porting(porting)
    check_porting(cfg, m, porting)
    like = sd["transformer.wte.weight"] if sd else torch.empty(0)
    # T⁺ was computed in float64; applying it in the weights' dtype is exact enough. On the weights' device: a
    # caller's T may live elsewhere (port_model)
    maps = PortMaps(*(t.to(like.device, like.dtype) for t in (T, T_pinv, T_pinv if reader_T_pinv is None
                                                                    else reader_T_pinv)))
    if cfg.head != "linear":
        sd.pop("lm_head.weight", None)  # tied: set to the ported embeddings below; KNN: reads wte itself
    plan = porting_plan(list(sd), cfg, porting, rescale_gains)
    out = {name: plan[name](sd.pop(name), maps) for name in list(sd)}
    if cfg.head == "tied":
        out["lm_head.weight"] = out["transformer.wte.weight"]
    cfg = copy.deepcopy(cfg)
    cfg.n_embd = m
    if rescale_gains:
        cfg.norm_eps = cfg.norm_eps * d / m
    if porting == "sandwich":
        cfg.head_dim = m // cfg.n_head
    return out, cfg


def paper_code_map(t: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """The paper's public code, by shape: every axis of length d is mapped — a last axis t → t·Tᵀ (readers,
    embeddings, head: Tᵀ, not T⁺), a first axis t → T·t (writers); so a d×d matrix becomes T·t·Tᵀ and a 1-D
    tensor of length d (norm gains and biases) T·t. Tensors with no axis of length d are unchanged."""
    d = T.shape[1]
    out = t
    if t.shape[-1] == d:
        out = out @ T.T if t.dim() > 1 else T @ out
    if t.dim() > 1 and t.shape[0] == d:
        out = T @ out
    return out.clone() if out is t else out


def paper_code_weights(sd: dict, cfg: GPTConfig, T: torch.Tensor) -> tuple[dict, GPTConfig]:
    """The ``paper_code`` port of an un-canonicalized (state_dict, config): ``paper_code_map`` on every tensor,
    with c_attn split into its Q, K, V blocks first (that code stores them as separate d×d matrices). The
    architecture is kept (LayerNorm stays LayerNorm, per-dimension gains stay, ε unchanged); the heads are
    re-split to head_dim = m / n_head. One deviation: the position axis of learned positions is never mapped
    (mapping it 'by shape' when block_size == d would break the model rather than reproduce anything)."""
    m, d = T.shape
    check_porting(cfg, m, "paper_code")
    T = T.to(sd["transformer.wte.weight"].device, sd["transformer.wte.weight"].dtype)
    out = {}
    for name, t in sd.items():
        if cfg.head == "tied" and name == "lm_head.weight":
            continue
        if name.endswith(".attn.c_attn.weight") or name.endswith(".attn.c_attn.bias"):
            out[name] = torch.cat([paper_code_map(block, T) for block in t.split(d)])
        elif name == "transformer.wpe.weight":  # rows are positions, even when block_size == d
            out[name] = t @ T.T
        else:
            out[name] = paper_code_map(t, T)
    if cfg.head == "tied":
        out["lm_head.weight"] = out["transformer.wte.weight"]
    cfg = copy.deepcopy(cfg)
    cfg.n_embd, cfg.head_dim = m, m // cfg.n_head
    return out, cfg


def paper_code_projection(kind: str, T: torch.Tensor) -> torch.Tensor:
    """The paper's code's JL matrix: its Gaussian is ours (N(0, 1/m)); its orthogonal kind is Qᵀ/√m."""
    return T / math.sqrt(T.shape[0]) if kind == "orthogonal" else T


def restore_attention_scale(sd: dict, cfg: GPTConfig, d: int) -> None:
    """Q → √(m/d)·Q (weights and bias) after a port that re-split the heads to m / n_head: the logits
    q·k/√(m/n_head) then equal the original scale q·k/√(d/n_head)."""
    m = cfg.n_embd
    factor = math.sqrt(m / d)
    for attn in residual_roles(cfg).attention:
        for suffix in (".c_attn.weight", ".c_attn.bias"):
            name = attn + suffix
            if name in sd:
                q, kv = sd[name].split((cfg.n_head * cfg.head_dim, 2 * cfg.kv_heads * cfg.head_dim))
                sd[name] = torch.cat([q * factor, kv])


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
    for norm in residual_roles(cfg).norms:
        sd[f"{norm}.weight"] = sd[f"{norm}.weight"].expand(m).clone()
        sd[f"{norm}.bias"] = torch.zeros_like(sd[f"{norm}.weight"])
    sd["transformer.ln_f.bias"] = (T.to(beta.device) @ (beta / gamma)).to(sd["transformer.ln_f.weight"])
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
    g = torch.Generator().manual_seed(seed + 1)  # drawn on the CPU: the same R on every device
    R = (torch.randn(d, m, generator=g, dtype=torch.float64) / math.sqrt(m)).to(T.device)
    return T_pinv + sigma * R @ (torch.eye(m, dtype=torch.float64, device=T.device) - T @ T_pinv)


def model_from_state(sd: dict, cfg: GPTConfig) -> GPT:
    """A GPT in eval mode using the tensors of ``sd`` as its parameters (no copy)."""
    return GPT.from_state_dict(GPTConfig(**asdict(cfg)), sd).eval()


def port_model(model: GPT, T: torch.Tensor, T_pinv: torch.Tensor, porting: str = "residual", norms: str = "fold",
               reader_T_pinv: torch.Tensor | None = None) -> GPT:
    """A new GPT of width m = T.shape[0] from ``model`` and a given (T, T⁺): canonicalize, then port.
    (``transform_model`` also builds T, calibrates PCA and writes the record.)"""
    d = model.config.n_embd
    if T.shape[1] != d or tuple(T_pinv.shape) != (d, T.shape[0]):
        raise TransformError(f"T must be m×d and T⁺ d×m for d={d}, got {tuple(T.shape)} and {tuple(T_pinv.shape)}")
    sd, cfg, _ = canonicalize(model.state_dict(), model.config, norms)
    reader = None if reader_T_pinv is None else reader_T_pinv.double()
    return model_from_state(*port_weights(sd, cfg, T.double(), T_pinv.double(), porting, reader))


def canonical_model(model: GPT, norms: str = "fold") -> tuple[GPT, list[str]]:
    """The same-width model after ``canonicalize`` (equal function with ``fold``)."""
    sd, cfg, notes = canonicalize(model.state_dict(), model.config, norms)
    return model_from_state({k: v.clone() for k, v in sd.items()}, cfg), notes


# ----------------------------------------------------------------------------------------------
# Calibration


def unit_second_moment(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(Σ u uᵀ, N) over the rows u of ``x`` scaled to unit length, in float64."""
    u = x.reshape(-1, x.shape[-1]).double()
    u = u / u.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return u.T @ u, len(u)


@torch.no_grad()
def collect_calibration(model: GPT, loader: BatchLoader, batches: int, seed: int = 0) -> Calibration:
    """Second moment of the calibration set: every token embedding plus the residual-stream hidden
    states of every layer (after the embedding and after each block) on ``batches`` training batches.
    Each vector is scaled to unit length first: norms are scale-invariant, so what the readers need
    is the direction of h, and unscaled late layers would otherwise dominate."""
    model.eval()
    total, count = unit_second_moment(model.transformer.wte.weight)
    for k in progress(range(batches), "calibrate", unit="batch"):
        x, _ = loader.get_batch("train", seed=seed + k)
        for h in model(x, return_hidden=True)[2]:
            moment, n = unit_second_moment(h)
            total += moment
            count += n
    return Calibration(total / count, count)


def calibration_points(cfg: GPTConfig, loader: BatchLoader | None, batches: int) -> int:
    """How many vectors ``collect_calibration`` would see (the N of the JL bound), without running the model:
    the token embeddings plus n_layer + 1 hidden states per calibration token."""
    if loader is None:
        return cfg.vocab_size
    return cfg.vocab_size + batches * loader.batch_size * loader.block_size * (cfg.n_layer + 1)


# ----------------------------------------------------------------------------------------------
# The whole transform


def starting_map(given_map: torch.Tensor | None, kind: str, d: int, m: int, seed: int,
                 calibration: Calibration | None, damping: float, keep_layernorm: bool) -> tuple[torch.Tensor, ...]:
    """(T, T⁺) before any learning: a given map as it is, else the one ``kind`` samples; mean-preserving when the
    model keeps its LayerNorm."""
    if given_map is not None:
        T = given_map.detach().cpu().double()
        T_pinv = pseudo_inverse(T)
    else:
        T, T_pinv = make_projection(kind, d, m, seed, calibration, damping)
    if keep_layernorm:
        T = mean_preserving(T)
        T_pinv = T.T.clone()
    return T, T_pinv


def transform_model(model: GPT, width: int, *, kind: str = "orthogonal", porting: str = "residual",
                    norms: str = "fold", seed: int = 0, calibration_loader: BatchLoader | None = None,
                    calib_batches: int = 8, grow_noise: float = 0.0, jl_eps: float = 0.2, jl_delta: float = 0.05,
                    pca_damping: float = 1e-6, keep_layernorm: bool = False, restore_attn_scale: bool = False,
                    refit: str = "none", refit_ridge: float = 1e-4, learn_steps: int = 0,
                    learn_lr: float = 1e-3, n_head: int = 0, mlp_hidden: int = 0, grow_mode: str = "zero",
                    clone_noise: float = 0.0, n_kv_head: int = 0,
                    given_map: torch.Tensor | None = None, rescale_gains: bool = True, n_layer: int = 0,
                    depth_mode: str = "interleave", grow_reader_std: float = 0.0, grow_mask_iters: int = 0,
                    rms_preserve: bool = False) -> tuple[GPT, dict]:
    """Transform ``model`` to residual width ``width``; returns (new model, transform record). ``given_map``
    (m×d) replaces the map ``kind`` would sample, and is used as it is (recorded as kind 'file');
    ``rescale_gains=False`` keeps norm gains and ε as they are (the paper's Algorithm 1). With
    ``grow_mask_iters`` the new model carries MSG's masks (closed) and the record a ``growth_ramp``."""
    started = time.perf_counter()
    porting = check_transform(model.config, width, kind, porting, norms, keep_layernorm, grow_noise,
                              restore_attn_scale, refit, learn_steps, n_head, mlp_hidden, grow_mode, n_kv_head,
                              n_layer, depth_mode)
    d, m = model.config.n_embd, width
    check_new_directions(model.config, d, m, porting, norms, rescale_gains, keep_layernorm, refit, learn_steps,
                         grow_reader_std, grow_mask_iters, rms_preserve)
    if not rescale_gains and porting == "paper_code":
        raise TransformError("rescale_gains=False applies to porting='residual' or 'sandwich' (paper_code maps "
                             "gains by shape and never rescales them); drop --rescale_gains")
    for what, needed in (("kind='pca'", kind == "pca"), (f"refit={refit!r}", refit != "none"),
                         ("learn_steps", learn_steps > 0)):
        if needed and calibration_loader is None:
            raise TransformError(f"{what} needs calibration data: pass calibration_loader (the CLI uses the "
                                 "checkpoint's training data, or --data_dir)")
    if porting == "paper_code":  # the paper's code neither folds nor canonicalizes anything
        sd, cfg, notes = dict(model.state_dict()), copy.deepcopy(model.config), ["paper_code: weights mapped by "
                                                                                 "shape, architecture kept"]
    else:
        sd, cfg, notes = canonicalize(model.state_dict(), model.config, norms)
    calibration = None
    if calibration_loader is not None and (kind == "pca" and given_map is None or refit != "none"
                                           or learn_steps > 0):  # a random map needs only the count (JL bound)
        calibration = collect_calibration(model_from_state(dict(sd), cfg), calibration_loader, calib_batches, seed)
    T, T_pinv = starting_map(given_map, kind, d, m, seed, calibration, pca_damping, keep_layernorm)
    check_orthonormal_growth(T, kind if given_map is None else "file", grow_reader_std, grow_mask_iters)
    kind = "file" if given_map is not None else kind
    device = model.transformer.wte.weight.device
    T, T_pinv = T.to(device), T_pinv.to(device)  # the one move: every rule below meets the weights on their device
    corrections: dict = {}
    if refit != "none" or learn_steps > 0:
        batches = calibration_batches(calibration_loader, calib_batches, seed)
        original = model_from_state(dict(sd), cfg)
    if learn_steps > 0:
        skeleton = model_from_state(*port_weights(dict(sd), cfg, T, T_pinv, porting, None, rescale_gains))

        def differentiable_port(T_: torch.Tensor):
            return skeleton, port_weights(dict(sd), cfg, T_, T_.T, porting, None, rescale_gains)[0]

        T, corrections["learned_map"] = learn_map(original, T, differentiable_port, batches, learn_steps, learn_lr,
                                                  seed)
        T_pinv = T.T.clone()
        notes.append(f"map learned for {learn_steps} steps from kind={kind!r}: calibration KL "
                     f"{corrections['learned_map']['initial']:.4f} → {corrections['learned_map']['learned']:.4f} "
                     f"(kept: {corrections['learned_map']['kept']})")
    if porting == "paper_code":
        T = T if given_map is not None else paper_code_projection(kind, T)
        T_pinv = pseudo_inverse(T)
        new_sd, new_cfg = paper_code_weights(sd, cfg, T)
    else:
        reader_T_pinv = symmetry_breaking_pinv(T, T_pinv, grow_noise, seed) if grow_noise > 0 else None
        new_sd, new_cfg = port_weights(sd, cfg, T, T_pinv, porting, reader_T_pinv, rescale_gains)
    if restore_attn_scale:
        restore_attention_scale(new_sd, new_cfg, d)
        notes.append(f"attention scale restored: Q × √(m/d) = {math.sqrt(m / d):.4f}")
    ramp = grow(new_sd, new_cfg, model.config, T, seed, notes, n_head=n_head, n_kv_head=n_kv_head,
                mlp_hidden=mlp_hidden, grow_mode=grow_mode, clone_noise=clone_noise, n_layer=n_layer,
                depth_mode=depth_mode, reader_std=grow_reader_std, mask_iters=grow_mask_iters,
                rms_preserve=rms_preserve)
    if keep_layernorm:
        restore_layernorm(new_sd, new_cfg, model, T)
        notes.append("kept LayerNorm: T maps the all-ones direction to the all-ones direction")
    new_model = model_from_state(new_sd, new_cfg)
    if ramp is not None:
        attach_ramp(new_model, ramp)
    if refit != "none":
        corrections.update(apply_refit(original, new_model, T, batches, refit, refit_ridge))
        notes.append(f"refit={refit}: calibration KL {corrections['calibration_kl_before']:.4f} → "
                     f"{corrections['calibration_kl_after']:.4f}")
    n_points = (calibration.count if calibration is not None
                else calibration_points(model.config, calibration_loader, calib_batches))
    min_width = jl_min_width(n_points, jl_eps, jl_delta)
    if m < min_width and kind in JL_KINDS:
        warnings.warn(f"width m={m} is below the JL minimum width {min_width} for N={n_points} points at "
                      f"ε={jl_eps}, δ={jl_delta}: pairwise distances are not guaranteed", stacklevel=2)
    orthonormal = m >= d and bool(torch.allclose(T.T @ T, torch.eye(d, dtype=T.dtype, device=T.device), atol=1e-9))
    exact = (porting == "residual" and orthonormal and norms == "fold" and rescale_gains
             and not (n_layer > model.config.n_layer and depth_mode == "gstack")
             and not any(n.startswith("APPROX") for n in notes))
    record = {"kind": kind, "d": d, "m": m, "seed": seed, "porting": porting,
              "norms": "kept" if porting == "paper_code" else norms, "restore_attn_scale": restore_attn_scale,
              "rescale_gains": rescale_gains and porting != "paper_code",
              "grow_noise": grow_noise, "grow_reader_std": grow_reader_std, "rms_preserve": rms_preserve,
              "jl_eps": jl_eps, "jl_delta": jl_delta, "jl_points": n_points,
              "jl_min_width": min_width, "exact": exact, "notes": notes, "refit": refit, "learn_steps": learn_steps,
              "corrections": corrections, "seconds": time.perf_counter() - started,
              "T": T.float().cpu(), "T_pinv": T_pinv.float().cpu()}  # records are device-neutral
    record["growth_ramp"] = ramp  # MSG's masks or None: transform_checkpoint stores them beside the weights
    return new_model, record


def check_new_directions(cfg: GPTConfig, d: int, m: int, porting: str, norms: str, rescale_gains: bool,
                         keep_layernorm: bool, refit: str, learn_steps: int, reader_std: float, mask_iters: int,
                         rms_preserve: bool) -> None:
    """Raise TransformError unless ``grow_reader_std``, ``grow_mask_iters`` and ``rms_preserve`` can apply: each
    needs the exact port (residual, fold, gains rescaled) of a pre-LN model with a linear head, growing."""
    asked = [name for name, on in (("grow_reader_std", reader_std > 0), ("grow_mask_iters", mask_iters > 0),
                                   ("rms_preserve", rms_preserve)) if on]
    if not asked:
        return
    needs = {f"width > d={d}": m > d, "porting='residual'": resolve_porting(porting) == "residual",
             "norms='fold'": norms == "fold", "rescale_gains": rescale_gains,
             "no keep_layernorm, refit or learn_steps": not keep_layernorm and refit == "none" and not learn_steps,
             "a pre-LN model": cfg.norm_placement == "pre",
             "a linear head (the scaled or masked embeddings would change a tied or KNN head)": cfg.head == "linear"}
    failed = [what for what, ok in needs.items() if not ok]
    if failed:
        raise TransformError(f"{' and '.join(asked)} need {' and '.join(failed)}: they add to the exact growth of the "
                             "residual stream; change those settings or drop them")


def check_orthonormal_growth(T: torch.Tensor, kind: str, reader_std: float, mask_iters: int) -> None:
    """Fresh readers N·(I − T·Tᵀ) and MSG's masks A_c = T·Tᵀ + c·(I − T·Tᵀ) are exact only when T·Tᵀ projects onto
    range(T), i.e. TᵀT = I (orthonormal columns); with any other T the new parts show through at the switch."""
    if not (reader_std > 0 or mask_iters > 0):
        return
    gram = T.T @ T
    if not torch.allclose(gram, torch.eye(len(gram), dtype=gram.dtype, device=gram.device), atol=1e-6):
        raise TransformError(f"grow_reader_std and grow_mask_iters need a map with orthonormal columns (TᵀT = I); "
                             f"kind={kind!r} has none, so the model would change at the switch: use "
                             "--kind=orthogonal or --kind=truncate")


def preserve_rms(sd: dict, cfg: GPTConfig, d: int, m: int) -> str:
    """SPARKLING's RMS-scale consistency (Yu et al., 2026), kept exact: embeddings and writers × a = √(m/d), so the
    stream a·T·h has the per-coordinate RMS h had at width d. An RMSNorm is blind to a (the gains keep g·√(d/m)),
    and its mean of squares is unchanged, so ε goes back to its width-d value (port_weights made it ε·d/m)."""
    a = math.sqrt(m / d)
    roles = residual_roles(cfg)
    for name in roles.embeddings:
        sd[name] = sd[name] * a
    for writer in roles.writers:
        for name in (f"{writer}.weight", f"{writer}.bias"):
            if name in sd:
                sd[name] = sd[name] * a
    cfg.norm_eps = cfg.norm_eps * m / d
    return f"RMS kept: the stream × √(m/d) = {a:.4f} (embeddings, writers), norm ε as at width d"


def grow(sd: dict, cfg: GPTConfig, old: GPTConfig, T: torch.Tensor, seed: int, notes: list[str], *, n_head: int,
         n_kv_head: int, mlp_hidden: int, grow_mode: str, clone_noise: float, n_layer: int, depth_mode: str,
         reader_std: float, mask_iters: int, rms_preserve: bool) -> GrowthRamp | None:
    """Everything after the port that grows (in place, notes appended): the RMS-keeping scale, fresh readers of the
    new directions, new heads / neurons / blocks, and MSG's masked new parts (the masks returned, or None)."""
    d, m = T.shape[1], T.shape[0]
    if rms_preserve:
        notes.append(preserve_rms(sd, cfg, d, m))
    if reader_std > 0:
        fresh_null_readers(sd, residual_roles(cfg).readers, T, reader_std, seed)
        notes.append(f"readers read the new directions with fresh N(0, {reader_std}²) weights")
    notes += grow_units(sd, cfg, old, n_head, n_kv_head, mlp_hidden, grow_mode, clone_noise, seed, n_layer, depth_mode)
    if not mask_iters:
        return None
    writers = {w: old.n_head * old.head_dim if w.endswith("attn.c_proj") else old.mlp_hidden
               for w in residual_roles(cfg).writers}
    notes.append(f"MSG masks: the new parts start at the scratch scale behind masks (closed) that training opens over "
                 f"{mask_iters} steps")
    return masked_growth(sd, residual_roles(cfg).embeddings, writers, cfg.n_layer, T, mask_iters, seed)


def grow_units(sd: dict, cfg: GPTConfig, old: GPTConfig, n_head: int, n_kv_head: int, mlp_hidden: int,
               grow_mode: str, clone_noise: float, seed: int, n_layer: int, depth_mode: str) -> list[str]:
    """Head, MLP and depth growth of a ported (state_dict, config), in place (grow.py); the notes it makes."""
    notes = []
    if n_head or n_kv_head or mlp_hidden:
        growth = weight_growth(grow_mode, clone_noise, torch.Generator().manual_seed(seed + 2))
        grow_heads(sd, cfg, n_head, growth, n_kv_head)
        grow_mlp(sd, cfg, mlp_hidden, growth)
        notes.append(f"grown ({grow_mode}): n_head {old.n_head} → {cfg.n_head}, n_kv_head {old.kv_heads} → "
                     f"{cfg.kv_heads}, mlp_hidden {old.mlp_hidden} → {cfg.mlp_hidden}")
    if n_layer > old.n_layer:
        grow_depth(sd, cfg, n_layer, depth_mode)
        notes.append(f"grown in depth ({depth_mode}): n_layer {old.n_layer} → {n_layer}"
                     + (" (G_stack: copies keep their writers, the function changes)" if depth_mode == "gstack"
                        else " (new blocks: copies with zero writers)"))
    return notes


def regroups_heads(cfg: GPTConfig, n_head: int, n_kv_head: int) -> bool:
    """Whether head growth changes how many query heads share a key/value head (copies of key/value heads)."""
    heads = n_head or cfg.n_head
    return heads // grown_kv_heads(cfg, heads, n_kv_head) != cfg.n_head // cfg.kv_heads


@torch.no_grad()
def calibration_kl(original: GPT, new: GPT, batches: list[torch.Tensor], chunk: int = 256) -> float:
    """Mean over the calibration batches of KL(original ‖ new) per token, the heads applied ``chunk`` positions at
    a time (a 50k vocabulary would otherwise hold several (tokens × vocabulary) tensors at once)."""
    total = 0.0
    for b in batches:
        h_original, h_new = original(b, features=True)[0].flatten(0, -2), new(b, features=True)[0].flatten(0, -2)
        total += sum(kl_to_original(torch.log_softmax(original.lm_head(h_original[i:i + chunk]).float(), -1),
                                    new.lm_head(h_new[i:i + chunk])).item() * len(h_original[i:i + chunk])
                     for i in range(0, len(h_original), chunk)) / len(h_original)
    return total / len(batches)


def apply_refit(original: GPT, new: GPT, T: torch.Tensor, batches: list[torch.Tensor], refit: str,
                ridge: float) -> dict:
    """``fit_gains`` or ``refit_layers`` on ``new`` (in place); the record of what was fitted and the calibration
    KL(original ‖ new) before and after."""
    out = {"calibration_kl_before": calibration_kl(original, new, batches)}
    if refit == "gains":
        out["gain_factors"] = fit_gains(original, new, batches)
    else:
        out["relative_errors"] = refit_layers(original, new, T, batches, refit, ridge)
    out["calibration_kl_after"] = calibration_kl(original, new, batches)
    return out


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


def transform_checkpoint(cfg: TransformConfig) -> dict:
    """The CLI's work: read in_dir/ckpt.pt, transform, evaluate before/after, write out_dir/ckpt.pt.
    Every check runs before any work, and nothing is written unless all of it succeeds."""
    check_output_dir(cfg.out_dir, cfg.in_dir, cfg.overwrite)
    cfg.device = resolve_device(cfg.device)  # before any work: a missing GPU is one clear error
    ckpt = load_checkpoint(cfg.in_dir)
    model = model_from_checkpoint(ckpt).to(cfg.device).eval()
    check_transform(model.config, cfg.width, cfg.kind, cfg.porting, cfg.norms, cfg.keep_layernorm, cfg.grow_noise,
                    cfg.restore_attn_scale, cfg.refit, cfg.learn_steps, cfg.n_head, cfg.mlp_hidden, cfg.grow_mode,
                    cfg.n_kv_head, cfg.n_layer, cfg.depth_mode)
    if cfg.carry_optimizer:
        from carry import check_carry
        check_carry(ckpt, cfg.porting, cfg.norms, cfg.kind, model.config.n_embd, cfg.width, cfg.keep_layernorm,
                    cfg.refit, cfg.learn_steps, regroups=regroups_heads(model.config, cfg.n_head, cfg.n_kv_head))
    given_map = read_map_file(cfg.map_file, cfg.width, model.config.n_embd) if cfg.map_file else None
    loader = None
    if cfg.kind == "pca" or cfg.eval_iters != 0 or cfg.refit != "none" or cfg.learn_steps > 0:
        data_dir = data_dir_for_checkpoint(ckpt, cfg.data_dir, "--data_dir")
        check_tokenizer(ckpt, data_dir, "--data_dir")
        loader = BatchLoader(data_dir, window_size(cfg.block_size, model.config.block_size), cfg.calib_batch_size,
                             cfg.device)
    announce_threads(cfg.device)
    new_model, record = transform_model(
        model, cfg.width, kind=cfg.kind, porting=cfg.porting, norms=cfg.norms, seed=cfg.seed,
        calibration_loader=loader, calib_batches=cfg.calib_batches, grow_noise=cfg.grow_noise, jl_eps=cfg.jl_eps,
        jl_delta=cfg.jl_delta, pca_damping=cfg.pca_damping, keep_layernorm=cfg.keep_layernorm,
        restore_attn_scale=cfg.restore_attn_scale, refit=cfg.refit, refit_ridge=cfg.refit_ridge,
        learn_steps=cfg.learn_steps, learn_lr=cfg.learn_lr, n_head=cfg.n_head, mlp_hidden=cfg.mlp_hidden,
        grow_mode=cfg.grow_mode, clone_noise=cfg.clone_noise, n_kv_head=cfg.n_kv_head, given_map=given_map,
        rescale_gains=cfg.rescale_gains, n_layer=cfg.n_layer, depth_mode=cfg.depth_mode,
        grow_reader_std=cfg.grow_reader_std, grow_mask_iters=cfg.grow_mask_iters, rms_preserve=cfg.rms_preserve)
    ramp = record.pop("growth_ramp", None)
    record["source"] = os.path.abspath(cfg.in_dir)
    record["source_fingerprint"] = weights_fingerprint(ckpt["model"])  # consumers check the source is unchanged
    if is_interrupted(ckpt):
        record["notes"].append(f"in_dir is an interrupted training run (stopped at iter {ckpt.get('iter_num', 0)}, "
                               "marked incomplete): the transformed model is marked incomplete too")
    carried = None
    if cfg.carry_optimizer:
        from carry import carry_moments
        carried = carry_moments(model, ckpt["optimizer"], record["T"], new_model, cfg.n_head, cfg.mlp_hidden,
                                cfg.grow_mode, cfg.n_kv_head, cfg.n_layer, cfg.depth_mode,
                                stream_scale=math.sqrt(cfg.width / model.config.n_embd) if cfg.rms_preserve else 1.0)
        record["optimizer"] = {"carried": True, "step": carried["step"], "iter_num": ckpt.get("iter_num", 0),
                               "exp_avg": "exact on range(T)", "exp_avg_sq": "diagonal approximation (T∘T)"}
    if loader is not None and cfg.eval_iters != 0:
        if cfg.eval_reference:
            record["val_loss_before"] = evaluate_loss(model, loader, "val", cfg.eval_iters)
        record["val_loss_after"] = evaluate_loss(new_model, loader, "val", cfg.eval_iters)
        record["val_loss_basis"] = loss_basis(loader, cfg.eval_iters)
    out = {"model": raw_state_dict(new_model), "model_args": new_model.config.to_dict(),
           "config": dict(ckpt.get("config") or {}, **{f"transform_{k}": v for k, v in asdict(cfg).items()}),
           "iter_num": 0, "source_iter_num": ckpt.get("iter_num", 0),  # finetune.py --init_state goes on from it
           "best_val_loss": record.get("val_loss_after", float("inf")), "optimizer": None,
           "optimizer_moments": carried, "meta": ckpt.get("meta"), "transform": record}
    if ramp is not None:
        out["growth_ramp"] = ramp.record()
    if is_interrupted(ckpt):
        out["complete"] = False
    save_checkpoint(out, cfg.out_dir)
    return record


def jl_line(record: dict) -> str:
    """What the Johnson–Lindenstrauss bound says about this run, in words."""
    bound = (f"JL minimum width for N={record['jl_points']} points at ε={record['jl_eps']}, δ={record['jl_delta']}: "
             f"{record['jl_min_width']}")
    if record["kind"] not in JL_KINDS:
        return f"{bound} (applies to random maps only; kind={record['kind']!r} is not one, so it says nothing here)"
    if record["m"] >= record["jl_min_width"]:
        return f"{bound}; m={record['m']} reaches it: pairwise distances are kept within ε with probability 1 − δ"
    return f"{bound}; m={record['m']} is below it: pairwise distances are not guaranteed to stay within ε"


def main(argv: list[str]) -> None:
    cfg = load_config(TransformConfig, argv, prog="transform.py")
    with hold_run_dir(cfg.out_dir, "transform.py"):
        record = transform_checkpoint(cfg)
    print(f"{record['kind']} {record['porting']} d={record['d']} → m={record['m']} (norms={record['norms']}); "
          f"exact: {record['exact']} (True: the same function)")
    print(f"  {jl_line(record)}")
    for note in record["notes"]:
        print(f"  note: {note}")
    if "val_loss_after" in record:
        before = f"{record['val_loss_before']:.4f} → " if "val_loss_before" in record else ""
        print(f"val loss ({record['val_loss_basis']}): {before}{record['val_loss_after']:.4f}")
    print(f"wrote {os.path.join(cfg.out_dir, 'ckpt.pt')}")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
