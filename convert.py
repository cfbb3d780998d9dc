"""
Pretrained models in and out: Hugging Face GPT-2, Llama, Qwen2 and Gemma 3, and nanoGPT checkpoints ↔ nanoLGPT
checkpoints.

    python convert.py --from_hf=gpt2 --out_dir=out-gpt2                # HF hub name (cache) or local directory
    python convert.py --from_hf=HuggingFaceTB/SmolLM-135M --out_dir=out-smollm   # Llama family, its tokenizer kept
    python convert.py --from_nanogpt=PATH/ckpt.pt --out_dir=out-mine   # a nanoGPT training checkpoint
    python convert.py --in_dir=out-m1024 --to_hf=hf-m1024              # back to the matching HF class
    python convert.py --from_gguf=SmolLM2-135M-Instruct.Q4_1.gguf --out_dir=out-smollm2   # a llama.cpp GGUF file
    python convert.py --in_dir=out-smollm2-m432 --to_gguf=smollm2-m432.gguf --gguf_type=f16   # and back
    python convert.py --in_dir=out-smollm2-m432 --to_gguf=m432-q4km.gguf --gguf_type=Q4_K_M --pad_width=32
                                                      # llama.cpp's own quantizer (pip install llama-cpp-python)

This file is the shared path — which family a source is, loading it, checking it, writing exports and tokenizers,
the CLI. Each family's mapping of tensors and config fields has a room of its own: convert_gpt2.py (GPT-2 and
nanoGPT), convert_llama.py (Llama, Qwen2), convert_gemma3.py (Gemma 3 text), gguf_format.py (llama.cpp's GGUF
files). The architecture is read from the config before any weight: any other class is refused, and a checkpoint
that leaves a tensor unloaded (random) is refused.
``transformers`` is needed only here (and for init_from='gpt2'); it is an optional dependency.
"""
from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass

import torch

from lgpt.formats.gemma3 import (
    GEMMA3,
    export_gemma3,
    gemma3_config_from_hf,
    gemma3_export_problems,
    gemma3_hf_config,
    gemma3_state_from_hf,
    gemma3_state_to_hf,
)
from lgpt.formats.gpt2 import (
    GPT2,
    IGNORED_HF_KEYS,
    export_gpt2,
    gpt2_config_from_hf,
    gpt2_export_problems,
    gpt2_state_from_hf,
    import_nanogpt,
    nanogpt_meta,
)
from lgpt.formats.llama import (
    LLAMA,
    QWEN2,
    export_llama,
    llama_config_from_hf,
    llama_export_problems,
    llama_hf_config,
    llama_state_from_hf,
    llama_state_to_hf,
)
from lgpt.formats.llama_cpp import QUANT_BLOCK, check_quantizable, llama_cpp, padded_width, quantize
from lgpt.method.grow import pad_residual
from lgpt.plumbing.checkpoint import (
    LOCK_NAME,
    check_finite,
    check_output_dir,
    check_writable_dir,
    checkpoint_path,
    hold_run_dir,
    is_interrupted,
    load_checkpoint,
    load_model,
    make_dirs,
    remove_made_dirs,
    save_checkpoint,
    staged_dir,
)
from lgpt.plumbing.cli import run_cli
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.dataset import (
    GPT2_META,
    HF_TOKENIZER_FILES,
    data_dir_for_checkpoint,
    gpt2_encoding,
    hf_tokenizer_meta,
    read_tokenizer_files,
)
from lgpt.plumbing.errors import ConfigError, ConversionError
from model import GPT, GPTConfig


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise ConversionError("this needs the optional dependency transformers: "
                              "pip install -r requirements-extras.txt") from e
    return transformers


# ----------------------------------------------------------------------------------------------
# Hugging Face → ours

ARCHITECTURES = (GPT2, LLAMA, QWEN2, GEMMA3)  # the Hugging Face classes we import and export, exactly
MODEL_TYPES = {"gpt2": GPT2, "llama": LLAMA, "qwen2": QWEN2, "gemma3_text": GEMMA3}  # a config naming no class


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


