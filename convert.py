"""
Pretrained models in and out: Hugging Face GPT-2, Llama and Qwen2, and nanoGPT checkpoints ↔ nanoLGPT checkpoints.

    python convert.py --from_hf=gpt2 --out_dir=out-gpt2                # HF hub name (cache) or local directory
    python convert.py --from_hf=HuggingFaceTB/SmolLM-135M --out_dir=out-smollm   # Llama family, its tokenizer kept
    python convert.py --from_nanogpt=PATH/ckpt.pt --out_dir=out-mine   # a nanoGPT training checkpoint
    python convert.py --in_dir=out-m1024 --to_hf=hf-m1024              # back to the matching HF class
    python convert.py --from_gguf=SmolLM2-135M-Instruct.Q4_1.gguf --out_dir=out-smollm2   # a llama.cpp GGUF file
    python convert.py --in_dir=out-smollm2-m432 --to_gguf=smollm2-m432.gguf --gguf_type=f16   # and back

GPT-2 is pre-LN LayerNorm with per-dimension gains and biases, learned positions, the tanh GELU
('gelu_new') and a tied head. Hugging Face stores its Linear layers as Conv1D, i.e. transposed.
Llama (2, 3, 3.1/3.2 RoPE scaling; SmolLM, TinyLlama) and Qwen2/2.5 are pre-RMSNorm, SwiGLU, rotary, with grouped-
query attention; Qwen2 adds Q/K/V biases. Hugging Face rotates dimension i with i + head_dim/2, we rotate 2i with
2i + 1: Q and K rows are reordered within each head on the way in and back on the way out (``rope_pair_order``),
which changes no attention score. The architecture is read from the config before any weight: any other class is
refused, and a checkpoint that leaves a tensor unloaded (random) is refused.
``transformers`` is needed only here (and for init_from='gpt2'); it is an optional dependency.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from checkpoint import (
    check_finite,
    check_output_dir,
    check_writable_dir,
    clean_state_dict,
    hold_run_dir,
    is_interrupted,
    load_checkpoint,
    load_model,
    save_checkpoint,
)
from cli import run_cli
from configurator import load_config
from dataset import (
    GPT2_META,
    HF_TOKENIZER_FILES,
    data_dir_for_checkpoint,
    dataset_dir,
    gpt2_encoding,
    hf_tokenizer_meta,
    load_meta,
    read_tokenizer_files,
)
from errors import CheckpointError, ConfigError, ConversionError
from model import GPT, LLAMA3_SCALING_KEYS, GPTConfig, check_rope_scaling

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise ConversionError("this needs the optional dependency transformers: "
                              "pip install -r requirements-extras.txt") from e
    return transformers


# ----------------------------------------------------------------------------------------------
# Hugging Face → ours

GPT2, LLAMA, QWEN2 = "GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM"
ARCHITECTURES = (GPT2, LLAMA, QWEN2)  # the Hugging Face classes we import and export, exactly
MODEL_TYPES = {"gpt2": GPT2, "llama": LLAMA, "qwen2": QWEN2}  # for a config.json that names no architecture
IGNORED_HF_KEYS = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")  # buffers of older transformers


def hf_architecture(hf_config, source: str) -> str:
    """The one supported architecture a Hugging Face config declares, or ConversionError naming what it declares."""
    declared = list(getattr(hf_config, "architectures", None) or [])
    if not declared and getattr(hf_config, "model_type", None) in MODEL_TYPES:
        declared = [MODEL_TYPES[hf_config.model_type]]
    if len(declared) != 1 or declared[0] not in ARCHITECTURES:
        named = ", ".join(declared) or f"model_type={getattr(hf_config, 'model_type', None)!r}"
        raise ConversionError(f"{source} is a {named} model; convert.py imports exactly {', '.join(ARCHITECTURES)} "
                              "(another architecture would load into the wrong class with random weights)")
    return declared[0]


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


def config_from_hf(hf_config, arch: str = GPT2) -> GPTConfig:
    """The GPTConfig equal to a Hugging Face GPT-2, Llama or Qwen2 config, or ConversionError naming the first
    field that has no exact equivalent."""
    if arch != GPT2:
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


def gpt2_state_from_hf(hf_state: dict) -> dict:
    """Our state dict from a GPT2LMHeadModel one: the Conv1D weights transposed, the mask buffers dropped."""
    return {name: (t.detach().float().t().contiguous() if name.endswith(CONV1D) else t.detach().float().clone())
            for name, t in hf_state.items() if not name.endswith(IGNORED_HF_KEYS)}


def model_from_hf_model(hf_model, **overrides) -> GPT:
    """Our GPT with the same function as a loaded GPT2LMHeadModel, LlamaForCausalLM or Qwen2ForCausalLM."""
    arch = type(hf_model).__name__
    if arch not in ARCHITECTURES:
        raise ConversionError(f"{arch} is not supported; convert.py imports exactly {', '.join(ARCHITECTURES)}")
    config = config_from_hf(hf_model.config, arch)
    for key, value in overrides.items():
        setattr(config, key, value)
    hf_state = hf_model.state_dict()
    embedding = "transformer.wte.weight" if arch == GPT2 else "model.embed_tokens.weight"
    if config.head == "tied" and "lm_head.weight" in hf_state and \
            hf_model.lm_head.weight.data_ptr() != hf_model.get_input_embeddings().weight.data_ptr():
        # the config says tied, but the file held a trained head of its own and transformers kept it (it warns):
        # importing it tied would drop that head and change the model
        config.head = "linear"
        print(f"note: the config says tie_word_embeddings, but the weights hold their own lm_head (≠ {embedding}); "
              "imported with that head, untied, as transformers runs it")
    state = gpt2_state_from_hf(hf_state) if arch == GPT2 else llama_state_from_hf(hf_state, config)
    return GPT.from_state_dict(config, state)


def _load_hf(loader, name_or_dir: str, what: str, **kwargs):
    """``loader.from_pretrained`` with the offline hint as one ConversionError."""
    import transformers
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its load report and bars: our error line says what failed
    transformers.logging.disable_progress_bar()
    try:
        return loader.from_pretrained(name_or_dir, **kwargs)
    except OSError as e:
        if os.path.isdir(name_or_dir):  # a local directory: a file is missing or unreadable (a shard, the weights)
            raise ConversionError(f"could not load the Hugging Face {what} of '{name_or_dir}': {_first_line(e)}; "
                                  "the directory is incomplete: save or download it again") from e
        raise ConversionError(
            f"could not load the Hugging Face {what} of '{name_or_dir}' ({e.__class__.__name__}). Offline, it must "
            "already be in the Hugging Face cache (HF_HOME, default ~/.cache/huggingface) with HF_HUB_OFFLINE=1, "
            "or pass a local directory written by save_pretrained") from e
    except Exception as e:  # damaged or inconsistent files: transformers, safetensors and tokenizers raise
        #                      ValueError, KeyError, RuntimeError and types of their own
        hint = (" (a tensor's shape differs from what config.json describes)" if "mismatched_sizes" in str(e)
                else "")
        raise ConversionError(f"'{name_or_dir}' cannot be loaded as a Hugging Face {what}: {_first_line(e)}{hint}; "
                              "its files are damaged or disagree with each other: save or download them again") from e
    finally:
        transformers.logging.set_verbosity(verbosity)
        transformers.logging.enable_progress_bar()


def _first_line(e: BaseException) -> str:
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()][:2]  # a validator's reason is line 2
    line = " ".join(lines).replace(" For details look at the above report!", "")
    return f"{e.__class__.__name__}: {line[:200]}"


def hf_pretrained(name_or_dir: str, **overrides) -> tuple[GPT, str]:
    """(our GPT, its Hugging Face architecture) from a model name (local cache or hub) or a save_pretrained
    directory. The architecture comes from its config before any weight is read: only GPT-2, Llama and Qwen2 load,
    each into its own class, and every tensor of the checkpoint must land in a parameter (none left random)."""
    transformers = _transformers()
    if os.path.isdir(name_or_dir) and not os.path.exists(os.path.join(name_or_dir, "config.json")):
        raise ConversionError(f"'{name_or_dir}' is a directory without config.json, so not a save_pretrained "
                              "directory; point --from_hf at the directory that model.save_pretrained wrote")
    hf_config = _load_hf(transformers.AutoConfig, name_or_dir, "config")
    arch = hf_architecture(hf_config, name_or_dir)
    config_from_hf(hf_config, arch)  # an unrepresentable field fails here, before the weights are read
    hf_model, info = _load_hf(getattr(transformers, arch), name_or_dir, "model", output_loading_info=True,
                              dtype=torch.float32)
    left = {kind: [k for k in info.get(kind, []) if not str(k).endswith(IGNORED_HF_KEYS)]
            for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(left.values()):
        raise ConversionError(f"'{name_or_dir}' does not fill the {arch} exactly: " + "; ".join(
            f"{kind.replace('_', ' ')} {[str(k) for k in keys[:3]]}" for kind, keys in left.items() if keys)
            + " — refusing to keep randomly initialised tensors")
    return model_from_hf_model(hf_model.eval(), **overrides), arch


def gpt2_from_pretrained(name_or_dir: str, **overrides) -> GPT:
    """A Hugging Face GPT-2 (name or directory) as our GPT; any other architecture is refused."""
    model, arch = hf_pretrained(name_or_dir, **overrides)
    if arch != GPT2:
        raise ConversionError(f"'{name_or_dir}' is a {arch}, not GPT-2; import it with convert.py --from_hf")
    return model


def hf_tokenizer_files(name_or_dir: str) -> dict[str, str]:
    """The model's Hugging Face tokenizer files (tokenizer.json and its configs), verbatim: read from the directory,
    or from the hub's cache for a model name. Not re-saved through a tokenizer class, which may add tokens."""
    directory = name_or_dir
    if not os.path.isdir(name_or_dir):
        try:
            from huggingface_hub import snapshot_download
            directory = snapshot_download(name_or_dir, allow_patterns=list(HF_TOKENIZER_FILES))
        except Exception as e:  # offline without a cache, unknown repo, no access: hub errors of several kinds
            raise ConversionError(f"could not fetch the tokenizer of '{name_or_dir}' ({e.__class__.__name__}); "
                                  "offline it must be in the Hugging Face cache, or pass a local directory") from e
    files = read_tokenizer_files(directory)
    if "tokenizer.json" not in files:
        raise ConversionError(f"'{name_or_dir}' has no tokenizer.json; an imported model keeps its own tokenizer: "
                              "save it beside the model (tokenizer.save_pretrained(DIR) of a fast tokenizer)")
    return files


