"""
Gemma 3 text models (Hugging Face Gemma3ForCausalLM, model_type gemma3_text: 270M, 1B) ↔ ours: the mapping of each
tensor and config field. convert.py holds the shared path (which family, loading, checking, writing, tokenizers).

Gemma 3 is our peri-LN variant with these parts, each a config field of ours (``model.GPTConfig``):
- RMSNorm before **and after** attention and MLP (``norm_placement='peri'``: input_layernorm → ln_1,
  post_attention_layernorm → ln_1_out, pre_feedforward_layernorm → ln_2, post_feedforward_layernorm → ln_2_out);
  every Gemma norm multiplies by (1 + w): we store the gain γ = 1 + w (and write w = γ − 1 back);
- a per-head RMSNorm on queries and keys before RoPE (``qk_norm``; its gains, over head_dim, are reordered with
  the Q/K rows into our RoPE pair layout, which an RMS over the head does not see);
- GeGLU with the tanh GELU (``mlp='geglu'``), a head size independent of d (``head_dim``), logits scaled by
  query_pre_attn_scalar^−½ (``attn_scale``);
- sliding-window attention in the local blocks and full attention every ``global_every``-th block
  (``attn_window``, ``global_every``; HF's ``layer_types``), with two RoPE bases (``rope_local_base`` for the local
  blocks, ``rope_base`` for the global ones);
- token embeddings × √d on the way in (``embed_scale``), a tied head reading the unscaled E.
Soft-capping, bidirectional attention, attention biases and RoPE scaling are refused by name.
"""
from __future__ import annotations

import math

import torch

from lgpt.formats.llama import permute_head_rows, rope_pair_order
from lgpt.plumbing.errors import ConversionError
from model import GPT, GPTConfig

GEMMA3 = "Gemma3ForCausalLM"
NORMS = {"input_layernorm": "ln_1", "post_attention_layernorm": "ln_1_out", "pre_feedforward_layernorm": "ln_2",
         "post_feedforward_layernorm": "ln_2_out"}


def global_every(layer_types: list[str]) -> int:
    """k such that block i attends fully exactly when (i + 1) % k == 0 (0: every block windowed); ConversionError
    for a pattern of another shape."""
    full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    if any(t not in ("full_attention", "sliding_attention") for t in layer_types):
        raise ConversionError(f"layer_types {sorted(set(layer_types))} holds a type other than full_attention / "
                              "sliding_attention")
    if not full:
        return 0
    k = full[0] + 1
    if full != list(range(k - 1, len(layer_types), k)):
        raise ConversionError(f"layer_types puts full attention at blocks {full}, not every k-th block: "
                              "this pattern cannot be represented")
    return k