def config_from_hf(hf_config, arch: str = GPT2) -> GPTConfig:
    """The GPTConfig equal to a Hugging Face GPT-2, Llama or Qwen2 config, or ConversionError naming the first
    field that has no exact equivalent (each family's own rules: convert_gpt2.py, convert_llama.py)."""
    try:
        if arch == GEMMA3:
            return gemma3_config_from_hf(hf_config)
        return gpt2_config_from_hf(hf_config) if arch == GPT2 else llama_config_from_hf(hf_config, arch)
    except ConversionError:
        raise
    except (ValueError, TypeError) as e:  # model.py's own checks of a field: a value no model can have
        raise ConversionError(f"the {arch} config describes no valid model: {_first_line(e)}; fix config.json (or "
                              "the GGUF file's metadata) or obtain the model again") from e


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
    return GPT.from_state_dict(config, state_from_hf(hf_state, config, arch))


def state_from_hf(hf_state: dict, config: GPTConfig, arch: str) -> dict:
    """Our state dict from a Hugging Face one of class ``arch`` (each family's own rules)."""
    if arch == GPT2:
        return gpt2_state_from_hf(hf_state)
    return gemma3_state_from_hf(hf_state, config) if arch == GEMMA3 else llama_state_from_hf(hf_state, config)


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
    """(our GPT, its Hugging Face architecture, its tokenizer description) from a Llama / Qwen2 / Gemma 3 GGUF file:
    the tensors dequantized to float32 by our reader, the tokenizer the file describes (transformers builds it)."""
    from lgpt.formats.gguf_file import gguf_pretokenizer, gguf_tokenizer_files, read_gguf
    _transformers()
    held = read_gguf(path)
    config = config_from_hf(held.hf_config, held.arch)
    model = GPT.from_state_dict(config, state_from_hf(held.hf_state, config, held.arch))
    meta = hf_tokenizer_meta(gguf_tokenizer_files(path), hf_special_ids(held.hf_config))
    meta["gguf_pre"] = gguf_pretokenizer(path)  # llama.cpp's pre-tokenizer name, written back by --to_gguf
    if meta["vocab_size"] > config.vocab_size:
        raise ConversionError(f"the tokenizer of '{path}' has {meta['vocab_size']} tokens but the model only "
                              f"{config.vocab_size} embeddings")
    return model.eval(), held.arch, meta


# ----------------------------------------------------------------------------------------------
# nanoGPT → ours


# ----------------------------------------------------------------------------------------------
# ours → Hugging Face


def export_target(config: GPTConfig) -> str:
    """The Hugging Face class that holds ``config`` exactly; otherwise one ConversionError naming the first field
    that the closest supported class cannot hold."""
    problems = {GPT2: gpt2_export_problems(config), LLAMA: llama_export_problems(config, LLAMA),
                QWEN2: llama_export_problems(config, QWEN2), GEMMA3: gemma3_export_problems(config)}
    best = min(ARCHITECTURES, key=lambda arch: len(problems[arch]))
    if problems[best]:
        raise ConversionError(f"this model cannot be exported exactly to any of {', '.join(ARCHITECTURES)}; the "
                              f"closest is {best}, which cannot hold {problems[best][0]}")
    return best


