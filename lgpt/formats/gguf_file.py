"""
GGUF files (llama.cpp's format) ↔ the Hugging Face Llama / Qwen2 / Gemma 3 state dict that convert.py already maps
to ours.

GGUF names a Llama's tensors ``token_embd``, ``blk.N.attn_q`` … ``output``, stores every matrix as (out, in) rows
(its ggml shape lists the axes in reverse), and keeps Llama's Q and K rows in the interleaved RoPE layout (pairs
2i, 2i + 1: llama.cpp's convert permutes them so, and that is our layout too) while Qwen2's stay in Hugging Face's
rotate-half layout. Reading dequantizes every tensor type the ``gguf`` package knows (F32, F16, BF16, Q8_0,
Q4_0/1, Q5_0/1, the K-quants …) to float32; writing stores F32, F16 or Q8_0 matrices (norm gains always F32, as
llama.cpp does) and the tokenizer as llama.cpp's ``gpt2`` byte-level BPE (tokens, token types, merges, special
ids). The config comes from the metadata; a field we cannot represent exactly is refused by name, like --from_hf.

Gemma 3 (``gemma3``) differs in four ways, each as llama.cpp's converter writes it: every norm gain is stored as
1 + w (Hugging Face's Gemma keeps w), Q and K stay in rotate-half order, the block has four norms and a QK-norm
(``attn_norm``, ``post_attention_norm``, ``ffn_norm``, ``post_ffw_norm``, ``attn_q_norm``, ``attn_k_norm``), and the
tokenizer is SentencePiece's (model ``llama``: tokens, scores, token types). The layer pattern and the local RoPE
base are read from ``gemma3.attention.sliding_window_pattern`` / ``gemma3.rope.freq_base_swa`` and written there;
a file without them gets llama.cpp's fixed values (every 6th block global, base 10,000), and so does a reader that
ignores them (transformers does), so a model of another pattern is exported with a warning.

``gguf`` (the package llama.cpp publishes) is needed only here; transformers reads the tokenizer from the file.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

from lgpt.plumbing.errors import ConversionError
from lgpt.plumbing.logger import progress

GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
GEMMA3 = GGUF_ARCHITECTURES["gemma3"]
GEMMA3_DEFAULT_PATTERN, GEMMA3_DEFAULT_LOCAL_BASE = 6, 10000.0  # what llama.cpp assumes when the file is silent
GGUF_TYPES = ("f32", "f16", "q8_0")  # what --to_gguf writes (matrices; gains stay F32)
# GGUF tensor name (in block N: blk.N.<name>) → the Hugging Face Llama / Qwen2 name (model.layers.N.<name>)
BLOCK_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight"}
GEMMA3_BLOCK_TENSORS = {
    **{k: v for k, v in BLOCK_TENSORS.items() if "norm" not in k and ".bias" not in k},
    "attn_norm.weight": "input_layernorm.weight", "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight", "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight"}
TOP_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
               "output.weight": "lm_head.weight"}
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


def block_tensors(arch: str) -> dict[str, str]:
    """GGUF block tensor name → Hugging Face name, for ``arch`` (a Hugging Face class name)."""
    return GEMMA3_BLOCK_TENSORS if arch == GEMMA3 else BLOCK_TENSORS


def _gguf():
    try:
        import gguf
    except ImportError as e:
        raise ConversionError("GGUF needs the optional dependency gguf: pip install -r requirements-extras.txt") from e
    return gguf


def hf_name(gguf_name: str, arch: str = "LlamaForCausalLM") -> str | None:
    """The Hugging Face name of a GGUF tensor name (None: not one of ``arch``'s tensors)."""
    if gguf_name in TOP_TENSORS:
        return TOP_TENSORS[gguf_name]
    parts, names = gguf_name.split(".", 2), block_tensors(arch)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}"
    return None


