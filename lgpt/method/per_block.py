"""
Per-block maps with shortcut matrices: SliceGPT's construction (Ashkboos et al., 2024, "SliceGPT: Compress Large
Language Models by Deleting Rows and Columns"), on our canonical form, as ``transform.py --porting=per_block``.

One global map (porting.py) gives the whole residual stream one basis. Here every *site* of the stream — the input
of each sublayer's norm and of the final norm — gets its own map T_s (m×d): site 2l is the input of block l's
attention, 2l + 1 that of its MLP, 2L that of the final norm. Between two sites the stream changes basis, so each
residual path carries a shortcut matrix (``GPTConfig.shortcuts``):

    h_{s+1}' = S_s·h_s' + T_{s+1}·W_out·f(W_in·T_s⁺·norm(h_s')),    S_s = T_{s+1}·S·T_s⁺

(S the model's own shortcut, I for a plain residual). The embedding rows are ported with T_0, each sublayer's
readers with its site's T_s⁺, its writers with the next site's T_{s+1}, the head with T_{2L}⁺ (so a tied head is
untied). With orthonormal columns (m ≥ d) every T_s⁺·T_s = I and the model is the same function; for m < d each
site keeps its own top-m principal directions (``kind='pca'``: one calibration per site), which a global map cannot.
The price is parameters: 2·L shortcut matrices of m² each, and an untied head — results/real_model/table.md
says how much.
"""
from __future__ import annotations

import copy
import time

import torch

from lgpt.method.maps import (
    NO_COORDINATES,
    Calibration,
    Coordinates,
    PortMaps,
    calibration_points,
    jl_min_width,
    make_projection,
    unit_second_moment,
    vocabulary_moment,
)
from lgpt.method.porting import canonicalize, model_from_state, port_embedding, port_reader, port_writer, scale_gain
from lgpt.plumbing.dataset import BatchLoader, calibration_seed
from lgpt.plumbing.errors import TransformError
from lgpt.plumbing.logger import progress
from model import GPT, GPTConfig


def site_norms(cfg: GPTConfig) -> list[str]:
    """The norm that reads each site, in order: ln_1, ln_2 of every block, then ln_f (2·n_layer + 1 sites)."""
    return [f"transformer.h.{i}.{n}" for i in range(cfg.n_layer) for n in ("ln_1", "ln_2")] + ["transformer.ln_f"]


@torch.no_grad()
def collect_site_calibration(model: GPT, loader: BatchLoader, batches: int, seed: int = 0,
                             weighting: str = "unit", vocabulary: bool = True) -> list[Calibration]:
    """One second moment per site: the residual states entering each site's norm, each scaled to unit length as in
    ``maps.collect_calibration`` (or as they are: ``weighting='raw'``, SliceGPT's); site 0 also counts every token
    embedding, as the global map does (unless ``vocabulary`` is off, as SliceGPT's)."""
    model.eval()
    names = site_norms(model.config)
    modules = dict(model.named_modules())
    totals: list[torch.Tensor | None] = [None] * len(names)
    counts = [0] * len(names)

    def hook(site: int):
        def record(_module, inputs):
            moment, n = unit_second_moment(inputs[0], weighting)
            totals[site] = moment if totals[site] is None else totals[site] + moment
            counts[site] += n
        return record

    handles = [modules[name].register_forward_pre_hook(hook(s)) for s, name in enumerate(names)]
    try:
        for k in progress(range(batches), "calibrate per site", unit="batch"):
            x, _ = loader.get_batch("train", seed=calibration_seed(seed, k))
            model(x)
    finally:
        for h in handles:
            h.remove()
    embedding, n = vocabulary_moment(model, weighting, vocabulary)
    totals[0], counts[0] = totals[0] + embedding, counts[0] + n
    return [Calibration(t / c, c) for t, c in zip(totals, counts)]