def export_hf(model: GPT, out_dir: str, special_ids: dict | None = None) -> str:
    """Write the Hugging Face model (save_pretrained) with the same function as ``model``: GPT2LMHeadModel,
    LlamaForCausalLM or Qwen2ForCausalLM, whichever holds its architecture exactly. Returns the class name."""
    transformers = _transformers()
    arch = export_target(model.config)
    special_ids = dict(special_ids or {})
    hf_model = (export_gpt2(model, transformers, special_ids) if arch == GPT2
                else export_gemma3(model, transformers, special_ids) if arch == GEMMA3
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
    """Write ``model`` (Llama-, Qwen2- or Gemma 3-shaped: what export_target maps to them) and its tokenizer as one GGUF
    file, atomically: a temporary sibling renamed into place, removed on any failure. Returns the class name."""
    from lgpt.formats.gguf_file import write_gguf
    transformers = _transformers()
    arch = export_target(model.config)
    if arch not in (LLAMA, QWEN2, GEMMA3):
        raise ConversionError(f"this model exports as a {arch}; --to_gguf writes {LLAMA} / {QWEN2} / {GEMMA3}-shaped "
                              "models (RMSNorm, rotary, gated MLP): use --to_hf for it")
    files = tokenizer_files(meta)
    special_ids = dict((meta or {}).get("special_ids") or {})
    if arch == GEMMA3:
        check_gemma3_gguf(model.config)
        hf_config = gemma3_hf_config(model.config, transformers, special_ids)
        hf_state = gemma3_state_to_hf(model.state_dict(), model.config)
    else:
        hf_config = llama_hf_config(model.config, transformers, arch, special_ids)
        hf_state = llama_state_to_hf(model.state_dict(), model.config)
    made = make_dirs(os.path.dirname(os.path.abspath(path)))
    tmp = f"{path}.tmp-{os.getpid()}"
    done = False
    try:
        write_gguf(tmp, hf_state, hf_config, arch, files, special_ids, dtype,
                   pretokenizer=str((meta or {}).get("gguf_pre", "default")))
        read_back_gguf(tmp, path, hf_state, arch, dtype)
        os.replace(tmp, path)
        done = True
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
        if not done:
            remove_made_dirs(made)  # the folders this export made for its file, and nothing that was there before
    return arch


def read_back_hf(folder: str, model: GPT, target: str) -> None:
    """An export is done only once transformers reads it back: its tokenizer loads, and its model gives our
    log-probabilities on a few tokens (within float32 rounding); else one ConversionError, and nothing is moved in."""
    transformers = _transformers()
    try:
        transformers.AutoTokenizer.from_pretrained(folder)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    except Exception as e:  # noqa: BLE001 - whatever transformers raises for a folder it cannot read
        raise ConversionError(f"the export written for '{target}' does not read back in transformers "
                              f"({e.__class__.__name__}: {str(e)[:160]}); nothing was written") from e
    idx = torch.arange(min(8, model.config.block_size)).unsqueeze(0) % model.config.vocab_size
    with torch.no_grad():
        ours = torch.log_softmax(model.cpu().eval()(idx, all_logits=True)[0].float(), -1)
        back = torch.log_softmax(theirs(idx).logits.float(), -1)[..., :ours.shape[-1]]
    if not torch.allclose(ours, back, atol=1e-3, rtol=1e-4):
        raise ConversionError(f"the export written for '{target}' reads back in transformers as another model "
                              f"(log-probs differ by {(ours - back).abs().max().item():.3g}); nothing was written")


def read_back_gguf(tmp: str, path: str, hf_state: dict, arch: str, dtype: str) -> None:
    """An export is done only once it reads back: our reader finds every tensor with its shape (bit for bit in f32,
    finite in f16 / q8_0), and transformers builds the tokenizer the file describes; else one ConversionError and
    nothing is written (the temporary file goes)."""
    from lgpt.formats.gguf_file import gguf_tokenizer_files, read_gguf
    try:
        held = read_gguf(tmp)
        gguf_tokenizer_files(tmp)
    except ConversionError as e:
        raise ConversionError(f"the GGUF written for '{path}' does not read back ({e}); nothing was written") from e
    for name, W in hf_state.items():
        got = held.hf_state.get(name)
        if got is None or tuple(got.shape) != tuple(W.shape) or not torch.isfinite(got).all() or (
                dtype == "f32" and arch != GEMMA3 and not torch.equal(got, W.float())):
            raise ConversionError(f"the GGUF written for '{path}' reads back {name} "
                                  f"{'missing' if got is None else 'changed'}; nothing was written")


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

    from lgpt.plumbing.dataset import BatchLoader, Tokenizer
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
    # conversion (one of from_hf, from_gguf, from_nanogpt, to_hf, to_gguf)
    from_hf: str = ""  # a Hugging Face GPT-2 / Llama / Qwen2 name or save_pretrained directory
    from_gguf: str = ""  # a Llama / Qwen2 / Gemma 3 GGUF file (any tensor type the gguf package dequantizes)
    from_nanogpt: str = ""  # a nanoGPT ckpt.pt (or its directory)
    data_dir: str = ""  # from_nanogpt: the dataset whose meta.pkl is its tokenizer; lm_eval_task: whose val split
    in_dir: str = ""  # with to_hf: our checkpoint to export
    to_hf: str = ""  # directory for the exported GPT2LMHeadModel / LlamaForCausalLM / Qwen2ForCausalLM + tokenizer
    to_gguf: str = ""  # file for the exported Llama / Qwen2 / Gemma 3 GGUF (model + tokenizer)
    gguf_type: str = "f32"  # with to_gguf: f32 | f16 | q8_0 (ours; norm gains stay f32), or llama.cpp's Q4_K_M …
    #   (its own quantizer on our f32 export: needs llama-cpp-python; docs/serving.md)
    pad_width: int = 0  # with to_gguf: zero-pad the residual width up to a multiple of this, exactly (32: llama.cpp)
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
        if self.gguf_type not in ("f32", "f16", "q8_0", *QUANT_BLOCK):
            raise ConfigError(f"--gguf_type={self.gguf_type!r} is not one of f32, f16, q8_0 (written here) or "
                              f"llama.cpp's {', '.join(QUANT_BLOCK)} (its quantizer, with llama-cpp-python)")
        if self.pad_width < 0 or (self.pad_width and not self.to_gguf):
            raise ConfigError(f"--pad_width={self.pad_width} pads a --to_gguf export's width up to a multiple of it "
                              "(32 for llama.cpp's block types); give a positive number with --to_gguf, or 0")


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (links resolved)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_export_dir(to_hf: str, overwrite: bool, in_dir: str = "") -> None:
    """Before any work: ``to_hf`` is a new or empty directory, or one that holds an export of ours (replaced only
    with ``overwrite``) — never a folder of other files, and never the input checkpoint's folder or one around it,
    whatever the flags: an export replaces only its own files."""
    if os.path.exists(to_hf) and not os.path.isdir(to_hf):
        raise ConversionError(f"--to_hf='{to_hf}' is a file: the export is a directory (config.json, weights, "
                              "tokenizer); give a directory path")
    if in_dir and _inside(in_dir, to_hf):
        raise ConversionError(f"--to_hf='{to_hf}' is or holds the input checkpoint's folder '{in_dir}'; an export "
                              "never writes over its input: choose another --to_hf")
    held = [name for name in ("config.json", "model.safetensors") if os.path.exists(os.path.join(to_hf, name))]
    others = sorted(name for name in (os.listdir(to_hf) if os.path.isdir(to_hf) else [])
                    if name != LOCK_NAME and not name.startswith(".staging.tmp-"))  # ours: a lock, a killed staging
    # weights an export of ours never writes: the folder is someone else's model (a config.json is not ours alone)
    foreign = [name for name in others if name not in EXPORT_NAMES and FOREIGN_WEIGHTS.search(name)]
    if others and (not held or foreign):
        shown = foreign or others
        more = ", …" if len(shown) > 3 else ""
        raise ConversionError(f"'{to_hf}' holds files an export of ours never writes ({', '.join(shown[:3])}{more})"
                              f"{' beside a config.json: another model' if foreign else ''}; an export goes into a "
                              "new or empty folder, or replaces one of ours: choose another --to_hf")
    if held and not overwrite:
        raise ConversionError(f"'{to_hf}' already holds an export ({', '.join(held)}); choose another --to_hf, or "
                              "pass --overwrite=True to replace it")
    check_writable_dir(to_hf)


# what an export of ours writes into its folder: on --overwrite, those the new export does not write again go (an
# old lm_eval/ task beside a new model would score it on the old data); nothing else in the folder is touched
FOREIGN_WEIGHTS = re.compile(r"\.(bin|pt|pth|ckpt|safetensors|gguf|h5|msgpack|onnx)$|\.index\.json$")
EXPORT_NAMES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt", "chat_template.jinja",
                "added_tokens.json", "lm_eval")