def gguf_name(name: str, arch: str = "LlamaForCausalLM") -> str:
    """The GGUF name of a Hugging Face tensor name (the inverse of ``hf_name``)."""
    inverse = {v: k for k, v in TOP_TENSORS.items()}
    if name in inverse:
        return inverse[name]
    _, _, i, rest = name.split(".", 3)
    return f"blk.{i}." + {v: k for k, v in block_tensors(arch).items()}[rest]


def is_gemma_gain(name: str) -> bool:
    """A Gemma norm gain: stored as 1 + w in GGUF (llama.cpp's converter adds the 1 that Gemma's RMSNorm adds)."""
    return name.endswith("norm.weight")


def interleave_rope_rows(W: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's Q/K permutation (Hugging Face rotate-half rows → interleaved pairs within each head):
    row 2i + a of a head is row a·head_dim/2 + i of the Hugging Face head."""
    head_dim = W.shape[0] // n_heads
    return W.reshape(n_heads, 2, head_dim // 2, *W.shape[1:]).transpose(1, 2).reshape(W.shape)


def uninterleave_rope_rows(W: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of ``interleave_rope_rows`` (what transformers' GGUF reader applies to a Llama's Q and K)."""
    head_dim = W.shape[0] // n_heads
    return W.reshape(n_heads, head_dim // 2, 2, *W.shape[1:]).transpose(1, 2).reshape(W.shape)


@dataclass
class GGUFModel:
    """What a GGUF file holds, in Hugging Face terms: the config (a transformers Llama/Qwen2 config), the state
    dict (float32, Hugging Face names and layout), and the architecture name."""
    hf_config: object
    hf_state: dict
    arch: str


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    try:
        return field.contents()
    except Exception as e:  # a damaged field: the gguf package raises several kinds
        raise ConversionError(f"GGUF metadata field {key} cannot be read ({e.__class__.__name__})") from e


_LAST_READER: dict = {}  # the last file opened, by identity: one import opens its file four times, and parsing a
#                         262,144-token vocabulary's fields costs ~30 s each time (Gemma 3)


def open_reader(path: str):
    """gguf.GGUFReader over ``path``, or one ConversionError (missing, truncated, not GGUF). The last file's reader
    is reused while the file is the same one (device, inode, size, modification and change times unchanged: a
    rewrite that restores the modification time still moves the change time)."""
    gguf = _gguf()
    if not os.path.isfile(path):
        raise ConversionError(f"--from_gguf={path}: no such file")
    info = os.stat(path)
    identity = (os.path.realpath(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    if _LAST_READER.get("identity") == identity:
        return _LAST_READER["reader"]
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # truncated or foreign files raise ValueError, IndexError, struct/numpy errors
        raise ConversionError(f"'{path}' is not a readable GGUF file ({e.__class__.__name__}: {str(e)[:120]}); "
                              "is it truncated? download it again") from e
    _LAST_READER.clear()
    _LAST_READER.update(identity=identity, reader=reader)
    return reader


def float32_value(x: float) -> float:
    """The shortest decimal that the float32 GGUF stores rounds from (1e-5, not 9.999999747e-06): the value the
    exporter meant, so a round trip keeps a config equal."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


# bounds on what a GGUF header may claim, checked before anything is built from it: a model's RoPE tables and
# embeddings are allocated from these numbers, so a small file claiming a huge context or vocabulary would
# otherwise allocate without bound (a 175 KB file grew the process past 14 GB). Real models sit far inside them.
MAX_CONTEXT = 1 << 20
MAX_WIDTH = 1 << 16
MAX_HEADS = 1 << 10
MAX_LAYERS = 1 << 10
MAX_VOCAB = 1 << 22
MAX_ROPE = 1 << 28  # context × head_dim: a 1M context at head_dim 256 (1 GiB of float32 tables)
MAX_EMBEDDING = 1 << 31  # vocab × width: Gemma 3 27B's 262,144 × 5,376 fits


def bounded(reader, path: str, key: str, low: float, high: float, kind: type = int, default=None,
            required: bool = False):
    """A numeric GGUF metadata field checked before use: of the right kind (an integer field an integer, not text,
    a bool or a fraction; a float field a finite number) and within [low, high]; ``default`` when it is absent
    (or a ConversionError naming it when ``required``)."""
    value = _field(reader, key)
    if value is None:
        if required:
            raise ConversionError(f"'{path}' lacks the GGUF metadata field {key}")
        return default
    numeric = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if kind is int and numeric and float(value) != int(value):
        numeric = False
    if not numeric or not math.isfinite(float(value)) or not low <= float(value) <= high:
        raise ConversionError(f"'{path}': GGUF metadata field {key} = {str(value)[:40]!r} is not "
                              f"{'an integer' if kind is int else 'a number'} in [{low:g}, {high:g}]; the file is "
                              "damaged or not a model we read")
    return kind(value)


def gguf_config(reader, path: str):
    """The transformers LlamaConfig / Qwen2Config a GGUF file's metadata describes, refusing what we cannot hold."""
    import transformers
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ConversionError(f"'{path}' is a GGUF of architecture {arch!r}; --from_gguf reads exactly "
                              f"{', '.join(GGUF_ARCHITECTURES)}")

    def need(key: str, low: float, high: float, kind: type = int):
        return bounded(reader, path, f"{arch}.{key}", low, high, kind, required=True)

    def may(key: str, default, low: float, high: float, kind: type = int):
        return bounded(reader, path, f"{arch}.{key}", low, high, kind, default=default)

    n_head, d = need("attention.head_count", 1, MAX_HEADS), need("embedding_length", 1, MAX_WIDTH)
    n_kv = may("attention.head_count_kv", n_head, 1, n_head)
    if n_head % n_kv:
        raise ConversionError(f"'{path}': {n_kv} key/value heads do not divide {n_head} query heads")
    head_dim = (may("attention.key_length", 0, 1, MAX_WIDTH) or may("rope.dimension_count", 0, 1, MAX_WIDTH)
                or d // n_head)
    if head_dim < 1:
        raise ConversionError(f"'{path}': {arch}.embedding_length {d} is smaller than its {n_head} heads")
    if may("attention.value_length", head_dim, 1, MAX_WIDTH) != head_dim:
        raise ConversionError(f"'{path}': key and value head sizes differ; they cannot be represented exactly")
    if may("rope.dimension_count", head_dim, 1, MAX_WIDTH) != head_dim:
        raise ConversionError(f"'{path}': RoPE on part of each head cannot be represented exactly")
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None) or any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise ConversionError(f"'{path}': RoPE scaling ({scaling if scaling != 'none' else 'rope_freqs.weight'}) "
                              "is not read from GGUF; import the Hugging Face directory with --from_hf instead")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    vocab = may("vocab_size", 0, 1, MAX_VOCAB) or (len(tokens) if tokens is not None else 0)
    if not vocab:
        raise ConversionError(f"'{path}' records neither {arch}.vocab_size nor a token list")
    special = {f"{k}_token_id": v for k in ("bos", "eos", "pad")
               for v in [bounded(reader, path, f"tokenizer.ggml.{'padding' if k == 'pad' else k}_token_id", 0,
                                 vocab - 1)] if v is not None}
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    context = need("context_length", 1, MAX_CONTEXT)
    # tables built from products of the claims: RoPE's (context × head_dim), the embeddings (vocab × d)
    for what, size, most in (("context_length × key_length (the RoPE tables)", context * head_dim, MAX_ROPE),
                             ("vocab × embedding_length (the embeddings)", vocab * d, MAX_EMBEDDING)):
        if size > most:
            raise ConversionError(f"'{path}': {what} = {size:,} values, more than the {most:,} we build from a "
                                  "GGUF header; the file is damaged or not a model we read")
    if vocab > MAX_VOCAB:
        raise ConversionError(f"'{path}': its token list holds {vocab} tokens, more than the {MAX_VOCAB} we read")
    common = dict(hidden_size=d, intermediate_size=need("feed_forward_length", 1, MAX_WIDTH * 16),
                  num_hidden_layers=need("block_count", 1, MAX_LAYERS), num_attention_heads=n_head,
                  num_key_value_heads=n_kv, head_dim=head_dim, vocab_size=vocab,
                  max_position_embeddings=context,
                  rms_norm_eps=float32_value(need("attention.layer_norm_rms_epsilon", 1e-12, 1.0, float)),
                  rope_parameters={"rope_type": "default",
                                   "rope_theta": float32_value(may("rope.freq_base", 10000.0, 1.0, 1e9, float))},
                  tie_word_embeddings=tied, hidden_act="silu", **special)
    if arch == "gemma3":
        return gemma3_config(reader, path, common), GEMMA3
    from lgpt.formats.llama import llama_config
    return llama_config(transformers, GGUF_ARCHITECTURES[arch], common), GGUF_ARCHITECTURES[arch]


def gemma3_layer_types(pattern, n_layer: int, path: str) -> list[str]:
    """Hugging Face's layer_types from ``gemma3.attention.sliding_window_pattern``: an integer k (block i is global
    when (i + 1) % k == 0, llama.cpp's rule) or one flag per block (true: sliding window)."""
    if isinstance(pattern, (list, tuple)):
        if len(pattern) != n_layer:
            raise ConversionError(f"'{path}': the sliding-window pattern has {len(pattern)} flags for {n_layer} blocks")
        return ["sliding_attention" if flag else "full_attention" for flag in pattern]
    k = int(pattern)
    if k < 1:
        raise ConversionError(f"'{path}': gemma3.attention.sliding_window_pattern = {k} names no layer pattern")
    return ["full_attention" if (i + 1) % k == 0 else "sliding_attention" for i in range(n_layer)]


def gemma3_config(reader, path: str, common: dict):
    """The transformers Gemma3TextConfig of a ``gemma3`` GGUF file (llama.cpp's fixed values where it is silent:
    every 6th block global, local RoPE base 10,000, attention scale 1/√head_dim as for the 270M–12B models)."""
    import transformers
    window = bounded(reader, path, "gemma3.attention.sliding_window", 1, MAX_CONTEXT, required=True)
    n_layer = common["num_hidden_layers"]
    types = gemma3_layer_types(_field(reader, "gemma3.attention.sliding_window_pattern", GEMMA3_DEFAULT_PATTERN),
                               n_layer, path)
    local = float32_value(bounded(reader, path, "gemma3.rope.freq_base_swa", 1.0, 1e9, float,
                                  default=GEMMA3_DEFAULT_LOCAL_BASE))
    theta = common.pop("rope_parameters")["rope_theta"]
    common.pop("hidden_act")
    return transformers.Gemma3TextConfig(
        **common, hidden_activation="gelu_pytorch_tanh", sliding_window=int(window), layer_types=types,
        query_pre_attn_scalar=common["head_dim"], attention_bias=False, final_logit_softcapping=None,
        attn_logit_softcapping=None,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": theta},
                         "sliding_attention": {"rope_type": "default", "rope_theta": local}})


def dequantized(tensor) -> torch.Tensor:
    """One GGUF tensor as float32 in (out, in) layout, whatever its storage type."""
    gguf = _gguf()
    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as e:
        raise ConversionError(f"tensor {tensor.name} is stored as {tensor.tensor_type.name}, which the gguf package "
                              "cannot dequantize") from e
    shape = tuple(int(x) for x in reversed(tensor.shape))
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))  # a writable copy


def read_gguf(path: str) -> GGUFModel:
    """The model in a GGUF file as a Hugging Face config + float32 state dict. Every tensor must belong to the
    architecture and every tensor the architecture needs must be there (one ConversionError naming it)."""
    reader = open_reader(path)
    hf_config, arch = gguf_config(reader, path)
    state, unknown = {}, []
    for tensor in progress(reader.tensors, "dequantize", unit="tensor"):
        name = hf_name(tensor.name, arch)
        if name is None:
            unknown.append(tensor.name)
            continue
        W = dequantized(tensor)
        if arch == GGUF_ARCHITECTURES["llama"] and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = hf_config.num_attention_heads if "q_proj" in name else hf_config.num_key_value_heads
            W = uninterleave_rope_rows(W, heads)
        if arch == GEMMA3 and is_gemma_gain(name):
            W = W - 1.0
        state[name] = W
    if unknown:
        raise ConversionError(f"'{path}' holds tensors a {arch} does not have ({', '.join(unknown[:3])}); "
                              "refusing to drop them")
    expected = expected_shapes(hf_config, arch)
    missing = [gguf_name(k, arch) for k in expected if k not in state]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ConversionError(f"'{path}' lacks the tensor {missing[0]}{more}; the file is incomplete")
    for k, shape in expected.items():
        if tuple(state[k].shape) != shape:
            raise ConversionError(f"tensor {gguf_name(k, arch)} has shape {tuple(state[k].shape)} but the metadata "
                                  f"says {shape}")
    return GGUFModel(hf_config, state, arch)


def expected_shapes(hf_config, arch: str) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor a Llama / Qwen2 with this config has, and its shape."""
    d, hd, f = hf_config.hidden_size, hf_config.head_dim, hf_config.intermediate_size
    q, kv = hf_config.num_attention_heads * hd, hf_config.num_key_value_heads * hd
    shapes = {"model.embed_tokens.weight": (hf_config.vocab_size, d), "model.norm.weight": (d,)}
    if not hf_config.tie_word_embeddings:
        shapes["lm_head.weight"] = (hf_config.vocab_size, d)
    for i in range(hf_config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                       p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
                       p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
                       p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                       p + "mlp.down_proj.weight": (d, f)})
        if arch == GGUF_ARCHITECTURES["qwen2"]:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if arch == GEMMA3:
            shapes.update({p + "pre_feedforward_layernorm.weight": (d,), p + "post_feedforward_layernorm.weight": (d,),
                           p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
    return shapes


def gguf_pretokenizer(path: str) -> str:
    """The file's ``tokenizer.ggml.pre``: the name llama.cpp picks its pre-tokenizer (the regex that splits text
    before BPE) by; kept in the checkpoint so that an export writes it back."""
    return str(_field(open_reader(path), "tokenizer.ggml.pre", "default"))


def heads_do_not_divide(path: str) -> bool:
    """Whether the file's embedding length is not a multiple of its head count (a width zero-padded for llama.cpp's
    blocks): transformers refuses to build such a config, and so to open the file even for its tokenizer."""
    reader = open_reader(path)
    arch = _field(reader, "general.architecture")
    d, heads = _field(reader, f"{arch}.embedding_length"), _field(reader, f"{arch}.attention.head_count")
    return isinstance(d, int) and isinstance(heads, int) and heads > 0 and d % heads != 0


def header_copy(path: str, out: str) -> None:
    """A tensorless copy of the file's header (every field, the tokenizer's included) whose embedding length is the
    heads' total width, which transformers accepts: the tokenizer read from it is the file's."""
    gguf = _gguf()
    reader = open_reader(path)
    arch = _field(reader, "general.architecture")
    width = _field(reader, f"{arch}.attention.head_count") * _field(reader, f"{arch}.attention.key_length")
    writer = gguf.GGUFWriter(out, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = width if name == f"{arch}.embedding_length" else field.contents()
        array = field.types[0] == gguf.GGUFValueType.ARRAY
        writer.add_key_value(name, value, field.types[0], sub_type=field.types[-1] if array else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def gguf_tokenizer_files(path: str) -> dict[str, str]:
    """The Hugging Face tokenizer files (tokenizer.json and its configs) of the tokenizer a GGUF file describes,
    built by transformers' GGUF converter (the same tokenizer transformers uses with the file). It reads the file
    through a link in a folder of its own: transformers would otherwise also read any tokenizer_config.json or
    tokenizer.json lying beside the file, and the import would depend on what else is in that folder."""
    import transformers

    from lgpt.plumbing.dataset import read_tokenizer_files
    try:
        with tempfile.TemporaryDirectory() as alone:
            if heads_do_not_divide(path):
                header_copy(path, os.path.join(alone, "model.gguf"))
            else:
                os.symlink(os.path.abspath(path), os.path.join(alone, "model.gguf"))
            tokenizer = transformers.AutoTokenizer.from_pretrained(alone, gguf_file="model.gguf")
    except Exception as e:  # no or a damaged token list: the converter raises several kinds
        raise ConversionError(f"the tokenizer in '{path}' cannot be read ({e.__class__.__name__}: {str(e)[:120]}); "
                              "an imported model keeps its own tokenizer") from e
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        files = read_tokenizer_files(tmp)
    return without_added_defaults(files, len(_field(open_reader(path), "tokenizer.ggml.tokens") or []))


def without_added_defaults(files: dict[str, str], n_tokens: int) -> dict[str, str]:
    """The tokenizer files less the tokens transformers' GGUF converter appends past the file's own list (its
    class defaults, e.g. '<|endoftext|>' as unk/bos/eos when the file has no such token): the model has no
    embedding for them, and the file does not name them."""
    spec = json.loads(files["tokenizer.json"])
    extra = {t["content"] for t in spec.get("added_tokens") or [] if t["id"] >= n_tokens}
    if not extra:
        return files
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < n_tokens]
    if spec.get("model", {}).get("unk_token") in extra:
        spec["model"]["unk_token"] = None
    files = dict(files, **{"tokenizer.json": json.dumps(spec, ensure_ascii=False)})
    if "tokenizer_config.json" in files:
        config = json.loads(files["tokenizer_config.json"])
        config["added_tokens_decoder"] = {k: v for k, v in (config.get("added_tokens_decoder") or {}).items()
                                          if int(k) < n_tokens}
        for key in ("unk_token", "bos_token", "eos_token", "pad_token"):
            if config.get(key) in extra:
                config[key] = None
        files["tokenizer_config.json"] = json.dumps(config, ensure_ascii=False, indent=2)
    files.pop("special_tokens_map.json", None)  # rewritten from the config by transformers when it loads
    return files


# ----------------------------------------------------------------------------------------------
# writing


def tokenizer_fields(files: dict[str, str], special_ids: dict, vocab_size: int) -> dict:
    """llama.cpp's tokenizer metadata for a Hugging Face BPE tokenizer (its files: tokenizer.json and configs):
    byte-level BPE (model 'gpt2': GPT-2, Llama 3, Qwen2, SmolLM2) or SentencePiece's BPE with byte fallback (model
    'llama': Llama 2, Gemma; scores −id, the order Gemma merges in, byte tokens <0xHH> typed as bytes). Tokens by id,
    their types, merges (transformers rebuilds the tokenizer from them) and special ids; the vocabulary is padded
    to the model's rows with unused tokens."""
    spec = json.loads(files["tokenizer.json"])
    model = spec.get("model", {})
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise ConversionError(f"the tokenizer is a {model.get('type')!r} model; GGUF export writes BPE tokenizers "
                              "only (byte-level or SentencePiece's; export with --to_hf instead)")
    sentencepiece = bool(model.get("byte_fallback"))
    steps = json.dumps([spec.get("normalizer"), spec.get("pre_tokenizer")])
    space_prefix = '"Prepend"' in steps or '"prepend_scheme": "always"' in steps or '"prepend_scheme": "first"' in steps
    tokens = {int(i): tok for tok, i in model["vocab"].items()}
    types = {i: TOKEN_BYTE if sentencepiece and len(t) == 6 and t.startswith("<0x") and t.endswith(">")
             else TOKEN_UNKNOWN if t == model.get("unk_token") else TOKEN_NORMAL for i, t in tokens.items()}
    for added in spec.get("added_tokens") or []:
        tokens[int(added["id"])] = added["content"]
        types[int(added["id"])] = (TOKEN_UNKNOWN if added["content"] == model.get("unk_token") else TOKEN_CONTROL
                                   if added.get("special") else TOKEN_USER_DEFINED)
    size = max(vocab_size, max(tokens) + 1)
    merges = []
    for i, m in enumerate(model.get("merges") or []):
        pair = m.split(" ") if isinstance(m, str) else list(m)
        if len(pair) != 2 or not all(pair) or any(" " in side for side in pair):  # stored as 'left right'
            raise ConversionError(f"the tokenizer's merge {i} ({m!r}) has a token holding a space, which GGUF's "
                                  "'left right' merges cannot write (no reader could split it back); export with "
                                  "--to_hf instead")
        merges.append(" ".join(pair))
    fields = {"model": "llama" if sentencepiece else "gpt2",
              "tokens": [tokens.get(i, f"[PAD{i}]") for i in range(size)],
              "token_types": [types.get(i, TOKEN_UNUSED) for i in range(size)], "merges": merges,
              "scores": [-float(i) for i in range(size)] if sentencepiece else None,
              "special": dict(special_ids or {}), "chat_template": None, "space_prefix": space_prefix}
    unk = [i for i, t in types.items() if t == TOKEN_UNKNOWN]
    if unk:
        fields["special"].setdefault("unk_token_id", unk[0])
    if files.get("tokenizer_config.json"):
        fields["chat_template"] = json.loads(files["tokenizer_config.json"]).get("chat_template")
    if files.get("chat_template.jinja"):
        fields["chat_template"] = files["chat_template.jinja"]
    return fields


