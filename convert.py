"""
Pretrained models in and out: Hugging Face GPT-2 and nanoGPT checkpoints ↔ nanoLGPT checkpoints.

    python convert.py --from_hf=gpt2 --out_dir=out-gpt2                # HF hub name (cache) or local directory
    python convert.py --from_nanogpt=PATH/ckpt.pt --out_dir=out-mine   # a nanoGPT training checkpoint
    python convert.py --in_dir=out-m1024 --to_hf=hf-m1024              # back to a GPT2LMHeadModel directory

GPT-2 is pre-LN LayerNorm with per-dimension gains and biases, learned positions, the tanh GELU
('gelu_new') and a tied head. Hugging Face stores its Linear layers as Conv1D, i.e. transposed.
``transformers`` is needed only here (and for init_from='gpt2'); it is an optional dependency.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from checkpoint import check_output_dir, clean_state_dict, load_checkpoint, load_model, save_checkpoint
from cli import run_cli
from configurator import load_config
from dataset import GPT2_META, data_dir_for_checkpoint, dataset_dir, gpt2_encoding, load_meta
from errors import CheckpointError, ConfigError, ConversionError
from model import GPT, GPTConfig

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


def config_from_hf(hf_config) -> GPTConfig:
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


def gpt2_from_hf_model(hf_model, **overrides) -> GPT:
    config = config_from_hf(hf_model.config)
    for key, value in overrides.items():
        setattr(config, key, value)
    state = {}
    for name, tensor in hf_model.state_dict().items():
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # causal-mask buffers of older transformers versions
        tensor = tensor.detach().float()
        state[name] = tensor.t().contiguous() if name.endswith(CONV1D) else tensor.clone()
    return GPT.from_state_dict(config, state)


def gpt2_from_pretrained(name_or_dir: str, **overrides) -> GPT:
    """GPT-2 from a Hugging Face model name (local cache or hub) or a save_pretrained directory."""
    transformers = _transformers()
    if os.path.isdir(name_or_dir) and not os.path.exists(os.path.join(name_or_dir, "config.json")):
        raise ConversionError(f"'{name_or_dir}' is a directory without config.json, so not a save_pretrained "
                              "directory; point --from_hf at the directory that model.save_pretrained wrote")
    try:
        hf_model = transformers.GPT2LMHeadModel.from_pretrained(name_or_dir)
    except OSError as e:
        raise ConversionError(
            f"could not load Hugging Face model '{name_or_dir}' ({e.__class__.__name__}). Offline, the weights must "
            "already be in the Hugging Face cache (HF_HOME, default ~/.cache/huggingface) with HF_HUB_OFFLINE=1, "
            "or pass a local directory written by save_pretrained") from e
    return gpt2_from_hf_model(hf_model, **overrides)


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


def export_requirements(config: GPTConfig) -> list[str]:
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
    inner = config.n_head * config.head_dim
    if inner > config.n_embd or (config.n_embd - inner) % config.head_dim:
        problems.append(f"n_head*head_dim={inner} != n_embd={config.n_embd}: GPT-2's attention width equals its "
                        f"residual width (zero heads pad it only up to multiples of head_dim={config.head_dim})")
    return problems


def export_hf(model: GPT, out_dir: str) -> None:
    """Write a GPT2LMHeadModel directory (save_pretrained) with the same function as ``model``."""
    transformers = _transformers()
    problems = export_requirements(model.config)
    if problems:
        raise ConversionError("this model cannot be exported to GPT-2: " + "; ".join(problems))
    model = pad_attention_heads(model)
    cfg = model.config
    hf_config = transformers.GPT2Config(
        n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, n_positions=cfg.block_size,
        vocab_size=cfg.vocab_size, n_inner=cfg.mlp_hidden, layer_norm_epsilon=cfg.norm_eps,
        activation_function="gelu_new" if cfg.mlp == "gelu_tanh" else "gelu", tie_word_embeddings=cfg.head == "tied",
        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
        bos_token_id=min(50256, cfg.vocab_size - 1), eos_token_id=min(50256, cfg.vocab_size - 1))
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
    hf_model.save_pretrained(out_dir)


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


def write_lm_eval_task(ckpt: dict, data_dir: str, out_dir: str) -> str:
    """An lm-evaluation-harness task over the model's own val split (one document, the decoded val text), so lm-eval
    runs offline and its perplexity can be checked against ours: ``lm_eval --include_path out_dir --tasks
    nanolgpt_val``. Returns the task directory."""
    import json

    from dataset import BatchLoader, Tokenizer
    tokens = BatchLoader(data_dir, 1, 1).tokens("val")
    text = Tokenizer(ckpt["meta"]).decode(tokens.tolist())
    task_dir = os.path.join(out_dir, "lm_eval")
    os.makedirs(task_dir, exist_ok=True)
    data = os.path.abspath(os.path.join(task_dir, "val.jsonl"))
    with open(data, "w") as f:
        f.write(json.dumps({"text": text}) + "\n")
    with open(os.path.join(task_dir, "nanolgpt_val.yaml"), "w") as f:
        f.write(LM_EVAL_TASK.format(data=data))
    return task_dir


# ----------------------------------------------------------------------------------------------
# CLI


@dataclass
class ConvertConfig:
    # conversion (one of from_hf, from_nanogpt, to_hf)
    from_hf: str = ""  # a Hugging Face GPT-2 name or save_pretrained directory
    from_nanogpt: str = ""  # a nanoGPT ckpt.pt (or its directory)
    data_dir: str = ""  # from_nanogpt: the dataset whose meta.pkl is its tokenizer; lm_eval_task: whose val split
    in_dir: str = ""  # with to_hf: our checkpoint to export
    to_hf: str = ""  # directory for the exported GPT2LMHeadModel and its tokenizer
    lm_eval_task: bool = False  # with to_hf: also write to_hf/lm_eval/, an lm-eval task over the model's val split
    out_dir: str = ""  # with from_hf / from_nanogpt: where our ckpt.pt goes
    overwrite: bool = False  # replace a checkpoint already in out_dir

    def validate(self) -> None:
        modes = [bool(self.from_hf), bool(self.from_nanogpt), bool(self.to_hf)]
        if sum(modes) != 1:
            raise ConfigError("give exactly one of --from_hf=NAME_OR_DIR, --from_nanogpt=CKPT or --to_hf=DIR")
        if (self.from_hf or self.from_nanogpt) and not self.out_dir:
            raise ConfigError("--out_dir=DIR is required to import a model")
        if self.to_hf and not self.in_dir:
            raise ConfigError("--in_dir=DIR (our checkpoint) is required with --to_hf")


def convert(cfg: ConvertConfig) -> str:
    if cfg.to_hf:
        model, ckpt = load_model(cfg.in_dir)
        if ckpt.get("meta") is None:  # checked before anything is written
            raise ConversionError(f"{cfg.in_dir} records no tokenizer (meta): the export would have no tokenizer")
        data_dir = data_dir_for_checkpoint(ckpt, cfg.data_dir, "--data_dir") if cfg.lm_eval_task else ""
        export_hf(model, cfg.to_hf)
        export_tokenizer(ckpt.get("meta"), cfg.to_hf)
        if cfg.lm_eval_task:
            write_lm_eval_task(ckpt, data_dir, cfg.to_hf)
        return cfg.to_hf
    check_output_dir(cfg.out_dir, cfg.from_nanogpt, cfg.overwrite)
    if cfg.from_hf:
        model, meta, source = gpt2_from_pretrained(cfg.from_hf), GPT2_META, {"init_from": cfg.from_hf}
    else:
        ckpt = load_checkpoint(cfg.from_nanogpt)
        model = import_nanogpt(ckpt)
        meta, source = nanogpt_meta(ckpt, cfg.data_dir), dict(ckpt.get("config", {}), imported_from=cfg.from_nanogpt)
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
    print(f"wrote {convert(load_config(ConvertConfig, argv, prog='convert.py'))}")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