def remove_stale_export_files(folder: str, written: set[str]) -> None:
    """Remove the files of an earlier export in ``folder`` that this export did not write again."""
    import shutil
    for name in EXPORT_NAMES:
        path = os.path.join(folder, name)
        if name in written or not os.path.lexists(path):
            continue
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)


def check_gemma3_gguf(config: GPTConfig) -> None:
    """What a Gemma 3 GGUF cannot say: llama.cpp scales attention by 1/√head_dim (the 270M–12B models' value) and
    has no key for another; a layer pattern or local RoPE base other than llama.cpp's fixed ones (every 6th block
    global, 10,000) is written to its keys, which transformers' GGUF reader ignores — said once, not refused."""
    if config.attn_scale is not None and not math.isclose(config.attn_scale, config.head_dim ** -0.5, rel_tol=1e-9):
        raise ConversionError(f"this Gemma 3 model scales attention by {config.attn_scale:.6g}, not 1/√head_dim = "
                              f"{config.head_dim ** -0.5:.6g}; a GGUF file cannot say so (llama.cpp fixes it): "
                              "export with --to_hf instead")
    local = config.rope_local_base or config.rope_base
    if config.attn_window and (config.global_every != 6 or local != 10000.0) or not config.attn_window and \
            config.rope_base != 10000.0:
        print("warning: this Gemma 3 model's layer pattern or local RoPE base differs from llama.cpp's fixed ones "
              "(every 6th block global, base 10,000): the GGUF records them (gemma3.attention.sliding_window_pattern, "
              "gemma3.rope.freq_base_swa), but readers that ignore those keys, transformers among them, will "
              "compute another model", file=sys.stderr)


