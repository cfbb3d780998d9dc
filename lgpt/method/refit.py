"""
Corrections after porting, on calibration text (training split only), deterministic: what makes a shrink with
one global map nearly lossless before any finetuning. ``transform.py`` calls them with ``--refit`` and
``--learn_steps``; each is one small function whose docstring is its equation.

- ``fit_gains`` (``--refit=gains``): each norm's scalar gain g is multiplied by the least-squares factor
  s = Σ⟨y − b, z⟩ / Σ⟨z, z⟩ that makes its ported readers' outputs z = W′·norm_m(h′) reproduce the original
  readers' pre-activations y (b: the reader bias, which the port keeps). For an orthonormal-column T the port is
  exact and s = 1 (the √(d/m) of ``scale_gain`` was already right); for random maps it is not.
- ``refit_layers`` (``--refit=readers`` / ``all``): GPTQ/OBS-style layer-wise reconstruction applied to the width
  map. In forward order, each reader (Q/K/V, MLP in and gate, the head) is refit in closed form (ridge) so that,
  fed the transformed model's *own* input at that point, it reproduces the original reader's output:
  W′ = argmin ‖X′W′ᵀ − (Y − b)‖² + λ‖W′‖², i.e. W′ᵀ = (X′ᵀX′ + λI)⁻¹X′ᵀ(Y − b), one k×k solve per matrix.
  Errors of earlier layers are corrected rather than compounded, because X′ comes from the already refit
  model. With ``all`` the writers (attention out, MLP out) are refit too, towards T·(original output).
- ``retie_head`` (``--tie_head=True``): a shrink unties a tied head (the final norm's per-dimension gain is
  folded into it); this ties it back to the embeddings with a fitted per-dimension final-norm gain, so the shrunk
  model keeps m/d of the original's parameters.
- ``learn_map`` (``--learn_steps=N``): T itself is optimised over matrices with orthonormal rows (torch's
  orthogonal parametrization, a retraction onto the Stiefel manifold), weights frozen and the port applied
  differentiably, to minimise KL(original ‖ transformed) on calibration batches (SpinQuant's idea, for a width
  change). The best T seen — never worse than the initial one on the calibration loss — is returned. With
  ``--learn_gain_lr`` each norm's per-coordinate gain is learned with it (``gain_readers``).

Refit needs ``porting='residual'``: the sandwich rules re-split the heads, so the transformed Q/K/V outputs have
no original counterpart to be fitted to.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from lgpt.plumbing.dataset import calibration_seed
from lgpt.plumbing.logger import progress
from model import GPT

REFIT_MODES = ("none", "gains", "readers", "all")
RETIE_TARGETS = ("head", "original")  # what a head kept tied is fitted to (retie_head's target logits)
LEARN_DECAYS = ("none", "cosine")  # learn_map's rate schedules: constant, or a half cosine down to 0


class _Stop(Exception):
    """Raised by a capture hook once it has what it needs: the rest of the forward pass is skipped."""


@contextmanager
def _captured(model: GPT, name: str, store: dict) -> Iterator[None]:
    """Record the input and output of submodule ``name`` on the next forward pass, then stop that pass."""

    def hook(module, inputs, output):
        store["x"], store["y"] = inputs[0].detach(), output.detach()
        raise _Stop

    handle = model.get_submodule(name).register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def module_io(model: GPT, name: str, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) of submodule ``name`` on ``batch``, flattened to (tokens, features), in its dtype."""
    store: dict = {}
    with _captured(model, name, store), torch.no_grad():
        try:
            model(batch, all_logits=True)
        except _Stop:
            pass
    return store["x"].flatten(0, -2), store["y"].flatten(0, -2)


def _row_chunks(*tensors: torch.Tensor, rows: int = 2048):
    """Float64 row chunks of equally long tensors: statistics accumulate in float64 without a float64 copy of a
    whole (tokens × vocabulary) output."""
    for start in range(0, len(tensors[0]), rows):
        yield tuple(t[start:start + rows].double() for t in tensors)


