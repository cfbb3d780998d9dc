"""
What a width transform (and a finetune after it) did to a model's geometry.

    python eval_geometry.py --ref_dir=out-shakespeare-char --in_dir=out-m96 --out_dir=geom-m96
    python eval_geometry.py --ref_dir=out-shakespeare-char --out_dir=geom-ref      # one model alone

Writes out_dir/metrics.json (schema in docs/finetune_and_geometry.md), PNG figures, and logs both to wandb
(offline unless WANDB_MODE says otherwise). Definitions of every metric are in geometry.py's docstrings.

Reference basis: the transform maps the residual stream of the canonical model (transform.py step 1);
with norms=fold on a LayerNorm model that stream is the original one centred (h − mean(h)·1), which has
the same function. The reference's probes are therefore centred in that case, so that an exact
transform shows AE = 0 and HC = 1.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass

import torch

from lgpt.method import geometry as geo
from lgpt.plumbing.checkpoint import check_transform_source, check_writable_dir, hold_run_dir, load_model, staged_dir
from lgpt.plumbing.cli import run_cli
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.dataset import (
    LOGITS_BUDGET,
    BatchLoader,
    Tokenizer,
    check_tokenizer,
    chunked_logits,
    data_dir_for_checkpoint,
    describe_tokenizer,
    eval_batches,
    evaluate_loss,
    head_rows,
    loss_basis,
    tokenizer_fingerprint,
    window_size,
)
from lgpt.plumbing.devices import announce_threads, check_memory, resolve_device
from lgpt.plumbing.errors import CheckpointError, ConfigError
from lgpt.plumbing.logger import MetricsLogger
from model import GPT, embedding_norm_stats

SIMILARITIES = ("neg_euclidean", "inv_euclidean", "cosine", "dot")


@dataclass
class GeometryConfig:
    # what to compare
    ref_dir: str = ""  # the reference (untransformed) checkpoint (required)
    in_dir: str = ""  # the transformed or finetuned checkpoint ('' → analyse ref_dir alone)
    out_dir: str = "geom"  # where metrics.json and the figures go
    overwrite: bool = False  # replace a geometry report (metrics.json) already in out_dir
    allow_unrelated: bool = False  # compare in_dir with a ref_dir that is not the transform's recorded source
    data_dir: str = ""  # '' → the data directory recorded in ref_dir's checkpoint
    n_probes: int = 4096  # probe vectors: token embeddings + hidden states spread over every layer
    probe_batches: int = 4  # val batches the hidden-state probes are sampled from
    batch_size: int = 16  # sequences per val batch
    block_size: int = 0  # tokens per window (0: the models' context; smaller for 32k–128k-context imports)
    eval_iters: int = 50  # val batches for loss, KL and top-1 agreement
    n_features: int = 64  # FA: this many frequent-token embeddings and this many principal directions
    ndcg_k: int = 10  # NDCG@k of the similarity ranking of tokens against the head's ranking
    heatmap_probes: int = 48  # probe vectors in each cosine-similarity heatmap
    figures: bool = True  # write the PNG figures (False: metrics.json and wandb scalars only, ~3 s less a run)
    prompt: str = ""  # the norm heatmap's text ('' → the start of the val split)
    seed: int = 0  # seed of the probe sampling
    wandb_log: bool = True  # also log to wandb (offline unless WANDB_MODE says otherwise)
    wandb_project: str = "nanolgpt"  # wandb project name
    wandb_run_name: str = "geometry"  # wandb run name
    device: str = "cpu"  # where the models run: 'cpu' | 'cuda' | 'cuda:N' | 'mps' | 'auto' (statistics follow them)

    def validate(self) -> None:
        if not self.ref_dir:
            raise ConfigError("ref_dir is required: --ref_dir=DIR (the reference checkpoint)")
        for name in ("n_probes", "probe_batches", "batch_size", "eval_iters", "n_features", "ndcg_k",
                     "heatmap_probes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.n_probes < 2:
            raise ConfigError(f"n_probes={self.n_probes}: the geometry compares pairs of probes; give at least 2")
        if self.block_size < 0:
            raise ConfigError(f"block_size must be >= 0 (0: the models' context), got {self.block_size}")


# ----------------------------------------------------------------------------------------------
# Probes


@torch.no_grad()
def hidden_states(model: GPT, x: torch.Tensor) -> list[torch.Tensor]:
    """The L+1 residual-stream states (no logits: on a 50k vocabulary they would be most of the memory)."""
    return model(x, features=True)[1]


@torch.no_grad()
def collect_probes(ref: GPT, new: GPT | None, loader: BatchLoader, n_probes: int, batches: int, seed: int,
                   centre_ref: bool) -> dict:
    """Row-aligned probes: token embeddings of random tokens, then hidden states at random (sequence,
    position) of every layer 0..L, the same rows for both models."""
    L = ref.config.n_layer
    g = torch.Generator().manual_seed(seed)
    per_group = max(1, n_probes // (L + 2))
    token_ids = torch.randperm(ref.config.vocab_size, generator=g)[:per_group]
    xs = [loader.get_batch("val", seed=seed + 7919 * (k + 1))[0] for k in range(batches)]
    x = torch.cat(xs)
    sites = torch.randint(0, x.numel(), (per_group * (L + 1),), generator=g)
    layer_of = torch.arange(L + 1).repeat_interleave(per_group)

    def gather(model: GPT) -> tuple[torch.Tensor, list[torch.Tensor]]:
        hidden = hidden_states(model, x)
        flat = [h.reshape(-1, h.shape[-1]) for h in hidden]
        rows = [model.transformer.wte.weight[token_ids]]
        rows += [flat[layer][sites[layer_of == layer]] for layer in range(L + 1)]
        return torch.cat(rows).double(), hidden

    X, ref_hidden = gather(ref)
    if centre_ref:
        X = X - X.mean(1, keepdim=True)
        ref_hidden = [h - h.mean(-1, keepdim=True) for h in ref_hidden]
    groups = torch.cat([torch.full((len(token_ids),), -1), layer_of])  # −1 = embeddings (host: indexes probes)
    out = {"X": X, "groups": groups, "x": x, "ref_hidden": ref_hidden, "token_ids": token_ids}
    if new is not None:
        out["Y"], out["new_hidden"] = gather(new)
    return out


# ----------------------------------------------------------------------------------------------
# Per-model measurements


def geometry_memory(cfg: GeometryConfig, ref: GPT, new: GPT | None, block: int) -> int:
    """Bytes the geometry statistics hold at once beyond the models, roughly, so that an impossible request stops
    before it starts: the probes and their unit copies (float64, n × both widths, twice), the blocks of pairwise
    cosines (float64, geo.PAIR_BLOCK × n, five at once: the measured slope is 11 KB a probe at widths 32 and 24), every
    layer's hidden states of the probe batches (float32, and their centred copies) and one block of logits (float32,
    with its softmax and its float copy)."""
    n = cfg.n_probes
    widths = ref.config.n_embd + (new.config.n_embd if new is not None else 0)
    tokens = cfg.probe_batches * cfg.batch_size * block
    probes = 2 * 8 * n * widths
    pair_blocks = 5 * 8 * geo.PAIR_BLOCK * n
    hidden = 2 * 4 * tokens * (ref.config.n_layer + 1) * widths
    logits = 3 * 4 * min(LOGITS_BUDGET, max(tokens, cfg.batch_size * block) * ref.config.vocab_size)
    return probes + pair_blocks + hidden + logits


def weight_matrices(model: GPT) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in model.named_parameters() if p.dim() == 2}


@torch.no_grad()
def logit_lens(model: GPT, hidden: list[torch.Tensor], x: torch.Tensor, budget: int = LOGITS_BUDGET) -> dict:
    """Decode every layer's hidden state through the final norm and head: mean rank (1 = top) and mean
    probability of the true next token, per layer (iterative refinement, as in Traveling Words). The head is
    applied ``budget`` logits at a time (``chunked_logits``), so memory does not grow with the probe set."""
    targets = x[:, 1:].reshape(-1)
    ranks, probs = [], []
    for h in hidden:
        rank_sum = prob_sum = 0.0
        for part, logits in chunked_logits(model, model.transformer.ln_f(h.float())[:, :-1], budget):
            target = targets[part, None]
            target_logit = logits.gather(1, target)
            rank_sum += (logits > target_logit).sum(1).double().add(1).sum().item()
            prob_sum += logits.float().softmax(-1).gather(1, target).double().sum().item()
        ranks.append(rank_sum / len(targets))
        probs.append(prob_sum / len(targets))
    return {"rank": ranks, "prob": probs}


@torch.no_grad()
def ndcg_report(model: GPT, hidden_last: torch.Tensor, k: int, max_positions: int = 512) -> dict:
    """NDCG@k of each similarity between the final normed hidden state and the token embeddings, against
    the model's own next-token probabilities as graded relevance (the thesis' Table 6.1)."""
    h = model.transformer.ln_f(hidden_last.float()).reshape(-1, model.config.n_embd)[:max_positions]
    relevance = model.lm_head(h).softmax(-1)
    E = model.transformer.wte.weight
    return {kind: geo.ndcg_at_k(geo.similarity_scores(h, E, kind), relevance, k) for kind in SIMILARITIES}


@torch.no_grad()
def throughput(model: GPT, x: torch.Tensor, repeats: int = 3) -> dict:
    x = x[: max(1, head_rows(model.config.vocab_size) // x.shape[1])]  # the whole batch unless its logits are huge
    model(x, all_logits=True)
    t0 = time.perf_counter()
    for _ in range(repeats):
        model(x, all_logits=True)
    if x.is_cuda:
        torch.cuda.synchronize()  # kernels are asynchronous: time them, not their launch
    seconds = (time.perf_counter() - t0) / repeats
    params = sum(p.numel() for p in model.parameters())
    return {"tokens_per_s": x.numel() / seconds, "params": params,
            "bytes": sum(p.numel() * p.element_size() for p in model.parameters())}


def model_report(model: GPT, hidden: list[torch.Tensor], x: torch.Tensor, cfg: GeometryConfig) -> dict:
    weights = weight_matrices(model)
    mean_e, std_e, threshold = embedding_norm_stats(model.transformer.wte.weight.detach().double())
    layer_states = [h.reshape(-1, h.shape[-1]) for h in hidden]
    return {
        "embedding_norms": {"mean": mean_e.item(), "std": std_e.item(), "threshold": threshold.item()},
        "hidden_norm_mean": [h.double().norm(dim=-1).mean().item() for h in layer_states],
        "weight_kurtosis": {n: geo.excess_kurtosis(w) for n, w in weights.items()},
        "activation_kurtosis": [geo.excess_kurtosis(h) for h in layer_states],
        "int8_rtn_error": sum(geo.rtn_error(w, 8) for w in weights.values()) / len(weights),
        "int4_rtn_error": sum(geo.rtn_error(w, 4) for w in weights.values()) / len(weights),
        "intrinsic_dimension": [geo.intrinsic_dimension(h[:4096]) for h in layer_states],
        "twonn_dimension": [geo.twonn_dimension(h[:2048]) for h in layer_states],
        "ndcg": ndcg_report(model, hidden[-1], cfg.ndcg_k),
        "logit_lens": logit_lens(model, hidden, x),
        "throughput": throughput(model, x[: cfg.batch_size]),
    }


# ----------------------------------------------------------------------------------------------
# Figures


def _plt():
    import matplotlib
    matplotlib.use(os.environ.get("MPLBACKEND", "Agg"))
    import matplotlib.pyplot as plt
    return plt


@torch.no_grad()
def norm_heatmap(models: dict[str, GPT], ids: torch.Tensor, path: str) -> str:
    from matplotlib.colors import LogNorm
    plt = _plt()
    grids = {}
    for name, model in models.items():
        hidden = hidden_states(model, ids)
        grids[name] = torch.stack([h[0].norm(dim=-1) for h in hidden]).cpu().numpy()
    vmin = max(min(g.min() for g in grids.values()), 1e-3)
    vmax = max(g.max() for g in grids.values())
    fig, axes = plt.subplots(len(grids), 1, figsize=(10, 2.2 + 1.6 * len(grids)), squeeze=False)
    for ax, (name, grid) in zip(axes[:, 0], grids.items()):
        im = ax.imshow(grid, aspect="auto", cmap="viridis", norm=LogNorm(vmin=vmin, vmax=vmax), origin="lower")
        ax.set_title(f"hidden-state norm ‖h‖₂ — {name}")
        ax.set_xlabel("token position")
        ax.set_ylabel("layer (0 = embedding)")
        fig.colorbar(im, ax=ax, label="‖h‖₂ (log scale)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def probe_ticks(groups: list[int]) -> tuple[list[float], list[str], list[float]]:
    """(tick positions, labels, boundaries) of probes sorted by layer: one tick at the middle of each layer's block,
    labelled 'wte' for the token-embedding rows (group −1), 'h0' for the residual stream entering block 1 and 'h1',
    'h2', … for the residual stream after each block."""
    ticks, labels, bounds, start = [], [], [], 0
    for i in range(1, len(groups) + 1):
        if i == len(groups) or groups[i] != groups[start]:
            ticks.append((start + i - 1) / 2)
            labels.append("wte" if groups[start] < 0 else f"h{groups[start]}")
            if i < len(groups):
                bounds.append(i - 0.5)
            start = i
    return ticks, labels, bounds


def cosine_heatmaps(mats: dict[str, torch.Tensor], path: str, groups: list[int]) -> str:
    """Pairwise cosines of the same probes in each model, sorted by layer; the axes name each layer's block."""
    plt = _plt()
    ticks, labels, bounds = probe_ticks(groups)
    fig, axes = plt.subplots(1, len(mats), figsize=(4.6 * len(mats), 4.2), squeeze=False)
    for ax, (name, M) in zip(axes[0], mats.items()):
        U = torch.nn.functional.normalize(M.double(), dim=1)
        im = ax.imshow((U @ U.T).cpu().numpy(), cmap="RdBu_r", vmin=-1, vmax=1)
        ax.set_title(f"pairwise cosine — {name}")
        for b in bounds:
            ax.axhline(b, color="k", lw=0.5)
            ax.axvline(b, color="k", lw=0.5)
        ax.set_xticks(ticks, labels, fontsize=7)
        ax.set_yticks(ticks, labels, fontsize=7)
        ax.set_xlabel("probes: wte = token embeddings, h0 = into block 1, hN = after block N", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046, label="cosine similarity")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def concordance_plot(X: torch.Tensor, others: dict[str, torch.Tensor], path: str, seed: int) -> str:
    plt = _plt()
    i, j = geo.sample_pairs(len(X), 20_000, seed)
    Xu = torch.nn.functional.normalize(X.double(), dim=1)
    before = (Xu[i] * Xu[j]).sum(1).cpu().numpy()
    fig, axes = plt.subplots(1, len(others), figsize=(4.8 * len(others), 4.4), squeeze=False)
    for ax, (name, Y) in zip(axes[0], others.items()):
        Yu = torch.nn.functional.normalize(Y.double(), dim=1)
        after = (Yu[i] * Yu[j]).sum(1).cpu().numpy()
        hb = ax.hexbin(before, after, gridsize=60, bins="log", cmap="magma")
        ax.plot([-1, 1], [-1, 1], "c--", lw=1, label="y = x")
        ax.set_title(f"cosine before vs after — {name}")
        ax.set_xlabel("cos(u, v), reference")
        ax.set_ylabel("cos(ũ, ṽ), transformed")
        ax.legend(loc="upper left")
        fig.colorbar(hb, ax=ax, label="pairs (log)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def layer_plots(reports: dict[str, dict], path: str) -> str:
    plt = _plt()
    fig, axes = plt.subplots(1, 4, figsize=(19, 4))
    for name, rep in reports.items():
        lens = rep["logit_lens"]
        layers = range(len(lens["rank"]))
        axes[0].plot(layers, lens["rank"], marker="o", label=name)
        axes[1].plot(layers, lens["prob"], marker="o", label=name)
        pca_line = axes[2].plot(layers, rep["intrinsic_dimension"], marker="o", label=f"{name}: PCA 95%")[0]
        axes[2].plot(layers, rep["twonn_dimension"], "--", marker="x", color=pca_line.get_color(),
                     label=f"{name}: TwoNN")
        axes[3].plot(layers, rep["activation_kurtosis"], marker="o", label=name)
    titles = [("logit lens: mean rank of the next token", "rank (log)"),
              ("logit lens: mean probability of the next token", "probability"),
              ("intrinsic dimension: PCA 95% variance, TwoNN", "dimension"),
              ("excess kurtosis of hidden-state coordinates\n(basis-dependent: a PCA or rotated basis changes it, "
               "the function unchanged)", "kurtosis")]
    for ax, (title, ylabel) in zip(axes, titles):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("layer (0 = embedding)")
        ax.set_ylabel(ylabel)
        ax.legend()
    axes[0].set_yscale("log")
    from matplotlib.ticker import MaxNLocator
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------
# The report


def check_related(cfg: GeometryConfig, ref_ckpt: dict, new_ckpt: dict | None) -> None:
    """ref_dir and in_dir must share a tokenizer, and in_dir's recorded transform source must be ref_dir."""
    if new_ckpt is None:
        return
    ours, theirs = tokenizer_fingerprint(ref_ckpt.get("meta")), tokenizer_fingerprint(new_ckpt.get("meta"))
    if ours is not None and theirs is not None and ours != theirs:
        raise CheckpointError(f"ref_dir and in_dir use different tokenizers ({describe_tokenizer(ref_ckpt['meta'])} "
                              f"vs {describe_tokenizer(new_ckpt['meta'])}); compare models of one tokenizer")
    record = new_ckpt.get("transform")
    if cfg.allow_unrelated:
        return
    if record is None:  # same width: compared as is (a model with itself, or finetuned); another width: unrelated
        widths = ref_ckpt["model_args"]["n_embd"], new_ckpt["model_args"]["n_embd"]
        if widths[0] != widths[1]:
            raise CheckpointError(f"in_dir '{cfg.in_dir}' (width {widths[1]}) records no transform, so nothing says it "
                                  f"was made from ref_dir '{cfg.ref_dir}' (width {widths[0]}); give a transform's "
                                  "output (or a finetune of one), or pass --allow_unrelated=True to compare two "
                                  "unrelated models")
        return
    if record.get("porting") == "per_block":
        raise CheckpointError(f"in_dir '{cfg.in_dir}' is a per-block transform (one map per residual site): the "
                              "comparison's map-based metrics (JL ε, feature and reader alignment) assume one T; "
                              "evaluate each model on its own (eval_geometry.py --ref_dir=DIR without --in_dir)")
    source = record.get("source")
    if source and os.path.realpath(source) != os.path.realpath(cfg.ref_dir):
        raise CheckpointError(f"in_dir was transformed from '{source}', not from ref_dir '{cfg.ref_dir}'; pass that "
                              "model as --ref_dir, or --allow_unrelated=True to compare them anyway")
    check_transform_source(record, ref_ckpt, cfg.ref_dir)


def reader_alignment(ref: GPT, new: GPT, record: dict) -> float:
    """``geometry.reader_alignment`` over every reader of the residual stream whose rows the port kept (all of
    them under residual porting; the MLP and head under sandwich), against the canonical reference's readers
    (gains folded in as the transform did; the raw reference for paper_code, which folds nothing)."""
    from lgpt.method.porting import canonical_model
    from lgpt.method.roles import residual_roles
    base = ref if record["norms"] == "kept" else canonical_model(ref, record["norms"])[0]
    ref_sd, new_sd = base.state_dict(), new.state_dict()
    pairs = [(ref_sd.get(f"{r}.weight"), new_sd.get(f"{r}.weight")) for r in residual_roles(base.config).readers]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None and a.shape[0] == b.shape[0]]
    return geo.reader_alignment(torch.cat([a for a, _ in pairs]), torch.cat([b for _, b in pairs]),
                                record["T"].double())