def hf_special_ids(hf_config) -> dict:
    return {k: getattr(hf_config, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")
            if getattr(hf_config, k, None) is not None}


def hf_tokenizer_meta_for(name_or_dir: str, model: GPT) -> dict:
    """The tokenizer description an imported Llama / Qwen2 keeps in its checkpoint (its own tokenizer)."""
    transformers = _transformers()
    meta = hf_tokenizer_meta(hf_tokenizer_files(name_or_dir),
                             hf_special_ids(_load_hf(transformers.AutoConfig, name_or_dir, "config")))
    if meta["vocab_size"] > model.config.vocab_size:
        raise ConversionError(f"the tokenizer of '{name_or_dir}' has {meta['vocab_size']} tokens but the model only "
                              f"{model.config.vocab_size} embeddings")
    return meta


def gguf_pretrained(path: str) -> tuple[GPT, str, dict]:
    """(our GPT, its Hugging Face architecture, its tokenizer description) from a Llama / Qwen2 GGUF file: the
    tensors dequantized to float32 by our reader, the tokenizer the file describes (transformers builds it)."""
    from gguf_format import gguf_pretokenizer, gguf_tokenizer_files, read_gguf
    _transformers()
    held = read_gguf(path)
    config = config_from_hf(held.hf_config, held.arch)
    model = GPT.from_state_dict(config, llama_state_from_hf(held.hf_state, config))
    meta = hf_tokenizer_meta(gguf_tokenizer_files(path), hf_special_ids(held.hf_config))
    meta["gguf_pre"] = gguf_pretokenizer(path)  # llama.cpp's pre-tokenizer name, written back by --to_gguf
    if meta["vocab_size"] > config.vocab_size:
        raise ConversionError(f"the tokenizer of '{path}' has {meta['vocab_size']} tokens but the model only "
                              f"{config.vocab_size} embeddings")
    return model.eval(), held.arch, meta


# ----------------------------------------------------------------------------------------------
# nanoGPT → ours


def import_nanogpt(ckpt: dict) -> GPT:
    """A nanoGPT training checkpoint ({'model', 'model_args', ...}): GPT-2 architecture, exact GELU, tied head."""
    if "model" not in ckpt or "model_args" not in ckpt:
        raise CheckpointError("not a nanoGPT checkpoint: it needs 'model' and 'model_args' keys")
    known = {"n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout"}
    args = {k: v for k, v in ckpt["model_args"].items() if k in known}
    state = {k: v for k, v in clean_state_dict(ckpt["model"]).items()
             if not (k.endswith(".attn.bias") and v.dim() == 4)}  # the mask buffer of non-flash nanoGPT
    tied = "lm_head.weight" not in state or torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    return GPT.from_state_dict(GPTConfig(**args, head="tied" if tied else "linear"),
                               {k: v.clone() for k, v in state.items()})


# ----------------------------------------------------------------------------------------------
# ours → Hugging Face


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
    problems = []
    if config.norm_type != "layernorm":
        problems.append(f"norm_type={config.norm_type!r}: GPT-2 uses LayerNorm (transform with --norms=scalar or "
                        "--norms=drop keeps LayerNorm, approximately)")
    if config.norm_placement != "pre":
        problems.append(f"norm_placement={config.norm_placement!r}: GPT-2 is pre-LN")
    if config.pos != "learned":
        problems.append(f"pos={config.pos!r}: GPT-2 has learned positions")
    if config.mlp == "swiglu":
        problems.append("mlp='swiglu': GPT-2's MLP is GELU")
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


def llama_export_problems(config: GPTConfig, arch: str) -> list[str]:
    """Why ``config`` has no exact LlamaForCausalLM / Qwen2ForCausalLM equivalent (empty when it has one)."""
    problems = []
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


def export_target(config: GPTConfig) -> str:
    """The Hugging Face class that holds ``config`` exactly; otherwise one ConversionError naming the first field
    that the closest supported class cannot hold."""
    problems = {GPT2: gpt2_export_problems(config), LLAMA: llama_export_problems(config, LLAMA),
                QWEN2: llama_export_problems(config, QWEN2)}
    best = min(ARCHITECTURES, key=lambda arch: len(problems[arch]))
    if problems[best]:
        raise ConversionError(f"this model cannot be exported exactly to any of {', '.join(ARCHITECTURES)}; the "
                              f"closest is {best}, which cannot hold {problems[best][0]}")
    return best


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
    if arch == LLAMA:
        return transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **common)
    return transformers.Qwen2Config(use_sliding_window=False, **common)


