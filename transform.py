"""
Change the residual width of a trained GPT from d to m with one linear map T (m×d) and its
pseudo-inverse T⁺ (d×m): the pipeline and its command line.

    python transform.py --in_dir=out-shakespeare-char --out_dir=out-m96 --width=96 --kind=pca --porting=residual

The work lives in rooms below this one, each importable on its own (nothing there imports this file):
- maps.py         what T is: the JL kinds, SRHT, orthogonal, PCA and its calibration, a map file;
- roles.py        where each tensor sits relative to the residual stream (the role table);
- porting.py      what T does to each weight: ``canonicalize`` at width d (SliceGPT's / QuaRot's computational
                  invariance), then ``port_weights`` by ``porting_plan``, one named function per rule;
- paper_rules.py  the LGPT paper's ``sandwich`` and ``paper_code`` rules, inside their stated domain;
- refit.py        corrections after the port: the least-squares refit, gain fitting, the learned map;
- grow.py         growth beyond the residual width (heads, MLP, depth, MSG masks).

``transform_model`` runs them in order — check everything, canonicalize, calibrate, draw T, (learn T), port,
grow, (refit) — and returns the new model and its record; ``transform_checkpoint`` is the CLI's work around it
(read, evaluate before and after, write atomically). With orthonormal columns (TᵀT = I, m ≥ d), ``residual``
porting after ``fold`` reproduces the original logits to float32 rounding. For m < d (shrink) nothing is
exact; ``pca`` keeps the top-m principal directions of the residual stream and loses far less than a random map.
"""
from __future__ import annotations

import copy
import math
import os
import time
import warnings
from dataclasses import asdict, dataclass

import torch

from lgpt.method.grow import (
    DEPTH_MODES,
    GROW_MODES,
    check_depth,
    check_growth,
    fresh_null_readers,
    grow_depth,
    grow_heads,
    grow_mlp,
    grown_kv_heads,
    masked_growth,
    weight_growth,
)
from lgpt.method.maps import (
    CALIB_WEIGHTINGS,
    JL_KINDS,
    KINDS,
    NO_COORDINATES,
    Coordinates,
    calibration_points,
    check_coordinates,
    collect_calibration,
    jl_min_width,
    pseudo_inverse,
    read_map_file,
    starting_map,
    symmetry_breaking_pinv,
)
from lgpt.method.paper_rules import (
    PAPER_CODE_KINDS,
    check_porting,
    paper_code_projection,
    paper_code_weights,
    restore_attention_scale,
)
from lgpt.method.per_block import collect_site_calibration, port_per_block, sequential_site_maps, site_maps, site_norms
from lgpt.method.porting import (
    NORM_MODES,
    PORTING_ALIASES,
    PORTINGS,
    canonicalize,
    model_from_state,
    port_weights,
    resolve_porting,
    restore_layernorm,
)
from lgpt.method.refit import (
    LEARN_DECAYS,
    REFIT_MODES,
    RETIE_TARGETS,
    calibration_batches,
    fit_gains,
    gain_outliers,
    gain_readers,
    gain_writers,
    kl_to_original,
    learn_map,
    readers_by_norm,
    refit_layers,
    retie_head,
)
from lgpt.method.roles import residual_roles
from lgpt.plumbing.checkpoint import (
    check_output_dir,
    hold_run_dir,
    is_interrupted,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    weights_fingerprint,
)
from lgpt.plumbing.cli import run_cli
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.dataset import (
    BatchLoader,
    check_tokenizer,
    data_dir_for_checkpoint,
    evaluate_loss,
    loss_basis,
    window_size,
)
from lgpt.plumbing.devices import announce_threads, resolve_device
from lgpt.plumbing.errors import ConfigError, TransformError
from model import GPT, GPTConfig, GrowthRamp, attach_ramp, raw_state_dict