def gemma3_rope(hf_config) -> tuple[float, float]:
    """(global RoPE base, local RoPE base); any scaling is refused."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    bases = {}
    for kind in ("full_attention", "sliding_attention"):
        p = dict(params.get(kind) or {})
        if p.get("rope_type", "default") != "default":
            raise ConversionError(f"rope_parameters[{kind!r}] has rope_type={p['rope_type']!r}: RoPE scaling is not "
                                  "represented for Gemma 3 (the 270M and 1B models use none)")
        bases[kind] = float(p.get("rope_theta", 1e6 if kind == "full_attention" else 1e4))
    return bases["full_attention"], bases["sliding_attention"]


def gemma3_config_from_hf(hf_config) -> GPTConfig:
    """The GPTConfig equal to a Hugging Face Gemma 3 text config, or ConversionError naming the first field that
    has no exact equivalent."""
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        if getattr(hf_config, name, None):
            raise ConversionError(f"{GEMMA3} field {name}={getattr(hf_config, name)} (soft-capping) cannot be "
                                  "represented exactly")
    for name, bad in (("use_bidirectional_attention", True), ("attention_bias", True)):
        if getattr(hf_config, name, False) == bad:
            raise ConversionError(f"{GEMMA3} field {name}={bad} cannot be represented exactly")
    if getattr(hf_config, "hidden_activation", "gelu_pytorch_tanh") not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ConversionError(f"{GEMMA3} field hidden_activation={hf_config.hidden_activation!r} (GeGLU uses the "
                              "tanh GELU) cannot be represented exactly")
    theta, local = gemma3_rope(hf_config)
    layer_types = list(getattr(hf_config, "layer_types", None) or ["full_attention"] * hf_config.num_hidden_layers)
    every = global_every(layer_types)
    if "sliding_attention" in layer_types and not getattr(hf_config, "sliding_window", None):
        raise ConversionError(f"{GEMMA3} config: layer_types names sliding-window blocks but sliding_window is "
                              f"{getattr(hf_config, 'sliding_window', None)!r}; readers disagree on what that computes "
                              "(transformers attends fully, llama.cpp uses its own default): set sliding_window")
    window = int(hf_config.sliding_window) if "sliding_attention" in layer_types else 0
    n_kv = hf_config.num_key_value_heads or hf_config.num_attention_heads
    head_dim = hf_config.head_dim
    scale = hf_config.query_pre_attn_scalar ** -0.5
    return GPTConfig(
        n_layer=hf_config.num_hidden_layers, n_head=hf_config.num_attention_heads,
        n_kv_head=None if n_kv == hf_config.num_attention_heads else n_kv, n_embd=hf_config.hidden_size,
        head_dim=head_dim, block_size=hf_config.max_position_embeddings, vocab_size=hf_config.vocab_size, bias=False,
        mlp="geglu", mlp_hidden=hf_config.intermediate_size, norm_type="rmsnorm", norm_gain="vector",
        norm_placement="peri", norm_eps=hf_config.rms_norm_eps, pos="rope", rope_base=theta,
        rope_local_base=local if window and local != theta else None, qk_norm=True,
        attn_scale=None if math.isclose(scale, head_dim ** -0.5, rel_tol=1e-12) else scale,
        attn_window=window, global_every=every if window else 0,
        embed_scale=float(torch.tensor(hf_config.hidden_size ** 0.5, dtype=torch.float32)),
        head="tied" if getattr(hf_config, "tie_word_embeddings", True) else "linear")


def gemma3_state_from_hf(hf_state: dict, cfg: GPTConfig) -> dict:
    """Our state dict from a Gemma3ForCausalLM one: gains 1 + w, Q/K rows and the QK-norm gains in our RoPE
    layout, gate/up stacked into c_fc."""
    order, hd = rope_pair_order(cfg.head_dim), cfg.head_dim

    def gain(name: str) -> torch.Tensor:
        return 1.0 + hf_state[name].float()

    state = {"transformer.wte.weight": hf_state["model.embed_tokens.weight"],
             "transformer.ln_f.weight": gain("model.norm.weight")}
    if cfg.head != "tied":
        state["lm_head.weight"] = hf_state["lm_head.weight"]
    for i in range(cfg.n_layer):
        hf, ours = f"model.layers.{i}", f"transformer.h.{i}"
        attn = f"{hf}.self_attn"
        q, k, v = (hf_state[f"{attn}.{p}_proj.weight"] for p in "qkv")
        state[f"{ours}.attn.c_attn.weight"] = torch.cat([permute_head_rows(q, hd, order),
                                                         permute_head_rows(k, hd, order), v])
        state[f"{ours}.attn.c_proj.weight"] = hf_state[f"{attn}.o_proj.weight"]
        state[f"{ours}.attn.q_norm.weight"] = gain(f"{attn}.q_norm.weight")[order]
        state[f"{ours}.attn.k_norm.weight"] = gain(f"{attn}.k_norm.weight")[order]
        state[f"{ours}.mlp.c_fc.weight"] = torch.cat([hf_state[f"{hf}.mlp.gate_proj.weight"],
                                                      hf_state[f"{hf}.mlp.up_proj.weight"]])
        state[f"{ours}.mlp.c_proj.weight"] = hf_state[f"{hf}.mlp.down_proj.weight"]
        for theirs, mine in NORMS.items():
            state[f"{ours}.{mine}.weight"] = gain(f"{hf}.{theirs}.weight")
    return {k: v.detach().float().clone() for k, v in state.items()}


def gemma3_export_problems(config: GPTConfig) -> list[str]:
    """Why ``config`` has no exact Gemma3ForCausalLM equivalent (empty when it has one)."""
    scalar = config.attn_scale ** -2 if config.attn_scale else config.head_dim
    needs = {"an attention scale of (whole number)^−½": math.isclose(scalar, round(scalar), rel_tol=1e-6),
             "norm_type='rmsnorm'": config.norm_type == "rmsnorm", "norm_placement='peri'":
             config.norm_placement == "peri", "mlp='geglu'": config.mlp == "geglu", "qk_norm=True": config.qk_norm,
             "pos='rope' without rope_scaling": config.pos == "rope" and config.rope_scaling is None,
             "no biases": not config.bias and not config.attn_bias, "no shortcuts": not config.shortcuts,
             "a linear or tied head without bias": config.head in ("linear", "tied") and not config.head_bias,
             "embed_scale = √n_embd with a tied head (an untied head lets the export fold the difference into the "
             "embeddings)": config.head != "tied" or math.isclose(config.embed_scale, config.n_embd ** 0.5,
                                                                   rel_tol=1e-6)}
    return [f"{what} (Gemma 3 has it)" for what, ok in needs.items() if not ok]


def gemma3_state_to_hf(ours: dict, cfg: GPTConfig) -> dict:
    """A Gemma3ForCausalLM state dict from ours: the inverse of ``gemma3_state_from_hf`` (w = γ − 1; scalar or
    absent gains become vectors)."""
    inverse, hd = torch.argsort(rope_pair_order(cfg.head_dim)), cfg.head_dim
    sizes = (cfg.n_head * hd, cfg.kv_heads * hd, cfg.kv_heads * hd)

    def w(name: str, dim: int) -> torch.Tensor:
        return ours.get(name, torch.ones(1)).expand(dim) - 1.0

    # Gemma scales the embeddings by √n_embd; after a width change ours may use another factor (√d of the source):
    # with an untied head the embeddings absorb the ratio, exactly
    ratio = 1.0 if cfg.head == "tied" else cfg.embed_scale / math.sqrt(cfg.n_embd)
    state = {"model.embed_tokens.weight": ours["transformer.wte.weight"] * ratio,
             "model.norm.weight": w("transformer.ln_f.weight", cfg.n_embd)}
    if cfg.head != "tied":
        state["lm_head.weight"] = ours["lm_head.weight"]
    for i in range(cfg.n_layer):
        hf, mine = f"model.layers.{i}", f"transformer.h.{i}"
        q, k, v = ours[f"{mine}.attn.c_attn.weight"].split(sizes)
        state.update({f"{hf}.self_attn.q_proj.weight": permute_head_rows(q, hd, inverse),
                      f"{hf}.self_attn.k_proj.weight": permute_head_rows(k, hd, inverse),
                      f"{hf}.self_attn.v_proj.weight": v,
                      f"{hf}.self_attn.o_proj.weight": ours[f"{mine}.attn.c_proj.weight"],
                      f"{hf}.self_attn.q_norm.weight": w(f"{mine}.attn.q_norm.weight", hd)[inverse],
                      f"{hf}.self_attn.k_norm.weight": w(f"{mine}.attn.k_norm.weight", hd)[inverse]})
        gate, up = ours[f"{mine}.mlp.c_fc.weight"].chunk(2)
        state.update({f"{hf}.mlp.gate_proj.weight": gate, f"{hf}.mlp.up_proj.weight": up,
                      f"{hf}.mlp.down_proj.weight": ours[f"{mine}.mlp.c_proj.weight"]})
        for theirs, own in NORMS.items():
            state[f"{hf}.{theirs}.weight"] = w(f"{mine}.{own}.weight", cfg.n_embd)
    return {k: v.detach().clone().contiguous() for k, v in state.items()}


def gemma3_hf_config(cfg: GPTConfig, transformers, special_ids: dict):
    """The transformers Gemma3TextConfig equal to ``cfg`` (which export_target has accepted)."""
    types = ["sliding_attention" if cfg.windowed(i) else "full_attention" for i in range(cfg.n_layer)]
    local = cfg.rope_local_base or cfg.rope_base
    return transformers.Gemma3TextConfig(
        hidden_size=cfg.n_embd, intermediate_size=cfg.mlp_hidden, num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head, num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size, max_position_embeddings=cfg.block_size, rms_norm_eps=cfg.norm_eps,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=cfg.head == "tied", attention_bias=False,
        query_pre_attn_scalar=round(cfg.attn_scale ** -2) if cfg.attn_scale else cfg.head_dim,
        sliding_window=cfg.attn_window or cfg.block_size, layer_types=types, final_logit_softcapping=None,
        attn_logit_softcapping=None, attention_dropout=cfg.dropout,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": cfg.rope_base},
                         "sliding_attention": {"rope_type": "default", "rope_theta": local}}, **special_ids)


def export_gemma3(model: GPT, transformers, special_ids: dict):
    """A Gemma3ForCausalLM with the same function as ``model``."""
    cfg = model.config
    hf_model = transformers.Gemma3ForCausalLM(gemma3_hf_config(cfg, transformers, special_ids))
    missing, unexpected = hf_model.load_state_dict(gemma3_state_to_hf(model.state_dict(), cfg), strict=False)
    missing = [k for k in missing if not (cfg.head == "tied" and k == "lm_head.weight")]
    if missing or unexpected:
        raise ConversionError(f"internal: {GEMMA3} export left {missing[:3]} unset and {unexpected[:3]} unused")
    return hf_model