def sliding_window_pattern(layer_types: list[str]) -> int | list[bool]:
    """llama.cpp's pattern for Hugging Face's layer_types: k when block i is global exactly where (i + 1) % k == 0
    (1: every block global), else one flag per block (true: sliding window)."""
    for k in range(1, len(layer_types) + 1):
        if all((t == "full_attention") == ((i + 1) % k == 0) for i, t in enumerate(layer_types)):
            return k
    return [t == "sliding_attention" for t in layer_types]


def gguf_state(hf_state: dict, hf_config, arch: str) -> dict[str, torch.Tensor]:
    """GGUF-named tensors from a Hugging Face Llama / Qwen2 state dict (a Llama's Q and K rows interleaved)."""
    out = {}
    for name, W in hf_state.items():
        if arch == GGUF_ARCHITECTURES["llama"] and name.endswith(("q_proj.weight", "k_proj.weight")):
            W = interleave_rope_rows(W, hf_config.num_attention_heads if "q_proj" in name
                                     else hf_config.num_key_value_heads)
        if arch == GEMMA3 and is_gemma_gain(name):
            W = W + 1.0
        out[gguf_name(name, arch)] = W.detach().float().contiguous()
    return out


F16_MAX = float(np.finfo(np.float16).max)  # 65504: past it float16 holds only inf