@dataclass
class TransformConfig:
    # the transform
    in_dir: str = "out-shakespeare-char"  # the checkpoint to transform
    out_dir: str = ""  # where the transformed ckpt.pt goes (required)
    width: int = 0  # the new residual width m (required)
    kind: str = "orthogonal"  # the map T: gaussian | rademacher | sparse | srht | orthogonal | hadamard (m = d)
    #                           | pca | truncate
    porting: str = "residual"  # 'residual' (ours; alias 'head') | 'sandwich' (paper's eqs) | 'paper_code' (its code)
    #                            | 'per_block' (SliceGPT's: one map per site, shortcut matrices; per_block.py)
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
    tie_head: bool = False  # a tied model's head stays tied: the final norm gets a per-dimension gain fitted to the
    #                         untied head's logits on calibration text (refit.retie_head); parameters × m/d
    tie_keep: int = 0  # with tie_head and kind='pca': T keeps the N coordinates whose final-norm gain lies farthest
    #                    from the median as rows of their own (--pca_keep), so one m-space gain can stand in for it
    retie_target: str = "head"  # with tie_head, what the final gain is fitted to: 'head' (the untied head's logits
    #                             on the shrunk model's states; a --refit refits that head first) | 'original' (the
    #                             original's logits: the gain corrects the final states too; --refit leaves the head)
    learn_lr: float = 1e-3  # Adam learning rate of the learned map
    learn_gain_lr: float = 0.0  # > 0: with learn_steps, every norm also learns a per-coordinate gain (m values,
    #                             folded into its readers: refit.gain_readers) jointly with T, at this Adam rate
    learn_writer_gains: bool = False  # with learn_gain_lr: every residual writer (attention and MLP out) learns a
    #                                   per-coordinate gain on its output too (refit.gain_writers), at the same rate
    learn_decay: str = "none"  # the learned map's rates over its steps: 'none' (constant) | 'cosine' (from
    #                            learn_lr and learn_gain_lr down to 0 along a half cosine: the last steps, on the
    #                            last batches, move T least)
    learn_label_weight: float = 0.0  # α in [0, 1]: the learned map's objective per calibration token is
    #                                   (1 − α)·KL(original ‖ new) + α·the cross-entropy of the text's next token
    learn_hold: bool = True  # the learned map keeps the --tie_keep/--pca_keep rows e_iᵀ and --pca_exclude's zero
    #                          columns as they start (refit.free_block); False learns all of T (an ablation: it
    #                          breaks what those options promise, the tie's commuting rows among them)
    # calibration: token embeddings + hidden states of every layer on training text (pca, JL bound)
    data_dir: str = ""  # '' → the data directory recorded in the input checkpoint
    calib_batches: int = 8  # training batches whose hidden states calibrate PCA and the JL bound
    calib_batch_size: int = 16  # sequences per calibration batch
    calib_weighting: str = "unit"  # PCA's second moment: 'unit' (each state scaled to unit length, as the norms see
    #                                it) | 'raw' (as they are: SliceGPT's, where massive activations dominate)
    sequential_calibration: bool = False  # porting='per_block', kind='pca': each site's PCA on the states of the
    #                                       model already cut before it (SliceGPT's order; per_block.py)
    calib_vocabulary: bool = True  # the first site's moment also counts every token embedding (False: only the
    #                                calibration text's own, as SliceGPT's)
    map_groups: int = 0  # porting='per_block': G maps, each shared by a run of consecutive sites (a shortcut matrix
    #                      only where the map changes: G − 1 of them); 0: a map per site, SliceGPT's construction
    pca_exclude: tuple[int, ...] = ()  # kind='pca': residual coordinates kept out of range(T) (--pca_exclude=507 or
    #                                    =507,199): the same PCA on the stream with those coordinates removed
    pca_keep: tuple[int, ...] = ()  # kind='pca': residual coordinates kept in range(T) as rows e_iᵀ of their own
    #                                 (--pca_keep=247,17); the rest is the PCA of the stream without them
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
                              ("calib_weighting", CALIB_WEIGHTINGS),
                              ("grow_mode", GROW_MODES), ("depth_mode", DEPTH_MODES)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}={getattr(self, name)!r} is not one of {allowed}")
        if PORTING_ALIASES.get(self.porting, self.porting) not in PORTINGS:
            raise ConfigError(f"porting={self.porting!r} is not one of {PORTINGS} (or the alias 'head')")
        if not 0 < self.jl_eps < 1 or not 0 < self.jl_delta < 1 or self.learn_lr <= 0:
            raise ConfigError("jl_eps and jl_delta must lie in (0, 1), learn_lr must be > 0")
        check_gain_learning(self.learn_gain_lr, self.learn_steps, ConfigError, self.learn_writer_gains,
                            self.learn_decay, self.learn_label_weight)
        if not self.learn_hold and not self.learn_steps:
            raise ConfigError("learn_hold=False chooses what a learned map may change: add --learn_steps=N or drop "
                              "--learn_hold")
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
        if self.carry_optimizer and self.porting == "per_block":
            raise ConfigError("carry_optimizer maps AdamW's moments with one T; porting='per_block' has one per site: "
                              "drop --carry_optimizer")
        self.check_calibration()
        if not self.rescale_gains and (self.porting == "paper_code" or self.carry_optimizer):
            raise ConfigError("rescale_gains=False applies to porting='residual' or 'sandwich' without "
                              "carry_optimizer (paper_code never rescales; carried moments need the exact port); "
                              "drop --rescale_gains=False")

    def check_calibration(self) -> None:
        """The PCA-only settings ask for kind='pca' (sequential_calibration also for porting='per_block')."""
        for name, what in (("pca_exclude", "keeps coordinates out of a PCA map's range"),
                           ("pca_keep", "keeps coordinates in a PCA map's range"),
                           ("tie_keep", "keeps the final gain's outlying coordinates in a PCA map's range")):
            if getattr(self, name) and (self.kind != "pca" or self.map_file):
                raise ConfigError(f"{name} {what}; kind={self.kind!r}" + (" with a map file" if self.map_file else "")
                                  + f": use --kind=pca without --map_file or drop --{name}")
        if self.retie_target not in RETIE_TARGETS or self.retie_target != "head" and not self.tie_head:
            raise ConfigError(f"retie_target={self.retie_target!r} chooses what a head kept tied is fitted to: one of "
                              f"{RETIE_TARGETS} with --tie_head=True, or drop --retie_target")
        if self.tie_keep < 0 or self.tie_keep and not self.tie_head:
            raise ConfigError(f"tie_keep={self.tie_keep} chooses coordinates for a head kept tied: give a count >= 0 "
                              "with --tie_head=True, or drop --tie_keep")
        if self.sequential_calibration and (self.porting != "per_block" or self.kind != "pca"):
            raise ConfigError("sequential_calibration orders the per-site PCAs of porting='per_block' with kind='pca'; "
                              "add --porting=per_block --kind=pca or drop --sequential_calibration")
        if self.map_groups < 0 or self.map_groups and self.porting != "per_block":
            raise ConfigError(f"map_groups={self.map_groups} shares per-block maps between consecutive sites: give a "
                              "count >= 0 with --porting=per_block, or drop --map_groups")