def readers_by_norm(model: GPT) -> list[tuple[str, list[str]]]:
    """(norm, the Linear readers it feeds) in forward order; the head only when it is a Linear of its own."""
    pairs = []
    for i in range(model.config.n_layer):
        pairs += [(f"transformer.h.{i}.ln_1", [f"transformer.h.{i}.attn.c_attn"]),
                  (f"transformer.h.{i}.ln_2", [f"transformer.h.{i}.mlp.c_fc"])]
    if model.config.head == "linear":
        pairs.append(("transformer.ln_f", ["lm_head"]))
    return pairs


@torch.no_grad()
def fit_gains(original: GPT, new: GPT, batches: list[torch.Tensor]) -> dict[str, float]:
    """Multiply each reader-feeding norm's scalar gain by s = Σ⟨y − b, z⟩ / Σ⟨z, z⟩ (module docstring), in forward
    order so that each fit sees the gains already fitted before it. Returns {norm: s}."""
    factors = {}
    for norm, readers in progress(readers_by_norm(new), "refit gains", unit="norm"):
        num = den = 0.0
        for reader in readers:
            bias = getattr(new.get_submodule(reader), "bias", None)
            for batch in batches:
                for y, z in _row_chunks(module_io(original, reader, batch)[1], module_io(new, reader, batch)[1]):
                    if bias is not None:
                        y, z = y - bias.double(), z - bias.double()
                    num += (y * z).sum().item()
                    den += (z * z).sum().item()
        s = num / den if den > 0 else 1.0
        new.get_submodule(norm).weight.mul_(s)
        factors[norm] = s
    return factors


def ridge_solver(gram: torch.Tensor, ridge: float):
    """C ↦ (G + λI)⁻¹·C with λ = ridge · tr(G)/k (the ridge is relative to the input's mean energy), factorised
    once (Cholesky); a singular G (ridge 0 on inputs that span less than k dimensions, e.g. an exact port at
    m > d) gets the minimum-norm solution G⁺·C instead."""
    k = gram.shape[0]
    regularised = gram + ridge * torch.trace(gram) / k * torch.eye(k, dtype=gram.dtype, device=gram.device)
    factor, info = torch.linalg.cholesky_ex(regularised)
    if info == 0:
        return lambda cross: torch.cholesky_solve(cross, factor)
    inverse = torch.linalg.pinv(regularised, hermitian=True)
    return lambda cross: inverse @ cross


def module_input(root: torch.nn.Module, name: str, x: torch.Tensor) -> torch.Tensor:
    """The input of submodule ``name`` of ``root`` when ``root(x)`` runs (the pass stops there)."""
    store: dict = {}

    def hook(module, inputs):
        store["x"] = inputs[0].detach()
        raise _Stop

    handle = root.get_submodule(name).register_forward_pre_hook(hook)
    try:
        root(x)
    except _Stop:
        pass
    finally:
        handle.remove()
    return store["x"]