def storage(W: torch.Tensor, dtype: str, name: str = "a tensor"):
    """(array, GGML type) for one tensor: matrices in ``dtype``, vectors and matrices whose rows Q8_0 cannot
    block (length not a multiple of 32) in F32/F16. A weight that float16 cannot hold (|w| > 65504, or a Q8_0
    block whose float16 scale would overflow) is refused, not written as inf."""
    gguf = _gguf()
    Q = gguf.GGMLQuantizationType
    x = W.numpy()
    if x.ndim == 1 or dtype == "f32":
        return x.astype(np.float32), Q.F32
    largest = float(np.abs(x).max()) if x.size else 0.0
    if largest > F16_MAX * (127 if dtype == "q8_0" and x.shape[-1] % 32 == 0 else 1):
        raise ConversionError(f"{name} holds a weight of magnitude {largest:.4g}, beyond what --gguf_type={dtype} "
                              "stores (float16 tops out at 65504); export with --gguf_type=f32")
    if dtype == "q8_0" and x.shape[-1] % 32 == 0:
        return gguf.quants.quantize(x.astype(np.float32), Q.Q8_0), Q.Q8_0
    return x.astype(np.float16), Q.F16


def write_gguf(path: str, hf_state: dict, hf_config, arch: str, tokenizer_files: dict[str, str],
               special_ids: dict, dtype: str = "f32", pretokenizer: str = "default",
               name: str = "nanoLGPT export") -> None:
    """Write a GGUF file (version 3) that llama.cpp and transformers read as the same Llama / Qwen2 / Gemma 3, with
    the tokenizer whose Hugging Face files are ``tokenizer_files`` (``pretokenizer``: llama.cpp's name for its
    pre-tokenizer, e.g. 'smollm', 'qwen2', 'llama-bpe'; 'default' is GPT-2's)."""
    gguf = _gguf()
    if dtype not in GGUF_TYPES:
        raise ConversionError(f"--gguf_type={dtype!r} is not one of {GGUF_TYPES}")
    key = {v: k for k, v in GGUF_ARCHITECTURES.items()}[arch]
    tok = tokenizer_fields(tokenizer_files, special_ids, hf_config.vocab_size)
    writer = gguf.GGUFWriter(path, key)
    writer.add_name(name)
    writer.add_context_length(hf_config.max_position_embeddings)
    writer.add_embedding_length(hf_config.hidden_size)
    writer.add_block_count(hf_config.num_hidden_layers)
    writer.add_feed_forward_length(hf_config.intermediate_size)
    writer.add_head_count(hf_config.num_attention_heads)
    writer.add_head_count_kv(hf_config.num_key_value_heads)
    writer.add_key_length(hf_config.head_dim)
    writer.add_value_length(hf_config.head_dim)
    writer.add_rope_dimension_count(hf_config.head_dim)
    rope = hf_config.rope_parameters
    writer.add_rope_freq_base(float(rope["full_attention"]["rope_theta"] if key == "gemma3" else rope["rope_theta"]))
    if key == "gemma3":
        writer.add_sliding_window(int(hf_config.sliding_window))
        writer.add_sliding_window_pattern(sliding_window_pattern(list(hf_config.layer_types)))
        writer.add_rope_freq_base_swa(float(rope["sliding_attention"]["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(hf_config.rms_norm_eps))
    writer.add_vocab_size(len(tok["tokens"]))
    writer.add_file_type({"f32": 0, "f16": 1, "q8_0": 7}[dtype])
    writer.add_tokenizer_model(tok["model"])
    writer.add_tokenizer_pre(pretokenizer)
    if tok["model"] == "llama":  # SentencePiece: llama.cpp prepends a space unless told (Gemma does not)
        writer.add_add_space_prefix(tok["space_prefix"])
    writer.add_token_list(tok["tokens"])
    if tok["scores"] is not None:
        writer.add_token_scores(tok["scores"])
    writer.add_token_types(tok["token_types"])
    writer.add_token_merges(tok["merges"])
    for k, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                   ("pad_token_id", writer.add_pad_token_id), ("unk_token_id", writer.add_unk_token_id)):
        if tok["special"].get(k) is not None:
            add(int(tok["special"][k]))
    writer.add_add_bos_token(False)  # a dataset is one stream of text: no BOS is added (as prepare.py does)
    if tok["chat_template"]:
        writer.add_chat_template(tok["chat_template"])
    tensors = {name: storage(W, dtype, name) for name, W in gguf_state(hf_state, hf_config, arch).items()}
    for tensor_name, (data, qtype) in tensors.items():  # every tensor checked above, before any byte is written
        writer.add_tensor(tensor_name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
