"""
One GPT language model whose config selects every architecture variant nanoLGPT studies.

Read it top to bottom: config, norms, attention (with optional RoPE), MLP (GELU or SwiGLU),
a block (pre-LN or peri-LN), the heads (linear, tied, KNN) and the GPT itself.

The residual width ``n_embd`` is kept separate from the attention inner width
(``n_head * head_dim``) and the MLP width (``mlp_hidden``) so that ``transform.py`` can change
the residual width alone and leave heads and MLP untouched.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from functools import partial

import torch
import torch.nn as nn
from torch.nn import functional as F

NORM_TYPES = ("layernorm", "rmsnorm")
NORM_GAINS = ("vector", "scalar", "none")
NORM_PLACEMENTS = ("pre", "peri")
HEADS = ("linear", "tied", "knn")
POSITIONS = ("learned", "rope")
MLPS = ("gelu", "gelu_tanh", "swiglu", "geglu")  # gelu_tanh: GPT-2's "gelu_new"; geglu: Gemma's (tanh GELU gate)
GATED_MLPS = ("swiglu", "geglu")  # c_fc holds [gate; up]


@dataclass
class GPTConfig:
    # model
    block_size: int = 1024  # context length (positions)
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention (query) heads
    n_kv_head: int | None = None  # key/value heads (grouped-query attention): None = n_head; 1 = multi-query
    n_embd: int = 768  # residual width d: the axis transform.py changes
    head_dim: int | None = None  # None: n_embd // n_head
    mlp_hidden: int | None = None  # None: 4 * n_embd (gelu) or the LLaMA SwiGLU size
    dropout: float = 0.0  # dropout probability (0 for pretraining small models, 0.1+ for finetuning)
    bias: bool = True  # biases in Linear layers and LayerNorm (with vector gains)
    qkv_bias: bool | None = None  # biases on Q, K, V only (Qwen2: True with bias=False); None = follow bias
    norm_type: str = "layernorm"  # 'layernorm' | 'rmsnorm'
    norm_gain: str = "vector"  # 'vector' (per dimension) | 'scalar' (one gain) | 'none'
    norm_placement: str = "pre"  # 'pre' | 'peri' (also a norm on each sublayer output, Gemma 2/3)
    norm_eps: float = 1e-5  # ε inside the norm's square root, > 0
    head: str = "linear"  # LM head: 'linear' | 'tied' (to the embeddings) | 'knn' (−‖h − e_j‖² + b_j)
    head_bias: bool = False  # a per-token logit bias on the linear/tied head (the KNN head always has one)
    pos: str = "learned"  # positions: 'learned' | 'rope'
    rope_base: float = 10000.0  # RoPE θ_i = rope_base^(−2i/head_dim) (Hugging Face's rope_theta)
    rope_scaling: dict | None = None  # Llama 3.1's {'rope_type': 'llama3', 'factor', 'low_freq_factor', ...}
    mlp: str = "gelu"  # 'gelu' | 'gelu_tanh' (GPT-2's gelu_new) | 'swiglu'
    norm_reg: float = 0.0  # λ of the hidden-state norm regularizer (0 disables it)
    qk_norm: bool = False  # a per-head RMSNorm (per-dimension gain) on queries and keys before RoPE (Gemma 3, Qwen3)
    qk_norm_eps: float | None = None  # ε of those q/k norms (None: norm_eps); a width map rescales only norm_eps
    attn_scale: float | None = None  # attention logits × this; None: 1/√head_dim (Gemma 3: query_pre_attn_scalar^−½)
    attn_window: int = 0  # > 0: sliding-window attention over the last attn_window positions (Gemma 3's local layers)
    global_every: int = 0  # with attn_window: every global_every-th block (i + 1 ≡ 0) attends to all positions
    rope_local_base: float | None = None  # RoPE base of the windowed blocks (Gemma 3: 10,000); None: rope_base
    embed_scale: float = 1.0  # token embeddings × this on the way in (Gemma: √d); the tied head reads E unscaled
    shortcuts: bool | tuple[int, ...] = False  # an m×m matrix on each sublayer's residual path, h ← S·h + f(norm(h))
    #   (SliceGPT's per-block maps: transform.py --porting=per_block writes them; identity at init); a tuple: only on
    #   these paths, 2·layer for a block's attention and 2·layer + 1 for its MLP (--map_groups: sites that share a map)

    def __post_init__(self) -> None:
        """Check every field and fill the derived widths; raises ValueError naming the field and the fix."""
        choices = {
            "norm_type": NORM_TYPES, "norm_gain": NORM_GAINS, "norm_placement": NORM_PLACEMENTS,
            "head": HEADS, "pos": POSITIONS, "mlp": MLPS,
        }
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {allowed}")
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        self._fill_widths()
        self._check_values()

    def _fill_widths(self) -> None:
        if self.head_dim is None:
            if self.n_embd % self.n_head:
                raise ValueError(
                    f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                    "change one of them or set head_dim explicitly")
            self.head_dim = self.n_embd // self.n_head
        if self.mlp_hidden is None:
            if self.mlp != "swiglu":
                self.mlp_hidden = 4 * self.n_embd
            else:  # LLaMA: 2/3 of 4d, rounded up to a multiple of 64, keeps the parameter count of a GELU MLP
                self.mlp_hidden = 64 * math.ceil(8 * self.n_embd / 3 / 64)

    def _check_values(self) -> None:
        for name in ("head_dim", "mlp_hidden"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer (or None: the default), got {getattr(self, name)}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0 (it keeps the norm's division finite), got {self.norm_eps}")
        if self.pos == "rope" and not self.rope_base > 0:
            raise ValueError(f"rope_base must be > 0 (θ_i = rope_base^(−2i/head_dim)), got {self.rope_base}")
        if self.pos == "rope" and self.head_dim % 2:
            raise ValueError(f"pos='rope' needs an even head_dim, got {self.head_dim}")
        if self.n_kv_head is not None and not (0 < self.n_kv_head <= self.n_head and self.n_head % self.n_kv_head == 0):
            raise ValueError(f"n_kv_head={self.n_kv_head} must divide n_head={self.n_head} (each key/value head "
                             "serves n_head/n_kv_head query heads); None means n_head")
        if self.rope_scaling is not None:
            if self.pos != "rope":
                raise ValueError("rope_scaling needs pos='rope'")
            check_rope_scaling(self.rope_scaling)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.norm_reg < 0:
            raise ValueError(f"norm_reg must be >= 0, got {self.norm_reg}")
        self._check_attention()
        if not self.embed_scale > 0:
            raise ValueError(f"embed_scale must be > 0, got {self.embed_scale}")
        if not isinstance(self.qk_norm, bool):
            raise ValueError(f"qk_norm must be True or False, got {self.qk_norm!r}")
        if self.qk_norm_eps is not None and not self.qk_norm_eps > 0:
            raise ValueError(f"qk_norm_eps must be > 0 (or None: norm_eps), got {self.qk_norm_eps}")
        self._check_shortcuts()

    def _check_shortcuts(self) -> None:
        """shortcuts: a bool, or the sorted distinct residual paths (0 … 2·n_layer − 1) that carry a matrix."""
        if isinstance(self.shortcuts, tuple):
            paths = self.shortcuts
            if not all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p < 2 * self.n_layer for p in paths) \
                    or list(paths) != sorted(set(paths)):
                raise ValueError(f"shortcuts must be True, False or sorted distinct paths in 0 … {2 * self.n_layer - 1}"
                                 f" (2·layer: attention, 2·layer + 1: MLP), got {self.shortcuts!r}")
            self.shortcuts = paths if paths else False
        elif not isinstance(self.shortcuts, bool):
            raise ValueError(f"shortcuts must be True, False or a tuple of residual paths, got {self.shortcuts!r}")

    def has_shortcut(self, layer: int, which: int) -> bool:
        """Whether sublayer ``which`` (1: attention, 2: MLP) of block ``layer`` has a shortcut matrix."""
        if isinstance(self.shortcuts, tuple):
            return 2 * layer + which - 1 in self.shortcuts
        return self.shortcuts

    def _check_attention(self) -> None:
        if self.attn_window < 0 or self.global_every < 0:
            raise ValueError(f"attn_window and global_every must be >= 0, got {self.attn_window}, {self.global_every}")
        if self.global_every and not self.attn_window:
            raise ValueError("global_every marks the full-attention blocks among windowed ones: set attn_window > 0")
        if self.attn_scale is not None and not self.attn_scale > 0:
            raise ValueError(f"attn_scale must be > 0 (or None: 1/√head_dim), got {self.attn_scale}")
        if self.rope_local_base is not None and not (self.pos == "rope" and self.rope_local_base > 0):
            raise ValueError(f"rope_local_base needs pos='rope' and a value > 0, got {self.rope_local_base}")

    def extra_parts(self) -> list[str]:
        """The parts beyond GPT-2 / Llama that are switched on ('field=value'): what those exports cannot hold."""
        plain = {"qk_norm": False, "attn_window": 0, "attn_scale": None, "embed_scale": 1.0, "rope_local_base": None,
                 "shortcuts": False}
        return [f"{k}={getattr(self, k)!r}" for k, v in plain.items() if getattr(self, k) != v]

    def windowed(self, layer: int) -> bool:
        """Whether block ``layer`` attends over a sliding window (attn_window) rather than all positions."""
        return self.attn_window > 0 and not (self.global_every and (layer + 1) % self.global_every == 0)

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads (n_head unless grouped-query attention)."""
        return self.n_kv_head or self.n_head

    @property
    def attn_bias(self) -> bool:
        """Whether Q, K and V have biases."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


# ----------------------------------------------------------------------------------------------
# Norms


class Norm(nn.Module):
    """LayerNorm or RMSNorm over the last axis with a per-dimension, scalar or no gain.

    ``vector``: y = γ ⊙ n(x) (+ β for LayerNorm when bias=True); ``scalar``: y = g · n(x);
    ``none``: y = n(x). n(x) = (x − mean x) / √(var x + ε) or x / √(mean x² + ε).
    """

    def __init__(self, dim: int, norm_type: str, gain: str, bias: bool, eps: float):
        super().__init__()
        self.dim, self.norm_type, self.gain, self.eps = dim, norm_type, gain, eps
        self.weight = nn.Parameter(torch.ones(dim if gain == "vector" else 1)) if gain != "none" else None
        use_bias = bias and gain == "vector" and norm_type == "layernorm"
        self.bias = nn.Parameter(torch.zeros(dim)) if use_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        vector_weight = self.weight if self.gain == "vector" else None
        if self.norm_type == "layernorm":
            y = F.layer_norm(x, (self.dim,), vector_weight, self.bias, self.eps)
        else:
            y = F.rms_norm(x, (self.dim,), vector_weight, self.eps)
        return y * self.weight if self.gain == "scalar" else y


def make_norm(config: GPTConfig) -> Norm:
    return Norm(config.n_embd, config.norm_type, config.norm_gain, config.bias, config.norm_eps)


# ----------------------------------------------------------------------------------------------
# Attention


LLAMA3_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def check_rope_scaling(scaling: dict) -> None:
    """Raise ValueError unless ``scaling`` is Llama 3.1's RoPE scaling with all its parameters."""
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: 'llama3')")
    missing = [k for k in LLAMA3_SCALING_KEYS if k not in scaling]
    if missing:
        raise ValueError(f"rope_scaling of type 'llama3' lacks {missing}")
    if not scaling["high_freq_factor"] > scaling["low_freq_factor"] > 0 or not scaling["factor"] > 0:
        raise ValueError("rope_scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0")