@torch.no_grad()
def kl_and_agreement(ref: GPT, new: GPT, batches, budget: int = LOGITS_BUDGET // 4) -> dict:
    """Mean KL(p_ref ‖ p_new) (nats) and top-1 agreement over every position of ``batches``, the heads applied
    ``budget`` logits at a time (``geometry.kl_and_agreement`` per chunk, weighted by its positions; a quarter of
    the usual budget, as it holds about four float64 copies of a chunk)."""
    sums, count = {"kl": 0.0, "top1_agreement": 0.0}, 0
    for x, _ in batches:
        h_ref, h_new = ref(x, features=True)[0].flatten(0, -2), new(x, features=True)[0].flatten(0, -2)
        for part, logits_ref in chunked_logits(ref, h_ref, budget):
            chunk = geo.kl_and_agreement(logits_ref, new.lm_head(h_new[part]))
            rows = len(logits_ref)
            sums = {key: sums[key] + chunk[key] * rows for key in sums}
            count += rows
    return {key: value / count for key, value in sums.items()}


def model_circuits(model: GPT) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per layer and head, (W_QK, W_OV) in residual space (``geometry.head_circuits``)."""
    cfg = model.config
    return [geo.head_circuits(b.attn.c_attn.weight.detach(), b.attn.c_proj.weight.detach(),
                              getattr(b.ln_1, "weight", None), cfg.n_head, cfg.head_dim, cfg.kv_heads)
            for b in model.transformer.h]


def circuit_report(ref: GPT, new: GPT, record: dict, out_dir: str | None, k: int = 10) -> dict:
    """Which heads' QK and OV circuits survive the transform: per head, the spectrum distance and the overlap of
    decoded top tokens between the canonical reference and the transformed model (heads kept: residual porting);
    a heatmap of the token overlap in out_dir (None: no figure). Exact ports score distance 0 and overlap 1."""
    from lgpt.method.porting import canonical_model
    if (new.config.n_head, new.config.head_dim) != (ref.config.n_head, ref.config.head_dim):
        return {"skipped": "the port re-split the heads (sandwich, paper_code): no head-to-head correspondence"}
    base = ref if record["norms"] == "kept" else canonical_model(ref, record["norms"])[0]
    E_ref, E_new = base.transformer.wte.weight.detach(), new.transformer.wte.weight.detach()
    heads = []
    for layer, (a, b) in enumerate(zip(model_circuits(base), model_circuits(new))):
        for head, (ra, rb) in enumerate(zip(a, b)):
            heads.append({"layer": layer, "head": head,
                          **geo.circuit_stability(ra, rb, E_ref, E_new, rank=ref.config.head_dim, k=k)})
    keys = ("qk_spectrum_distance", "ov_spectrum_distance", "qk_token_overlap", "ov_token_overlap")
    summary = {key: sum(h[key] for h in heads) / len(heads) for key in keys}
    if out_dir is None:
        return {"heads": heads, "mean": summary, "k": k}
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    L, H = ref.config.n_layer, ref.config.n_head
    for ax, key in zip(axes, ("qk_token_overlap", "ov_token_overlap")):
        grid = torch.tensor([h[key] for h in heads]).view(L, H)
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis")
        ax.set_title(f"{key.replace('_', ' ')} (top-{k} decoded tokens)", fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(H))  # one tick per head and layer, not matplotlib's half steps
        ax.set_yticks(range(L))
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "circuits.png"), dpi=110)
    plt.close(fig)
    return {"heads": heads, "mean": summary, "k": k}


def feature_alignments(ref: GPT, new: GPT | None, record: dict, loader: BatchLoader, ref_hidden: list[torch.Tensor],
                       centre: bool, n_features: int) -> dict:
    """FA of the most frequent tokens' embeddings and of the top principal directions of the reference's hidden
    states (``geometry.feature_alignment``), and, with a transformed model, of its readers (``reader_alignment``)."""
    E_ref = ref.transformer.wte.weight.detach().double()
    T, T_pinv = record["T"].to(E_ref), record["T_pinv"].to(E_ref)  # from the record (host) to the model's device
    freq = torch.bincount(torch.from_numpy(loader.tokens("train")[:1_000_000].astype("int64")),
                          minlength=ref.config.vocab_size)
    frequent = freq.argsort(descending=True)[:n_features]
    if centre:
        E_ref = E_ref - E_ref.mean(1, keepdim=True)
    directions = geo.principal_directions(ref_hidden, n_features)
    out = {"frequent_tokens": geo.feature_alignment(E_ref[frequent], T, T_pinv),
           "principal_directions": geo.feature_alignment(directions, T, T_pinv)}
    if new is not None:
        out["readers"] = reader_alignment(ref, new, record)
    return out


def geometry_figures(cfg: GeometryConfig, where: str, ref_ckpt: dict, loader: BatchLoader, models: dict[str, GPT],
                     reports: dict[str, dict], X: torch.Tensor, groups: torch.Tensor, maps: dict[str, torch.Tensor],
                     block: int, circuits_drawn: bool) -> dict[str, str]:
    """The report's PNG figures in ``where`` ({name: path}): hidden-state norms, per-layer curves, cosine
    heatmaps, the concordance scatter and (drawn by circuit_report) the circuits heatmap."""
    tokenizer = Tokenizer(ref_ckpt["meta"]) if ref_ckpt.get("meta") else None
    if cfg.prompt and tokenizer is not None:
        ids = torch.tensor(tokenizer.encode(cfg.prompt)[:block], device=loader.device)[None]
    else:
        ids = loader.windows(loader.tokens("val"), [0])[0]
    figures = {"norm_heatmap": norm_heatmap(models, ids, os.path.join(where, "norm_heatmap.png")),
               "layers": layer_plots(reports, os.path.join(where, "layers.png"))}
    subset = torch.randperm(len(X), generator=torch.Generator().manual_seed(cfg.seed))[: cfg.heatmap_probes]
    subset = subset[groups[subset].argsort()]  # grouped by layer, so block structure is visible
    heat = {"reference": X[subset]} | {f"{k}-level" if k == "map" else "transformed model": Y[subset]
                                       for k, Y in maps.items()}
    figures["cosine_heatmaps"] = cosine_heatmaps(heat, os.path.join(where, "cosine_heatmaps.png"),
                                                 groups[subset].tolist())
    if maps:
        figures["concordance"] = concordance_plot(X, {("map-level T·u" if k == "map" else "model-level"): Y
                                                      for k, Y in maps.items()},
                                                  os.path.join(where, "concordance.png"), cfg.seed)
    if circuits_drawn:
        figures["circuits"] = os.path.join(where, "circuits.png")
    return figures


def evaluate_geometry(cfg: GeometryConfig, write_to: str | None = None) -> dict:
    """Every geometry metric of in_dir against ref_dir (or of ref_dir alone): JSON, PNG figures and wandb, written
    to ``write_to`` (the CLI's staging directory, moved into out_dir when all of it is written) or out_dir."""
    where = write_to or cfg.out_dir
    check_writable_dir(cfg.out_dir)
    if os.path.exists(os.path.join(cfg.out_dir, "metrics.json")) and not cfg.overwrite:
        raise CheckpointError(f"'{cfg.out_dir}' already holds a geometry report (metrics.json); choose another "
                              "--out_dir, or pass --overwrite=True to replace it")
    cfg.device = resolve_device(cfg.device)  # before any work: a missing GPU is one clear error
    ref, ref_ckpt = load_model(cfg.ref_dir, device=cfg.device)
    new, new_ckpt = load_model(cfg.in_dir, device=cfg.device) if cfg.in_dir else (None, None)
    check_related(cfg, ref_ckpt, new_ckpt)
    record = (new_ckpt or {}).get("transform")
    if new is not None and new.config.vocab_size != ref.config.vocab_size:
        raise ConfigError(f"ref_dir and in_dir have different vocabularies ({ref.config.vocab_size} vs "
                          f"{new.config.vocab_size}); compare models with the same tokenizer")
    if new is not None and new.config.n_layer != ref.config.n_layer:
        raise ConfigError("ref_dir and in_dir have different numbers of layers; layer-wise probes need equal depth")
    if record is not None and record["d"] != ref.config.n_embd:
        raise ConfigError(f"in_dir's transform record maps width {record['d']}, but ref_dir has width "
                          f"{ref.config.n_embd}; pass the model it was transformed from as --ref_dir")
    data_dir = data_dir_for_checkpoint(ref_ckpt, cfg.data_dir)
    check_tokenizer(ref_ckpt, data_dir)
    block = min(ref.config.block_size, new.config.block_size if new is not None else ref.config.block_size)
    loader = BatchLoader(data_dir, window_size(cfg.block_size, block), cfg.batch_size, cfg.device)
    centre = bool(record and record["norms"] == "fold" and ref.config.norm_type == "layernorm")
    check_memory(geometry_memory(cfg, ref, new, loader.block_size), cfg.device,
                 f"the probe statistics (n_probes={cfg.n_probes}, probe_batches={cfg.probe_batches}, "
                 f"batch_size={cfg.batch_size})", "lower --n_probes (default 4096), --probe_batches or --batch_size")
    announce_threads(cfg.device)
    probes = collect_probes(ref, new, loader, cfg.n_probes, cfg.probe_batches, cfg.seed, centre)
    X, groups = probes["X"], probes["groups"]
    L = ref.config.n_layer
    os.makedirs(where, exist_ok=True)
    names = {"ref": "reference"} | ({"new": "transformed"} if new is not None else {})
    metrics: dict = {"ref_dir": os.path.abspath(cfg.ref_dir), "in_dir": os.path.abspath(cfg.in_dir) if cfg.in_dir
                     else None, "config": asdict(cfg), "reference_centred": centre,
                     "transform": {k: record[k] for k in ("kind", "d", "m", "porting", "norms", "seed")}
                     if record else None,
                     "probes": {"n": len(X), "per_group": int((groups == -1).sum()), "layers": L + 1}}

    # losses on the same val batches, KL and agreement
    losses = {"ref": evaluate_loss(ref, loader, "val", cfg.eval_iters, cfg.seed)}
    if new is not None:
        losses["new"] = evaluate_loss(new, loader, "val", cfg.eval_iters, cfg.seed)
        metrics.update(kl_and_agreement(ref, new, eval_batches(loader, "val", cfg.eval_iters, cfg.seed)))
    metrics["loss"] = {k: {"val_loss": v, "perplexity": math.exp(v)} for k, v in losses.items()}
    metrics["loss_basis"] = loss_basis(loader, cfg.eval_iters, cfg.seed)

    # per-model reports
    reports = {"ref": model_report(ref, probes["ref_hidden"], probes["x"], cfg)}
    if new is not None:
        reports["new"] = model_report(new, probes["new_hidden"], probes["x"], cfg)
    metrics["models"] = reports

    # the transform's effect on geometry
    maps = {}
    if record is not None:
        T = record["T"].to(X)  # records keep T on the host; the probes live on the models' device
        maps["map"] = X @ T.T
        counts = geo.jl_distortion(X, T, seed=cfg.seed)
        metrics["jl"] = {"empirical_eps": counts, "bound_eps": geo.jl_epsilon_bound(len(X), record["m"]),
                         "n_points": len(X), "m": record["m"]}
        metrics["feature_alignment"] = feature_alignments(ref, new, record, loader, probes["ref_hidden"], centre,
                                                          cfg.n_features)
        if new is not None:
            metrics["circuits"] = circuit_report(ref, new, record, where if cfg.figures else None)
    if new is not None:
        maps["model"] = probes["Y"]
    metrics["angular_error"], metrics["concordance"] = {}, {}
    for flavour, Y in maps.items():
        metrics["angular_error"][flavour] = geo.angular_error(X, Y)
        metrics["concordance"][flavour] = geo.hyperspherical_concordance(X, Y, seed=cfg.seed)
        per_layer_ae, per_layer_hc = [], []
        for layer in range(-1, L + 1):
            rows = groups == layer
            per_layer_ae.append(geo.angular_error(X[rows], Y[rows]))
            per_layer_hc.append(geo.hyperspherical_concordance(X[rows], Y[rows], seed=cfg.seed)["pearson"])
        metrics["angular_error"][f"{flavour}_per_group"] = per_layer_ae
        metrics["concordance"][f"{flavour}_per_group"] = per_layer_hc

    figures = {}
    if cfg.figures:
        models = {names[k]: m for k, m in (("ref", ref), ("new", new)) if m is not None}
        figures = geometry_figures(cfg, where, ref_ckpt, loader, models, {names[k]: r for k, r in reports.items()},
                                   X, groups, maps, block, "heads" in metrics.get("circuits", {}))
    metrics["figures"] = {k: os.path.basename(v) for k, v in figures.items()}

    with open(os.path.join(where, "metrics.json.tmp"), "w") as f:
        json.dump(metrics, f, indent=2)
    os.replace(os.path.join(where, "metrics.json.tmp"), os.path.join(where, "metrics.json"))
    logger = MetricsLogger(where, wandb_log=cfg.wandb_log, project=cfg.wandb_project,
                           run_name=cfg.wandb_run_name, config=asdict(cfg), filename="geometry.jsonl")
    scalars = flat_scalars({k: v for k, v in metrics.items() if k != "config"})
    logger.log(scalars)
    logger.log_images(figures)
    logger.summary(scalars)
    logger.finish()
    return metrics


def flat_scalars(metrics: dict, prefix: str = "") -> dict:
    """'a/b/c': number for every scalar leaf of the nested metrics (lists and strings left out)."""
    out = {}
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_scalars(v, key + "/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None:
            out[key] = v
    return out


def main(argv: list[str]) -> None:
    cfg = load_config(GeometryConfig, argv, prog="eval_geometry.py")
    with hold_run_dir(cfg.out_dir, "eval_geometry.py"), staged_dir(cfg.out_dir, "metrics.json") as staging:
        m = evaluate_geometry(cfg, staging)  # figures, metrics and logs appear in out_dir together, or not at all
    loss = m["loss"]
    print(f"val loss ({m['loss_basis']}): reference {loss['ref']['val_loss']:.4f}" +
          (f", transformed {loss['new']['val_loss']:.4f}, KL {m['kl']:.4f}, top-1 agreement "
           f"{m['top1_agreement']:.3f}" if "new" in loss else ""))
    for flavour in ("map", "model"):
        if flavour in m["angular_error"]:
            hc = m["concordance"][flavour]
            print(f"{flavour}-level: AE {m['angular_error'][flavour]:.4f} rad, "
                  f"HC {hc['pearson']:.4f} (Spearman {hc['spearman']:.4f})")
    if "feature_alignment" in m:
        fa = m["feature_alignment"]
        print(f"FA: frequent tokens {fa['frequent_tokens']:.4f}, principal directions {fa['principal_directions']:.4f}"
              + (f", readers {fa['readers']:.4f}" if "readers" in fa else ""))
    print(f"wrote {os.path.join(cfg.out_dir, 'metrics.json')} and {len(m['figures'])} figures")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
