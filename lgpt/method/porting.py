"""
What T does to each weight: the model rewritten at width d into a canonical form, then ported to width m,
one small named function per rule (its docstring the equation) and one plan that says which rule applies where.
The paper's own rules (sandwich, paper_code) are in paper_rules.py; T itself in maps.py.

1. ``canonicalize`` (``--norms``) rewrites the model at width d. With ``fold`` it keeps the function
   exactly (SliceGPT's / QuaRot's computational invariance): ``untie_head`` / ``knn_to_linear`` where a
   per-dimension final gain must move into the head, ``fold_gain_into_readers`` (W·diag γ, b + W·β),
   then LayerNorm becomes RMSNorm by ``center_embeddings`` and ``center_writers`` (C·W, C = I − 11ᵀ/d:
   every norm then sees mean-free inputs, where the two agree); every norm keeps one scalar gain.
   ``drop`` and ``scalar`` replace per-dimension gains by 1 or by their mean (approximations, as in the paper).
2. ``port_weights`` (``--porting``) applies T by ``porting_plan``:
   - ``residual`` (ours; ``head`` is accepted as its old name): only the residual axis changes —
     ``port_reader`` W·T⁺, ``port_writer`` T·W and T·b, ``port_embedding`` E·Tᵀ; heads, head size,
     attention scale, RoPE and MLP width stay as they are.
   - ``sandwich``: the paper's T·W·T⁺ on attention (paper_rules.py), the rest as ``residual``.
   An RMSNorm over m coordinates of T·h equals √(m/d)·T·norm_d(h) when T has orthonormal columns
   (and ε is scaled by d/m), so ``scale_gain`` multiplies every scalar gain by √(d/m).

With orthonormal columns (TᵀT = I, m ≥ d), ``residual`` porting after ``fold`` reproduces the original
logits to float32 rounding. For m < d (shrink) nothing is exact.

Adding a porting rule: write one function of (tensor, maps) with its equation in the docstring, and
give it the roles it applies to in ``porting_plan``.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import asdict

import torch

from lgpt.method.maps import PortMaps
from lgpt.method.paper_rules import check_porting, sandwich_attention, sandwich_output
from lgpt.method.roles import ResidualRoles, residual_roles
from lgpt.plumbing.errors import TransformError
from model import GPT, GPTConfig

PORTINGS = ("residual", "sandwich", "paper_code", "per_block")  # per_block: per_block.py (SliceGPT's maps)
PORTING_ALIASES = {"head": "residual"}  # the old name, kept so existing commands and records still work
NORM_MODES = ("fold", "scalar", "drop")
ZERO_GAIN = 1e-6  # an output gain below this × its norm's largest counts as zero (carried as that tiny gain)
CARRY_EXACT = 1e-6  # a carried output gain's relative residual below which it counts as exact (float64 rounding)
OUTPUT_GAINS = ("carry", "average")  # peri-LN output norms' per-dimension gains: carried through T, or averaged


def resolve_porting(porting: str) -> str:
    """The canonical name of a porting rule (``head`` → ``residual``); raises for an unknown one."""
    porting = PORTING_ALIASES.get(porting, porting)
    if porting not in PORTINGS:
        raise TransformError(f"porting={porting!r} is not one of {PORTINGS} (or the alias 'head')")
    return porting


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


def average_output_gains(sd: dict, roles: ResidualRoles, vector: bool) -> list[str]:
    """``--output_gains=average``: peri-LN's output norms get γ → mean(γ), biases dropped (the plain average, kept
    to measure against ``carry``; the note says APPROXIMATE)."""
    for norm in roles.output_norms:
        (average_gain if vector else drop_gain)(sd, norm)
    if vector and roles.output_norms:
        return ["APPROXIMATE: peri-LN output norms' per-dimension gains replaced by their means (output_gains="
                "'average') and biases dropped"]
    return []


def diagonal_fit(T: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The diagonal a (one entry per row of T) that best carries diag(b) through T, and its relative residual:

        a = argmin ‖Tᵀ·diag(a)·T − diag(b)‖_F,   i.e.   ((T·Tᵀ) ∘ (T·Tᵀ))·a = (T ∘ T)·b   (∘: entrywise).

    Exact (residual 0) wherever an exact a exists: a coordinate map, ``maps.split_map``, any T whose rows lie in
    the eigenspaces of diag(b). For orthonormal rows (T·Tᵀ = I, a shrink) a = (T ∘ T)·b: each row's gain is the
    b-average over the coordinates it reads. ``B``: b, or several b as the columns of a d×k matrix (one solve for
    all). Rows T never writes (all zero) get the mean of the others. Solved in float64 on the host (an SVD-based
    least squares: zero rows make the system singular); returned on T's device. The residual is the largest over
    the columns."""
    T64, B64 = T.detach().double().cpu(), B.detach().double().cpu()
    column = B64.dim() == 1
    B64 = B64[:, None] if column else B64
    P = T64 @ T64.T
    A = torch.linalg.lstsq(P * P, (T64 * T64) @ B64, driver="gelsd").solution  # min-norm where G is singular
    used = (T64 != 0).any(1)
    if not bool(used.all()):
        A = torch.where(used[:, None], A, A[used].mean(0, keepdim=True))
    residual = max(float((T64.T @ (A[:, j, None] * T64) - torch.diag(B64[:, j])).norm()
                         / B64[:, j].norm().clamp_min(1e-300)) for j in range(B64.shape[1]))
    return (A[:, 0] if column else A).to(T.device, T.dtype), residual


