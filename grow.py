"""
Growing more than the residual stream (``transform.py --n_head=H --mlp_hidden=F``): more attention heads and
more MLP neurons, every mode function-preserving, combinable with the residual map T and its symmetry breaking.
Each rule is one function; the docstring is its equation.

- ``zero`` (``--grow_mode=zero``): new heads / neurons read with fresh weights (N(0, 0.02), as at init) and write
  through zero output columns: W_out = [W_out, 0]. Their outputs are multiplied by 0, so the function is
  unchanged, and the zero columns receive gradient from the first step (the new units are active).
- ``clone`` (HyperCloning-style): each head / neuron j becomes k copies with identical input weights whose
  output columns split it, W_out[:, j]/k + ε_i with Σ_i ε_i = 0 (ε ~ N(0, σ²), ``--clone_noise=σ``, centred
  over the copies). The copies compute the same activation a_j, so Σ_i (W_out[:, j]/k + ε_i)·a_j = W_out[:, j]·a_j:
  the function is unchanged; the noise breaks the symmetry between copies. Needs new = k × old.

Heads keep their size (head_dim) and the attention scale; the residual width is T's business (transform.py).
"""
from __future__ import annotations

import torch

from errors import TransformError
from model import GPTConfig

GROW_MODES = ("zero", "clone")


def check_growth(cfg: GPTConfig, n_head: int, mlp_hidden: int, mode: str) -> None:
    """Raise TransformError for a head / MLP growth request that cannot apply to ``cfg``."""
    if mode not in GROW_MODES:
        raise TransformError(f"grow_mode={mode!r} is not one of {GROW_MODES}")
    for what, new, old in (("n_head", n_head, cfg.n_head), ("mlp_hidden", mlp_hidden, cfg.mlp_hidden)):
        if new and new < old:
            raise TransformError(f"{what}={new} is below the model's {old}: growth adds heads and neurons, it does "
                                 f"not remove them (shrink the residual with --width instead)")
        if new and mode == "clone" and new % old:
            raise TransformError(f"grow_mode='clone' makes k copies of each unit: {what}={new} must be a multiple "
                                 f"of the model's {old}")


def _fresh(rows: int, cols: int, g: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    return (0.02 * torch.randn(rows, cols, generator=g, dtype=torch.float64)).to(like.dtype)


def _split_columns(W: torch.Tensor, k: int, sigma: float, g: torch.Generator) -> torch.Tensor:
    """[W/k + ε_1, ..., W/k + ε_k] with Σ ε_i = 0: k column blocks that sum to W."""
    noise = sigma * torch.randn(k, *W.shape, generator=g, dtype=torch.float64)
    noise = (noise - noise.mean(0)).to(W.dtype)
    return torch.cat([W / k + noise[i] for i in range(k)], dim=1)


def grow_heads(sd: dict, cfg: GPTConfig, n_head: int, mode: str, sigma: float, g: torch.Generator) -> None:
    """Q, K, V get rows and c_proj gets columns for the new heads (in place; ``cfg.n_head`` updated)."""
    old, hd = cfg.n_head, cfg.head_dim
    if n_head <= old:
        return
    k = n_head // old
    for i in range(cfg.n_layer):
        a = f"transformer.h.{i}.attn"
        W, Wo = sd[f"{a}.c_attn.weight"], sd[f"{a}.c_proj.weight"]
        blocks = W.split(old * hd)  # Q, K, V
        bias = sd.get(f"{a}.c_attn.bias")
        if mode == "clone":
            sd[f"{a}.c_attn.weight"] = torch.cat([b.repeat(k, 1) for b in blocks])
            if bias is not None:
                sd[f"{a}.c_attn.bias"] = torch.cat([b.repeat(k) for b in bias.split(old * hd)])
            sd[f"{a}.c_proj.weight"] = _split_columns(Wo, k, sigma, g)
        else:
            extra = (n_head - old) * hd
            sd[f"{a}.c_attn.weight"] = torch.cat([torch.cat([b, _fresh(extra, W.shape[1], g, W)]) for b in blocks])
            if bias is not None:
                sd[f"{a}.c_attn.bias"] = torch.cat([torch.cat([b, b.new_zeros(extra)]) for b in bias.split(old * hd)])
            sd[f"{a}.c_proj.weight"] = torch.cat([Wo, Wo.new_zeros(Wo.shape[0], extra)], dim=1)
    cfg.n_head = n_head


def grow_mlp(sd: dict, cfg: GPTConfig, mlp_hidden: int, mode: str, sigma: float, g: torch.Generator) -> None:
    """c_fc rows (both halves for SwiGLU) and c_proj columns for the new neurons (in place; config updated)."""
    old = cfg.mlp_hidden
    if mlp_hidden <= old:
        return
    k = mlp_hidden // old
    halves = 2 if cfg.mlp == "swiglu" else 1  # SwiGLU's c_fc is [gate; up]
    for i in range(cfg.n_layer):
        m = f"transformer.h.{i}.mlp"
        W, Wo = sd[f"{m}.c_fc.weight"], sd[f"{m}.c_proj.weight"]
        bias = sd.get(f"{m}.c_fc.bias")
        if mode == "clone":
            sd[f"{m}.c_fc.weight"] = torch.cat([h.repeat(k, 1) for h in W.chunk(halves)])
            if bias is not None:
                sd[f"{m}.c_fc.bias"] = torch.cat([h.repeat(k) for h in bias.chunk(halves)])
            sd[f"{m}.c_proj.weight"] = _split_columns(Wo, k, sigma, g)
        else:
            extra = mlp_hidden - old
            sd[f"{m}.c_fc.weight"] = torch.cat([torch.cat([h, _fresh(extra, W.shape[1], g, W)])
                                                for h in W.chunk(halves)])
            if bias is not None:
                sd[f"{m}.c_fc.bias"] = torch.cat([torch.cat([h, h.new_zeros(extra)]) for h in bias.chunk(halves)])
            sd[f"{m}.c_proj.weight"] = torch.cat([Wo, Wo.new_zeros(Wo.shape[0], extra)], dim=1)
    cfg.mlp_hidden = mlp_hidden
