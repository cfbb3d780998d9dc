"""
Llama (2, 3, 3.1/3.2 RoPE scaling; SmolLM, TinyLlama) and Qwen2/2.5 (Hugging Face LlamaForCausalLM,
Qwen2ForCausalLM) ↔ ours: the mapping of each tensor and config field. gguf_format.py reads and writes the same
tensors under llama.cpp's names.

Both are pre-RMSNorm, SwiGLU, rotary, with grouped-query attention; Qwen2 adds Q/K/V biases. Hugging Face rotates
dimension i with i + head_dim/2, we rotate 2i with 2i + 1: Q and K rows are reordered within each head on the way in
and back on the way out (``rope_pair_order``), which changes no attention score. Fields with no exact equivalent
(``unsupported_llama_fields``) are refused by name. convert.py holds the shared path.
"""
from __future__ import annotations

import torch

from lgpt.plumbing.errors import ConversionError
from model import GPT, LLAMA3_SCALING_KEYS, GPTConfig, check_rope_scaling

LLAMA, QWEN2 = "LlamaForCausalLM", "Qwen2ForCausalLM"


def llama_config_from_hf(hf_config, arch: str = LLAMA) -> GPTConfig:
    """The GPTConfig equal to a Hugging Face Llama or Qwen2 config, or ConversionError naming the first field that
    has no exact equivalent."""
    problems = unsupported_llama_fields(hf_config, arch)
    if problems:
        raise ConversionError(f"{arch} field {problems[0]} cannot be represented exactly")
    theta, scaling = hf_rope(hf_config)
    n_kv = hf_config.num_key_value_heads or hf_config.num_attention_heads
    return GPTConfig(
        n_layer=hf_config.num_hidden_layers, n_head=hf_config.num_attention_heads,
        n_kv_head=None if n_kv == hf_config.num_attention_heads else n_kv, n_embd=hf_config.hidden_size,
        head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads,
        block_size=hf_config.max_position_embeddings, vocab_size=hf_config.vocab_size, bias=False,
        qkv_bias=True if arch == QWEN2 else None, mlp="swiglu", mlp_hidden=hf_config.intermediate_size,
        norm_type="rmsnorm", norm_gain="vector", norm_placement="pre", norm_eps=hf_config.rms_norm_eps,
        pos="rope", rope_base=theta, rope_scaling=scaling,
        head="tied" if getattr(hf_config, "tie_word_embeddings", False) else "linear")