@torch.no_grad()
def fit_linear(module: torch.nn.Linear, target: torch.nn.Linear, inputs, T: torch.Tensor | None,
               ridge: float, rows: int = 4096) -> float:
    """Refit ``module``'s weight (its bias kept) so that on its own inputs X′ it reproduces the original module's
    output Y = X·Aᵀ + c (A, c: ``target``'s weight and bias, times T for a writer, ``T`` given): ridge least squares
    W′ᵀ = (X′ᵀX′ + λI)⁻¹·X′ᵀ(Y − b′). Y is never formed: X′ᵀY = (X′ᵀX)·Aᵀ + (X′ᵀ1)·cᵀ and ‖Y‖² = tr(A·XᵀX·Aᵀ) +
    2·(1ᵀX)·Aᵀc + N‖c‖²; the output rows are solved ``rows`` at a time against one factorisation
    (``ridge_solver``), so a 50k-vocabulary head holds no (tokens × vocabulary) and no (k × vocabulary) float64
    tensor. ``inputs`` yields (X, X′) pairs. Returns the relative residual ‖X′W′ᵀ − (Y − b′)‖ / ‖Y − b′‖."""
    gram = mixed = original_gram = None
    sum_new = sum_original = 0.0
    count = 0
    for x, x_new in inputs:
        for xo, xn in _row_chunks(x.flatten(0, -2), x_new.flatten(0, -2)):
            gram = xn.T @ xn if gram is None else gram + xn.T @ xn
            mixed = xn.T @ xo if mixed is None else mixed + xn.T @ xo
            original_gram = xo.T @ xo if original_gram is None else original_gram + xo.T @ xo
            sum_new, sum_original, count = sum_new + xn.sum(0), sum_original + xo.sum(0), count + len(xn)
    solve = ridge_solver(gram, ridge)
    target_energy = residual = 0.0
    for start in range(0, module.weight.shape[0], rows):
        part = slice(start, start + rows)
        if T is None:
            A = target.weight[part].double()
            c = target.bias[part].double() if target.bias is not None else A.new_zeros(len(A))
        else:  # a writer: its contribution should land where T puts the original's
            A = T[part] @ target.weight.double()
            c = T[part] @ target.bias.double() if target.bias is not None else A.new_zeros(len(A))
        if module.bias is not None:
            c = c - module.bias[part].double()
        cross = mixed @ A.T + torch.outer(sum_new, c)  # X′ᵀ(Y − b′) for these outputs, (k′, rows)
        weight_t = solve(cross)
        module.weight[part] = weight_t.T.to(module.weight.dtype)
        energy = (((A @ original_gram) * A).sum() + 2 * (A @ sum_original) @ c + count * (c @ c)).item()
        # residual ‖X′W − Y‖² = ‖Y‖² − 2⟨W, C⟩ + ⟨W, G W⟩, from the accumulated statistics
        residual += energy - 2 * (weight_t * cross).sum().item() + (weight_t * (gram @ weight_t)).sum().item()
        target_energy += energy
    return math.sqrt(max(residual, 0.0) / max(target_energy, 1e-30))


BLOCK_REFITS = {"readers": (("attn.c_attn", "reader"), ("mlp.c_fc", "reader")),
                "all": (("attn.c_attn", "reader"), ("attn.c_proj", "writer"), ("mlp.c_fc", "reader"),
                        ("mlp.c_proj", "writer"))}


@torch.no_grad()
def refit_layers(original: GPT, new: GPT, T: torch.Tensor, batches: list[torch.Tensor], mode: str,
                 ridge: float = 1e-4, head: bool = True) -> dict[str, float]:
    """The sequential least-squares refit (module docstring). ``original`` is the canonical width-d model, ``new``
    the ported width-m one (changed in place). Block by block: both models' residual streams at the block's input
    are kept for every calibration batch, each module's inputs come from running that one block (the new one with
    the fits made so far), and the streams then move through the finished block — one forward of each model in
    all, instead of one per module. ``head=False`` leaves an untied head as it is (``retie_head`` with the
    original's logits as target replaces it anyway). Returns each module's relative residual error after its fit."""
    T = T.double()
    errors = {}
    streams = [(original.embed(b), new.embed(b)) for b in batches]
    blocks = progress(list(enumerate(zip(original.transformer.h, new.transformer.h))), f"refit {mode}",
                      unit="block")
    for i, (old_block, new_block) in blocks:
        for name, role in BLOCK_REFITS[mode]:
            pairs = ((module_input(old_block, name, h), module_input(new_block, name, h_new)) for h, h_new in streams)
            errors[f"transformer.h.{i}.{name}"] = fit_linear(new_block.get_submodule(name),
                                                             old_block.get_submodule(name), pairs,
                                                             T if role == "writer" else None, ridge)
        streams = [(old_block(h), new_block(h_new)) for h, h_new in streams]
    if new.config.head == "linear" and head:
        pairs = ((original.transformer.ln_f(h), new.transformer.ln_f(h_new)) for h, h_new in streams)
        errors["lm_head"] = fit_linear(new.lm_head, original.lm_head, pairs, None, ridge)
    return errors


@torch.no_grad()
def gain_outliers(model: GPT, count: int) -> tuple[int, ...]:
    """The ``count`` residual coordinates whose final-norm gain γ_i lies farthest from the median gain (ties: the
    lower index first). A tied head needs diag(γ)·Tᵀ ≈ Tᵀ·diag(γ′) (``retie_head``); a PCA direction that mixes a
    coordinate of outlying gain (SmolLM2's γ_247 = −2.1 among gains near +1.8) with the rest cannot be given one
    gain, so ``--tie_keep`` keeps these coordinates as rows of T of their own (``maps.pca_map``)."""
    if count <= 0:
        return ()
    gain = model.transformer.ln_f.weight.detach().double().cpu()  # count > m is maps.check_coordinates' error
    order = torch.argsort(-(gain - gain.median()).abs(), stable=True)
    return tuple(order[:count].tolist())


