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

Depth (``transform.py --n_layer=L'``): new blocks are copies of old ones whose writers (attention and MLP output
projections, weights and biases) are zero, so each adds 0 to the residual stream and the function is unchanged;
the zero writers receive gradient from the first step (a block's input is the stream). Where they go
(``--depth_mode``): ``interleave`` puts each copy right after the block it copies (old blocks spread evenly over
the new depth); ``stack`` appends copies of blocks 0, 1, … after the old stack (G_stack's order, Du et al. 2024);
``gstack`` is G_stack itself, the copies' writers kept — not function-preserving (the non-exact alternative).

Grouped-query attention (n_kv_head < n_head; query head h reads key/value head h // g, g = n_head / n_kv_head):
``--n_head`` alone keeps g, so the key/value heads grow in proportion, new ones grown as the query heads are
(new query heads read only new key/value heads). ``--n_kv_head=K'`` sets the key/value heads instead, exactly when
the new group size g' = n_head'/K' divides g: the key/value heads that old query heads read are copied (each old
one g/g' times, so every old query head still reads its own), the rest grown as above. E.g. GQA → MHA: g' = 1.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lgpt.method.roles import residual_roles
from lgpt.plumbing.errors import TransformError
from model import GATED_MLPS, GPTConfig, GrowthRamp, null_projector

GROW_MODES = ("zero", "clone")
DEPTH_MODES = ("interleave", "stack", "gstack")
BLOCK_WRITERS = ("attn.c_proj.weight", "attn.c_proj.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")


def grown_kv_heads(cfg: GPTConfig, n_head: int, n_kv_head: int = 0) -> int:
    """The key/value heads after growing to ``n_head`` query heads: ``n_kv_head`` if given, else the ratio kept."""
    heads = n_head or cfg.n_head
    return n_kv_head or heads * cfg.kv_heads // cfg.n_head


def check_growth(cfg: GPTConfig, n_head: int, mlp_hidden: int, mode: str, n_kv_head: int = 0) -> None:
    """Raise TransformError for a head / MLP growth request that cannot apply to ``cfg``."""
    if mode not in GROW_MODES:
        raise TransformError(f"grow_mode={mode!r} is not one of {GROW_MODES}")
    heads, group = n_head or cfg.n_head, cfg.n_head // cfg.kv_heads
    if n_head and not n_kv_head and n_head % group:
        raise TransformError(f"n_head={n_head} keeps the model's {group} query heads per key/value head only if it "
                             f"is a multiple of {group}; choose such an n_head or give --n_kv_head")
    if n_kv_head:
        if n_kv_head < cfg.kv_heads or heads % n_kv_head:
            raise TransformError(f"n_kv_head={n_kv_head} must be >= the model's {cfg.kv_heads} and divide n_head="
                                 f"{heads}")
        if group % (heads // n_kv_head):
            raise TransformError(f"n_kv_head={n_kv_head} makes groups of {heads // n_kv_head} query heads, which "
                                 f"must divide the model's {group} so every old query head keeps its key/value head")
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


def grow_heads(sd: dict, cfg: GPTConfig, n_head: int, growth: UnitGrowth, n_kv_head: int = 0) -> None:
    """Q, K, V get rows and c_proj gets columns for the new heads (in place; ``cfg.n_head``, ``cfg.n_kv_head``
    updated). K and V: the heads old queries read, each copied g/g' times, then grown like Q (module docstring).
    Tensors missing from ``sd`` are skipped (an optimizer may hold no state for some)."""
    old, old_kv, hd = cfg.n_head, cfg.kv_heads, cfg.head_dim
    heads = max(n_head, old)
    kv_heads = grown_kv_heads(cfg, heads, n_kv_head)
    if (heads, kv_heads) == (old, old_kv):
        return
    copies = (old // old_kv) // (heads // kv_heads)  # g / g': how many new key/value heads each old one becomes
    for i in range(cfg.n_layer):
        a = f"transformer.h.{i}.attn"
        for name in (f"{a}.c_attn.weight", f"{a}.c_attn.bias"):
            if name in sd:
                q, k, v = sd[name].split((old * hd, old_kv * hd, old_kv * hd))
                kv = [growth.inputs(t.unflatten(0, (old_kv, hd)).repeat_interleave(copies, 0).flatten(0, 1),
                                    kv_heads * hd) for t in (k, v)]
                sd[name] = torch.cat([growth.inputs(q, heads * hd), *kv])
        if f"{a}.c_proj.weight" in sd and heads > old:
            sd[f"{a}.c_proj.weight"] = growth.outputs(sd[f"{a}.c_proj.weight"], heads * hd)
    cfg.n_head, cfg.n_kv_head = heads, (None if kv_heads == heads else kv_heads)


def grow_mlp(sd: dict, cfg: GPTConfig, mlp_hidden: int, growth: UnitGrowth) -> None:
    """c_fc rows (both halves for SwiGLU) and c_proj columns for the new neurons (in place; config updated)."""
    old = cfg.mlp_hidden
    if mlp_hidden <= old:
        return
    halves = 2 if cfg.mlp in GATED_MLPS else 1  # SwiGLU's and GeGLU's c_fc is [gate; up]
    for i in range(cfg.n_layer):
        m = f"transformer.h.{i}.mlp"
        for name in (f"{m}.c_fc.weight", f"{m}.c_fc.bias"):
            if name in sd:
                sd[name] = torch.cat([growth.inputs(half, mlp_hidden) for half in sd[name].chunk(halves)])
        if f"{m}.c_proj.weight" in sd:
            sd[f"{m}.c_proj.weight"] = growth.outputs(sd[f"{m}.c_proj.weight"], mlp_hidden)
    cfg.mlp_hidden = mlp_hidden


def check_depth(cfg: GPTConfig, n_layer: int, mode: str) -> None:
    """Raise TransformError for a depth growth request that cannot apply to ``cfg``."""
    if mode not in DEPTH_MODES:
        raise TransformError(f"depth_mode={mode!r} is not one of {DEPTH_MODES}")
    if n_layer and n_layer < cfg.n_layer:
        raise TransformError(f"n_layer={n_layer} is below the model's {cfg.n_layer}: depth growth adds blocks, it "
                             "does not remove them")


def depth_plan(n_old: int, n_new: int, mode: str) -> list[tuple[int, bool]]:
    """For each block of the grown model, (the old block it is or copies, whether it is a new copy)."""
    extra = n_new - n_old
    if mode == "interleave":  # old block j is followed by its copies; the copies spread evenly over the stack
        plan: list[tuple[int, bool]] = []
        for j in range(n_old):
            plan += [(j, False)] + [(j, True)] * ((j + 1) * extra // n_old - j * extra // n_old)
        return plan
    return [(j, False) for j in range(n_old)] + [(k % n_old, True) for k in range(extra)]


def grow_depth(sd: dict, cfg: GPTConfig, n_layer: int, mode: str, copies: bool = True) -> None:
    """Insert the new blocks of ``depth_plan`` (in place; ``cfg.n_layer`` updated). ``copies``: new blocks are
    copies of their old block with zero writers (``gstack``: writers kept); False leaves new blocks out of ``sd``
    (an optimizer's moments: the new blocks start with no history)."""
    if n_layer <= cfg.n_layer:
        return
    old: dict[int, dict[str, torch.Tensor]] = {}
    for j in range(cfg.n_layer):
        prefix = f"transformer.h.{j}."
        old[j] = {k[len(prefix):]: sd.pop(k) for k in [k for k in sd if k.startswith(prefix)]}
    for i, (j, new) in enumerate(depth_plan(cfg.n_layer, n_layer, mode)):
        if new and not copies:
            continue
        for name, t in old[j].items():
            writer = new and mode != "gstack" and name in BLOCK_WRITERS
            sd[f"transformer.h.{i}.{name}"] = torch.zeros_like(t) if writer else t.clone()
    cfg.n_layer = n_layer


# ----------------------------------------------------------------------------------------------
# Growth that uses the new directions: fresh readers of them, and MSG's masked writers (Yao et al., ICLR 2024)


def fresh_null_readers(sd: dict, readers: tuple[str, ...], T: torch.Tensor, std: float, seed: int) -> None:
    """W → W + N·(I − T·Tᵀ), N ~ N(0, std²) (in place): every reader of the residual also reads the m − d new
    directions, with weights at the scale a fresh model starts from (std = 0.02). The ported stream lies in range(T),
    where (I − T·Tᵀ) is 0, so the function is unchanged (T with orthonormal columns)."""
    null = null_projector(T)
    g = torch.Generator().manual_seed(seed + 3)
    for name in readers:
        W = sd[f"{name}.weight"]
        noise = std * torch.randn(W.shape, generator=g, dtype=torch.float64)
        sd[f"{name}.weight"] = W + (noise @ null).to(W)


def masked_growth(sd: dict, embeddings: tuple[str, ...], writers: dict[str, int], n_layer: int, T: torch.Tensor,
                  iters: int, seed: int) -> GrowthRamp:
    """The writers' new parts — their rows on the new directions (I − T·Tᵀ) and the new units' columns — and the
    embeddings' new directions, drawn at the scratch initialisation's scale (std 0.02; writers 0.02/√(2·n_layer))
    and added in place (``writers``: writer module → its old unit count); the masks that keep them closed (c = 0)
    until training opens them over ``iters`` steps."""
    null = null_projector(T)
    g = torch.Generator().manual_seed(seed + 4)
    tensors: list[tuple[str, str, int | None]] = []
    for name in embeddings:
        E = sd[name]
        sd[name] = E + (0.02 * torch.randn(E.shape, generator=g, dtype=torch.float64) @ null).to(E)
        tensors.append((name, "columns", None))
    writer_std = 0.02 / (2 * n_layer) ** 0.5
    for writer, old_units in writers.items():
        W = sd[f"{writer}.weight"]
        fresh = writer_std * torch.randn(W.shape, generator=g, dtype=torch.float64)
        fresh[:, :old_units] = null @ fresh[:, :old_units]  # old units: on the new directions only; new units: all
        sd[f"{writer}.weight"] = W + fresh.to(W)
        tensors.append((f"{writer}.weight", "rows", old_units if old_units < W.shape[1] else None))
        if f"{writer}.bias" in sd:
            tensors.append((f"{writer}.bias", "rows", None))
    return GrowthRamp(null, tensors, iters)


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


def check_paddable(cfg: GPTConfig, width: int) -> None:
    """``pad_residual``'s conditions: it widens, and every norm is an RMSNorm with a gain to rescale."""
    if width < cfg.n_embd:
        raise TransformError(f"pad_residual widens: width={width} is below the model's d={cfg.n_embd}")
    if cfg.norm_type != "rmsnorm" or cfg.norm_gain == "none":
        raise TransformError(f"zero-padding is exact only with RMSNorm gains (norm_type='rmsnorm', norm_gain vector "
                             f"or scalar); this model has norm_type={cfg.norm_type!r}, norm_gain={cfg.norm_gain!r}: "
                             "use transform.py --kind=truncate --width=M, which folds the gains (and unties the head)")


def pad_residual(model, width: int):
    """The same function at residual width ``width`` ≥ d, the new coordinates always zero — with every gain kept in
    its norm, so a tied head stays tied (a width map folds gains into the readers and unties it). For an RMSNorm
    over width m' of h' = [h; 0]: mean(h'²) = (d/m')·mean(h²), so with ε' = ε·d/m'

        norm'(h') = [√(m'/d)·norm(h); 0],    and gains g' = [√(d/m')·g; 0] give back g ⊙ norm(h).

    Embeddings and readers get zero columns, writers (and their biases) zero rows, shortcuts a zero border; q/k
    norms act on head_dim and keep their ε (``qk_norm_eps``). Exact for RMSNorm with per-dimension or scalar gains;
    a LayerNorm's mean (and a norm without a gain) would change, so those are refused. Used to give llama.cpp's block
    quantizers rows whose length is a multiple of 32 (lgpt/formats/llama_cpp.py)."""
    from dataclasses import asdict

    from model import GPT

    cfg = model.config
    d = cfg.n_embd
    check_paddable(cfg, width)
    roles = residual_roles(cfg)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    pad = width - d

    def columns(W: torch.Tensor) -> torch.Tensor:
        return torch.cat([W, W.new_zeros(*W.shape[:-1], pad)], -1)

    def rows(W: torch.Tensor) -> torch.Tensor:
        return torch.cat([W, W.new_zeros(pad, *W.shape[1:])], 0)

    done = set()
    for name in roles.embeddings:
        sd[name], _ = columns(sd[name]), done.add(name)
    for reader in roles.readers:
        if reader == "lm_head" and cfg.head != "linear":  # tied: the embedding itself (below); KNN: reads wte
            continue
        sd[f"{reader}.weight"], _ = columns(sd[f"{reader}.weight"]), done.add(f"{reader}.weight")
    for writer in roles.writers:
        for name in (f"{writer}.weight", f"{writer}.bias"):
            if name in sd:
                sd[name], _ = rows(sd[name]), done.add(name)
    for shortcut in roles.shortcuts:
        name = f"{shortcut}.weight"
        sd[name], _ = rows(columns(sd[name])), done.add(name)
    scale = math.sqrt(d / width)
    for norm in roles.norms:
        name = f"{norm}.weight"
        if name in sd:
            g = sd[name] * scale
            sd[name], _ = (rows(g) if cfg.norm_gain == "vector" else g), done.add(name)
    if cfg.head == "tied" and "lm_head.weight" in sd:
        sd["lm_head.weight"] = sd["transformer.wte.weight"]
        done.add("lm_head.weight")
    left = [k for k, v in sd.items() if k not in done and d in v.shape and ".q_norm." not in k and ".k_norm." not in k]
    if left:
        raise TransformError(f"pad_residual does not know where {left[0]} sits in the residual stream; it pads only "
                             "what residual_roles names")
    new = GPTConfig(**dict(asdict(cfg), n_embd=width, head_dim=cfg.head_dim, mlp_hidden=cfg.mlp_hidden,
                           norm_eps=cfg.norm_eps * d / width,
                           qk_norm_eps=(cfg.qk_norm_eps or cfg.norm_eps) if cfg.qk_norm else cfg.qk_norm_eps))
    return GPT.from_state_dict(new, sd).eval()