def check_gain_learning(gain_lr: float, learn_steps: int, error: type[Exception], writers: bool = False,
                        decay: str = "none", label_weight: float = 0.0) -> None:
    """Raise ``error`` for learned gains without a learned map, at a negative rate, writer gains without a rate,
    a rate schedule that is unknown or has no learned map to schedule, or a label weight outside [0, 1] or without
    a learned map."""
    if not 0 <= label_weight <= 1 or label_weight > 0 and not learn_steps:
        raise error(f"learn_label_weight={label_weight} weighs the text's next tokens against the KL in a learned "
                    "map's objective: a number in [0, 1] with --learn_steps=N, or drop --learn_label_weight")
    if decay not in LEARN_DECAYS or decay != "none" and not learn_steps:
        raise error(f"learn_decay={decay!r} schedules a learned map's rates: one of {LEARN_DECAYS} with "
                    "--learn_steps=N, or drop --learn_decay")
    if gain_lr < 0 or gain_lr > 0 and not learn_steps:
        raise error(f"learn_gain_lr={gain_lr} needs learn_steps > 0 and must be >= 0: add --learn_steps=N (the "
                    "gains are learned with the map) or drop --learn_gain_lr")
    if writers and not gain_lr > 0:
        raise error("learn_writer_gains=True learns the writers' gains at learn_gain_lr: add --learn_gain_lr=R "
                    "(R > 0, with --learn_steps=N) or drop --learn_writer_gains")