def retie_head(new: GPT, batches: list[torch.Tensor], ridge: float = 1e-6,
               original: GPT | None = None) -> tuple[GPT, dict]:
    """Tie the head of a shrunk model back to its embeddings E′ (V×m) by giving the final norm a per-dimension
    gain γ: the head becomes E′·diag(γ), applied to the final norm's output y_t (width m), with γ the least-squares
    fit of target logits z_t on calibration text,
        γ = argmin Σ_t ‖z_t − E′·diag(γ)·y_t‖²  ⇒  (M ⊙ E′ᵀE′)·γ = diag(E′ᵀ·B),   M = (1/N)·Σ_t y_t y_tᵀ,
    an m×m solve (⊙: elementwise). The target: the shrunk model's untied head A (V×m; the ported head, or the
    refit one) on its own final states, z_t = A·y_t, B = A·M (``original=None``); or the original's logits,
    z_t = A₀·y₀_t with A₀ (V×d) the original's head and y₀_t its final states, B = A₀·C, C = (1/N)·Σ_t y₀_t y_tᵀ
    (``original``: the gain then also corrects what the shrink did to the final states, within the tie). Every
    other norm keeps its gain (expanded to a vector: the model's norms then carry per-dimension gains). The shrunk
    model loses the head's V·m parameters; the record gives the relative logit residual
    Σ_t ‖z_t − E′·diag(γ)·y_t‖² / Σ_t ‖z_t‖² before (γ = 1) and after the fit."""
    cfg = new.config
    m = cfg.n_embd
    device = new.transformer.wte.weight.device
    M = torch.zeros(m, m, dtype=torch.float64, device=device)
    d0 = original.config.n_embd if original is not None else m
    C = torch.zeros(d0, m, dtype=torch.float64, device=device)  # Σ y₀ yᵀ (for the own head y₀ = y, so C = M)
    M0 = torch.zeros(d0, d0, dtype=torch.float64, device=device)  # Σ y₀ y₀ᵀ: the target's energy
    count = 0
    for b in batches:
        _, y = module_io(new, "transformer.ln_f", b)
        y0 = module_io(original, "transformer.ln_f", b)[1] if original is not None else y
        for chunk, chunk0 in _row_chunks(y, y0):
            M += chunk.T @ chunk
            C += chunk0.T @ chunk
            M0 += chunk0.T @ chunk0
            count += len(chunk)
    M, C, M0 = M / count, C / count, M0 / count
    E = new.transformer.wte.weight.double()
    A = (original.lm_head.weight if original is not None else new.lm_head.weight).double()
    G, EB = E.T @ E, (E.T @ A) @ C  # E′ᵀ·B, m×m; for the own head C = M
    lhs = M * G
    gamma = torch.linalg.solve(lhs + ridge * torch.trace(lhs) / m * torch.eye(m, dtype=lhs.dtype, device=device),
                               torch.diagonal(EB))
    energy = torch.trace((A.T @ A) @ M0)  # Σ‖z‖² / N without a V-long vector per token

    def residual(g: torch.Tensor) -> float:  # (Σ‖z‖² − 2·gᵀ·diag(E′ᵀB) + gᵀ(M ⊙ G)g) / Σ‖z‖², all per token
        return ((energy - 2 * g @ torch.diagonal(EB) + g @ lhs @ g) / energy).item()

    before, after = residual(torch.ones(m, dtype=torch.float64, device=device)), residual(gamma)
    sd = {k: v.detach().clone() for k, v in new.state_dict().items() if k != "lm_head.weight"}
    for name, t in list(sd.items()):
        if name.endswith(".weight") and t.numel() == 1 and (".ln_" in name or name.startswith("transformer.ln_f")):
            sd[name] = t.expand(m).clone()  # scalar gains become per-dimension (all equal) ...
    dtype = new.transformer.wte.weight.dtype
    sd["transformer.ln_f.weight"] = (sd["transformer.ln_f.weight"].double() * gamma).to(dtype)  # ... but ln_f's
    new_cfg = copy.deepcopy(cfg)
    new_cfg.head, new_cfg.norm_gain = "tied", "vector"
    tied = GPT.from_state_dict(new_cfg, sd).eval()
    return tied, {"relative_logit_residual_untied_gain": before, "relative_logit_residual": after,
                  "gain_range": [gamma.min().item(), gamma.max().item()], "head_parameters_saved": A.numel()}