def export_llama(model: GPT, transformers, arch: str, special_ids: dict):
    """A LlamaForCausalLM or Qwen2ForCausalLM with the same function as ``model``."""
    cfg = model.config
    hf_model = getattr(transformers, arch)(llama_hf_config(cfg, transformers, arch, special_ids))
    missing, unexpected = hf_model.load_state_dict(llama_state_to_hf(model.state_dict(), cfg), strict=False)
    missing = [k for k in missing if not (cfg.head == "tied" and k == "lm_head.weight")]
    if missing or unexpected:
        raise ConversionError(f"internal: {arch} export left {missing[:3]} unset and {unexpected[:3]} unused")
    return hf_model


def export_hf(model: GPT, out_dir: str, special_ids: dict | None = None) -> str:
    """Write the Hugging Face model (save_pretrained) with the same function as ``model``: GPT2LMHeadModel,
    LlamaForCausalLM or Qwen2ForCausalLM, whichever holds its architecture exactly. Returns the class name."""
    transformers = _transformers()
    arch = export_target(model.config)
    special_ids = dict(special_ids or {})
    hf_model = (export_gpt2(model, transformers, special_ids) if arch == GPT2
                else export_llama(model, transformers, arch, special_ids))
    hf_model.save_pretrained(out_dir)
    return arch