def check_transform(cfg: GPTConfig, width: int, kind: str, porting: str, norms: str,
                    keep_layernorm: bool = False, grow_noise: float = 0.0, restore_attn_scale: bool = False,
                    refit: str = "none", learn_steps: int = 0, n_head: int = 0, mlp_hidden: int = 0,
                    grow_mode: str = "zero", n_kv_head: int = 0, n_layer: int = 0,
                    depth_mode: str = "interleave", learn_label_weight: float = 0.0) -> str:
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
    check_shortcut_models(cfg, porting, refit, learn_steps, keep_layernorm, grow_noise,
                          bool(n_head or n_kv_head or mlp_hidden or n_layer))
    check_corrections(cfg.n_embd, width, porting, refit, learn_steps, keep_layernorm, learn_label_weight)
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


def check_shortcut_models(cfg: GPTConfig, porting: str, refit: str, learn_steps: int, keep_layernorm: bool,
                          grow_noise: float, grows: bool) -> None:
    """Raise TransformError for what porting='per_block' cannot do, or what a model with shortcut matrices (its
    output) cannot undergo."""
    if porting == "per_block":
        asked = [name for name, on in (("refit", refit != "none"), ("learn_steps", learn_steps > 0),
                                       ("keep_layernorm", keep_layernorm), ("grow_noise", grow_noise > 0),
                                       ("n_head / n_kv_head / mlp_hidden / n_layer growth",
                                        grows)) if on]
        if asked:
            raise TransformError(f"porting='per_block' (one map per site, SliceGPT's construction) takes no "
                                 f"{', '.join(asked)}; drop them or use porting='residual'")
        if cfg.head == "knn":
            raise TransformError("porting='per_block' cannot carry a KNN head; use porting='residual'")
    if cfg.shortcuts and (grows or keep_layernorm or porting == "paper_code"):
        raise TransformError("this model has shortcut matrices (a per-block transform's output): only residual or "
                             "per_block porting applies to it, without growth or keep_layernorm")


def check_corrections(d: int, m: int, porting: str, refit: str, learn_steps: int, keep_layernorm: bool,
                      label_weight: float = 0.0) -> None:
    """Raise TransformError for a refit / learned-map request that cannot apply. A map learned at m = d is allowed
    only with the text's labels in its objective (``label_weight`` > 0): the KL alone is already 0 at an exact
    port, while the labels move it — the same-width control of a shrink learned on labels."""
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
    if learn_steps > 0 and (m > d or m == d and not label_weight):
        raise TransformError(f"learn_steps learns a map with orthonormal rows for a shrink (m < d, or m = d with "
                             f"--learn_label_weight > 0), got width={m}, d={d}; at m ≥ d an orthogonal T is already "
                             "exact")


# ----------------------------------------------------------------------------------------------
# Projections


# ----------------------------------------------------------------------------------------------
# The role table: where each tensor sits relative to the residual stream


# ----------------------------------------------------------------------------------------------
# Step 1: canonical form at width d, one rule per function


# ----------------------------------------------------------------------------------------------
# Step 2: apply T, one rule per function


# ----------------------------------------------------------------------------------------------
# Calibration


# ----------------------------------------------------------------------------------------------
# The whole transform