def carried_gains(sd: dict, cfg: GPTConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The peri-LN output gains as ``carry_output_norms`` carries them: d × (one column per output norm), float64,
    and a mask of the zero ones. A zero gain never writes its coordinate, but its f_j still counts in the norm's
    length: it is carried as a tiny gain δ (ZERO_GAIN of its norm's largest) in the writer and the length, and a
    row that reads only such coordinates gets output gain 0 (exact on a coordinate row: writer row × δ/δ)."""
    norms = residual_roles(cfg).output_norms
    raw = torch.stack([sd[f"{norm}.weight"].double() for norm in norms], 1)
    if not bool(torch.isfinite(raw).all()):
        bad = [norm for j, norm in enumerate(norms) if not bool(torch.isfinite(raw[:, j]).all())]
        raise TransformError(f"output norm gains that are not finite ({', '.join(bad)}): the model is damaged; "
                             "repair or retrain it before a width transform")
    largest = raw.abs().amax(0, keepdim=True)
    tiny = ZERO_GAIN * torch.where(largest > 0, largest, torch.ones_like(largest))  # a norm of all zeros: δ = 1e-6
    zero = raw.abs() < tiny
    return torch.where(zero, tiny, raw), zero


def length_matrix(T: torch.Tensor, a: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """M = diag(γ)·Tᵀ·diag(a)·T·diag(γ): the ported norm's squared length is fᵀ·M·f where the original's is fᵀ·f
    (all float64)."""
    U = T * gamma
    return U.T @ (a[:, None] * U)


def length_residual(T: torch.Tensor, A: torch.Tensor, gammas: torch.Tensor) -> float:
    """The carried lengths' relative error, max over the output norms of ‖M − I‖_F / √d (0: exact for every f)."""
    d = T.shape[1]
    eye = torch.eye(d, dtype=torch.float64)
    return max(float((length_matrix(T, A[:, j], gammas[:, j]) - eye).norm()) / math.sqrt(d)
               for j in range(gammas.shape[1]))


def bounded_quadratic(H: torch.Tensor, g: torch.Tensor, lower: torch.Tensor) -> torch.Tensor:
    """argmin ½·cᵀ·H·c − gᵀ·c subject to c ≥ ``lower`` (H symmetric positive semi-definite, float64): the
    unconstrained solution where it keeps the bounds, else, with H = Q·Λ·Qᵀ, the least squares
    ‖Λ^½·Qᵀ·c − Λ^-½·Qᵀ·g‖² (the same objective up to a constant) under the bounds (scipy's ``lsq_linear``, BVLS)."""
    from scipy.optimize import lsq_linear

    c = torch.linalg.lstsq(H, g[:, None], driver="gelsd").solution[:, 0]
    if bool((c >= lower).all()):
        return c
    values, vectors = torch.linalg.eigh(H)
    keep = values > 1e-12 * values.amax()
    root = values[keep].sqrt()
    design = (root[:, None] * vectors[:, keep].T).numpy()
    target = ((vectors[:, keep].T @ g) / root).numpy()
    return torch.from_numpy(lsq_linear(design, target, bounds=(lower.numpy(), float("inf")), method="bvls").x)


def length_fit(T: torch.Tensor, gamma: torch.Tensor, floor: float = 1e-3) -> torch.Tensor:
    """The per-row length a > 0 that carries one output norm's gains γ through T: with M = ``length_matrix``,

        a = argmin E_f (fᵀ·M·f − fᵀ·f)² = 2·‖M − I‖²_F + (tr M − d)²,   f ~ N(0, I_d):

    relative (every coordinate's length counts alike, whatever its gain: an absolute fit of Tᵀ·diag(a)·T to
    diag(1/γ²) is ruled by the smallest gains), and the trace term lets a shrink scale up for the energy of the
    directions it drops (≈ d/m for a projection). With u_i = row i of T·diag(γ), v_i = u_i/‖u_i‖ and
    c_i = a_i·‖u_i‖² it is the quadratic

        cᵀ·(2·G + 11ᵀ)·c − 2·(d + 2)·1ᵀc,   G = (V·Vᵀ) ∘ (V·Vᵀ)   (∘: entrywise),

    solved unconstrained (c = 1 on a coordinate map that keeps every coordinate, (d + 2)/(m + 2) on a selection;
    exact wherever M = I can hold: ``maps.split_map``, zero padding), and with c ≥ ``floor`` where that gives
    some c < floor (``bounded_quadratic``). Rows T never writes get the mean of the others. float64, on the host."""
    T64, g64 = T.detach().double().cpu(), gamma.detach().double().cpu()
    d = T64.shape[1]
    U = T64 * g64
    size = U.norm(dim=1)
    used = size > 1e-300
    if not bool(used.any()):
        return torch.ones(len(U), dtype=torch.float64)  # no row reads a coordinate: nothing is written
    V = U[used] / size[used, None]
    P = V @ V.T
    c = bounded_quadratic(2 * P * P + 1.0, torch.full((len(V),), d + 2.0, dtype=torch.float64),
                          torch.full((len(V),), floor, dtype=torch.float64))
    a = torch.empty(len(U), dtype=torch.float64)
    a[used] = c / size[used].pow(2)
    a[~used] = a[used].mean()
    return a


def carry_output_norms(sd: dict, cfg: GPTConfig, maps: PortMaps, fitted: torch.Tensor | None = None
                       ) -> tuple[dict, float]:
    """``--output_gains=carry``, for every peri-LN output norm with per-dimension gains: it adds γ ⊙ norm_d(f) to
    the residual, f = W·h its writer's output, and the ported block must add T·(γ ⊙ norm_d(f)). With a per row of T
    (``length_fit``), the writer W' = diag(√a)·T·diag(γ)·W (bias alike) and the gain γ' = √(d/m)/√a (ε' = ε·d/m) add

        γ' ⊙ norm_m(W'·h) = T·diag(γ)·f·√d / √(‖diag(√a)·T·diag(γ)·f‖² + ε·d),

    which is T·(γ ⊙ norm_d(f)) exactly when diag(γ)·Tᵀ·diag(a)·T·diag(γ) = I (the two lengths then agree): the
    direction is exact for every T; only the per-token length depends on the fit. ``fitted``: a (m × norms) from
    calibration text instead (``refit.fit_output_lengths``). Pops the writers and output norms from ``sd``; returns
    them ported, and the lengths' relative error (``length_residual``; 0: exact)."""
    roles = residual_roles(cfg)
    gammas, zero = carried_gains(sd, cfg)
    T64 = maps.T.detach().double().cpu()
    A = torch.stack([length_fit(T64, gammas[:, j]) for j in range(gammas.shape[1])], 1)
    residual = length_residual(T64, A, gammas)
    if fitted is not None and residual > CARRY_EXACT:  # lengths fitted on calibration text (refit.fit_output_lengths)
        A = fitted.double().cpu()  # where the data-free lengths are exact, no text can improve on them
        residual = length_residual(T64, A, gammas)
    reads = T64.abs() > 1e-12 * T64.abs().amax()
    out = {}
    for j, (writer, norm) in enumerate(zip(roles.writers, roles.output_norms)):
        gamma = gammas[:, j].to(maps.T.device, sd.pop(f"{norm}.weight").dtype)
        root = A[:, j].sqrt().to(maps.T.device)
        for name in (f"{writer}.weight", f"{writer}.bias"):
            if name in sd:
                W = sd.pop(name)
                scaled = gamma[:, None] * W if W.dim() > 1 else gamma * W
                out[name] = (root[:, None] if W.dim() > 1 else root).to(W.dtype) * (maps.T @ scaled)
        silent = ~(reads & ~zero[:, j]).any(1)  # rows that read only zero-gain coordinates write nothing
        gain = torch.where(silent.to(root.device), torch.zeros_like(root), math.sqrt(maps.d / maps.m) / root)
        out[f"{norm}.weight"] = gain.to(gamma.dtype)
    return out, residual


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
    for writer in roles.writers + roles.shortcuts:  # a shortcut also writes the residual stream (S·h)
        sd[f"{writer}.weight"] = sd[f"{writer}.weight"] - sd[f"{writer}.weight"].mean(0, keepdim=True)
        if f"{writer}.bias" in sd:
            sd[f"{writer}.bias"] = sd[f"{writer}.bias"] - sd[f"{writer}.bias"].mean()


def _one(like: torch.Tensor) -> torch.Tensor:
    return torch.ones(1, dtype=like.dtype, device=like.device)


def head_for_folding(sd: dict, cfg: GPTConfig, fold_final: bool) -> list[str]:
    """A tied or KNN head under a per-dimension final gain that will fold (``fold_final``) becomes a linear head
    (``untie_head``, ``knn_to_linear``); the notes of what changed."""
    if fold_final and cfg.head == "tied":
        return [untie_head(sd, cfg)]
    if fold_final and cfg.head == "knn":
        return [knn_to_linear(sd, cfg)]
    return []


def canonicalize(sd: dict, cfg: GPTConfig, norms: str, output_gains: str = "average", keep_tied: bool = False
                 ) -> tuple[dict, GPTConfig, list[str]]:
    """Rewrite (state_dict, config) at the same width so that every norm has one scalar gain; returns the notes
    of what changed. ``fold`` preserves the function; ``scalar`` and ``drop`` average or drop every per-dimension
    gain. Peri-LN output norms (RMSNorm) with per-dimension gains write to the residual directly, so nothing can
    fold them: ``output_gains='carry'`` keeps them (every other norm then gets a vector of ones, and the model
    stays exact; ``port_weights`` carries them through T by ``carry_output_norms``), ``'average'`` replaces them
    by their means (APPROXIMATE). ``keep_tied`` (with ``carry``): a tied head stays tied and the final norm keeps
    its gain, which ``port_weights`` carries as it carries the output gains (exact wherever they are)."""
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
    if output_gains not in OUTPUT_GAINS:
        raise TransformError(f"output_gains={output_gains!r} is not one of {OUTPUT_GAINS}")
    keep = output_gains == "carry" and vector and bool(roles.output_norms) and cfg.norm_type == "rmsnorm"
    carry_final = keep and keep_tied and cfg.head == "tied"  # the final gain carried like the output gains
    notes += head_for_folding(sd, cfg, vector and not carry_final)
    for norm, readers in roles.norm_readers:
        if carry_final and norm == "transformer.ln_f":
            continue
        if vector:
            fold_gain_into_readers(sd, cfg, norm, readers)
        elif cfg.norm_gain == "none":
            drop_gain(sd, norm)
    if not keep:
        notes += average_output_gains(sd, roles, vector)
    if cfg.norm_type == "layernorm":
        center_embeddings(sd, cfg, roles)
        center_writers(sd, roles)
        cfg.norm_type = "rmsnorm"
        notes.append("LayerNorm → RMSNorm: residual writers and embeddings centred")
    if keep:  # output norms keep their vectors, so every norm carries one (the folded ones: all ones)
        for norm in roles.norms:
            sd[f"{norm}.weight"] = sd[f"{norm}.weight"].expand(cfg.n_embd).clone()
        notes.append("peri-LN output norms keep their per-dimension gains (output_gains='carry')")
        return sd, cfg, notes
    cfg.norm_gain = "scalar"
    return sd, cfg, notes


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
    """g → g·√(d/m): RMSNorm over m coordinates of T·h is √(m/d)·T·norm_d(h) for orthonormal-column T. A
    per-dimension gain becomes √(d/m)·``diagonal_fit``(T, g): T·g for a coordinate map (a new coordinate, which
    the ported model never writes, gets the mean gain); a gain of equal entries stays one."""
    if g.numel() > 1 and bool((g != g[0]).any()):
        return diagonal_fit(maps.T, g)[0].to(g.dtype) * math.sqrt(maps.d / maps.m)
    if g.numel() > 1:
        return g.new_full((maps.m,), float(g[0])) * math.sqrt(maps.d / maps.m)
    return g * math.sqrt(maps.d / maps.m)


def is_coordinate_map(T: torch.Tensor) -> bool:
    """T (m×d) maps coordinates to coordinates: 0/1 entries, at most one 1 per row and per column (kind='truncate';
    a permutation). Only such a T commutes with a per-dimension gain: T·diag(γ) = diag(T·γ + …)·T."""
    binary = bool(((T == 0) | (T == 1)).all())
    return binary and bool((T.sum(0) <= 1).all()) and bool((T.sum(1) <= 1).all())


def port_shortcut(S: torch.Tensor, maps: PortMaps) -> torch.Tensor:
    """S → T·S·T⁺: a residual-path matrix (a per-block transform's shortcut) acts on T·h as S did on h."""
    return maps.T @ S @ maps.T_pinv


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
    plan.update({f"{shortcut}.weight": port_shortcut for shortcut in roles.shortcuts})
    if porting == "sandwich":
        for attn in roles.attention:
            plan.update({f"{attn}.c_attn.weight": sandwich_attention, f"{attn}.c_attn.bias": sandwich_attention,
                         f"{attn}.c_proj.weight": sandwich_output})
    return {name: plan.get(name, keep) for name in names}


def rescale_tied_embedding(out: dict, cfg: GPTConfig, d: int, m: int) -> None:
    """A tied model whose input scale is √d (Gemma: the embeddings × √d on the way in, the head reading E itself)
    keeps that rule at width m: s' = √m, E' → c·E', the final gain → g/c with c = √(d/m), so the input c·E'·√m =
    E'·√d and the head (c·E')·diag(g/c) are unchanged (Gemma's exports derive the scale from the width)."""
    if abs(cfg.embed_scale - math.sqrt(d)) > 1e-6 * math.sqrt(d) or m == d:
        return
    c = math.sqrt(d / m)
    out["transformer.wte.weight"] = out["transformer.wte.weight"] * c
    out["lm_head.weight"] = out["transformer.wte.weight"]
    out["transformer.ln_f.weight"] = out["transformer.ln_f.weight"] / c
    if out.get("transformer.ln_f.bias") is not None and cfg.norm_gain == "vector":  # g ⊙ n + β: β reaches the head too
        out["transformer.ln_f.bias"] = out["transformer.ln_f.bias"] / c
    cfg.embed_scale = math.sqrt(m)


def rescale_tied_input(model: GPT, d: int) -> float | None:
    """``rescale_tied_embedding`` on a finished model of width m (in place): a head that a refit retied at width m
    (``--tie_head``) keeps the source's input scale √d, which computes the same function but which Gemma's exports
    cannot say (they derive the scale from the width). E → c·E, the final gain (and a LayerNorm's shift) → ·/c,
    s → √m with c = √(d/m). Returns c, or None where nothing applies (no tied head, no √d input scale, m = d, or a
    final norm without a gain to take 1/c)."""
    cfg, m = model.config, model.config.n_embd
    if (cfg.head != "tied" or m == d or abs(cfg.embed_scale - math.sqrt(d)) > 1e-6 * math.sqrt(d)
            or getattr(model.transformer.ln_f, "weight", None) is None):
        return None
    c = math.sqrt(d / m)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(c)  # the tied head reads this same parameter
        model.transformer.ln_f.weight.div_(c)
        ln_f = model.transformer.ln_f
        if getattr(ln_f, "bias", None) is not None and getattr(ln_f, "gain", "vector") == "vector":
            ln_f.bias.div_(c)  # g ⊙ n + β reaches the head as c·E: β too (a scalar gain multiplies n + β whole)
    cfg.embed_scale = math.sqrt(m)
    return c


def port_weights(sd: dict, cfg: GPTConfig, T: torch.Tensor, T_pinv: torch.Tensor, porting: str,
                 reader_T_pinv: torch.Tensor | None = None, rescale_gains: bool = True,
                 notes: list[str] | None = None, output_lengths: torch.Tensor | None = None
                 ) -> tuple[dict, GPTConfig]:
    """Map a canonical (state_dict, config) of width d to width m = T.shape[0] by ``porting_plan``. ``sd`` is
    consumed (entries removed as they are ported, so peak memory stays near two copies of the model). Tied and
    KNN heads follow the embeddings; norm ε × d/m (unless ``rescale_gains=False``, which keeps gains and ε);
    ``sandwich`` sets head_dim = m / n_head. ``reader_T_pinv`` replaces T⁺ in the readers (grow symmetry breaking).
    Per-dimension gains only where ``canonicalize`` kept them (peri-LN output norms, ``carry_output_norms``; the
    other norms all ones) or for a coordinate map; ``notes`` gets an APPROXIMATE line where the carry is not exact."""
    roles = residual_roles(cfg)
    final_kept = cfg.head == "tied" and cfg.norm_gain == "vector"  # canonicalize(keep_tied=True) kept its gain
    carried = (cfg.norm_gain == "vector" and bool(roles.output_norms) and porting in ("residual", "head")
               and rescale_gains and all(bool((sd[f"{n}.weight"] == 1).all()) for n, _ in roles.norm_readers
                                         if not (final_kept and n == "transformer.ln_f")))
    if cfg.norm_gain == "vector" and not carried and not is_coordinate_map(T):
        raise TransformError("port_weights needs scalar norm gains (or a coordinate map T); run canonicalize first")
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
    out: dict = {}
    if carried:
        out, residual = carry_output_norms(sd, cfg, maps, output_lengths)
        if final_kept:
            gamma = sd.pop("transformer.ln_f.weight")
            fitted, final_residual = diagonal_fit(maps.T, gamma)
            out["transformer.ln_f.weight"] = (fitted * math.sqrt(maps.d / maps.m)).to(gamma.dtype)
            residual = max(residual, final_residual)  # Tᵀ·diag(g')·T = √(d/m)·diag(γ): the tied head reads E·Tᵀ
        if not math.isfinite(residual):
            raise TransformError(f"the carried output lengths are not finite (residual {residual}): report this with "
                                 "the model and the map")
        if residual > CARRY_EXACT and notes is not None:
            notes.append(f"APPROXIMATE: peri-LN output gains{' and the final gain' if final_kept else ''} carried "
                         f"through T with a relative residual of "
                         f"{residual:.2g} (‖diag(γ)·Tᵀ·diag(a)·T·diag(γ) − I‖/√d: this T mixes coordinates of "
                         "unequal gain or drops some; "
                         "the direction each output norm writes is exact, its length is not — kind='split' or "
                         "zero-padding is exact)")
    plan = porting_plan(list(sd), cfg, porting, rescale_gains)
    out.update({name: plan[name](sd.pop(name), maps) for name in list(sd)})
    if cfg.head == "tied":
        out["lm_head.weight"] = out["transformer.wte.weight"]
    cfg = copy.deepcopy(cfg)
    if carried and final_kept:
        rescale_tied_embedding(out, cfg, d, m)
    cfg.n_embd = m
    if rescale_gains:
        if cfg.qk_norm and cfg.qk_norm_eps is None and m != d:  # the q/k norms (over head_dim) keep their ε
            cfg.qk_norm_eps = cfg.norm_eps
        cfg.norm_eps = cfg.norm_eps * d / m
    if porting == "sandwich":
        cfg.head_dim = m // cfg.n_head
    return out, cfg


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