def sublayer_parts(block: torch.nn.Module, which: int) -> tuple[torch.nn.Module, torch.nn.Module,
                                                                  torch.nn.Module | None]:
    """(input norm, f, output norm or None) of sublayer ``which`` (1: attention, 2: MLP): its update is
    out_norm(f(norm(x))), peri-LN's output norm included."""
    norm, f = (block.ln_1, block.attn) if which == 1 else (block.ln_2, block.mlp)
    return norm, f, getattr(block, f"ln_{which}_out") if block.peri else None


def site_groups(n_sites: int, groups: int) -> list[int]:
    """The group of each site: ``groups`` runs of consecutive sites, as equal as they come (the first ones a site
    longer), each with one map (``--map_groups``); 0: a group per site, SliceGPT's construction."""
    if groups == 0:
        return list(range(n_sites))
    if not 1 <= groups <= n_sites:
        raise TransformError(f"map_groups must lie in 1 … {n_sites} (the model's sites) or be 0 (a map per site), got "
                             f"{groups}")
    return [g for g in range(groups) for _ in range(n_sites // groups + (g < n_sites % groups))]


def grouped(calibrations: list[Calibration], group_of: list[int]) -> list[Calibration]:
    """One moment per group: its sites' moments averaged with their token counts as weights."""
    out = []
    for g in range(group_of[-1] + 1):
        members = [c for c, h in zip(calibrations, group_of) if h == g]
        count = sum(c.count for c in members)
        out.append(Calibration(sum(c.second_moment * c.count for c in members) / count, count))
    return out


def advance(model: GPT, states: list[torch.Tensor], pending: tuple | None, site: int, P: torch.Tensor | None
            ) -> tuple[list[torch.Tensor], tuple | None]:
    """Carry the calibration states through site ``site``'s sublayer, the site cut to range(T_s) by P_s = T_s⁺·T_s
    (None: uncut). ``pending``: peri-LN's outputs still before their output norm, which reads them in this site's
    basis. Returns the states entering the next site and its pending outputs."""
    if pending is not None:
        states = [r + pending[1](y if P is None else y @ P) for r, y in zip(states, pending[0])]
    if P is not None:
        states = [h @ P for h in states]
    norm, f, out_norm = sublayer_parts(model.transformer.h[site // 2], site % 2 + 1)
    outputs = [f(norm(h)) for h in states]
    if out_norm is None:
        return [h + y for h, y in zip(states, outputs)], None
    return states, (outputs, out_norm)


@torch.no_grad()
def sequential_site_maps(model: GPT, m: int, loader: BatchLoader, batches: int, seed: int = 0,
                         weighting: str = "unit", damping: float = 1e-6, vocabulary: bool = True,
                         coordinates: Coordinates = NO_COORDINATES, groups: int = 0
                         ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """SliceGPT's sequential calibration: site s's PCA is taken on the states of the model whose earlier sites are
    already cut. With P_s = T_s⁺·T_s, the ported model computes in d-space, exactly (the norms' √(d/m) gains and d/m
    ε make norm_m(T_s·h) read as norm_d(P_s·h)),

        h̃_0 = embed(x),    h̃_{s+1} = P_s·h̃_s + f_s(P_s·h̃_s)                      (pre-LN)
                            h̃_{s+1} = P_s·h̃_s + norm_out(P_{s+1}·f_s(P_s·h̃_s))    (peri-LN)

    and T_s is the PCA of h̃_s (site 0 also counts every token embedding, as ``collect_site_calibration``, unless
    ``vocabulary`` is off; ``coordinates``: kept out of or in every range, ``maps.pca_map``), so the
    error of every earlier cut is in the data the next map is fitted to. Peri-LN's output norm reads the output
    already in the next site's basis, which is not known before that site's PCA: the PCA sees norm_out(f) uncut,
    the states carried on are the model's own. With ``groups`` (``site_groups``) a group's one map is the PCA of
    all its sites' states, carried through the group uncut from the cut states entering it. One sublayer at a time
    over the whole calibration set (its states held in memory: batches × batch × block × d floats, twice for
    peri-LN, twice again while a group of several sites is fitted)."""
    model.eval()
    cfg = model.config
    like = model.transformer.wte.weight
    states = [model.embed(loader.get_batch("train", seed=calibration_seed(seed, k))[0]) for k in range(batches)]
    pending: tuple[list[torch.Tensor], torch.nn.Module] | None = None  # peri-LN: outputs before their output norm
    n_sites = 2 * cfg.n_layer + 1
    group_of = site_groups(n_sites, groups)
    maps = []
    for g in progress(range(group_of[-1] + 1), "calibrate per site, in order", unit="group" if groups else "site"):
        sites = [s for s in range(n_sites) if group_of[s] == g]
        total, count = vocabulary_moment(model, weighting, vocabulary) if sites[0] == 0 else (0, 0)
        h, carried = states, pending
        for s in sites:  # fit: the group's sites uncut, from the cut states entering it
            fit_on = h if carried is None else [r + carried[1](y) for r, y in zip(h, carried[0])]
            for x in fit_on:
                moment, n = unit_second_moment(x, weighting)
                total, count = total + moment, count + n
            if s != sites[-1]:
                h, carried = advance(model, h, carried, s, None)
        T, T_pinv = make_projection("pca", cfg.n_embd, m, seed, Calibration(total / count, count), damping,
                                    coordinates)
        P = (T_pinv @ T).to(like)  # symmetric: PCA's T has orthonormal rows and T⁺ = Tᵀ
        for s in sites:  # carry on: the group's sites cut
            maps.append((T, T_pinv))
            if s < n_sites - 1:
                states, pending = advance(model, states, pending, s, P)
    return maps


def site_maps(kind: str, d: int, m: int, n_sites: int, seed: int, calibrations: list[Calibration] | None,
              damping: float, coordinates: Coordinates = NO_COORDINATES, groups: int = 0
              ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(T_s, T_s⁺) for every site: PCA of that site's calibration (``coordinates``: kept out of or in its
    range, ``maps.pca_map``), or the kind's map drawn with seed + s; with ``groups`` (``site_groups``) one map per
    group, the PCA of its sites' moments together or drawn with seed + group."""
    group_of = site_groups(n_sites, groups)
    if kind == "pca":
        if calibrations is None:
            raise TransformError("kind='pca' with porting='per_block' needs calibration data (one moment per site)")
        per_group = [make_projection("pca", d, m, seed, c, damping, coordinates)
                     for c in grouped(calibrations, group_of)]
    else:
        per_group = [make_projection(kind, d, m, seed + g, coordinates=coordinates) for g in range(group_of[-1] + 1)]
    return [per_group[g] for g in group_of]


def port_shortcut(S: torch.Tensor, into: PortMaps, out_of: PortMaps) -> torch.Tensor:
    """S → T_{s+1}·S·T_s⁺: the residual path from site s's basis to site s+1's (exact where T_s⁺·T_s = I)."""
    return into.T @ S @ out_of.T_pinv


def port_per_block(sd: dict, cfg: GPTConfig, maps: list[tuple[torch.Tensor, torch.Tensor]]
                   ) -> tuple[dict, GPTConfig]:
    """Port a canonical (state_dict, config) with one map per site (``site_norms`` order); ``sd`` is consumed. Norm
    gains × √(d/m) and ε × d/m as in ``porting.port_weights``; the head is untied; shortcuts are added, except on a
    plain residual path between two sites with the same map (``site_groups``): there T·I·T⁺ acts as I on the stream,
    which stays in range(T), so the path stays plain."""
    if cfg.norm_gain == "vector":
        raise TransformError("port_per_block needs scalar norm gains; run canonicalize first")
    if cfg.head == "knn":
        raise TransformError("porting='per_block' cannot carry a KNN head (it compares the final state with the "
                             "embeddings, which live in another site's basis); use porting='residual'")
    like = sd["transformer.wte.weight"]
    at = [PortMaps(T.to(like), Tp.to(like), Tp.to(like)) for T, Tp in maps]
    m, d = at[0].m, at[0].d
    if len(at) != 2 * cfg.n_layer + 1:
        raise TransformError(f"porting='per_block' needs {2 * cfg.n_layer + 1} maps (one per site), got {len(at)}")
    out = {}
    if cfg.head == "tied":
        sd["lm_head.weight"] = sd["transformer.wte.weight"]  # untied: the head reads the last site's basis
    for name in ("transformer.wte.weight", "transformer.wpe.weight"):
        if name in sd:
            out[name] = port_embedding(sd.pop(name), at[0])
    eye = torch.eye(d, dtype=like.dtype, device=like.device)
    paths = []  # the residual paths that carry a shortcut matrix
    for i in range(cfg.n_layer):
        b = f"transformer.h.{i}"
        for j, (norm, reader, writer) in enumerate((("ln_1", "attn.c_attn", "attn.c_proj"),
                                                    ("ln_2", "mlp.c_fc", "mlp.c_proj"))):
            here, there = at[2 * i + j], at[2 * i + j + 1]
            out[f"{b}.{norm}.weight"] = scale_gain(sd.pop(f"{b}.{norm}.weight"), here)
            out[f"{b}.{reader}.weight"] = port_reader(sd.pop(f"{b}.{reader}.weight"), here)
            for leaf in ("weight", "bias"):
                if f"{b}.{writer}.{leaf}" in sd:
                    out[f"{b}.{writer}.{leaf}"] = port_writer(sd.pop(f"{b}.{writer}.{leaf}"), there)
            if f"{b}.{norm}_out.weight" in sd:  # peri-LN: the output norm writes into the next site
                out[f"{b}.{norm}_out.weight"] = scale_gain(sd.pop(f"{b}.{norm}_out.weight"), there)
            S = sd.pop(f"{b}.shortcut_{j + 1}.weight", None)
            if S is None and torch.equal(maps[2 * i + j][0], maps[2 * i + j + 1][0]):
                continue  # one map on both sides of a plain residual path (--map_groups): it stays plain
            out[f"{b}.shortcut_{j + 1}.weight"] = port_shortcut(eye if S is None else S, there, here)
            paths.append(2 * i + j)
    out["transformer.ln_f.weight"] = scale_gain(sd.pop("transformer.ln_f.weight"), at[-1])
    out["lm_head.weight"] = port_reader(sd.pop("lm_head.weight"), at[-1])
    out.update({name: t.clone() for name, t in sd.items()})  # outside the residual: reader biases, head bias
    sd.clear()
    cfg = copy.deepcopy(cfg)
    cfg.n_embd, cfg.head = m, "linear"
    cfg.shortcuts = True if len(paths) == 2 * cfg.n_layer else tuple(paths) or False
    cfg.norm_eps = cfg.norm_eps * d / m
    return out, cfg


def port_per_block_model(model: GPT, m: int, kind: str, norms: str, seed: int, loader: BatchLoader | None,
                         calib_batches: int, damping: float, started: float, jl: tuple[float, float],
                         weighting: str = "unit", sequential: bool = False, vocabulary: bool = True,
                         coordinates: Coordinates = NO_COORDINATES, groups: int = 0) -> tuple[GPT, dict]:
    """``pipeline.transform_model`` for porting='per_block', its spec already checked (spec.check_spec: no map
    file, sequential only with kind='pca'): canonicalize, one map per site or per group of ``groups`` (PCA
    calibrated per site on the original's states, or ``sequential``ly on the already cut model's), port; the
    record's T is site 0's map, ``site_maps`` counts the sites and ``map_groups`` the distinct maps; ``started``:
    the transform's perf_counter start (the record's seconds)."""
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
