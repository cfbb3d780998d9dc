"""
GPT-2 (Hugging Face GPT2LMHeadModel) and nanoGPT checkpoints ↔ ours: the mapping of each tensor and config field.

GPT-2 is pre-LN LayerNorm with per-dimension gains and biases, learned positions, the tanh GELU ('gelu_new') and a
tied head. Hugging Face stores its Linear layers as Conv1D, i.e. transposed (``CONV1D``). nanoGPT checkpoints are the
same architecture with the exact GELU. convert.py holds the shared path (reading, checking, writing, tokenizers).
"""
from __future__ import annotations

import torch

from lgpt.plumbing.checkpoint import clean_state_dict
from lgpt.plumbing.dataset import GPT2_META, dataset_dir, load_meta
from lgpt.plumbing.errors import CheckpointError, ConversionError
from model import GPT, GPTConfig

GPT2 = "GPT2LMHeadModel"


def gpt2_config_from_hf(hf_config) -> GPTConfig:
    """The GPTConfig equal to a Hugging Face GPT-2 config, or ConversionError naming the first field that has no
    exact equivalent."""
    activation = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
    if hf_config.activation_function not in activation:
        raise ConversionError(f"activation_function={hf_config.activation_function!r} is not supported "
                              f"(supported: {sorted(activation)})")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if getattr(hf_config, flag, False):
            raise ConversionError(f"GPT-2 config flag {flag}=True is not supported")
    if not getattr(hf_config, "scale_attn_weights", True):
        raise ConversionError("scale_attn_weights=False is not supported (attention is scaled by 1/√head_dim)")
    return GPTConfig(
        n_layer=hf_config.n_layer, n_head=hf_config.n_head, n_embd=hf_config.n_embd,
        block_size=hf_config.n_positions, vocab_size=hf_config.vocab_size, bias=True,
        mlp_hidden=hf_config.n_inner or 4 * hf_config.n_embd, mlp=activation[hf_config.activation_function],
        norm_eps=hf_config.layer_norm_epsilon, norm_type="layernorm", norm_gain="vector", norm_placement="pre",
        pos="learned", head="tied" if getattr(hf_config, "tie_word_embeddings", True) else "linear")


CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
IGNORED_HF_KEYS = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")  # buffers of older transformers


def gpt2_state_from_hf(hf_state: dict) -> dict:
    """Our state dict from a GPT2LMHeadModel one: the Conv1D weights transposed, the mask buffers dropped."""
    return {name: (t.detach().float().t().contiguous() if name.endswith(CONV1D) else t.detach().float().clone())
            for name, t in hf_state.items() if not name.endswith(IGNORED_HF_KEYS)}


