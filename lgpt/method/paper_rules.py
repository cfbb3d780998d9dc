"""
The LGPT paper's two porting rules, beside ours (porting.py), each inside its stated domain (``check_porting``):

- ``sandwich`` (the paper's equations): ``sandwich_attention`` T·W·T⁺ on each of Q, K, V and
  ``sandwich_output`` T·W·T⁺ on O, with the heads re-split to m / n_head dimensions (which mixes heads: the
  function changes even for an orthogonal T at m = d). Everything else as ``residual`` porting.
- ``paper_code`` (the paper's public implementation, re-implemented from its description): no canonicalization;
  ``paper_code_map`` maps every axis of length d by shape (last axis t·Tᵀ, first axis T·t, so readers get Tᵀ
  rather than T⁺ and d×d matrices T·W·Tᵀ), per-dimension gains become T·γ, ε stays, heads are re-split, and its
  orthogonal map is Qᵀ/√m (``paper_code_projection``).
- ``restore_attention_scale`` (``--restore_attn_scale``): Q × √(m/d), so the attention logits keep their
  original 1/√(d/n_head) scale — it isolates the part of the rules' loss due to the scale change.
"""
from __future__ import annotations

import copy
import math

import torch

from lgpt.method.maps import PortMaps
from lgpt.method.roles import residual_roles
from lgpt.plumbing.errors import TransformError
from model import GPTConfig

PAPER_CODE_KINDS = ("gaussian", "orthogonal")  # the JL maps of the paper's public code


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
    if porting in ("sandwich", "paper_code") and (cfg.qk_norm or cfg.attn_scale is not None):
        raise TransformError(f"porting={porting!r} re-splits the heads to m/n_head dimensions, but this model's "
                             + ("per-head QK-norm gains" if cfg.qk_norm else "explicit attention scale")
                             + " belong to its head size; use porting='residual' (heads kept)")
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


def sandwich_attention(W: torch.Tensor, maps: PortMaps) -> torch.Tensor:
    """The paper's Q, K, V → T·W·T⁺ (each d×d block of c_attn; biases T·b), heads re-split to m / n_head."""
    if W.dim() == 1:
        return torch.cat([maps.T @ p for p in W.split(maps.d)])
    return torch.cat([maps.T @ p @ maps.T_pinv for p in W.split(maps.d, dim=0)])


def sandwich_output(W: torch.Tensor, maps: PortMaps) -> torch.Tensor:
    """The paper's O → T·W·T⁺ (the attention output projection, d×d)."""
    return maps.T @ W @ maps.T_pinv


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