def tokenizer_files(meta: dict | None) -> dict[str, str]:
    """The Hugging Face files (tokenizer.json and configs) of a checkpoint's tokenizer: an imported model's own, or
    GPT-2's BPE rebuilt from tiktoken's ranks; a character tokenizer has none (it is exported by --to_hf only)."""
    kind = (meta or {}).get("tokenizer", "char" if "stoi" in (meta or {}) else "gpt2")
    if meta is None or kind == "char":
        raise ConversionError("the checkpoint's tokenizer is " + ("missing" if meta is None else "character-level") +
                              "; a GGUF file holds a byte-level BPE tokenizer (export with --to_hf instead)")
    if kind == "hf":
        return dict(meta["files"])
    return {"tokenizer.json": gpt2_tokenizer_object().to_str()}


def export_gguf(model: GPT, meta: dict | None, path: str, dtype: str = "f32") -> str:
    """Write ``model`` (Llama- or Qwen2-shaped: anything export_target maps to them) and its tokenizer as one GGUF
    file, atomically: a temporary sibling renamed into place, removed on any failure. Returns the class name."""
    from gguf_format import write_gguf
    transformers = _transformers()
    arch = export_target(model.config)
    if arch not in (LLAMA, QWEN2):
        raise ConversionError(f"this model exports as a {arch}; --to_gguf writes {LLAMA} / {QWEN2}-shaped models "
                              "(pre-RMSNorm, rotary, SwiGLU): use --to_hf for it")
    files = tokenizer_files(meta)
    special_ids = dict((meta or {}).get("special_ids") or {})
    hf_config = llama_hf_config(model.config, transformers, arch, special_ids)
    hf_state = llama_state_to_hf(model.state_dict(), model.config)
    parent = os.path.dirname(os.path.abspath(path))
    created = not os.path.isdir(parent)
    os.makedirs(parent, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    done = False
    try:
        write_gguf(tmp, hf_state, hf_config, arch, files, special_ids, dtype,
                   pretokenizer=str((meta or {}).get("gguf_pre", "default")))
        os.replace(tmp, path)
        done = True
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
        if created and not done:
            os.removedirs(parent)  # the folders this export made for its file, and nothing else
    return arch


# ----------------------------------------------------------------------------------------------
# The tokenizer, exported beside the model (built offline: nothing is downloaded)


def gpt2_byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-character map (the alphabet of its vocab.json and merges)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def bpe_merge_of(ranks: dict[bytes, int], token: bytes) -> tuple[bytes, bytes]:
    """The merge that creates ``token``: run BPE on its bytes with only the merges ranked below it."""
    limit = ranks[token]
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        candidates = [(ranks.get(a + b), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))
                      if ranks.get(a + b, limit) < limit]
        if not candidates:
            break
        _, i = min(candidates)
        parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]
    if len(parts) != 2:
        raise ConversionError(f"internal: token {token!r} is not one merge of two tokens")
    return parts[0], parts[1]


