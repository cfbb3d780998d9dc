"""
Fake quantization (symmetric round-to-nearest), to measure what a same-width rotation does to quantization error —
the paper's application at m = d, and QuaRot's / SpinQuant's setting.

    Q(x) = round(x / s)·s,   s = max|x| / (2^(b−1) − 1),   one scale per row of x

- weights: every linear layer inside the blocks, one scale per output channel (row of W), or per group of
  ``group`` input columns of each row (``group`` > 0: 128 is usual for int4, 64 where 128 does not divide d);
- activations: the inputs of linear layers, one scale per token, at the residual stream's readers
  (``readers``: attention's c_attn and the MLP's c_fc read norm(h), the states a residual rotation changes) or
  at every linear layer in the blocks (``all``: the attention output and the MLP hidden state too, which a
  residual rotation leaves as they are — QuaRot rotates those online);
- the embedding and the head stay in float, as in QuaRot, SpinQuant and GPTQ's evaluations.

The weights are rounded in place on a copy; activations through forward pre-hooks on that copy.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from lgpt.plumbing.errors import ConfigError
from model import GPT

READERS = ("attn.c_attn", "mlp.c_fc")  # linear layers whose input is a normalized residual state
ACTIVATION_SITES = ("readers", "all")


@dataclass(frozen=True)
class Quantization:
    """What is rounded, to how many bits: weight_bits / act_bits 0 = left in float."""
    weight_bits: int = 0
    group: int = 0  # weights: 0 = one scale per output channel, else per group of this many input columns
    act_bits: int = 0
    act_at: str = "readers"  # 'readers' | 'all'

    def check(self) -> None:
        for name in ("weight_bits", "act_bits"):
            if getattr(self, name) not in (0, 2, 3, 4, 5, 6, 7, 8):
                raise ConfigError(f"{name} must be 0 (float) or 2…8, got {getattr(self, name)}")
        if self.group < 0 or self.act_at not in ACTIVATION_SITES:
            raise ConfigError(f"group must be >= 0 and act_at one of {ACTIVATION_SITES}, got {self.group}, "
                              f"{self.act_at!r}")

    @property
    def label(self) -> str:
        """W4, W4g64 (groups of 64), W4A4 (activations at the readers), W8A8all (at every linear layer), float."""
        w = f"W{self.weight_bits}" + (f"g{self.group}" if self.group else "") if self.weight_bits else ""
        a = f"A{self.act_bits}" + ("all" if self.act_at == "all" else "") if self.act_bits else ""
        return (w + a) or "float"


def rtn_rows(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round-to-nearest with one symmetric scale per row (last axis), s = max|x_r| / (2^(b−1) − 1)."""
    qmax = 2 ** (bits - 1) - 1
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / qmax
    return (x / scale).round().clamp(-qmax, qmax) * scale


def rtn_weight(W: torch.Tensor, bits: int, group: int = 0) -> torch.Tensor:
    """W rounded per output channel, or per group of ``group`` consecutive input columns of each row."""
    if not group:
        return rtn_rows(W, bits)
    if W.shape[1] % group:
        raise ConfigError(f"group={group} does not divide the layer's {W.shape[1]} input columns; pick a divisor "
                          "(SmolLM2's 576 and 1536 take 64 or 32)")
    return rtn_rows(W.reshape(W.shape[0], -1, group), bits).reshape(W.shape)


def block_linears(model: GPT, where: str = "all") -> dict[str, torch.nn.Linear]:
    """The linear layers inside the blocks (name → module): all of them, or the residual's readers."""
    return {name: module for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name.startswith("transformer.h.")
            and ".shortcut_" not in name and (where == "all" or name.endswith(READERS))}


@torch.no_grad()
def fake_quantized(model: GPT, q: Quantization) -> GPT:
    """A copy of ``model`` that computes as its quantized version: weights rounded, activations rounded per token."""
    q.check()
    out = copy.deepcopy(model).eval()
    if q.weight_bits:
        for module in block_linears(out).values():
            module.weight.copy_(rtn_weight(module.weight, q.weight_bits, q.group))
    if q.act_bits:
        for module in block_linears(out, q.act_at).values():
            module.register_forward_pre_hook(lambda _m, inputs: (rtn_rows(inputs[0], q.act_bits),))
    return out


@torch.no_grad()
def activation_outliers(model: GPT, idx: torch.Tensor) -> dict[str, float]:
    """How outlier-heavy the readers' inputs are on ``idx``: the mean over tokens and readers of max|x| / rms(x)
    (√d for a one-hot token, 1 for a flat one) and of the excess kurtosis per token."""
    ratios, kurtoses = [], []

    def record(_m, inputs):
        x = inputs[0].double().reshape(-1, inputs[0].shape[-1])
        rms = x.pow(2).mean(-1).sqrt().clamp_min(1e-12)
        ratios.append((x.abs().amax(-1) / rms).mean().item())
        centred = x - x.mean(-1, keepdim=True)
        var = centred.pow(2).mean(-1).clamp_min(1e-24)
        kurtoses.append((centred.pow(4).mean(-1) / var.pow(2) - 3).mean().item())

    handles = [m.register_forward_pre_hook(record) for m in block_linears(model, "readers").values()]
    try:
        model(idx)
    finally:
        for h in handles:
            h.remove()
    return {"max_over_rms": sum(ratios) / len(ratios), "kurtosis": sum(kurtoses) / len(kurtoses)}