class PhaseClock:
    """Seconds per named step of a pipeline: each ``lap(name)`` adds the time since the previous lap to ``name``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._mark
        self._mark = now


def transform_model(model: GPT, width: int, *, kind: str = "orthogonal", porting: str = "residual",
                    norms: str = "fold", seed: int = 0, calibration_loader: BatchLoader | None = None,
                    calib_batches: int = 8, grow_noise: float = 0.0, jl_eps: float = 0.2, jl_delta: float = 0.05,
                    pca_damping: float = 1e-6, keep_layernorm: bool = False, restore_attn_scale: bool = False,
                    refit: str = "none", refit_ridge: float = 1e-4, learn_steps: int = 0,
                    learn_lr: float = 1e-3, n_head: int = 0, mlp_hidden: int = 0, grow_mode: str = "zero",
                    clone_noise: float = 0.0, n_kv_head: int = 0,
                    given_map: torch.Tensor | None = None, rescale_gains: bool = True, n_layer: int = 0,
                    depth_mode: str = "interleave", grow_reader_std: float = 0.0, grow_mask_iters: int = 0,
                    rms_preserve: bool = False, tie_head: bool = False,
                    calib_weighting: str = "unit", sequential_calibration: bool = False,
                    calib_vocabulary: bool = True, pca_exclude: tuple[int, ...] = (), pca_keep: tuple[int, ...] = (),
                    map_groups: int = 0, learn_hold: bool = True,
                    tie_keep: int = 0, retie_target: str = "head", learn_gain_lr: float = 0.0,
                    learn_writer_gains: bool = False, learn_decay: str = "none",
                    learn_label_weight: float = 0.0) -> tuple[GPT, dict]:
    """Transform ``model`` to residual width ``width``; returns (new model, transform record). ``given_map``
    (m×d) replaces the map ``kind`` would sample, and is used as it is (recorded as kind 'file');
    ``pca_exclude`` / ``pca_keep``: coordinates kept out of a PCA map's range / in it as rows of their own
    (``maps.pca_map``); ``tie_keep``: with ``tie_head``, that many of the final gain's outliers kept
    (``refit.gain_outliers``), and ``retie_target`` what the tied head is fitted to (``apply_refit``);
    ``learn_hold``: a learned map keeps those coordinates' columns (``refit.free_block``); ``learn_gain_lr`` > 0:
    every norm's per-coordinate gain is learned with it, folded into its readers (``refit.gain_readers``), and
    with ``learn_writer_gains`` every residual writer's output gain too (``refit.gain_writers``); ``learn_decay``
    schedules the learning rates and ``learn_label_weight`` mixes the text's next tokens into the objective
    (``refit.learn_map``);
    ``rescale_gains=False`` keeps norm gains and ε as they are (the paper's Algorithm 1). With
    ``grow_mask_iters`` the new model carries MSG's masks (closed) and the record a ``growth_ramp``."""
    started = time.perf_counter()
    clock = PhaseClock()  # seconds per step of the pipeline: where a long run spends its time
    porting = check_transform(model.config, width, kind, porting, norms, keep_layernorm, grow_noise,
                              restore_attn_scale, refit, learn_steps, n_head, mlp_hidden, grow_mode, n_kv_head,
                              n_layer, depth_mode, learn_label_weight)
    d, m = model.config.n_embd, width
    check_new_directions(model.config, d, m, porting, norms, rescale_gains, keep_layernorm, refit, learn_steps,
                         grow_reader_std, grow_mask_iters, rms_preserve)
    check_tie_head(model.config, tie_head, porting, keep_layernorm, bool(n_head or n_kv_head or mlp_hidden or n_layer),
                   tie_keep, retie_target)
    check_gain_learning(learn_gain_lr, learn_steps, TransformError, learn_writer_gains, learn_decay,
                        learn_label_weight)
    coordinates = Coordinates(pca_exclude, pca_keep + gain_outliers(model, tie_keep)).normalized()
    check_coordinates(coordinates, model.config.n_embd, width, kind, given_map is not None)
    for what, needed in (("kind='pca'", kind == "pca"), (f"refit={refit!r}", refit != "none"),
                         ("learn_steps", learn_steps > 0), ("tie_head", tie_head)):
        if needed and calibration_loader is None:
            raise TransformError(f"{what} needs calibration data: pass calibration_loader (the CLI uses the "
                                 "checkpoint's training data, or --data_dir)")
    if porting == "per_block":
        return port_per_block_model(model, width, kind, norms, seed, calibration_loader, calib_batches, pca_damping,
                                    given_map, started=started, jl=(jl_eps, jl_delta), weighting=calib_weighting,
                                    sequential=sequential_calibration, vocabulary=calib_vocabulary,
                                    coordinates=coordinates, groups=map_groups)
    check_per_block_options(sequential_calibration, map_groups, porting)
    if porting == "paper_code":  # the paper's code neither folds nor canonicalizes anything
        sd, cfg, notes = dict(model.state_dict()), copy.deepcopy(model.config), ["paper_code: weights mapped by "
                                                                                 "shape, architecture kept"]
    else:  # a coordinate map keeps peri-LN output gains exactly (porting.average_output_gains says why)
        sd, cfg, notes = canonicalize(model.state_dict(), model.config, norms, keep_output_gains=kind == "truncate"
                                      and given_map is None and refit == "none" and not learn_steps and not tie_head)
    lap = clock.lap
    lap("check")  # the checks and the canonical form
    calibration = None
    if calibration_loader is not None and (kind == "pca" and given_map is None or refit != "none"
                                           or learn_steps > 0):  # a random map needs only the count (JL bound)
        calibration = collect_calibration(model_from_state(dict(sd), cfg), calibration_loader, calib_batches, seed,
                                          calib_weighting, calib_vocabulary)
    T, T_pinv = starting_map(given_map, kind, d, m, seed, calibration, pca_damping, keep_layernorm,
                               coordinates)
    check_orthonormal_growth(T, kind if given_map is None else "file", grow_reader_std, grow_mask_iters)
    kind = "file" if given_map is not None else kind
    lap("calibrate")
    device = model.transformer.wte.weight.device
    T, T_pinv = T.to(device), T_pinv.to(device)  # the one move: every rule below meets the weights on their device
    corrections: dict = {}
    gain_sites, gain_writer_sites, learned_gains = [], (), {}  # learned gains, folded in after the port
    if refit != "none" or learn_steps > 0 or tie_head:
        batches = calibration_batches(calibration_loader, calib_batches, seed)
        original = model_from_state(dict(sd), cfg)
    if learn_steps > 0:
        skeleton = model_from_state(*port_weights(dict(sd), cfg, T, T_pinv, porting, None, rescale_gains))

        def differentiable_port(T_: torch.Tensor):
            return skeleton, port_weights(dict(sd), cfg, T_, T_.T, porting, None, rescale_gains)[0]

        held = coordinates.exclude + coordinates.keep if learn_hold else ()
        sites = readers_by_norm(skeleton)
        writers = residual_roles(skeleton.config).writers if learn_writer_gains else ()
        T, learned_gains, corrections["learned_map"] = learn_map(
            original, T, differentiable_port, batches, learn_steps, learn_lr, seed, held=held,
            gain_lr=learn_gain_lr, sites=sites, writers=writers, decay=learn_decay, label_weight=learn_label_weight)
        gain_sites, gain_writer_sites = (sites, writers) if learned_gains else ([], ())
        T_pinv = T.T.clone()
        gained = "" if learn_gain_lr <= 0 else "and norm and writer gains " if learn_writer_gains else "and norm gains "
        notes.append(f"map {gained}learned for {learn_steps} steps from "
                     f"kind={kind!r}: calibration {corrections['learned_map'].get('objective', 'KL')} "
                     f"{corrections['learned_map']['initial']:.4f} → "
                     f"{corrections['learned_map']['learned']:.4f} (kept: {corrections['learned_map']['kept']})")
        lap("learn")
    if porting == "paper_code":
        T = T if given_map is not None else paper_code_projection(kind, T)
        T_pinv = pseudo_inverse(T)
        new_sd, new_cfg = paper_code_weights(sd, cfg, T)
    else:
        reader_T_pinv = symmetry_breaking_pinv(T, T_pinv, grow_noise, seed) if grow_noise > 0 else None
        new_sd, new_cfg = port_weights(sd, cfg, T, T_pinv, porting, reader_T_pinv, rescale_gains)
        new_sd = gain_writers(gain_readers(new_sd, gain_sites, learned_gains), gain_writer_sites, learned_gains)
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
    lap("port")
    if refit != "none" or tie_head:
        new_model = apply_refit(original, new_model, T, batches, refit, refit_ridge, tie_head, corrections, notes,
                                retie_target)
        lap("refit/tie")
    n_points = (calibration.count if calibration is not None
                else calibration_points(model.config, calibration_loader, calib_batches, calib_vocabulary))
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
              "learn_hold": learn_hold and learn_steps > 0, "learn_gain_lr": learn_gain_lr,
              "learn_writer_gains": learn_writer_gains and learn_gain_lr > 0, "learn_decay": learn_decay,
              "learn_label_weight": learn_label_weight,
              "corrections": corrections, "seconds": time.perf_counter() - started, "phase_seconds": clock.seconds,
              "calib_vocabulary": calib_vocabulary, "pca_exclude": list(coordinates.exclude),
              "pca_keep": list(coordinates.keep), "tie_keep": tie_keep,
              "retie_target": retie_target if tie_head else None,
              "T": T.float().cpu(), "T_pinv": T_pinv.float().cpu()}  # records are device-neutral
    record["growth_ramp"] = ramp  # MSG's masks or None: transform_checkpoint stores them beside the weights
    return new_model, record