def kl_to_original(original_logp: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of KL(p_original ‖ p_new)."""
    logq = F.log_softmax(logits.float().flatten(0, -2), dim=-1)
    return (original_logp.exp() * (original_logp - logq)).sum(-1).mean()


def gain_readers(params: dict, sites: list[tuple[str, list[str]]], gains: dict[str, torch.Tensor]) -> dict:
    """W′·norm_m(h′) → W′·diag(g)·norm_m(h′): a per-coordinate gain g (m values) of each norm in ``sites``
    (``readers_by_norm``), folded into every Linear reader it feeds (the canonical form's norms keep their scalar
    gain, so the model's form and parameter count stay as they are). Returns a new dict; ``params`` is unchanged."""
    params = dict(params)
    for norm, readers in sites:
        for reader in readers:
            key = f"{reader}.weight"
            params[key] = params[key] * gains[norm].to(params[key].dtype)
    return params


def gain_writers(params: dict, writers: tuple[str, ...], gains: dict[str, torch.Tensor]) -> dict:
    """T·W·x + T·b → diag(c)·(T·W·x + T·b): a per-coordinate gain c (m values) on what each residual writer in
    ``writers`` adds to the m-space stream, folded into its weight's rows (and its bias). It rescales each block's
    share of every kept coordinate (a per-writer diag(c)·T, T itself shared); form and parameter count stay as
    they are. Returns a new dict; ``params`` is unchanged."""
    params = dict(params)
    for writer in writers:
        for key in (f"{writer}.weight", f"{writer}.bias"):
            if params.get(key) is not None:
                gain = gains[writer].to(params[key].dtype)
                params[key] = params[key] * (gain[:, None] if params[key].dim() == 2 else gain)
    return params


def learn_map(original: GPT, T_init: torch.Tensor, port, batches: list[torch.Tensor], steps: int, lr: float = 1e-3,
              seed: int = 0, tokens_per_pass: int = 1024, held: tuple[int, ...] = (), gain_lr: float = 0.0,
              sites: list[tuple[str, list[str]]] = (), writers: tuple[str, ...] = (), decay: str = "none",
              label_weight: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None, dict]:
    """Optimise T (m×d, m < d, or m = d with ``label_weight`` > 0; orthonormal rows) to minimise KL(original ‖ port(T))
    on ``batches``.

    ``label_weight`` α > 0: the objective per calibration token is (1 − α)·KL(original ‖ port(T)) + α·CE, CE the
    cross-entropy of the calibration text's own next token (each row's last position has none: KL alone there);
    α = 1 fits the text alone. 0 (the default) is the KL, unchanged.

    ``held``: coordinates whose column of T stays as it starts — a row e_iᵀ of its own (``--tie_keep``,
    ``--pca_keep``) or zero (``--pca_exclude``); only the block of T on the other rows and columns is learned
    (``free_block``), so what those options promise (T·diag(γ) = diag(γ′)·T there, which ``retie_head`` needs)
    still holds after learning.

    ``gain_lr`` > 0: each norm of ``sites`` also learns a per-coordinate gain g = exp(s) (s from 0, Adam at
    ``gain_lr``), folded into its readers (``gain_readers``): the m-space norms get back the per-dimension freedom
    the original's had, jointly with T, on the same calibration KL. ``writers`` (with ``gain_lr`` > 0): each of
    these residual writers learns a per-coordinate gain on its output too (``gain_writers``), at the same rate.

    ``decay``: 'none' keeps both rates constant; 'cosine' scales them at step t of ``steps`` by
    ``decay_factor`` = ½(1 + cos(π·t/steps)), from 1 at the first step to nearly 0 at the last, so that the last
    batches, which a constant rate lets pull T toward themselves, move it least.

    ``port(T)`` returns (a GPT of width m, its parameters as a dict of tensors differentiable in T). Adam on the
    orthogonal parametrization's free parameter, one calibration batch per step (cycled). Returns the best of
    the initial and the final (T, gains) on the whole calibration set (so never worse than the initialisation;
    gains None where none were learned or the initial map was kept) and a record of the losses. Memory: the
    original's targets are kept as its final hidden states (the head is applied when needed), and a batch is
    processed ``tokens_per_pass`` tokens at a time with the gradient accumulated, so no (tokens × vocabulary)
    tensor of the whole calibration set is ever held (the default, 1024, is one pass per batch for the char
    model's 16 × 64 calibration batches: its cached results stay exact)."""
    T_init = orthonormal_rows(T_init.cpu()).to(T_init.device)  # on the CPU: the same start on every device
    free_rows, free_columns = free_block(T_init, held)
    with torch.random.fork_rng(devices=[]):  # the parametrization completes T to a square orthogonal matrix at random
        # (on the CPU: the same start on every device)
        torch.manual_seed(seed)
        holder = torch.nn.Linear(len(free_columns), len(free_rows), bias=False).double()
        torch.nn.utils.parametrizations.orthogonal(holder)
        holder.weight = T_init[free_rows][:, free_columns].cpu()
    holder.to(T_init.device)
    index = (free_rows.to(T_init.device)[:, None], free_columns.to(T_init.device)[None, :])

    def assembled(block: torch.Tensor) -> torch.Tensor:
        """T with ``block`` on the free rows and columns (differentiable in ``block``), the held ones as they were."""
        return T_init.index_put(index, block)

    with torch.no_grad():
        targets = [original(b, features=True)[0] for b in batches]
    m = T_init.shape[0]
    log_gains = {name: torch.zeros(m, device=T_init.device, requires_grad=True)
                 for name in [norm for norm, _ in sites] + list(writers)} if gain_lr > 0 else {}
    optimizer = torch.optim.Adam([{"params": list(holder.parameters()), "lr": lr}]
                                 + ([{"params": list(log_gains.values()), "lr": gain_lr}] if log_gains else []))
    rows = max(1, tokens_per_pass // batches[0].shape[1])
    rates = [group["lr"] for group in optimizer.param_groups]

    def gains_of(logs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        return {norm: s.exp() for norm, s in logs.items()} if logs else None

    def kl_of_rows(T: torch.Tensor, k: int, part: slice, gains: dict[str, torch.Tensor] | None = None
                   ) -> torch.Tensor:
        """KL(original ‖ port(T), its readers scaled by ``gains``) summed over the tokens of rows ``part`` of batch
        k (with ``label_weight`` α > 0: (1 − α)·that + α·the summed next-token cross-entropy)."""
        model, params = port(T)
        if gains is not None:
            params = gain_writers(gain_readers(params, sites, gains), writers, gains)
        tokens = batches[k][part]
        logits = torch.func.functional_call(model, params, (tokens,), {"all_logits": True})[0]
        with torch.no_grad():
            target = F.log_softmax(original.lm_head(targets[k][part]).float().flatten(0, -2), dim=-1)
        loss = kl_to_original(target, logits) * len(target)
        if label_weight > 0:
            text = F.cross_entropy(logits[:, :-1].float().flatten(0, -2), tokens[:, 1:].flatten(), reduction="sum")
            loss = (1 - label_weight) * loss + label_weight * text
        return loss

    def parts(k: int) -> list[slice]:
        return [slice(i, i + rows) for i in range(0, len(batches[k]), rows)]

    def calibration_loss(T: torch.Tensor, gains: dict[str, torch.Tensor] | None = None) -> float:
        with torch.no_grad():
            return sum(sum(kl_of_rows(T, k, p, gains).item() for p in parts(k)) / batches[k].numel()
                       for k in range(len(batches))) / len(batches)

    start = T_init
    losses = {"initial": calibration_loss(start)}
    if label_weight > 0:
        losses["objective"] = f"(1 - {label_weight})·KL + {label_weight}·CE"
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(batches), generator=generator).tolist()
    for step in progress(range(steps), "learn T" + (" and gains" if log_gains else ""), unit="step"):
        k = order[step % len(order)]
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate * decay_factor(decay, step, steps)
        optimizer.zero_grad(set_to_none=True)
        for part in parts(k):  # the port is rebuilt per pass: each backward frees its own graph
            (kl_of_rows(assembled(holder.weight), k, part, gains_of(log_gains)) / batches[k].numel()).backward()
        optimizer.step()
    if not (torch.isfinite(holder.weight).all() and all(torch.isfinite(s).all() for s in log_gains.values())):
        losses.update(learned=float("nan"), kept="initial", diverged=True)  # the promise: never worse than the start
        return start, None, losses
    # float64 retraction of the learned block: T orthonormal to rounding, the held columns exactly as they started
    learned = assembled(orthonormal_rows(holder.weight.detach()))
    gains = gains_of({norm: s.detach() for norm, s in log_gains.items()})
    losses["learned"] = calibration_loss(learned, gains)
    keep_learned = losses["learned"] <= losses["initial"]
    losses["kept"] = "learned" if keep_learned else "initial"
    if gains is not None:
        every = torch.cat([g for name, g in gains.items() if name not in writers])
        losses["gain_range"] = [every.min().item(), every.max().item()]
        if writers:
            every = torch.cat([gains[w] for w in writers])
            losses["writer_gain_range"] = [every.min().item(), every.max().item()]
    return (learned, gains, losses) if keep_learned else (start, None, losses)


def decay_factor(decay: str, step: int, steps: int) -> float:
    """The rate at step ``step`` (0-based) of ``steps``, relative to the set rate: 1 for 'none'; for 'cosine'
    ½(1 + cos(π·step/steps)), 1 at step 0, falling to ½(1 + cos(π·(steps−1)/steps)) ≈ 0 at the last step."""
    if decay not in LEARN_DECAYS:
        raise ValueError(f"decay={decay!r} is not one of {LEARN_DECAYS}")
    return 1.0 if decay == "none" else 0.5 * (1 + math.cos(math.pi * step / steps))


def free_block(T: torch.Tensor, held: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, columns) of T that ``learn_map`` may change: every column but the ``held`` coordinates', every row
    but those that are a held coordinate's e_iᵀ. Raises ValueError unless T is block-diagonal that way: each held
    column zero or one unit row, and those rows zero elsewhere (PCA maps with --pca_keep/--pca_exclude are)."""
    m, d = T.shape
    unit_rows = set()
    for i in sorted(set(held)):
        column = T[:, i].abs()
        if column.max() < 1e-9:  # an excluded coordinate: T·e_i = 0
            continue
        row = int(column.argmax())
        if abs(column[row].item() - 1) > 1e-6 or column.sum().item() - 1 > 1e-6 or T[row].abs().sum() - 1 > 1e-6:
            raise ValueError(f"coordinate {i} cannot be held: its column of T is neither zero nor one unit row e_iᵀ")
        unit_rows.add(row)
    rows = torch.tensor([r for r in range(m) if r not in unit_rows], dtype=torch.long)
    columns = torch.tensor([c for c in range(d) if c not in set(held)], dtype=torch.long)
    return rows, columns


def orthonormal_rows(T: torch.Tensor) -> torch.Tensor:
    """The nearest matrix with orthonormal rows (polar factor U·Vᵀ of the SVD), in float64; T itself if it has them."""
    T = T.detach().double()
    U, _, Vh = torch.linalg.svd(T, full_matrices=False)
    return U @ Vh


def calibration_batches(loader, batches: int, seed: int) -> list[torch.Tensor]:
    """``batches`` training batches (inputs only), fixed by ``seed``: the same text every correction sees."""
    return [loader.get_batch("train", seed=calibration_seed(seed, 10_000 + k))[0] for k in range(batches)]


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
                ridge: float, tie_head: bool, corrections: dict, notes: list[str], retie_target: str = "head") -> GPT:
    """``fit_gains`` or ``refit_layers`` on ``new`` (in place), then ``retie_head`` (fitted to the untied head's
    logits, or with ``retie_target='original'`` to the original's: the refit then leaves the head, which the tie
    replaces); ``corrections`` gets what was fitted and the calibration KL(original ‖ new) before and after,
    ``notes`` a line each. Returns the model."""
    to_original = tie_head and retie_target == "original"
    if refit != "none":
        before = calibration_kl(original, new, batches)
        if refit == "gains":
            corrections["gain_factors"] = fit_gains(original, new, batches)
        else:
            corrections["relative_errors"] = refit_layers(original, new, T, batches, refit, ridge,
                                                          head=not to_original)
        corrections.update(calibration_kl_before=before, calibration_kl_after=calibration_kl(original, new, batches))
        notes.append(f"refit={refit}: calibration KL {before:.4f} → {corrections['calibration_kl_after']:.4f}")
    if tie_head:  # its record is the logit residual (a calibration KL would cost two more passes of both models)
        new, corrections["tied_head"] = retie_head(new, batches, original=original if to_original else None)
        fit = corrections["tied_head"]
        notes.append("head tied back with a fitted final-norm gain" + (" (fitted to the original's logits)"
                                                                        if to_original else "")
                     + ": relative logit residual "
                     f"{fit['relative_logit_residual_untied_gain']:.3f} (gain 1) → "
                     f"{fit['relative_logit_residual']:.3f}")
    return new


@torch.no_grad()
def fit_output_lengths(canonical: GPT, T: torch.Tensor, batches: list[torch.Tensor], ridge: float = 1e-3
                       ) -> torch.Tensor:
    """The carried output norms' lengths fitted on calibration text (``--fit_lengths``): for each peri-LN output
    norm, its writer's outputs f on ``batches`` (from ``canonical``, the model at width d with the output gains
    kept), z = (T·diag(γ)·f)² per token, and a > 0 with

        a = argmin Σ_tokens ((zᵀa − ‖f‖²) / (‖f‖² + ε·d))² + λ·‖a − a₀‖²,    λ = ridge · tr(ZᵀZ)/m  (Z weighted),
        a ≥ a₀/1000,

    a₀ the data-free fit (``porting.length_fit``): the ported norm's denominator ‖diag(√a)·T·diag(γ)·f‖² + ε·d
    matches the true ‖f‖² + ε·d in relative terms, every token alike (ε·d is added by the ported norm itself), where
    the data-free fit cannot (f is not isotropic: T mixes unequal gains, or drops coordinates, as a shrink does).
    Returns a, m × (one column per output norm), float64."""
    from lgpt.method.porting import bounded_quadratic, carried_gains, length_fit
    from lgpt.method.roles import residual_roles

    cfg = canonical.config
    norms = residual_roles(cfg).output_norms
    gammas = carried_gains(canonical.state_dict(), cfg)[0].cpu()
    T64 = T.detach().double().cpu()
    seen: dict[str, list[torch.Tensor]] = {norm: [] for norm in norms}
    modules = dict(canonical.named_modules())
    hooks = [modules[norm].register_forward_pre_hook(
        lambda _m, args, norm=norm: seen[norm].append(args[0].detach().reshape(-1, args[0].shape[-1]).float().cpu()))
        for norm in norms]
    try:
        for batch in batches:
            canonical(batch, features=True)
    finally:
        for hook in hooks:
            hook.remove()
    out = []
    for j, norm in enumerate(norms):
        a0 = length_fit(T64, gammas[:, j])
        f = torch.cat(seen.pop(norm)).double()
        length = f.pow(2).sum(1)
        weight = 1.0 / (length + cfg.norm_eps * cfg.n_embd)
        Z = ((f * gammas[:, j]) @ T64.T).pow(2) * weight[:, None]
        y = length * weight
        lam = ridge * float((Z * Z).sum()) / Z.shape[1]
        eye = torch.eye(Z.shape[1], dtype=torch.float64)
        # solved for b = a / s, s = 1/√diag(ZᵀZ + λ) (Jacobi scaling: a spans ~10 orders of magnitude where gains
        # are zero): the same objective, well conditioned, so an exact map comes back exact; a ≥ a₀/1000 > 0
        A = Z.T @ Z + lam * eye
        scale = A.diagonal().clamp_min(1e-300).rsqrt()
        b = bounded_quadratic(scale[:, None] * A * scale[None, :], scale * (Z.T @ y + lam * a0), 1e-3 * a0 / scale)
        out.append(scale * b)
    return torch.stack(out, 1)