def gpt2_tokenizer_object():
    """GPT-2's byte-level BPE as a ``tokenizers.Tokenizer``, from tiktoken's cached ranks (vocab and merges are
    recovered from the ranks; ids are tiktoken's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    enc = gpt2_encoding()
    ranks = enc._mergeable_ranks
    to_char = gpt2_byte_to_unicode()

    def text(b: bytes) -> str:
        return "".join(to_char[x] for x in b)

    vocab = {text(tok): rank for tok, rank in ranks.items()}
    merges = [(text(a), text(b)) for a, b in (bpe_merge_of(ranks, tok) for tok, _ in
                                              sorted(ranks.items(), key=lambda kv: kv[1]) if len(tok) > 1)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    return tokenizer


def char_tokenizer_object(meta: dict):
    """A character-level tokenizer with the checkpoint's stoi: each character one token, decoding concatenates."""
    from tokenizers import Tokenizer, decoders, models
    tokenizer = Tokenizer(models.BPE(vocab=dict(meta["stoi"]), merges=[]))  # no merges: characters stay apart
    tokenizer.decoder = decoders.Fuse()
    return tokenizer


def export_tokenizer(meta: dict | None, out_dir: str) -> str:
    """Write the model's tokenizer (tokenizer.json + config) so that AutoTokenizer.from_pretrained(out_dir) loads
    it offline; returns its kind."""
    transformers = _transformers()
    if meta is None:
        raise ConversionError("the checkpoint records no tokenizer (meta); it cannot be exported with the model")
    kind = meta.get("tokenizer", "char" if "stoi" in meta else "gpt2")
    if kind == "hf":  # the model's own Hugging Face tokenizer, written back as it was imported
        os.makedirs(out_dir, exist_ok=True)
        for name, text in meta["files"].items():
            with open(os.path.join(out_dir, os.path.basename(name)), "w", encoding="utf-8") as f:
                f.write(text)
        return kind
    if kind == "char":
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=char_tokenizer_object(meta),
                                                    clean_up_tokenization_spaces=False)
    else:
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=gpt2_tokenizer_object(),
                                                    bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                                    unk_token="<|endoftext|>", clean_up_tokenization_spaces=False)
    fast.save_pretrained(out_dir)
    return kind