def pad_attention_heads(model: GPT) -> GPT:
    """An equal GPT whose attention width n_head·head_dim equals n_embd, by adding zero heads (zero Q, K,
    V and zero output columns: they attend uniformly to zero values and write nothing). A model grown with
    head porting keeps its attention width; GPT-2 requires it to equal the residual width."""
    cfg = model.config
    inner, d = cfg.n_head * cfg.head_dim, cfg.n_embd
    if inner == d:
        return model
    if inner > d or (d - inner) % cfg.head_dim:
        raise ConversionError(f"n_head*head_dim={inner} != n_embd={d}: GPT-2's attention width equals its residual "
                              f"width, and zero heads of size {cfg.head_dim} can only pad it up to a multiple of it")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for i in range(cfg.n_layer):
        prefix = f"transformer.h.{i}.attn"
        for leaf in ("weight", "bias"):
            name = f"{prefix}.c_attn.{leaf}"
            if name in state:
                parts = state[name].split(inner, dim=0)
                state[name] = torch.cat([torch.cat([p, p.new_zeros((d - inner, *p.shape[1:]))]) for p in parts])
        W = state[f"{prefix}.c_proj.weight"]
        state[f"{prefix}.c_proj.weight"] = torch.cat([W, W.new_zeros(d, d - inner)], dim=1)
    new_cfg = GPTConfig(**dict(cfg.to_dict(), n_head=d // cfg.head_dim))
    return GPT.from_state_dict(new_cfg, state).eval()


def gpt2_export_problems(config: GPTConfig) -> list[str]:
    """Why ``config`` has no exact GPT-2 equivalent (empty when it has one)."""
    problems = [f"{part}: GPT-2 has no such part (a per-block transform's shortcuts stay in our format)"
                 for part in config.extra_parts()]
    if config.norm_type != "layernorm":
        problems.append(f"norm_type={config.norm_type!r}: GPT-2 uses LayerNorm (transform with --norms=scalar or "
                        "--norms=drop keeps LayerNorm, approximately)")
    if config.norm_placement != "pre":
        problems.append(f"norm_placement={config.norm_placement!r}: GPT-2 is pre-LN")
    if config.pos != "learned":
        problems.append(f"pos={config.pos!r}: GPT-2 has learned positions")
    if config.mlp in ("swiglu", "geglu"):
        problems.append(f"mlp={config.mlp!r}: GPT-2's MLP is GELU")
    if config.head == "knn":
        problems.append("head='knn': GPT-2's head is linear")
    if config.head_bias:
        problems.append("head_bias=True: GPT-2's head has no bias")
    if config.kv_heads != config.n_head:
        problems.append(f"n_kv_head={config.n_kv_head}: GPT-2 has no grouped-query attention")
    if config.qkv_bias is not None and config.qkv_bias != config.bias:
        problems.append(f"qkv_bias={config.qkv_bias} with bias={config.bias}: GPT-2 has biases everywhere or nowhere")
    inner = config.n_head * config.head_dim
    if inner > config.n_embd or (config.n_embd - inner) % config.head_dim:
        problems.append(f"n_head*head_dim={inner} != n_embd={config.n_embd}: GPT-2's attention width equals its "
                        f"residual width (zero heads pad it only up to multiples of head_dim={config.head_dim})")
    return problems


def export_gpt2(model: GPT, transformers, special_ids: dict):
    """A GPT2LMHeadModel with the same function as ``model`` (attention padded with zero heads if needed)."""
    model = pad_attention_heads(model)
    cfg = model.config
    eos = special_ids.get("eos_token_id", min(50256, cfg.vocab_size - 1))
    hf_config = transformers.GPT2Config(
        n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, n_positions=cfg.block_size,
        vocab_size=cfg.vocab_size, n_inner=cfg.mlp_hidden, layer_norm_epsilon=cfg.norm_eps,
        activation_function="gelu_new" if cfg.mlp == "gelu_tanh" else "gelu", tie_word_embeddings=cfg.head == "tied",
        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
        bos_token_id=special_ids.get("bos_token_id", eos), eos_token_id=eos)
    hf_model = transformers.GPT2LMHeadModel(hf_config)
    ours = model.state_dict()
    state = {}
    for name, target in hf_model.state_dict().items():
        if name.endswith((".ln_1.weight", ".ln_2.weight", "ln_f.weight")):  # scalar or no gain → a vector
            value = ours.get(name, torch.ones(1)).expand(cfg.n_embd)
        elif name in ours:
            value = ours[name]
        elif name.endswith(".bias"):  # bias=False (or scalar gains): GPT-2 has zero biases there
            value = torch.zeros_like(target)
        else:
            raise ConversionError(f"internal: no value for GPT-2 parameter {name}")
        if name.endswith(CONV1D):
            value = value.t()
        state[name] = value.detach().clone().contiguous()
    hf_model.load_state_dict(state, strict=True)
    return hf_model


def import_nanogpt(ckpt: dict) -> GPT:
    """A nanoGPT training checkpoint ({'model', 'model_args', ...}): GPT-2 architecture, exact GELU, tied head."""
    if "model" not in ckpt or "model_args" not in ckpt:
        raise CheckpointError("not a nanoGPT checkpoint: it needs 'model' and 'model_args' keys")
    known = {"n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout"}
    ours = sorted(set(ckpt["model_args"]) - known)
    if ours or ckpt.get("transform") or ckpt.get("growth_ramp"):
        raise CheckpointError(f"this is a nanoLGPT checkpoint, not nanoGPT's (its model_args hold {ours[:4]}"
                              f"{' and a transform record' if ckpt.get('transform') else ''}); it needs no import: "
                              "use its directory directly (--in_dir=DIR)")
    args = {k: v for k, v in ckpt["model_args"].items() if k in known}
    state = {k: v for k, v in clean_state_dict(ckpt["model"]).items()
             if not (k.endswith(".attn.bias") and v.dim() == 4)}  # the mask buffer of non-flash nanoGPT
    tied = "lm_head.weight" not in state or torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    config = GPTConfig(**args, head="tied" if tied else "linear")
    with torch.device("meta"):  # shapes only: no memory, whatever the model's size
        expected = {k: v.shape for k, v in GPT(config).state_dict().items()}
    for name, value in state.items():
        if name in expected and tuple(value.shape) != tuple(expected[name]):
            raise CheckpointError(f"the nanoGPT checkpoint's '{name}' has shape {tuple(value.shape)}, but its "
                                  f"model_args build {tuple(expected[name])}: the file is not a nanoGPT GPT-2 "
                                  "checkpoint, or was edited; use the run's original ckpt.pt")
    return GPT.from_state_dict(config, {k: v.clone() for k, v in state.items()})


def nanogpt_meta(ckpt: dict, data_dir: str = "") -> dict:
    """nanoGPT keeps the tokenizer in data/<dataset>/meta.pkl; fall back to GPT-2 BPE as its sample.py does."""
    dataset = (ckpt.get("config") or {}).get("dataset")
    meta = load_meta(dataset_dir(dataset or "", data_dir)) if (dataset or data_dir) else None
    if meta is not None and meta["vocab_size"] <= ckpt["model_args"]["vocab_size"]:
        return meta
    if GPT2_META["vocab_size"] > ckpt["model_args"]["vocab_size"]:
        raise CheckpointError(f"the nanoGPT checkpoint has a {ckpt['model_args']['vocab_size']}-token vocabulary and "
                              "no dataset meta.pkl was found for it; pass --data_dir=DIR, the dataset it was "
                              "trained on (its meta.pkl is the tokenizer)")
    return GPT2_META