def llama3_frequencies(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's RoPE scaling: wavelengths 2π/θ_i above original_max_position_embeddings / low_freq_factor are
    slowed by ``factor``, those below original_max_position_embeddings / high_freq_factor kept, and those between
    interpolated smoothly (s = (L_orig/λ − low)/(high − low); θ' = (1 − s)·θ/factor + s·θ)."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    medium = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def shared_rope_tables(head_dim: int, length: int, base: float, scaling: dict | None = None,
                       device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``rope_tables``, one copy per distinct table: every block with the same RoPE shares it (a long context would
    otherwise hold n_layer copies). Keyed by the device the tables land on, so that tables made under
    ``with torch.device("meta")`` (GPT.from_state_dict) are never handed to a model built on the CPU."""
    device = torch.empty(0, device=device).device  # None: the current default, which a device context changes
    key = (head_dim, length, base, tuple(sorted((scaling or {}).items())), str(device))
    if key not in _ROPE_CACHE:
        if len(_ROPE_CACHE) > 8:
            _ROPE_CACHE.clear()
        _ROPE_CACHE[key] = rope_tables(head_dim, length, base, scaling, device)
    return _ROPE_CACHE[key]


_ROPE_CACHE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def rope_tables(head_dim: int, length: int, base: float, scaling: dict | None = None,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (length, head_dim/2) of the rotary embedding θ_i = base^(−2i/head_dim), Llama-3-scaled
    when ``scaling`` is given."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    if scaling is not None:
        inv_freq = llama3_frequencies(inv_freq, scaling)
    angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_2i, x_2i+1) of x (B, H, T, hd) by the angle t·θ_i of its position t."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class KVCache:
    """The keys and values of the positions a model has read so far, per block: generation then feeds only each
    new token through the model, so a step costs O(T) instead of the O(T²) of reading the whole context again.
    ``length``: the positions held (the next token's position)."""

    def __init__(self, n_layer: int):
        self.layers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layer
        self.length = 0

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Block ``layer``'s keys and values (B, n_kv_head, length + T, head_dim): the held ones, then k, v."""
        held = self.layers[layer]
        if held is not None:
            k, v = torch.cat((held[0], k), dim=2), torch.cat((held[1], v), dim=2)
        self.layers[layer] = (k, v)
        return k, v


class CausalSelfAttention(nn.Module):
    """Multi-head attention; with n_kv_head < n_head, grouped-query attention: key/value head j serves query heads
    j·g … j·g + g − 1 (g = n_head / n_kv_head), as Llama's repeat_kv. c_attn holds [Q; K; V] stacked by rows:
    n_head·head_dim, then n_kv_head·head_dim twice."""

    def __init__(self, config: GPTConfig, layer: int = 0):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        inner, kv = config.n_head * config.head_dim, config.kv_heads * config.head_dim
        self.split_sizes = (inner, kv, kv)
        self.c_attn = nn.Linear(config.n_embd, inner + 2 * kv, bias=config.attn_bias)  # reads the residual
        self.c_proj = nn.Linear(inner, config.n_embd, bias=config.bias)  # writes the residual
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        self.scale = config.attn_scale  # None: SDPA's 1/√head_dim
        self.layer = layer  # its slot in a KVCache
        self.window = config.attn_window if config.windowed(layer) else 0
        if config.qk_norm:  # per head, over head_dim: not on the residual axis, so no width map touches them
            eps = config.norm_eps if config.qk_norm_eps is None else config.qk_norm_eps
            self.q_norm = Norm(config.head_dim, "rmsnorm", "vector", False, eps)
            self.k_norm = Norm(config.head_dim, "rmsnorm", "vector", False, eps)
        self.use_rope = config.pos == "rope"
        if self.use_rope:
            base = config.rope_local_base if self.window and config.rope_local_base else config.rope_base
            self.rope_args = (config.head_dim, config.block_size, base, config.rope_scaling)
            cos, sin = shared_rope_tables(*self.rope_args)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def reset_rope(self, device=None) -> None:
        """Recompute the RoPE tables (e.g. after building the model on the meta device)."""
        if self.use_rope:
            self.rope_cos, self.rope_sin = shared_rope_tables(*self.rope_args, device=device)

    def heads(self, x: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, n_head, T, head_dim) and k, v (B, n_kv_head, T, head_dim), QK-norm and RoPE applied; x's first
        position is ``start``."""
        B, T, _ = x.size()
        q, k, v = self.c_attn(x).split(self.split_sizes, dim=2)
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope:
            cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v

    def mask(self, T: int, device, start: int = 0) -> torch.Tensor | None:
        """The causal mask (T, start + T) of queries at positions start … start + T − 1 over keys 0 … start + T − 1,
        banded to the last ``window`` positions in a windowed block; None: plain causal (start = 0)."""
        if start == 0 and (not self.window or T <= self.window):
            return None
        i = torch.arange(start, start + T, device=device)[:, None]
        j = torch.arange(start + T, device=device)[None, :]
        return (j <= i) & (i - j < self.window) if self.window else j <= i

    def pattern(self, x: torch.Tensor) -> torch.Tensor:
        """The attention probabilities (B, n_head, T, T) that forward uses (for analysis, not for speed)."""
        q, k, _ = self.heads(x)
        k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        T = x.size(1)
        scores = (q @ k.transpose(-2, -1)) * (self.scale or 1 / math.sqrt(self.head_dim))
        mask = self.mask(T, x.device)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril() if mask is None else mask
        return scores.masked_fill(~mask, float("-inf")).softmax(-1)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        B, T, _ = x.size()
        start = cache.length if cache is not None else 0
        q, k, v = self.heads(x, start)
        if cache is not None:
            k, v = cache.extend(self.layer, k, v)
        mask = self.mask(T, x.device, start)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=mask is None,
            scale=self.scale, **({"enable_gqa": True} if self.n_kv_head != self.n_head else {}))
        y = y.transpose(1, 2).contiguous().view(B, T, self.n_head * self.head_dim)
        return self.resid_dropout(self.c_proj(y))


# ----------------------------------------------------------------------------------------------
# MLP


class MLP(nn.Module):
    """GELU: W_out · gelu(W_in x) (exact erf, or GPT-2's tanh approximation).
    SwiGLU: W_out · (silu(W_gate x) ⊙ W_up x), gate and up fused in c_fc; GeGLU (Gemma): the tanh GELU as gate."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.gated = config.mlp in GATED_MLPS
        self.gate = F.silu if config.mlp == "swiglu" else partial(F.gelu, approximate="tanh")
        self.approximate = "tanh" if config.mlp == "gelu_tanh" else "none"
        width = 2 * config.mlp_hidden if self.gated else config.mlp_hidden
        self.c_fc = nn.Linear(config.n_embd, width, bias=config.bias)  # reads the residual
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)  # writes it
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = self.gate(gate) * up
        else:
            h = F.gelu(h, approximate=self.approximate)
        return self.dropout(self.c_proj(h))


# ----------------------------------------------------------------------------------------------
# Block


class Block(nn.Module):
    """pre-LN:  h ← h + f(norm(h)).   peri-LN:  h ← h + norm_out(f(norm_in(h)))  (Gemma 2/3, Peri-LN).
    With ``shortcuts`` each residual path carries a matrix: h ← S·h + … (SliceGPT's per-block maps)."""

    def __init__(self, config: GPTConfig, layer: int = 0):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)
        self.peri = config.norm_placement == "peri"
        if self.peri:
            self.ln_1_out = make_norm(config)
            self.ln_2_out = make_norm(config)
        for which in (1, 2):
            if config.has_shortcut(layer, which):
                setattr(self, f"shortcut_{which}", nn.Linear(config.n_embd, config.n_embd, bias=False))

    def skip(self, x: torch.Tensor, which: int) -> torch.Tensor:
        """The residual path of sublayer ``which`` (1: attention, 2: MLP): x, or S·x where it has a shortcut."""
        shortcut = getattr(self, f"shortcut_{which}", None)
        return x if shortcut is None else shortcut(x)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        if self.peri:
            x = self.skip(x, 1) + self.ln_1_out(self.attn(self.ln_1(x), cache))
            return self.skip(x, 2) + self.ln_2_out(self.mlp(self.ln_2(x)))
        x = self.skip(x, 1) + self.attn(self.ln_1(x), cache)
        return self.skip(x, 2) + self.mlp(self.ln_2(x))


# ----------------------------------------------------------------------------------------------
# Heads


class KnnHead(nn.Module):
    """logit_j = −‖h − e_j‖² + b_j, with e_j the token embeddings (shared with wte) and b a learned bias.

    Computed as 2·h·e_j − ‖e_j‖² − ‖h‖² + b_j, so no (B, T, V, d) difference tensor is built.
    """

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        self.embedding = [embedding]  # a list hides it from the module tree: wte owns the weight
        self.bias = nn.Parameter(torch.zeros(embedding.num_embeddings))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        e = self.embedding[0].weight
        cross = F.linear(h, 2.0 * e, self.bias - e.pow(2).sum(-1))
        return cross - h.pow(2).sum(-1, keepdim=True)


# ----------------------------------------------------------------------------------------------
# GPT


def embedding_norm_stats(embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(μ_E, σ_E, μ_E + 1.5·σ_E) of the row norms of an embedding matrix: the norm regularizer's threshold.
    σ_E is the population std (the thesis's eq. 5.12: divide by |V|, not |V| − 1)."""
    norms = embeddings.norm(dim=-1)
    mean, std = norms.mean(), norms.std(correction=0)
    return mean, std, mean + 1.5 * std


def plain_name(name: str) -> str:
    """A parameter's checkpoint name; a masked weight (growth masks, grow.py) is a torch parametrization, which
    names its raw tensor '<module>.parametrizations.<name>.original'."""
    return name.replace(".parametrizations.", ".").removesuffix(".original")


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        modules = dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=make_norm(config),
        )
        if config.pos == "learned":
            modules["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        self.transformer = nn.ModuleDict(modules)
        if config.head == "knn":
            self.lm_head = KnnHead(self.transformer.wte)
        else:
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=config.head_bias)
            if config.head == "tied":
                self.lm_head.weight = self.transformer.wte.weight  # weight tying
        # the detached terms of the last training loss ('lm', and 'norm_reg' when λ > 0), for logging only
        self.last_loss_terms: dict[str, torch.Tensor] = {}

        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual writers
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
            elif ".shortcut_" in name:  # a plain residual path until training moves it
                torch.nn.init.eye_(p)

    @classmethod
    def from_state_dict(cls, config: GPTConfig, state_dict: dict) -> GPT:
        """A GPT whose parameters are the given tensors (no random init, no copy): built on the meta
        device, then ``load_state_dict(assign=True)``. A tied head may omit ``lm_head.weight``."""
        with torch.device("meta"):
            model = cls(config)
        missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
        if config.head == "tied":
            model.lm_head.weight = model.transformer.wte.weight  # re-tie: assign made two parameters
            missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise ValueError(f"state_dict does not match the config: missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}")
        device = model.transformer.wte.weight.device
        for block in model.transformer.h:
            block.attn.reset_rope(device)
        return model

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; position embeddings excluded by default, as in nanoGPT."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def embedding_norm_threshold(self) -> torch.Tensor:
        """μ_E + 1.5·σ_E of the token-embedding row norms (a statistic, so no gradient flows through it)."""
        return embedding_norm_stats(self.transformer.wte.weight.detach())[2]

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        return_hidden: bool = False,
        all_logits: bool = False,
        features: bool = False,
        cache: KVCache | None = None,
    ):
        """Returns (logits, loss), or (logits, loss, hidden) with ``return_hidden``, or (final normed state,
        hidden) with ``features`` (no head: for losses computed outside, e.g. distillation in chunks).

        logits are (B, T, V) when targets are given or ``all_logits``; else (B, 1, V) for the last
        position only, as in nanoGPT. With a ``cache`` idx continues the positions it holds (their keys and values
        are read from it, idx's are added to it). ``hidden`` is a list of L+1 residual-stream states (B, T, d):
        after the embedding, then after every block. With ``norm_reg`` λ > 0 the training loss adds
        R = λ · mean over tokens and layers 1..L of max(0, ‖h‖₂ − (μ_E + 1.5·σ_E)).
        """
        B, T = idx.size()
        start = cache.length if cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} is longer than block_size={self.config.block_size}")
        x = self.embed(idx, start)
        keep_hidden = return_hidden or features or (self.config.norm_reg > 0 and targets is not None)
        hidden = [x] if keep_hidden else None
        for block in self.transformer.h:
            x = block(x, cache)
            if keep_hidden:
                hidden.append(x)
        if cache is not None:
            cache.length += T
        x = self.transformer.ln_f(x)
        if features:
            return x, hidden

        loss = None
        if targets is not None or all_logits:
            logits = self.lm_head(x)
        else:
            logits = self.lm_head(x[:, [-1], :])
        if targets is not None:
            lm_loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.reshape(-1), ignore_index=-1)
            loss = lm_loss
            terms = {"lm": lm_loss.detach()}
            if self.config.norm_reg > 0:
                reg = self.norm_regularizer(hidden[1:])
                loss = loss + reg
                terms["norm_reg"] = reg.detach()
            self.last_loss_terms = terms
        if return_hidden:
            return logits, loss, hidden
        return logits, loss

    def embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        """The residual stream before the first block: token (+ learned position) embeddings, dropout; idx's first
        position is ``start``."""
        x = self.transformer.wte(idx)
        if self.config.embed_scale != 1.0:  # Gemma's √d, on the input only (a tied head reads E itself)
            x = x * self.config.embed_scale
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(torch.arange(start, start + idx.size(1), device=idx.device))
        return self.transformer.drop(x)

    @torch.no_grad()
    def run_with_cache(self, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(logits, cache) with TransformerLens's names, so analysis code runs on either: ``hook_embed`` (+
        ``hook_pos_embed``), ``blocks.{l}.hook_resid_pre`` / ``hook_resid_mid`` (after attention) /
        ``hook_resid_post``, ``blocks.{l}.attn.hook_pattern`` (B, n_head, T, T), ``ln_final.hook_normalized``."""
        cache: dict[str, torch.Tensor] = {"hook_embed": self.transformer.wte(idx) * self.config.embed_scale}
        x = cache["hook_embed"]
        if "wpe" in self.transformer:
            cache["hook_pos_embed"] = self.transformer.wpe(torch.arange(idx.size(1), device=idx.device))[None]
            x = x + cache["hook_pos_embed"]
        for l, block in enumerate(self.transformer.h):
            cache[f"blocks.{l}.hook_resid_pre"] = x
            normed = block.ln_1(x)
            cache[f"blocks.{l}.attn.hook_pattern"] = block.attn.pattern(normed)
            attn = block.attn(normed)
            x = block.skip(x, 1) + (block.ln_1_out(attn) if block.peri else attn)
            cache[f"blocks.{l}.hook_resid_mid"] = x
            mlp = block.mlp(block.ln_2(x))
            x = block.skip(x, 2) + (block.ln_2_out(mlp) if block.peri else mlp)
            cache[f"blocks.{l}.hook_resid_post"] = x
        cache["ln_final.hook_normalized"] = self.transformer.ln_f(x)
        return self.lm_head(cache["ln_final.hook_normalized"]), cache

    def norm_regularizer(self, hidden_states: list[torch.Tensor]) -> torch.Tensor:
        """R = λ · mean_{layers 1..L, tokens} max(0, ‖h‖₂ − (μ_E + 1.5·σ_E))."""
        threshold = self.embedding_norm_threshold()
        norms = torch.stack([h.float().norm(dim=-1) for h in hidden_states])  # (L, B, T)
        return self.config.norm_reg * F.relu(norms - threshold).mean()

    def crop_block_size(self, block_size: int) -> None:
        """Shrink the context length (e.g. to finetune a pretrained model on shorter sequences)."""
        if block_size > self.config.block_size:
            raise ValueError(f"cannot grow block_size from {self.config.block_size} to {block_size}")
        self.config.block_size = block_size
        if "wpe" in self.transformer:
            self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])
        for block in self.transformer.h:
            if block.attn.use_rope:
                block.attn.rope_cos = block.attn.rope_cos[:block_size]
                block.attn.rope_sin = block.attn.rope_sin[:block_size]

    def optimizer_groups(self) -> tuple[list[str], list[str]]:
        """Names of the trainable parameters with and without weight decay, in the optimizer's order (its state
        is indexed by position in this order: ``carry.py`` maps it by name)."""
        params = {n: p for n, p in self.plain_named_parameters().items() if p.requires_grad}
        return [n for n, p in params.items() if p.dim() >= 2], [n for n, p in params.items() if p.dim() < 2]

    def plain_named_parameters(self) -> dict[str, nn.Parameter]:
        """named_parameters() under a checkpoint's names: while growth masks are on (grow.py, torch
        parametrizations) torch names a masked weight '<module>.parametrizations.<name>.original'."""
        return {plain_name(n): p for n, p in self.named_parameters()}

    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas, device_type: str,
                             optimizer: str = "adamw") -> torch.optim.Optimizer:
        """AdamW (or Adafactor) with weight decay on matrices and embeddings only, not on gains or biases."""
        params = self.plain_named_parameters()
        decay, no_decay = self.optimizer_groups()
        groups = [{"params": [params[n] for n in decay], "weight_decay": weight_decay},
                  {"params": [params[n] for n in no_decay], "weight_decay": 0.0}]
        if optimizer == "adafactor":
            return torch.optim.Adafactor(groups, lr=learning_rate)
        if optimizer != "adamw":
            raise ValueError(f"optimizer={optimizer!r} is not one of ('adamw', 'adafactor')")
        # the fused kernel exists for CUDA and (since torch 2.4) CPU; on small CPU models it is 4x faster
        fused = device_type in ("cuda", "cpu") and "fused" in inspect.signature(torch.optim.AdamW).parameters
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **({"fused": True} if fused else {}))

    def estimate_mfu(self, fwdbwd_per_iter: int, dt: float, peak_flops: float) -> float:
        """Model FLOPs utilisation against ``peak_flops`` (the device's, ``devices.peak_flops``), PaLM appendix B."""
        cfg = self.config
        N = self.get_num_params()
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.head_dim, cfg.block_size
        flops_per_token = 6 * N + 12 * L * H * Q * T
        return flops_per_token * T * fwdbwd_per_iter / dt / peak_flops

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, vocab_limit: int | None = None) -> torch.Tensor:
        """Sample ``max_new_tokens`` tokens after ``idx`` (B, T), feeding each prediction back in. ``vocab_limit``:
        only ids below it (a vocabulary padded past its tokenizer, e.g. 50304 for GPT-2's 50257, has ids that
        decode to nothing)."""
        new = list(self.generate_tokens(idx, max_new_tokens, temperature, top_k, vocab_limit))
        return torch.cat([idx, *new], dim=1)

    @torch.no_grad()
    def generate_tokens(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                        top_k: int | None = None, vocab_limit: int | None = None) -> Iterator[torch.Tensor]:
        """``generate`` one token at a time: yields each new (B, 1) token as it is sampled, keeping only the last
        block_size tokens as context, so memory and time per token stay bounded however many are asked for. A
        KVCache holds the context's keys and values, so each step reads only the new token; once the context fills
        block_size and starts to slide, its positions shift, and each step reads the whole window again (as
        without a cache)."""
        context = idx[:, -self.config.block_size:]
        cache, feed = KVCache(self.config.n_layer), context
        for _ in range(max_new_tokens):
            if cache.length + feed.size(1) > self.config.block_size:
                cache, feed = KVCache(self.config.n_layer), context
            logits, _ = self(feed, cache=cache)
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if vocab_limit is not None:
                logits[:, vocab_limit:] = -float("inf")
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            token = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            context = torch.cat((context, token), dim=1)[:, -self.config.block_size:]
            feed = token
            yield token


