"""
llama.cpp where users serve a model: its own quantizer (``llama_model_quantize``) on a GGUF file we exported, its
own logits (a loss as users would measure it) and its own speed (prompt processing and generation tokens/s).

Needs llama-cpp-python (``pip install llama-cpp-python``, which builds llama.cpp from source in a few minutes);
without it each function here fails with one line that says so.

Two rules of llama.cpp's quantizer decide what a narrow model gets (src/llama-quant.cpp):
- a block type needs every row length to be a multiple of its block (32 for Q4_0 … Q8_0 and IQ4_NL, 256 for the
  K-quants Q2_K … Q6_K and IQ4_XS); a K-quant tensor whose rows are not falls back to a 32-block type (in the
  llama.cpp that llama-cpp-python 0.3.36 builds: Q2_K and Q3_K → Q4_0, Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, as
  results/quant_frontier's files hold), and one whose rows are not a multiple of 32 either is left in F16 — or, for a
  32-block type asked for directly, refused. ``QUANT_BLOCK`` and ``check_quantizable`` say which;
- the token embedding of a tied model doubles as the head and is kept at Q6_K (Q8_0 where Q6_K falls back).
So the width m of a shrunk model decides how much of it the asked type reaches: ``tensor_mix`` reads it back.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable

import numpy as np

from lgpt.plumbing.errors import ConversionError

# llama.cpp's names of the types its quantizer writes (LLAMA_FTYPE_MOSTLY_<name>), and each type's block: a row
# length must be a multiple of it for the type to apply to that row (otherwise the fallback above)
QUANT_BLOCK = {"F16": 1, "Q8_0": 32, "Q6_K": 256, "Q5_K_M": 256, "Q5_K_S": 256, "Q5_0": 32, "Q5_1": 32,
               "Q4_K_M": 256, "Q4_K_S": 256, "Q4_0": 32, "Q4_1": 32, "IQ4_NL": 32, "IQ4_XS": 256,
               "Q3_K_L": 256, "Q3_K_M": 256, "Q3_K_S": 256, "Q2_K": 256}
ROW_BLOCK = 32  # the smallest block of any quantized type: a row length that is not a multiple of it stays F16


def llama_cpp():
    """The llama_cpp module, or one line saying how to install it."""
    try:
        import llama_cpp as module
    except ImportError:
        raise ConversionError("llama.cpp's quantizer and runtime need llama-cpp-python: pip install "
                              "llama-cpp-python (it builds llama.cpp from source, a few minutes)") from None
    return module


def ftype(name: str) -> int:
    """llama.cpp's file-type number for a quantization type name (Q4_K_M …), or one line naming the choices."""
    if name not in QUANT_BLOCK:
        raise ConversionError(f"quantization type {name!r} is not one of {', '.join(QUANT_BLOCK)}")
    return int(getattr(llama_cpp(), f"LLAMA_FTYPE_MOSTLY_{name}"))


def check_quantizable(config, name: str) -> None:
    """A model of this config can be quantized to ``name`` by llama.cpp: the row lengths of its matrices — the
    residual width (the readers and the embedding), the attention's inner width (its output projection) and the MLP's
    hidden width (its down projection) — are multiples of 32 where ``name`` is a 32-block type, which refuses any
    other (K-quants fall back instead, see the module's docstring). The residual width can be padded exactly."""
    if QUANT_BLOCK[name] != ROW_BLOCK:
        return
    if config.n_embd % ROW_BLOCK:
        raise ConversionError(f"llama.cpp's {name} needs rows of a multiple of {ROW_BLOCK}, and this model's residual "
                              f"width is {config.n_embd}; pass --pad_width={ROW_BLOCK} (zero-padding to "
                              f"{padded_width(config.n_embd)}, which changes no output)")
    for what, width in (("attention's inner width (n_head × head_dim)", config.n_head * config.head_dim),
                        ("MLP's hidden width", config.mlp_hidden)):
        if width % ROW_BLOCK:
            raise ConversionError(f"llama.cpp's {name} needs rows of a multiple of {ROW_BLOCK}, and this model's "
                                  f"{what} is {width}; choose a K-quant (Q4_K_M …: it falls back on such rows) "
                                  "or F16")