LM_EVAL_TASK = """task: nanolgpt_val
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
"""


def write_lm_eval_task(ckpt: dict, data_dir: str, out_dir: str, final_dir: str = "") -> str:
    """An lm-evaluation-harness task over the model's own val split (one document, the decoded val text), so lm-eval
    runs offline and its perplexity can be checked against ours: ``lm_eval --include_path out_dir --tasks
    nanolgpt_val``. Returns the task directory."""
    import json

    from dataset import BatchLoader, Tokenizer
    tokens = BatchLoader(data_dir, 1, 1).tokens("val")
    text = Tokenizer(ckpt["meta"]).decode(tokens.tolist())
    task_dir = os.path.join(out_dir, "lm_eval")
    os.makedirs(task_dir, exist_ok=True)
    with open(os.path.join(task_dir, "val.jsonl"), "w") as f:
        f.write(json.dumps({"text": text}) + "\n")
    data = os.path.abspath(os.path.join(final_dir or out_dir, "lm_eval", "val.jsonl"))  # where it will be read
    with open(os.path.join(task_dir, "nanolgpt_val.yaml"), "w") as f:
        f.write(LM_EVAL_TASK.format(data=data))
    return task_dir


# ----------------------------------------------------------------------------------------------
# CLI


@dataclass
class ConvertConfig:
    # conversion (one of from_hf, from_nanogpt, to_hf)
    from_hf: str = ""  # a Hugging Face GPT-2 / Llama / Qwen2 name or save_pretrained directory
    from_gguf: str = ""  # a Llama / Qwen2 GGUF file (any tensor type the gguf package dequantizes)
    from_nanogpt: str = ""  # a nanoGPT ckpt.pt (or its directory)
    data_dir: str = ""  # from_nanogpt: the dataset whose meta.pkl is its tokenizer; lm_eval_task: whose val split
    in_dir: str = ""  # with to_hf: our checkpoint to export
    to_hf: str = ""  # directory for the exported GPT2LMHeadModel / LlamaForCausalLM / Qwen2ForCausalLM + tokenizer
    to_gguf: str = ""  # file for the exported Llama / Qwen2 GGUF (model + tokenizer)
    gguf_type: str = "f32"  # with to_gguf: f32 | f16 | q8_0 (matrices; norm gains stay f32)
    lm_eval_task: bool = False  # with to_hf: also write to_hf/lm_eval/, an lm-eval task over the model's val split
    out_dir: str = ""  # with from_hf / from_nanogpt: where our ckpt.pt goes
    overwrite: bool = False  # replace a checkpoint already in out_dir, or an export already in to_hf / to_gguf
    allow_incomplete: bool = False  # with to_hf / to_gguf: export an interrupted run (marked incomplete) anyway

    def validate(self) -> None:
        modes = [bool(self.from_hf), bool(self.from_gguf), bool(self.from_nanogpt), bool(self.to_hf),
                 bool(self.to_gguf)]
        if sum(modes) != 1:
            raise ConfigError("give exactly one of --from_hf=NAME_OR_DIR, --from_gguf=FILE, --from_nanogpt=CKPT, "
                              "--to_hf=DIR or --to_gguf=FILE")
        if (self.from_hf or self.from_gguf or self.from_nanogpt) and not self.out_dir:
            raise ConfigError("--out_dir=DIR is required to import a model")
        if (self.to_hf or self.to_gguf) and not self.in_dir:
            raise ConfigError(f"--in_dir=DIR (our checkpoint) is required with --to_{'hf' if self.to_hf else 'gguf'}")
        if self.gguf_type not in ("f32", "f16", "q8_0"):
            raise ConfigError(f"--gguf_type={self.gguf_type!r} is not one of f32, f16, q8_0")