def port_per_block_model(model: GPT, m: int, kind: str, norms: str, seed: int, loader: BatchLoader | None,
                         calib_batches: int, damping: float, given_map: torch.Tensor | None, started: float,
                         jl: tuple[float, float], weighting: str = "unit", sequential: bool = False,
                         vocabulary: bool = True, coordinates: Coordinates = NO_COORDINATES, groups: int = 0
                         ) -> tuple[GPT, dict]:
    """``transform_model`` for porting='per_block' (per_block.py): canonicalize, one map per site or per group of
    ``groups`` (PCA calibrated per site on the original's states, or ``sequential``ly on the already cut model's),
    port; the record's T is site 0's map, ``site_maps`` counts the sites and ``map_groups`` the distinct maps."""
    if given_map is not None:
        raise TransformError("porting='per_block' draws one map per site; a map file gives one: drop --map_file")
    if sequential and kind != "pca":
        raise TransformError("sequential_calibration fits one PCA per site (kind='pca'); drop it")
    d = model.config.n_embd
    sd, cfg, notes = canonicalize(model.state_dict(), model.config, norms)
    canonical = model_from_state(dict(sd), cfg)
    calibrations = None
    if sequential:  # transform_model has checked that kind='pca' has calibration data
        maps = sequential_site_maps(canonical, m, loader, calib_batches, seed, weighting, damping, vocabulary,
                                    coordinates, groups)
        notes.append("per-site PCA calibrated in order (SliceGPT's): each on the states of the model cut before it")
    else:
        calibrations = (collect_site_calibration(canonical, loader, calib_batches, seed, weighting, vocabulary)
                        if kind == "pca" else None)
        maps = site_maps(kind, d, m, len(site_norms(cfg)), seed, calibrations, damping, coordinates, groups)
    device = model.transformer.wte.weight.device
    maps = [(T.to(device), Tp.to(device)) for T, Tp in maps]
    new_sd, new_cfg = port_per_block(sd, cfg, maps)
    shortcuts = sum(new_cfg.has_shortcut(i, j) for i in range(cfg.n_layer) for j in (1, 2))
    notes.append(f"per-block maps (SliceGPT): {len(maps)} sites" + (f" in {groups} groups" if groups else "")
                 + f", {shortcuts} shortcut matrices of {m}×{m}; the head is untied")
    eye = torch.eye(d, dtype=torch.float64, device=device)
    orthonormal = m >= d and all(torch.allclose(T.T @ T, eye, atol=1e-9) for T, _ in maps)
    n_points = (calibrations[0].count if calibrations
                else calibration_points(model.config, loader, calib_batches, vocabulary))
    T, T_pinv = maps[0]
    record = {"kind": kind, "d": d, "m": m, "seed": seed, "porting": "per_block", "norms": norms,
              "restore_attn_scale": False, "rescale_gains": True, "grow_noise": 0.0, "grow_reader_std": 0.0,
              "rms_preserve": False, "jl_eps": jl[0], "jl_delta": jl[1], "jl_points": n_points,
              "jl_min_width": jl_min_width(n_points, *jl),
              "exact": orthonormal and norms == "fold" and not any(n.startswith("APPROX") for n in notes),
              "notes": notes, "refit": "none", "learn_steps": 0, "learn_hold": False, "corrections": {},
              "site_maps": len(maps), "map_groups": groups,
              "calib_vocabulary": vocabulary, "pca_exclude": list(coordinates.exclude),
              "pca_keep": list(coordinates.keep), "tie_keep": 0,
              "seconds": time.perf_counter() - started, "T": T.float().cpu(), "T_pinv": T_pinv.float().cpu(),
              "growth_ramp": None}
    return model_from_state(new_sd, new_cfg), record