def quantize(source: str, destination: str, name: str, threads: int = 1) -> dict:
    """llama.cpp's quantizer: ``source`` (an F32/F16 GGUF) to ``destination`` as type ``name``. Written to a
    temporary file beside it and renamed, so a failed run leaves nothing; returns the seconds it took."""
    lib = llama_cpp()
    params = lib.llama_model_quantize_default_params()
    params.ftype = ftype(name)
    params.nthread = threads
    partial = f"{destination}.partial-{os.getpid()}"  # this run's own name: nothing of the user's is touched
    started = time.time()
    try:
        failed = lib.llama_model_quantize(source.encode(), partial.encode(), params)
        if failed:
            raise ConversionError(f"llama.cpp's quantizer failed on '{source}' as {name} (code {failed}); its own "
                                  "log says why (run with the environment variable LLAMA_LOG_LEVEL unset)")
        os.replace(partial, destination)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return {"seconds": round(time.time() - started, 2)}


def tensor_mix(path: str) -> dict:
    """What a GGUF file holds: its bytes, its weights' count, bits per weight over the whole file, and the share
    of the weights stored in each GGML type (where llama.cpp fell back, the types say so)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    counts: dict[str, int] = {}
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        counts[kind] = counts.get(kind, 0) + int(tensor.n_elements)
    weights = sum(counts.values())
    size = os.path.getsize(path)
    return {"bytes": size, "weights": weights, "bits_per_weight": round(8 * size / weights, 3),
            "types": {k: round(v / weights, 4) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}}


def load(path: str, context: int, threads: int, logits_all: bool = False, f32_cache: bool = False):
    """A llama.cpp model as users run it (llama-cpp-python's Llama; the KV cache in F16 unless ``f32_cache``)."""
    lib = llama_cpp()
    extra = {"type_k": 0, "type_v": 0} if f32_cache else {}  # 0: GGML F32
    return lib.Llama(model_path=path, n_ctx=context, n_batch=context, n_ubatch=context, n_threads=threads,
                     n_threads_batch=threads, logits_all=logits_all, verbose=False, **extra)


def log_softmax(scores: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, in float64 (llama.cpp returns float32 logits)."""
    x = scores.astype(np.float64)
    top = x.max(-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))


def window_losses(llm, windows: Iterable[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Each window's mean next-token loss from llama.cpp's own logits: for each (x, y) — y is x shifted by one —
    the model reads x from an empty cache and is scored on y, as our ``dataset.window_losses`` does."""
    out = []
    for x, y in windows:
        llm.reset()
        llm.eval([int(t) for t in x])
        logp = log_softmax(np.asarray(llm.scores[:len(x)]))
        out.append(-logp[np.arange(len(y)), np.asarray(y, dtype=np.int64)].mean())
    return np.array(out)


def speed(llm, prompt: list[int], generate: int, repeats: int = 3) -> dict:
    """Prompt processing and generation tokens/s: the prompt read from an empty cache, then ``generate`` tokens
    one at a time (greedy), the median of ``repeats`` after one warm-up; the process's peak memory after."""
    def once() -> tuple[float, float]:
        llm.reset()
        started = time.perf_counter()
        llm.eval(prompt)
        read = time.perf_counter() - started
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))  # the last position's logits (kept in either mode)
        started = time.perf_counter()
        for _ in range(generate):
            llm.eval([token])
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        return read, time.perf_counter() - started

    once()
    reads, gens = zip(*(once() for _ in range(repeats)))
    return {"prompt_tokens": len(prompt), "generated_tokens": generate, "repeats": repeats,
            "prompt_tokens_per_s": round(len(prompt) / float(np.median(reads)), 1),
            "generate_tokens_per_s": round(generate / float(np.median(gens)), 1),
            "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: Linux's VmHWM, which starts afresh in a new program (getrusage's
    ru_maxrss is inherited across exec, so a child started by a large parent reports the parent's peak)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return round(next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024, 1)
    except (OSError, StopIteration):
        import resource
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def padded_width(width: int, block: int = ROW_BLOCK) -> int:
    """The smallest multiple of ``block`` (by default ROW_BLOCK, llama.cpp's smallest) at least ``width``."""
    return -(-width // block) * block