# --- MSG growth masks (the model computes through them while a grown model's new parts open; grow.py makes them) ---

def null_projector(T: torch.Tensor) -> torch.Tensor:
    T = T.detach().double().cpu()
    return torch.eye(T.shape[0], dtype=torch.float64) - T @ T.T


@dataclass
class GrowthRamp:
    """MSG's masks over the new parts of a grown model (Masked Structural Growth, Yao et al., ICLR 2024): the model
    computes with W_eff = A_c·W·B_c, A_c = T·Tᵀ + c·(I − T·Tᵀ) on the residual side (a writer's rows, an embedding's
    columns) and B_c = diag(1 for the old units, c for the new ones) on a writer's columns, while training updates
    the raw W. The mask level c opens linearly from 0 to 1 over ``iters`` optimizer steps: at c = 0 the new parts
    add nothing (the function is the small model's, whatever their values), so they can start at the scratch
    initialisation's scale; their gradient is the masked one (×c), as in MSG. (A new unit's weight on a new
    direction is masked twice: c².)"""
    null: torch.Tensor  # I − T·Tᵀ (m×m): the new residual directions
    tensors: list[tuple[str, str, int | None]]  # (parameter, 'rows' | 'columns', first new unit column or None)
    iters: int  # steps over which the masks open
    done: int = 0  # steps taken

    @property
    def level(self) -> float:
        return min(1.0, self.done / self.iters)

    def record(self) -> dict:
        return {"null": self.null.float().cpu(), "tensors": [list(t) for t in self.tensors], "iters": self.iters,
                "done": self.done}

    @classmethod
    def from_record(cls, record: dict) -> GrowthRamp:
        return cls(record["null"].double(), [tuple(t) for t in record["tensors"]], int(record["iters"]),
                   int(record["done"]))