def check_new_directions(cfg: GPTConfig, d: int, m: int, porting: str, norms: str, rescale_gains: bool,
                         keep_layernorm: bool, refit: str, learn_steps: int, reader_std: float, mask_iters: int,
                         rms_preserve: bool) -> None:
    """Raise TransformError unless ``grow_reader_std``, ``grow_mask_iters`` and ``rms_preserve`` can apply: each
    needs the exact port (residual, fold, gains rescaled) of a pre-LN model with a linear head, growing."""
    if not rescale_gains and porting in ("paper_code", "per_block"):
        raise TransformError(f"rescale_gains=False applies to porting='residual' or 'sandwich' ({porting} always "
                             "handles the gains its own way); drop --rescale_gains")
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


def check_per_block_options(sequential: bool, map_groups: int, porting: str) -> None:
    """Raise TransformError for a per-block option (sequential_calibration, map_groups) without per-block maps."""
    if sequential and porting != "per_block":
        raise TransformError("sequential_calibration orders the per-site PCAs of porting='per_block'; "
                             "add --porting=per_block or drop it")
    if map_groups and porting != "per_block":
        raise TransformError(f"map_groups={map_groups} shares per-block maps between consecutive sites; add "
                             "--porting=per_block or drop it")


def check_tie_head(cfg: GPTConfig, tie_head: bool, porting: str, keep_layernorm: bool, grows: bool,
                   tie_keep: int = 0, retie_target: str = "head") -> None:
    """Raise TransformError unless --tie_head (and --tie_keep) can apply: a tied model, residual porting, no
    growth."""
    if tie_keep and not tie_head:
        raise TransformError(f"tie_keep={tie_keep} chooses coordinates for a head kept tied: add --tie_head=True or "
                             "drop --tie_keep")
    if retie_target not in RETIE_TARGETS or retie_target != "head" and not tie_head:
        raise TransformError(f"retie_target={retie_target!r} chooses what a head kept tied is fitted to: one of "
                             f"{RETIE_TARGETS} with tie_head=True")
    if not tie_head:
        return
    if cfg.head != "tied" or cfg.norm_gain != "vector":
        raise TransformError(f"tie_head keeps a tied head tied through the shrink; this model's head is {cfg.head!r}"
                             + (" and already stays tied (its norms have no per-dimension gain)"
                                if cfg.head == "tied" else "") + ": drop --tie_head")
    if resolve_porting(porting) != "residual" or keep_layernorm or grows:
        raise TransformError("tie_head needs porting='residual' without keep_layernorm or growth; drop --tie_head "
                             "or those settings")


