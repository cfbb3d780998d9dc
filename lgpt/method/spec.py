"""
What a width transform is asked to do, as one typed ``TransformSpec`` grouped by concern, and every check of it
in one place.

Each option is written once, in its group, with its default and a comment that says what it does; the command
(``transform.py``) builds its flat config keys from these same groups by dataclass inheritance, so a user still
writes ``width = 432`` in a config file or ``--kind=pca`` on the command line, and ``spec_from_config`` gathers
them back into groups. The comments are also the command's ``--help`` (configurator.field_docs reads them): a
section comment opens each group, and a continuation line starts with ``#  ``.

The checks come in two kinds:
- ``check_settings(spec, error)``: what the options alone can rule out (a value out of range, an option that
  needs another one); the command runs it before reading any checkpoint, raising ``ConfigError``;
- ``check_spec(spec, cfg)``: the whole request against the model it applies to (``GPTConfig``); the pipeline runs
  it before any work, raising ``TransformError``, and returns the canonical porting name.
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from lgpt.method.grow import DEPTH_MODES, GROW_MODES, check_depth, check_growth
from lgpt.method.maps import CALIB_WEIGHTINGS, KINDS
from lgpt.method.paper_rules import PAPER_CODE_KINDS, check_porting
from lgpt.method.porting import NORM_MODES, OUTPUT_GAINS, PORTING_ALIASES, PORTINGS, resolve_porting
from lgpt.method.refit import LEARN_DECAYS, REFIT_MODES, RETIE_TARGETS
from lgpt.plumbing.errors import TransformError
from model import GPTConfig


@dataclass
class MapSpec:
    """What T is (maps.py): its width, how it is drawn, and the coordinates a PCA map keeps out or in."""
    # the map T (maps.py)
    width: int = 0  # the new residual width m (required)
    kind: str = "orthogonal"  # the map T: gaussian | rademacher | sparse | srht | orthogonal | hadamard (m = d)
    #                           | pca | truncate
    seed: int = 0  # seed of the random map (and of the growth symmetry breaking)
    jl_eps: float = 0.2  # distortion ε of the JL minimum width (Algorithm 1, line 1)
    jl_delta: float = 0.05  # failure probability δ
    pca_damping: float = 1e-6  # relative ridge added to the second-moment matrix before eigh
    pca_exclude: tuple[int, ...] = ()  # kind='pca': residual coordinates kept out of range(T) (--pca_exclude=507 or
    #                                    =507,199): the same PCA on the stream with those coordinates removed
    pca_keep: tuple[int, ...] = ()  # kind='pca': residual coordinates kept in range(T) as rows e_iᵀ of their own
    #                                 (--pca_keep=247,17); the rest is the PCA of the stream without them
    output_keep: int = 0  # kind='pca' on a peri-LN model: T keeps the N coordinates whose output-norm gains lie
    #                       farthest from their norm's median (log scale, the largest over norms) as rows of their own
    #                       (--pca_keep), so their gains are carried exactly (porting.carry_output_norms)
    gain_groups: int = 0  # kind='pca' on a peri-LN model: G groups of coordinates of near-equal output gains
    #                       (maps.gain_groups, k-means of their log-gain profiles); every row of T reads one group,
    #                       so T nearly commutes with the output gains (0 or 1: one PCA over all coordinates)
    map_groups: int = 0  # porting='per_block': G maps, each shared by a run of consecutive sites (a shortcut matrix
    #                      only where the map changes: G − 1 of them); 0: a map per site, SliceGPT's construction


@dataclass
class PortingSpec:
    """What T does to each weight (porting.py, paper_rules.py, per_block.py)."""
    # porting the weights (porting.py)
    porting: str = "residual"  # 'residual' (ours; alias 'head') | 'sandwich' (paper's eqs) | 'paper_code' (its code)
    #                            | 'per_block' (SliceGPT's: one map per site, shortcut matrices; per_block.py)
    norms: str = "fold"  # 'fold' (exact) | 'scalar' (gain → its mean) | 'drop' (gain → 1)
    rescale_gains: bool = True  # norm gains × √(d/m), ε × d/m (an RMSNorm over m coordinates needs it); False
    #                             leaves them as they are, as the paper's Algorithm 1 does (residual, sandwich)
    restore_attn_scale: bool = False  # sandwich / paper_code: Q × √(m/d) keeps the attention scale 1/√(d/n_head)
    keep_layernorm: bool = False  # LayerNorm models, fold, orthogonal, m ≥ d: stay LayerNorm (GPT-2 exportable)
    output_gains: str = "carry"  # peri-LN output norms' per-dimension gains: 'carry' (through T, porting.py's
    #                              carry_output_norms: exact for truncate and split maps) | 'average' (their means)
    fit_lengths: int = 0  # with output_gains='carry': fit each output norm's carried length on N calibration
    #                       batches (refit.fit_output_lengths) instead of the data-free fit (0: data-free)


@dataclass
class CalibrationSpec:
    """Which states calibrate PCA, the JL bound and the corrections (maps.collect_calibration)."""
    # calibration: token embeddings + hidden states of every layer on training text (pca, JL bound)
    calib_batches: int = 8  # training batches whose hidden states calibrate PCA and the JL bound
    calib_weighting: str = "unit"  # PCA's second moment: 'unit' (each state scaled to unit length, as the norms see
    #                                it) | 'raw' (as they are: SliceGPT's, where massive activations dominate)
    sequential_calibration: bool = False  # porting='per_block', kind='pca': each site's PCA on the states of the
    #                                       model already cut before it (SliceGPT's order; per_block.py)
    calib_vocabulary: bool = True  # the first site's moment also counts every token embedding (False: only the
    #                                calibration text's own, as SliceGPT's)


@dataclass
class LearningSpec:
    """Corrections after the port, fitted on the calibration text (refit.py)."""
    # corrections after porting (refit.py), fitted on the calibration text; porting='residual'
    refit: str = "none"  # 'none' | 'gains' (LS norm gains) | 'readers' (sequential LS readers) | 'all' (+ writers)
    refit_ridge: float = 1e-4  # ridge of the least-squares refit, relative to the input's mean energy
    learn_steps: int = 0  # > 0: learn T (orthonormal rows; m < d, or m = d with learn_label_weight) by KL steps
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


@dataclass
class TieSpec:
    """A tied head kept tied through a shrink (refit.retie_head)."""
    # a tied head kept tied (refit.retie_head)
    tie_head: bool = False  # a tied model's head stays tied: the final norm gets a per-dimension gain fitted to the
    #                         untied head's logits on calibration text (refit.retie_head); parameters × m/d
    tie_keep: int = 0  # with tie_head and kind='pca': T keeps the N coordinates whose final-norm gain lies farthest
    #                    from the median as rows of their own (--pca_keep), so one m-space gain can stand in for it
    retie_target: str = "head"  # with tie_head, what the final gain is fitted to: 'head' (the untied head's logits
    #                             on the shrunk model's states; a --refit refits that head first) | 'original' (the
    #                             original's logits: the gain corrects the final states too; --refit leaves the head)


@dataclass
class GrowthSpec:
    """Growth beyond the residual width: new directions, heads, neurons and blocks (grow.py)."""
    # growing: new directions (m > d), heads, MLP and blocks (grow.py), function-preserving; 0 keeps the model's
    grow_noise: float = 0.0  # σ of the exact symmetry breaking T⁺ + σ·R·(I − T·T⁺) when m > d
    grow_reader_std: float = 0.0  # m > d: readers also read the new directions with fresh N(0, std²) weights
    #                               (0.02: the scratch init's scale); exact (the stream has no part there yet)
    grow_mask_iters: int = 0  # > 0: MSG masks: writers' new parts and new units start at the scratch scale behind
    #                           masks that training opens linearly over this many steps; exact at the switch
    rms_preserve: bool = False  # m > d: the stream × √(m/d) so its per-coordinate RMS is kept (SPARKLING); exact
    n_head: int = 0  # more attention heads (same head size); key/value heads keep their ratio to them
    n_kv_head: int = 0  # key/value heads after growth (0: the ratio kept), e.g. n_kv_head=n_head turns GQA into MHA
    mlp_hidden: int = 0  # more MLP neurons
    grow_mode: str = "zero"  # 'zero' (fresh inputs, zero outputs) | 'clone' (copies, split outputs, ± noise)
    clone_noise: float = 0.0  # σ of the cancelling noise on cloned output columns
    n_layer: int = 0  # more blocks (0 keeps the model's): copies of old blocks with zero writers, function-preserving
    depth_mode: str = "interleave"  # 'interleave' (each copy after its block) | 'stack' (copies appended) |
    #                                 'gstack' (G_stack: the stack repeated, writers kept; not function-preserving)

    def grows_units(self) -> bool:
        """Whether heads, neurons or blocks are asked for (each option: 0 keeps the model's)."""
        return bool(self.n_head or self.n_kv_head or self.mlp_hidden or self.n_layer)


GROUPS: dict[str, type] = {"map": MapSpec, "port": PortingSpec, "calib": CalibrationSpec, "learn": LearningSpec,
                           "tie": TieSpec, "grow": GrowthSpec}  # TransformSpec's attribute → its group


@dataclass
class TransformSpec:
    """Everything ``pipeline.transform_model`` is asked to do, one group per concern (the groups' fields are the
    command's flat config keys). ``given_map`` (m×d) replaces the map ``kind`` would sample and is used as it is
    (recorded as kind 'file'): a tensor, so it has no config key (the command reads it from --map_file)."""
    map: MapSpec = field(default_factory=MapSpec)
    port: PortingSpec = field(default_factory=PortingSpec)
    calib: CalibrationSpec = field(default_factory=CalibrationSpec)
    learn: LearningSpec = field(default_factory=LearningSpec)
    tie: TieSpec = field(default_factory=TieSpec)
    grow: GrowthSpec = field(default_factory=GrowthSpec)
    given_map: torch.Tensor | None = None

    @classmethod
    def from_flat(cls, given_map: torch.Tensor | None = None, **options: Any) -> TransformSpec:
        """A spec from flat option names (``width=48, kind='pca', refit='readers'``), each sent to its group; an
        unknown name raises TypeError, as an unknown keyword would."""
        unknown = sorted(set(options) - set(spec_fields()))
        if unknown:
            raise TypeError(f"unknown transform options {unknown}; each is a field of one of "
                            f"{[g.__name__ for g in GROUPS.values()]}")
        groups = {attr: group(**{f.name: options[f.name] for f in dataclasses.fields(group) if f.name in options})
                  for attr, group in GROUPS.items()}
        return cls(**groups, given_map=given_map)

    def flat(self) -> dict[str, Any]:
        """Every option by its flat name (the inverse of ``from_flat``, ``given_map`` left out)."""
        return {name: value for attr in GROUPS for name, value in dataclasses.asdict(getattr(self, attr)).items()}


def spec_fields() -> dict[str, str]:
    """Every flat option name → the TransformSpec attribute of its group (each name in exactly one group)."""
    return {f.name: attr for attr, group in GROUPS.items() for f in dataclasses.fields(group)}


def spec_from_config(cfg: Any) -> TransformSpec:
    """The spec of a flat config (transform.py's TransformConfig, or any object with the groups' attributes)."""
    return TransformSpec.from_flat(**{name: getattr(cfg, name) for name in spec_fields()})


# ----------------------------------------------------------------------------------------------
# The options alone (the command runs these before it reads a checkpoint)


def check_settings(spec: TransformSpec, error: type[Exception], map_file: bool = False) -> None:
    """Raise ``error`` for what the options alone rule out: an unknown mode, a value out of range, an option
    without the one it needs. ``map_file``: a map will be given (the command reads it later, with the model)."""
    s = spec.flat()
    if not isinstance(s["width"], int) or s["width"] <= 0:
        raise error(f"width must be a positive integer (the new residual width m), got {s['width']}")
    if not isinstance(s["output_keep"], int) or s["output_keep"] < 0:
        raise error(f"output_keep must be a count >= 0 (coordinates of outlying output gain kept as rows of T), "
                    f"got {s['output_keep']}")
    if not s["rescale_gains"] and s["porting"] == "paper_code":
        raise error("rescale_gains=False applies to porting='residual' or 'sandwich' (paper_code never rescales); "
                    "drop --rescale_gains=False")
    for name, allowed in (("kind", KINDS), ("norms", NORM_MODES), ("refit", REFIT_MODES),
                          ("calib_weighting", CALIB_WEIGHTINGS), ("grow_mode", GROW_MODES),
                          ("depth_mode", DEPTH_MODES), ("output_gains", OUTPUT_GAINS)):
        if s[name] not in allowed:
            raise error(f"{name}={s[name]!r} is not one of {allowed}")
    if PORTING_ALIASES.get(s["porting"], s["porting"]) not in PORTINGS:
        raise error(f"porting={s['porting']!r} is not one of {PORTINGS} (or the alias 'head')")
    if not 1e-3 <= s["jl_eps"] < 1 or not 0 < s["jl_delta"] < 1 or s["learn_lr"] <= 0:
        raise error("jl_eps must lie in [0.001, 1) (the JL width grows as 1/ε²), jl_delta in (0, 1), and learn_lr "
                    "must be > 0")
    if not s["refit_ridge"] <= 1e6:
        raise error(f"refit_ridge={s['refit_ridge']} is beyond 1e6 (relative to the input's mean energy): the refit "
                    "would solve for nothing; use a ridge in [0, 1e6]")
    check_learning(spec.learn, error)
    if not spec.learn.learn_hold and not spec.learn.learn_steps:
        raise error("learn_hold=False chooses what a learned map may change: add --learn_steps=N or drop "
                    "--learn_hold")
    for name in ("grow_noise", "n_head", "n_kv_head", "mlp_hidden", "clone_noise", "learn_steps", "refit_ridge",
                 "n_layer", "grow_reader_std", "grow_mask_iters", "pca_damping"):
        if not s[name] >= 0:  # 0: off (n_head, mlp_hidden: keep the model's; learn_steps: keep T); NaN fails too
            raise error(f"{name} must be >= 0, got {s[name]}")  # a negative damping would invert --pca_exclude
    for name in ("grow_noise", "clone_noise"):  # exact in exact arithmetic; float error grows with σ
        if s[name] > 100:
            raise error(f"{name}={s[name]} is beyond 100: the symmetry breaking is exact only up to float error, "
                        "which grows with σ (1e5 moved the loss); use σ ≤ 100 (0.01–1 is usual)")
    if spec.calib.calib_batches <= 0:
        raise error(f"calib_batches must be a positive integer, got {spec.calib.calib_batches}")
    check_pca_options(spec, error, map_file)
    check_tie_options(spec.tie, error)
    check_per_block_options(spec, error)


def check_learning(learn: LearningSpec, error: type[Exception]) -> None:
    """Raise ``error`` for learned gains without a learned map, at a negative rate, writer gains without a rate,
    a rate schedule that is unknown or has no learned map to schedule, or a label weight outside [0, 1] or without
    a learned map."""
    steps, gain_lr, weight = learn.learn_steps, learn.learn_gain_lr, learn.learn_label_weight
    if not 0 <= weight <= 1 or weight > 0 and not steps:
        raise error(f"learn_label_weight={weight} weighs the text's next tokens against the KL in a learned "
                    "map's objective: a number in [0, 1] with --learn_steps=N, or drop --learn_label_weight")
    if learn.learn_decay not in LEARN_DECAYS or learn.learn_decay != "none" and not steps:
        raise error(f"learn_decay={learn.learn_decay!r} schedules a learned map's rates: one of {LEARN_DECAYS} with "
                    "--learn_steps=N, or drop --learn_decay")
    if gain_lr < 0 or gain_lr > 0 and not steps:
        raise error(f"learn_gain_lr={gain_lr} needs learn_steps > 0 and must be >= 0: add --learn_steps=N (the "
                    "gains are learned with the map) or drop --learn_gain_lr")
    if learn.learn_writer_gains and not gain_lr > 0:
        raise error("learn_writer_gains=True learns the writers' gains at learn_gain_lr: add --learn_gain_lr=R "
                    "(R > 0, with --learn_steps=N) or drop --learn_writer_gains")


def check_pca_options(spec: TransformSpec, error: type[Exception], map_file: bool = False) -> None:
    """The PCA-only settings ask for kind='pca' drawn here (not a map file)."""
    kind, given = spec.map.kind, map_file or spec.given_map is not None
    for name, value, what in (("pca_exclude", spec.map.pca_exclude, "keeps coordinates out of a PCA map's range"),
                              ("pca_keep", spec.map.pca_keep, "keeps coordinates in a PCA map's range"),
                              ("tie_keep", spec.tie.tie_keep,
                               "keeps the final gain's outlying coordinates in a PCA map's range")):
        if value and (kind != "pca" or given):
            raise error(f"{name} {what}; kind={kind!r}" + (" with a map file" if given else "")
                        + f": use --kind=pca without --map_file or drop --{name}")


def check_tie_options(tie: TieSpec, error: type[Exception]) -> None:
    """retie_target and tie_keep choose how a head kept tied is fitted: they need --tie_head."""
    if tie.retie_target not in RETIE_TARGETS or tie.retie_target != "head" and not tie.tie_head:
        raise error(f"retie_target={tie.retie_target!r} chooses what a head kept tied is fitted to: one of "
                    f"{RETIE_TARGETS} with --tie_head=True, or drop --retie_target")
    if tie.tie_keep < 0 or tie.tie_keep and not tie.tie_head:
        raise error(f"tie_keep={tie.tie_keep} chooses coordinates for a head kept tied: give a count >= 0 "
                    "with --tie_head=True, or drop --tie_keep")


def check_per_block_options(spec: TransformSpec, error: type[Exception]) -> None:
    """sequential_calibration and map_groups shape porting='per_block''s maps; neither applies without it."""
    porting = PORTING_ALIASES.get(spec.port.porting, spec.port.porting)
    if spec.calib.sequential_calibration and (porting != "per_block" or spec.map.kind != "pca"):
        raise error("sequential_calibration orders the per-site PCAs of porting='per_block' with kind='pca'; "
                    "add --porting=per_block --kind=pca or drop --sequential_calibration")
    groups = spec.map.map_groups
    if groups < 0 or groups and porting != "per_block":
        raise error(f"map_groups={groups} shares per-block maps between consecutive sites: give a count >= 0 "
                    "with --porting=per_block, or drop --map_groups")
    if porting == "per_block" and spec.given_map is not None:
        raise error("porting='per_block' draws one map per site; a map file gives one: drop --map_file")


# ----------------------------------------------------------------------------------------------
# The request against the model (the pipeline runs this before any work)


def check_spec(spec: TransformSpec, cfg: GPTConfig) -> str:
    """Every check of a transform request against the model it applies to (``cfg``), in one place: every path
    calls it before any work. Returns the canonical porting name."""
    d, m, kind, norms = cfg.n_embd, spec.map.width, spec.map.kind, spec.port.norms
    if m <= 0:
        raise TransformError(f"width must be positive, got {m}")
    if kind not in KINDS:
        raise TransformError(f"kind={kind!r} is not one of {KINDS}")
    if norms not in NORM_MODES:
        raise TransformError(f"norms={norms!r} is not one of {NORM_MODES}")
    porting = resolve_porting(spec.port.porting)
    if spec.map.gain_groups < 0 or spec.map.gain_groups > 1 and (kind != "pca" or cfg.norm_placement != "peri"):
        raise TransformError(f"gain_groups={spec.map.gain_groups} groups a PCA map's coordinates by peri-LN output "
                             "gain: it needs kind='pca' on a peri-LN model with per-dimension gains; drop it")
    if spec.port.fit_lengths < 0 or spec.port.fit_lengths and spec.port.output_gains != "carry":
        raise TransformError(f"fit_lengths={spec.port.fit_lengths} fits carried peri-LN output lengths: give a count "
                             ">= 0 of calibration batches, with --output_gains=carry")
    if spec.map.output_keep < 0:
        raise TransformError(f"output_keep must be a count >= 0 (coordinates of outlying output gain kept as rows "
                             f"of T), got {spec.map.output_keep}")
    check_width(d, m, kind, spec.grow.grow_noise)
    check_paper_code(porting, kind, spec.port.keep_layernorm, spec.grow.grow_noise)
    check_shortcut_models(spec, cfg, porting)
    check_corrections(spec, d, porting)
    grow = spec.grow
    check_growth(cfg, grow.n_head, grow.mlp_hidden, grow.grow_mode, grow.n_kv_head)
    check_depth(cfg, grow.n_layer, grow.depth_mode)
    check_canonical_growth(spec, cfg, porting)
    if spec.port.restore_attn_scale and porting == "residual":
        raise TransformError("restore_attn_scale applies to porting='sandwich' or 'paper_code' (porting='residual' "
                             "keeps the head size, so the scale never changes); drop --restore_attn_scale")
    check_keep_layernorm(spec, cfg)
    check_porting(cfg, m, porting)
    if m > 64 * d:
        warnings.warn(f"width m={m} is more than 64× d={d}: the transformed model is {m // d}× as wide "
                      "(was that meant?)", stacklevel=2)
    check_new_directions(spec, cfg, porting)
    check_tie_head(spec, cfg, porting)
    check_learning(spec.learn, TransformError)
    check_per_block_options(spec, TransformError)
    return porting


def check_width(d: int, m: int, kind: str, grow_noise: float) -> None:
    """PCA has at most d directions to keep; the symmetry breaking acts only on new directions."""
    if kind == "pca" and m > d:
        raise TransformError(f"kind='pca' shrinks or keeps the width (m ≤ d), got width={m} > d={d}; "
                             "use kind='orthogonal' to grow")
    if kind == "split" and not d < m <= d + d // 2:
        raise TransformError(f"kind='split' grows by pairs of coordinates, one new row each: it needs "
                             f"d < m ≤ d + d//2 = {d + d // 2} (d={d}), got width={m}; grow in two steps, or use "
                             "kind='orthogonal' (approximate for peri-LN) / kind='truncate' (zero padding)")
    if grow_noise > 0 and m <= d:
        raise TransformError(f"grow_noise applies when growing (m > d), got width={m}, d={d}")


def check_paper_code(porting: str, kind: str, keep_layernorm: bool, grow_noise: float) -> None:
    """porting='paper_code' reproduces the paper's code: its maps, and nothing it lacks."""
    if porting != "paper_code":
        return
    if kind not in PAPER_CODE_KINDS:
        raise TransformError(f"porting='paper_code' reproduces the paper's code, whose maps are "
                             f"{PAPER_CODE_KINDS}; got kind={kind!r}")
    if keep_layernorm or grow_noise > 0:
        raise TransformError("porting='paper_code' takes no keep_layernorm or grow_noise (the paper's code has "
                             "neither); drop them")


def check_shortcut_models(spec: TransformSpec, cfg: GPTConfig, porting: str) -> None:
    """Raise TransformError for what porting='per_block' cannot do, or what a model with shortcut matrices (its
    output) cannot undergo."""
    keep_layernorm, grows = spec.port.keep_layernorm, spec.grow.grows_units()
    if porting == "per_block":
        asked = [name for name, on in (("refit", spec.learn.refit != "none"),
                                       ("learn_steps", spec.learn.learn_steps > 0),
                                       ("keep_layernorm", keep_layernorm), ("grow_noise", spec.grow.grow_noise > 0),
                                       ("n_head / n_kv_head / mlp_hidden / n_layer growth", grows)) if on]
        if asked:
            raise TransformError(f"porting='per_block' (one map per site, SliceGPT's construction) takes no "
                                 f"{', '.join(asked)}; drop them or use porting='residual'")
        if cfg.head == "knn":
            raise TransformError("porting='per_block' cannot carry a KNN head; use porting='residual'")
    if cfg.shortcuts and (grows or keep_layernorm or porting == "paper_code"):
        raise TransformError("this model has shortcut matrices (a per-block transform's output): only residual or "
                             "per_block porting applies to it, without growth or keep_layernorm")


def check_corrections(spec: TransformSpec, d: int, porting: str) -> None:
    """Raise TransformError for a refit / learned-map request that cannot apply. A map learned at m = d is allowed
    only with the text's labels in its objective (``learn_label_weight`` > 0): the KL alone is already 0 at an
    exact port, while the labels move it — the same-width control of a shrink learned on labels."""
    refit, steps, m = spec.learn.refit, spec.learn.learn_steps, spec.map.width
    if refit not in REFIT_MODES:
        raise TransformError(f"refit={refit!r} is not one of {REFIT_MODES}")
    if steps < 0:
        raise TransformError(f"learn_steps must be >= 0, got {steps}")
    if refit == "none" and steps == 0:
        return
    if porting != "residual":
        raise TransformError(f"refit and learn_steps need porting='residual' (porting={porting!r} re-splits the "
                             "heads, so its Q/K/V outputs have no original counterpart to fit); use "
                             "--porting=residual")
    if spec.port.keep_layernorm:
        raise TransformError("keep_layernorm ports exactly (orthogonal, m ≥ d): there is nothing to refit; drop "
                             "--refit / --learn_steps")
    if steps > 0 and (m > d or m == d and not spec.learn.learn_label_weight):
        raise TransformError(f"learn_steps learns a map with orthonormal rows for a shrink (m < d, or m = d with "
                             f"--learn_label_weight > 0), got width={m}, d={d}; at m ≥ d an orthogonal T is already "
                             "exact")


def check_canonical_growth(spec: TransformSpec, cfg: GPTConfig, porting: str) -> None:
    """Depth grows on the canonical model, and heads / neurons cannot be exported back to GPT-2."""
    grow, keep_layernorm = spec.grow, spec.port.keep_layernorm
    if grow.n_layer > cfg.n_layer and (porting == "paper_code" or keep_layernorm):
        raise TransformError("n_layer grows depth on the canonical model (RMSNorm, folded gains), so a zero writer "
                             "adds exactly 0; drop --porting=paper_code / --keep_layernorm, or --n_layer")
    if (grow.n_head or grow.n_kv_head or grow.mlp_hidden) and keep_layernorm:
        raise TransformError("keep_layernorm exports to GPT-2, whose attention width equals its residual width; "
                             "grow heads/MLP without --keep_layernorm")


def check_keep_layernorm(spec: TransformSpec, cfg: GPTConfig) -> None:
    """keep_layernorm needs a mean-preserving isometry, which exists only for these settings."""
    if not spec.port.keep_layernorm:
        return
    d, m = cfg.n_embd, spec.map.width
    needs = {"a LayerNorm model": cfg.norm_type == "layernorm", "norms='fold'": spec.port.norms == "fold",
             "kind='orthogonal'": spec.map.kind == "orthogonal", f"width ≥ d={d}": m >= d}
    failed = [what for what, ok in needs.items() if not ok]
    if failed:
        raise TransformError(f"keep_layernorm needs {' and '.join(failed)} (a mean-preserving isometry exists "
                             "only then); drop --keep_layernorm or change those settings")


def check_new_directions(spec: TransformSpec, cfg: GPTConfig, porting: str) -> None:
    """Raise TransformError unless ``grow_reader_std``, ``grow_mask_iters`` and ``rms_preserve`` can apply: each
    needs the exact port (residual, fold, gains rescaled) of a pre-LN model with a linear head, growing."""
    port, grow, d, m = spec.port, spec.grow, cfg.n_embd, spec.map.width
    if not port.rescale_gains and porting in ("paper_code", "per_block"):
        raise TransformError(f"rescale_gains=False applies to porting='residual' or 'sandwich' ({porting} always "
                             "handles the gains its own way); drop --rescale_gains")
    asked = [name for name, on in (("grow_reader_std", grow.grow_reader_std > 0),
                                   ("grow_mask_iters", grow.grow_mask_iters > 0),
                                   ("rms_preserve", grow.rms_preserve)) if on]
    if grow.grow_mask_iters > 0 and grow.grow_mode == "clone" and (grow.n_head or grow.mlp_hidden):
        raise TransformError("grow_mask_iters masks the new units, but grow_mode='clone' splits each old unit's output "
                             "with its clone: masking the clones halves those outputs; use grow_mode='zero' with "
                             "masks, or drop --grow_mask_iters")
    if not asked:
        return
    needs = {f"width > d={d}": m > d, "porting='residual'": porting == "residual",
             "norms='fold'": port.norms == "fold", "rescale_gains": port.rescale_gains,
             "no keep_layernorm, refit or learn_steps": (not port.keep_layernorm and spec.learn.refit == "none"
                                                         and not spec.learn.learn_steps),
             "a pre-LN model": cfg.norm_placement == "pre",
             "a linear head (the scaled or masked embeddings would change a tied or KNN head)": cfg.head == "linear"}
    failed = [what for what, ok in needs.items() if not ok]
    if failed:
        raise TransformError(f"{' and '.join(asked)} need {' and '.join(failed)}: they add to the exact growth of the "
                             "residual stream; change those settings or drop them")


def check_tie_head(spec: TransformSpec, cfg: GPTConfig, porting: str) -> None:
    """Raise TransformError unless --tie_head (and --tie_keep) can apply: a tied model, residual porting, no
    growth."""
    if spec.tie.tie_keep and not spec.tie.tie_head:
        raise TransformError(f"tie_keep={spec.tie.tie_keep} chooses coordinates for a head kept tied: add "
                             "--tie_head=True or drop --tie_keep")
    check_tie_options(spec.tie, TransformError)
    if not spec.tie.tie_head:
        return
    if cfg.head != "tied" or cfg.norm_gain != "vector":
        raise TransformError(f"tie_head keeps a tied head tied through the shrink; this model's head is {cfg.head!r}"
                             + (" and already stays tied (its norms have no per-dimension gain)"
                                if cfg.head == "tied" else "") + ": drop --tie_head")
    if porting != "residual" or spec.port.keep_layernorm or spec.grow.grows_units():
        raise TransformError("tie_head needs porting='residual' without keep_layernorm or growth; drop --tie_head "
                             "or those settings")
    if spec.map.width > cfg.n_embd:
        raise TransformError(f"tie_head keeps a tied head tied through a shrink (width ≤ d = {cfg.n_embd}), but "
                             f"width={spec.map.width} grows the model: drop --tie_head (growth keeps the tie exactly "
                             "only where the final norm's gain allows, which this option does not attempt)")