class _Mask(torch.nn.Module):
    """The parametrization W → A_c·W·B_c of one tensor (``side``: 'rows' for writers and their biases, 'columns'
    for embeddings; ``first_new``: a writer's first new unit column). The level c is a buffer, updated in place, so
    a compiled model is not recompiled at every step of the ramp."""

    def __init__(self, ramp: GrowthRamp, side: str, first_new: int | None, like: torch.Tensor):
        super().__init__()
        self.ramp, self.side = ramp, side
        self.register_buffer("null", ramp.null.to(like.device, like.dtype), persistent=False)
        self.register_buffer("level", torch.tensor(ramp.level, device=like.device, dtype=like.dtype),
                             persistent=False)
        new = None if first_new is None else (torch.arange(like.shape[1], device=like.device) >= first_new).to(like)
        self.register_buffer("new", new, persistent=False)

    def forward(self, W: torch.Tensor) -> torch.Tensor:
        W = W - (1 - self.level) * (self.null @ W if self.side == "rows" else W @ self.null)
        return W if self.new is None else W * (1 - self.new * (1 - self.level))


def attach_ramp(model: torch.nn.Module, ramp: GrowthRamp) -> None:
    """Put the masks on ``model`` (torch parametrizations: the Parameter objects, and so an optimizer holding them,
    stay the same; ``detach_ramp`` removes them)."""
    from torch.nn.utils import parametrize
    for name, side, first in ramp.tensors:
        module_name, _, tensor = name.rpartition(".")
        module = model.get_submodule(module_name)
        parametrize.register_parametrization(module, tensor, _Mask(ramp, side, first, getattr(module, tensor)))


def detach_ramp(model: torch.nn.Module) -> None:
    """Remove the masks, keeping what they compute (at c = 1: the raw weights themselves)."""
    from torch.nn.utils import parametrize
    for module in model.modules():
        if parametrize.is_parametrized(module):
            for tensor in list(module.parametrizations):
                parametrize.remove_parametrizations(module, tensor, leave_parametrized=True)


def ramp_of(model: torch.nn.Module) -> GrowthRamp | None:
    """The growth masks on ``model``, or None."""
    return next((m.ramp for m in model.modules() if isinstance(m, _Mask)), None)


def advance_ramp(model: torch.nn.Module) -> None:
    """One optimizer step of the ramp: the masks open by 1/iters; at c = 1 they are removed."""
    ramp = ramp_of(model)
    if ramp is None:
        return
    ramp.done += 1
    for mask in model.modules():
        if isinstance(mask, _Mask):
            mask.level.fill_(ramp.level)
    if ramp.level >= 1:
        detach_ramp(model)


def raw_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` under its plain names (a masked tensor saved as its raw weights, which a checkpoint's
    ``growth_ramp`` record masks again on load)."""
    return {plain_name(k): v for k, v in model.state_dict().items()}