def check_complete_for_export(ckpt: dict, cfg: ConvertConfig) -> None:
    """An interrupted run (marked ``complete: False``) exports only when asked for: an export cannot carry the
    mark, so the model would come back from it looking finished."""
    if is_interrupted(ckpt) and not cfg.allow_incomplete:
        raise ConversionError(f"'{cfg.in_dir}' is an interrupted run (stopped at iter {ckpt.get('iter_num', 0)}, "
                              "marked incomplete) and an export cannot carry that mark: resume it to the end, or "
                              "pass --allow_incomplete=True to export it as it is")


def check_export_file(path: str, overwrite: bool, in_dir: str = "") -> None:
    """Before any work: ``path`` can be written as a new file (an existing one only with ``overwrite``, and never
    the input checkpoint itself, whatever the flags)."""
    if os.path.isdir(path) or path.endswith(os.sep):
        raise ConversionError(f"--to_gguf='{path}' is a directory path; give a file path such as model.gguf")
    if in_dir and os.path.exists(path) and os.path.exists(checkpoint_path(in_dir)) and \
            os.path.samefile(path, checkpoint_path(in_dir)):
        raise ConversionError(f"--to_gguf='{path}' is the input checkpoint; an export never writes over its input: "
                              "choose another --to_gguf")
    if os.path.lexists(path) and not overwrite:
        raise ConversionError(f"'{path}' already exists; choose another --to_gguf, or pass --overwrite=True")
    check_writable_dir(os.path.dirname(os.path.abspath(path)))


def convert(cfg: ConvertConfig) -> str:
    if cfg.to_gguf:
        check_export_file(cfg.to_gguf, cfg.overwrite, cfg.in_dir)
        model, ckpt = load_model(cfg.in_dir)
        check_complete_for_export(ckpt, cfg)
        tokenizer_files(ckpt.get("meta"))  # a tokenizer GGUF cannot hold fails before anything is written
        if cfg.pad_width and model.config.n_embd % cfg.pad_width:
            width = padded_width(model.config.n_embd, cfg.pad_width)
            print(f"padding the residual width {model.config.n_embd} → {width} with zeros (the same function)")
            model = pad_residual(model, width)
        if cfg.gguf_type not in QUANT_BLOCK:
            export_gguf(model, ckpt.get("meta"), cfg.to_gguf, cfg.gguf_type)
            return cfg.to_gguf
        check_quantizable(model.config, cfg.gguf_type)  # checked before anything is written, as is the install
        llama_cpp()
        unquantized = f"{cfg.to_gguf}.f32-{os.getpid()}"
        try:
            export_gguf(model, ckpt.get("meta"), unquantized, "f32")
            quantize(unquantized, cfg.to_gguf, cfg.gguf_type, max(1, torch.get_num_threads()))
        finally:
            if os.path.exists(unquantized):
                os.remove(unquantized)
        return cfg.to_gguf
    if cfg.to_hf:
        check_export_dir(cfg.to_hf, cfg.overwrite, cfg.in_dir)
        model, ckpt = load_model(cfg.in_dir)
        check_complete_for_export(ckpt, cfg)
        if ckpt.get("meta") is None:  # checked before anything is written
            raise ConversionError(f"{cfg.in_dir} records no tokenizer (meta): the export would have no tokenizer")
        data_dir = data_dir_for_checkpoint(ckpt, cfg.data_dir, "--data_dir") if cfg.lm_eval_task else ""
        export_target(model.config)  # an architecture no supported class holds fails before anything is written
        with staged_dir(cfg.to_hf, "config.json") as staging:  # config.json makes it an export
            export_hf(model, staging, ckpt["meta"].get("special_ids"))
            export_tokenizer(ckpt.get("meta"), staging)
            if cfg.lm_eval_task:
                write_lm_eval_task(ckpt, data_dir, staging, final_dir=cfg.to_hf)
            read_back_hf(staging, model, cfg.to_hf)
            written = set(os.listdir(staging))
        remove_stale_export_files(cfg.to_hf, written)
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


def main(argv: list[str]) -> None:
    cfg = load_config(ConvertConfig, argv, prog="convert.py")
    if cfg.to_gguf:  # one file, written atomically by export_gguf
        print(f"wrote {convert(cfg)}")
        return
    with hold_run_dir(cfg.to_hf or cfg.out_dir, "convert.py"):
        print(f"wrote {convert(cfg)}")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
