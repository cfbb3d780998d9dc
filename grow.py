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

from collections.abc import Callable
from dataclasses import dataclass

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
    """0.02·N(0, 1) drawn on the CPU (the same draw on every device), then put where ``like`` lives."""
    return (0.02 * torch.randn(rows, cols, generator=g, dtype=torch.float64)).to(like)


def _split_columns(W: torch.Tensor, k: int, sigma: float, g: torch.Generator) -> torch.Tensor:
    """[W/k + ε_1, ..., W/k + ε_k] with Σ ε_i = 0: k column blocks that sum to W."""
    noise = sigma * torch.randn(k, *W.shape, generator=g, dtype=torch.float64)
    noise = (noise - noise.mean(0)).to(W)
    return torch.cat([W / k + noise[i] for i in range(k)], dim=1)


@dataclass
class UnitGrowth:
    """How one tensor of the grown units is made, given the old units' tensor and the new unit count along its
    unit axis: ``inputs`` for the rows of Q/K/V or c_fc (weights and biases), ``outputs`` for c_proj's columns."""
    inputs: Callable[[torch.Tensor, int], torch.Tensor]
    outputs: Callable[[torch.Tensor, int], torch.Tensor]


def weight_growth(mode: str, sigma: float, g: torch.Generator) -> UnitGrowth:
    """The weights of the new units: ``zero`` (fresh inputs, zero outputs) or ``clone`` (copies, split outputs)."""
    if mode == "clone":
        return UnitGrowth(inputs=lambda t, n: t.repeat(n // len(t), *[1] * (t.dim() - 1)),
                          outputs=lambda W, n: _split_columns(W, n // W.shape[1], sigma, g))

    def fresh_inputs(t: torch.Tensor, n: int) -> torch.Tensor:
        extra = t.new_zeros(n - len(t)) if t.dim() == 1 else _fresh(n - len(t), t.shape[1], g, t)
        return torch.cat([t, extra])

    return UnitGrowth(inputs=fresh_inputs, outputs=_zero_columns)


def moment_growth(mode: str, power: int) -> UnitGrowth:
    """AdamW's moments of the new units, as their gradients map (``power`` 1: exp_avg, 2: exp_avg_sq).
    ``zero``: new units start with no history (zeros). ``clone``: each copy's input rows get gradient/k (k copies
    share the output, each carrying 1/k of it), so moments/k^power; each split output column sees the same
    activation and upstream gradient as the original column, so its moments are the original's."""
    if mode == "clone":
        return UnitGrowth(inputs=lambda t, n: t.repeat(n // len(t), *[1] * (t.dim() - 1)) / (n // len(t)) ** power,
                          outputs=lambda W, n: W.repeat(1, n // W.shape[1]))
    return UnitGrowth(inputs=lambda t, n: torch.cat([t, t.new_zeros(n - len(t), *t.shape[1:])]),
                      outputs=_zero_columns)


def _zero_columns(W: torch.Tensor, n: int) -> torch.Tensor:
    return torch.cat([W, W.new_zeros(W.shape[0], n - W.shape[1])], dim=1)


def grow_heads(sd: dict, cfg: GPTConfig, n_head: int, growth: UnitGrowth) -> None:
    """Q, K, V get rows and c_proj gets columns for the new heads (in place; ``cfg.n_head`` updated). Tensors
    missing from ``sd`` are skipped (an optimizer may hold no state for some)."""
    old, hd = cfg.n_head, cfg.head_dim
    if n_head <= old:
        return
    for i in range(cfg.n_layer):
        a = f"transformer.h.{i}.attn"
        for name in (f"{a}.c_attn.weight", f"{a}.c_attn.bias"):
            if name in sd:  # Q, K and V each grow from old·hd to n_head·hd rows
                sd[name] = torch.cat([growth.inputs(block, n_head * hd) for block in sd[name].split(old * hd)])
        if f"{a}.c_proj.weight" in sd:
            sd[f"{a}.c_proj.weight"] = growth.outputs(sd[f"{a}.c_proj.weight"], n_head * hd)
    cfg.n_head = n_head


def grow_mlp(sd: dict, cfg: GPTConfig, mlp_hidden: int, growth: UnitGrowth) -> None:
    """c_fc rows (both halves for SwiGLU) and c_proj columns for the new neurons (in place; config updated)."""
    old = cfg.mlp_hidden
    if mlp_hidden <= old:
        return
    halves = 2 if cfg.mlp == "swiglu" else 1  # SwiGLU's c_fc is [gate; up]
    for i in range(cfg.n_layer):
        m = f"transformer.h.{i}.mlp"
        for name in (f"{m}.c_fc.weight", f"{m}.c_fc.bias"):
            if name in sd:
                sd[name] = torch.cat([growth.inputs(half, mlp_hidden) for half in sd[name].chunk(halves)])
        if f"{m}.c_proj.weight" in sd:
            sd[f"{m}.c_proj.weight"] = growth.outputs(sd[f"{m}.c_proj.weight"], mlp_hidden)
    cfg.mlp_hidden = mlp_hidden