def check_export_dir(to_hf: str, overwrite: bool) -> None:
    """Before any work: ``to_hf`` is a directory (or can be one) that holds no export, unless ``overwrite``."""
    if os.path.exists(to_hf) and not os.path.isdir(to_hf):
        raise ConversionError(f"--to_hf='{to_hf}' is a file: the export is a directory (config.json, weights, "
                              "tokenizer); give a directory path")
    held = [name for name in ("config.json", "model.safetensors", "pytorch_model.bin")
            if os.path.exists(os.path.join(to_hf, name))]
    if held and not overwrite:
        raise ConversionError(f"'{to_hf}' already holds an export ({', '.join(held)}); choose another --to_hf, or "
                              "pass --overwrite=True to replace it")
    check_writable_dir(to_hf)


@contextmanager
def staged_export(to_hf: str) -> Iterator[str]:
    """A temporary sibling directory to write a whole export into; only when it is complete are its files moved
    into ``to_hf``, config.json last (the file that makes a directory an export), so an export cut short by an
    error or a signal never looks complete. The staging directory goes in every case."""
    staging = f"{os.path.abspath(to_hf).rstrip(os.sep)}.tmp-{os.getpid()}"
    try:
        os.makedirs(staging)
        yield staging
        os.makedirs(to_hf, exist_ok=True)
        names = sorted(os.listdir(staging), key=lambda name: name == "config.json")
        for name in names:
            target = os.path.join(to_hf, name)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            os.replace(os.path.join(staging, name), target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_complete_for_export(ckpt: dict, cfg: ConvertConfig) -> None:
    """An interrupted run (marked ``complete: False``) exports only when asked for: an export cannot carry the
    mark, so the model would come back from it looking finished."""
    if is_interrupted(ckpt) and not cfg.allow_incomplete:
        raise ConversionError(f"'{cfg.in_dir}' is an interrupted run (stopped at iter {ckpt.get('iter_num', 0)}, "
                              "marked incomplete) and an export cannot carry that mark: resume it to the end, or "
                              "pass --allow_incomplete=True to export it as it is")


def check_export_file(path: str, overwrite: bool) -> None:
    """Before any work: ``path`` can be written as a new file (an existing one only with ``overwrite``)."""
    if os.path.isdir(path):
        raise ConversionError(f"--to_gguf='{path}' is a directory; give a file path such as model.gguf")
    if os.path.lexists(path) and not overwrite:
        raise ConversionError(f"'{path}' already exists; choose another --to_gguf, or pass --overwrite=True")
    check_writable_dir(os.path.dirname(os.path.abspath(path)))


def convert(cfg: ConvertConfig) -> str:
    if cfg.to_gguf:
        check_export_file(cfg.to_gguf, cfg.overwrite)
        model, ckpt = load_model(cfg.in_dir)
        check_complete_for_export(ckpt, cfg)
        tokenizer_files(ckpt.get("meta"))  # a tokenizer GGUF cannot hold fails before anything is written
        export_gguf(model, ckpt.get("meta"), cfg.to_gguf, cfg.gguf_type)
        return cfg.to_gguf
    if cfg.to_hf:
        check_export_dir(cfg.to_hf, cfg.overwrite)
        model, ckpt = load_model(cfg.in_dir)
        check_complete_for_export(ckpt, cfg)
        if ckpt.get("meta") is None:  # checked before anything is written
            raise ConversionError(f"{cfg.in_dir} records no tokenizer (meta): the export would have no tokenizer")
        data_dir = data_dir_for_checkpoint(ckpt, cfg.data_dir, "--data_dir") if cfg.lm_eval_task else ""
        export_target(model.config)  # an architecture no supported class holds fails before anything is written
        with staged_export(cfg.to_hf) as staging:
            export_hf(model, staging, ckpt["meta"].get("special_ids"))
            export_tokenizer(ckpt.get("meta"), staging)
            if cfg.lm_eval_task:
                write_lm_eval_task(ckpt, data_dir, staging, final_dir=cfg.to_hf)
        return cfg.to_hf
    check_output_dir(cfg.out_dir, cfg.from_nanogpt or cfg.from_gguf, cfg.overwrite)
    if cfg.from_hf:
        model, arch = hf_pretrained(cfg.from_hf)
        check_finite(model.state_dict(), cfg.from_hf)
        meta = GPT2_META if arch == GPT2 else hf_tokenizer_meta_for(cfg.from_hf, model)
        source = {"init_from": cfg.from_hf, "hf_architecture": arch}
    elif cfg.from_gguf:
        model, arch, meta = gguf_pretrained(cfg.from_gguf)
        check_finite(model.state_dict(), cfg.from_gguf)
        source = {"init_from": os.path.abspath(cfg.from_gguf), "hf_architecture": arch, "format": "gguf"}
    else:
        ckpt = load_checkpoint(cfg.from_nanogpt)
        model = import_nanogpt(ckpt)
        meta, source = nanogpt_meta(ckpt, cfg.data_dir), dict(ckpt.get("config") or {}, imported_from=cfg.from_nanogpt)
        if cfg.data_dir:
            source["data_dir"] = cfg.data_dir
    save_checkpoint({"model": model.state_dict(), "model_args": model.config.to_dict(), "config": source,
                     "iter_num": 0, "best_val_loss": float("inf"), "optimizer": None, "meta": meta}, cfg.out_dir)
    return cfg.out_dir


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


def main(argv: list[str]) -> None:
    cfg = load_config(ConvertConfig, argv, prog="convert.py")
    if cfg.to_gguf:  # one file, written atomically by export_gguf
        print(f"wrote {convert(cfg)}")
        return
    with hold_run_dir(cfg.to_hf or cfg.out_dir, "convert.py"):
        print(f"wrote {convert(cfg)}")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