def hf_rope(hf_config) -> tuple[float, dict | None]:
    """(rope_theta, Llama-3 scaling or None) from a config of any transformers version (``rope_parameters`` since
    v5, ``rope_theta`` + ``rope_scaling`` before). Any other scaling type is one ConversionError naming it."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    legacy = getattr(hf_config, "rope_scaling", None) if not params else None
    params.update(legacy or {})
    theta = float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0)) != 1.0:
        raise ConversionError("partial_rotary_factor != 1 (RoPE on part of each head) cannot be represented exactly")
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ConversionError(f"rope_scaling type {kind!r} cannot be represented exactly (supported: default, llama3)")
    scaling = {"rope_type": "llama3", **{k: params[k] for k in LLAMA3_SCALING_KEYS if k in params}}
    try:
        check_rope_scaling(scaling)
    except ValueError as e:
        raise ConversionError(f"rope_scaling: {e}") from e
    return theta, scaling


def unsupported_llama_fields(hf_config, arch: str) -> list[str]:
    """The fields of a Llama / Qwen2 config that nanoLGPT's model cannot represent exactly (empty: it can)."""
    problems = []
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={hf_config.hidden_act!r} (the SwiGLU MLP uses silu)")
    if getattr(hf_config, "attention_bias", False):
        problems.append("attention_bias=True (it adds an o_proj bias; only Q/K/V biases are representable)")
    if getattr(hf_config, "mlp_bias", False):
        problems.append("mlp_bias=True (the SwiGLU MLP has no biases)")
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(hf_config, name, None):
            problems.append(f"{name}={getattr(hf_config, name)} (attention/logit soft-capping)")
    if getattr(hf_config, "use_sliding_window", False):
        problems.append("use_sliding_window=True (sliding-window attention)")
    layer_types = set(getattr(hf_config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        problems.append(f"layer_types={sorted(layer_types)} (only full attention)")
    return problems


def rope_pair_order(head_dim: int) -> torch.Tensor:
    """Row order that turns Hugging Face's RoPE layout (dimension i rotates with i + head_dim/2, rotate_half) into
    ours (2i rotates with 2i + 1): [0, hd/2, 1, hd/2 + 1, …]. Applied to Q's and K's rows in every head, it changes
    no score q·k (the same permutation on both) and pairs the same frequencies, so the model is the same function."""
    return torch.arange(head_dim).view(2, head_dim // 2).t().flatten()


def permute_head_rows(W: torch.Tensor, head_dim: int, order: torch.Tensor) -> torch.Tensor:
    """The rows of each head of a projection (heads·head_dim rows, weight or bias) reordered by ``order``."""
    return W.reshape(-1, head_dim, *W.shape[1:])[:, order].reshape(W.shape)


def llama_state_from_hf(hf_state: dict, cfg: GPTConfig) -> dict:
    """Our state dict from a LlamaForCausalLM / Qwen2ForCausalLM one: Q/K/V stacked into c_attn (Q and K rows in
    our RoPE layout), gate/up stacked into c_fc, the rest renamed."""
    order, hd = rope_pair_order(cfg.head_dim), cfg.head_dim
    state = {"transformer.wte.weight": hf_state["model.embed_tokens.weight"],
             "transformer.ln_f.weight": hf_state["model.norm.weight"]}
    if cfg.head != "tied":
        state["lm_head.weight"] = hf_state["lm_head.weight"]
    for i in range(cfg.n_layer):
        hf, ours = f"model.layers.{i}", f"transformer.h.{i}"
        attn = f"{hf}.self_attn"
        for leaf in ("weight", "bias"):
            if f"{attn}.q_proj.{leaf}" in hf_state:
                q, k, v = (hf_state[f"{attn}.{p}_proj.{leaf}"] for p in "qkv")
                state[f"{ours}.attn.c_attn.{leaf}"] = torch.cat(
                    [permute_head_rows(q, hd, order), permute_head_rows(k, hd, order), v])
        state[f"{ours}.attn.c_proj.weight"] = hf_state[f"{attn}.o_proj.weight"]
        state[f"{ours}.mlp.c_fc.weight"] = torch.cat([hf_state[f"{hf}.mlp.gate_proj.weight"],
                                                      hf_state[f"{hf}.mlp.up_proj.weight"]])
        state[f"{ours}.mlp.c_proj.weight"] = hf_state[f"{hf}.mlp.down_proj.weight"]
        state[f"{ours}.ln_1.weight"] = hf_state[f"{hf}.input_layernorm.weight"]
        state[f"{ours}.ln_2.weight"] = hf_state[f"{hf}.post_attention_layernorm.weight"]
    return {k: v.detach().float().clone() for k, v in state.items()}


def llama_export_problems(config: GPTConfig, arch: str) -> list[str]:
    """Why ``config`` has no exact LlamaForCausalLM / Qwen2ForCausalLM equivalent (empty when it has one)."""
    problems = [f"{part}: {arch} has no such part (a per-block transform's shortcuts stay in our format)"
                 for part in config.extra_parts()]
    if config.norm_type != "rmsnorm":
        problems.append(f"norm_type={config.norm_type!r}: {arch} uses RMSNorm")
    if config.norm_placement != "pre":
        problems.append(f"norm_placement={config.norm_placement!r}: {arch} is pre-norm")
    if config.pos != "rope":
        problems.append(f"pos={config.pos!r}: {arch} has rotary positions")
    if config.mlp != "swiglu":
        problems.append(f"mlp={config.mlp!r}: {arch}'s MLP is SwiGLU")
    if config.bias:
        problems.append(f"bias=True: {arch} has no biases on its output projections and MLP")
    if config.head == "knn":
        problems.append(f"head='knn': {arch}'s head is linear")
    if config.head_bias:
        problems.append(f"head_bias=True: {arch}'s head has no bias")
    if config.attn_bias != (arch == QWEN2):
        problems.append(f"qkv_bias={config.attn_bias}: {arch} has {'' if arch == QWEN2 else 'no '}Q/K/V biases")
    return problems


def llama_state_to_hf(ours: dict, cfg: GPTConfig) -> dict:
    """A LlamaForCausalLM / Qwen2ForCausalLM state dict from ours: the inverse of ``llama_state_from_hf``; scalar
    or absent norm gains become vectors."""
    inverse, hd = torch.argsort(rope_pair_order(cfg.head_dim)), cfg.head_dim
    sizes = (cfg.n_head * hd, cfg.kv_heads * hd, cfg.kv_heads * hd)

    def gain(name: str) -> torch.Tensor:
        return ours.get(name, torch.ones(1)).expand(cfg.n_embd)

    state = {"model.embed_tokens.weight": ours["transformer.wte.weight"],
             "model.norm.weight": gain("transformer.ln_f.weight")}
    if cfg.head != "tied":
        state["lm_head.weight"] = ours["lm_head.weight"]
    for i in range(cfg.n_layer):
        hf, mine = f"model.layers.{i}", f"transformer.h.{i}"
        for leaf in ("weight", "bias"):
            if f"{mine}.attn.c_attn.{leaf}" in ours:
                q, k, v = ours[f"{mine}.attn.c_attn.{leaf}"].split(sizes)
                state.update({f"{hf}.self_attn.q_proj.{leaf}": permute_head_rows(q, hd, inverse),
                              f"{hf}.self_attn.k_proj.{leaf}": permute_head_rows(k, hd, inverse),
                              f"{hf}.self_attn.v_proj.{leaf}": v})
        state[f"{hf}.self_attn.o_proj.weight"] = ours[f"{mine}.attn.c_proj.weight"]
        gate, up = ours[f"{mine}.mlp.c_fc.weight"].chunk(2)
        state.update({f"{hf}.mlp.gate_proj.weight": gate, f"{hf}.mlp.up_proj.weight": up,
                      f"{hf}.mlp.down_proj.weight": ours[f"{mine}.mlp.c_proj.weight"],
                      f"{hf}.input_layernorm.weight": gain(f"{mine}.ln_1.weight"),
                      f"{hf}.post_attention_layernorm.weight": gain(f"{mine}.ln_2.weight")})
    return {k: v.detach().clone().contiguous() for k, v in state.items()}


def llama_hf_config(cfg: GPTConfig, transformers, arch: str, special_ids: dict):
    """The transformers LlamaConfig / Qwen2Config equal to ``cfg`` (which export_target has accepted for arch)."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_base}
    if cfg.rope_scaling is not None:
        rope.update({k: cfg.rope_scaling[k] for k in LLAMA3_SCALING_KEYS}, rope_type="llama3")
    common = dict(
        hidden_size=cfg.n_embd, intermediate_size=cfg.mlp_hidden, num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head, num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size, max_position_embeddings=cfg.block_size, rms_norm_eps=cfg.norm_eps,
        rope_parameters=rope, tie_word_embeddings=cfg.head == "tied", hidden_act="silu",
        attention_dropout=cfg.dropout, **special_ids)
    return llama_config(transformers, arch, common)


def llama_config(transformers, arch: str, common: dict):
    """transformers' LlamaConfig / Qwen2Config of ``common``. transformers 5 refuses a hidden size that the heads do
    not divide, even with an explicit head_dim; GGUF and llama.cpp do not (the key length is a field of its own),
    and a width zero-padded for llama.cpp's blocks (448 with 9 heads of 64) need not divide: such a config is built
    at the heads' width and given the model's after."""
    hidden = common["hidden_size"]
    common = dict(common, hidden_size=hidden if hidden % common["num_attention_heads"] == 0 else
                  common["num_attention_heads"] * common["head_dim"])
    hf_config = transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **common) if arch == LLAMA else \
        transformers.Qwen2Config(use_sliding_window=False, **common)
    hf_config.hidden_size = hidden
    return hf_config


def export_llama(model: GPT, transformers, arch: str, special_ids: dict):
    """A LlamaForCausalLM or Qwen2ForCausalLM with the same function as ``model``."""
    cfg = model.config
    hf_model = getattr(transformers, arch)(llama_hf_config(cfg, transformers, arch, special_ids))
    missing, unexpected = hf_model.load_state_dict(llama_state_to_hf(model.state_dict(), cfg), strict=False)
    missing = [k for k in missing if not (cfg.head == "tied" and k == "lm_head.weight")]
    if missing or unexpected:
        raise ConversionError(f"internal: {arch} export left {missing[:3]} unset and {unexpected[:3]} unused")
    return hf_model