def transform_checkpoint(cfg: TransformConfig) -> dict:
    """The CLI's work: read in_dir/ckpt.pt, transform, evaluate before/after, write out_dir/ckpt.pt.
    Every check runs before any work, and nothing is written unless all of it succeeds."""
    check_output_dir(cfg.out_dir, cfg.in_dir, cfg.overwrite)
    cfg.device = resolve_device(cfg.device)  # before any work: a missing GPU is one clear error
    ckpt = load_checkpoint(cfg.in_dir)
    model = model_from_checkpoint(ckpt).to(cfg.device).eval()
    check_transform(model.config, cfg.width, cfg.kind, cfg.porting, cfg.norms, cfg.keep_layernorm, cfg.grow_noise,
                    cfg.restore_attn_scale, cfg.refit, cfg.learn_steps, cfg.n_head, cfg.mlp_hidden, cfg.grow_mode,
                    cfg.n_kv_head, cfg.n_layer, cfg.depth_mode, cfg.learn_label_weight)
    if cfg.carry_optimizer:
        from lgpt.method.carry import check_carry
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
        tie_head=cfg.tie_head, calib_weighting=cfg.calib_weighting, sequential_calibration=cfg.sequential_calibration,
        calib_vocabulary=cfg.calib_vocabulary, pca_exclude=cfg.pca_exclude, map_groups=cfg.map_groups,
        pca_keep=cfg.pca_keep, tie_keep=cfg.tie_keep, learn_hold=cfg.learn_hold, retie_target=cfg.retie_target,
        learn_gain_lr=cfg.learn_gain_lr, learn_writer_gains=cfg.learn_writer_gains, learn_decay=cfg.learn_decay,
        learn_label_weight=cfg.learn_label_weight, grow_mode=cfg.grow_mode, clone_noise=cfg.clone_noise,
        n_kv_head=cfg.n_kv_head, given_map=given_map,
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
        from lgpt.method.carry import carry_moments
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
    if record.get("phase_seconds"):
        print("  seconds: " + ", ".join(f"{phase} {t:.1f}" for phase, t in record["phase_seconds"].items())
              + f" (transform {record['seconds']:.1f})")
    if "val_loss_after" in record:
        before = f"{record['val_loss_before']:.4f} → " if "val_loss_before" in record else ""
        print(f"val loss ({record['val_loss_basis']}): {before}{record['val_loss_after']:.4f}")
    print(f"wrote {os.path.join(cfg.out_dir, 'ckpt.pt')}")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
