"""
How exactly GGUF goes in and out, on the real model (SmolLM2-135M-Instruct, Q4_1, from fetch.py's cache):

1. import: our checkpoint (convert.py --from_gguf) against transformers' own GGUF reader on the same file;
2. export: our f32 GGUF (convert.py --to_gguf) read back by transformers, against our model;
3. llama.cpp (llama-cpp-python, when it is installed: it is built from source, ~10 min on 2 cores) on our f32
   export with an f32 KV cache, against our model, with its own tokenizer, and on the original Q4_1 file
   (llama.cpp then multiplies in 8-bit activations: a different computation, reported for scale).

Each is the max |Δ log p| over every position and vocabulary entry of one text (n = 1), plus whether the token ids
agree. Writes bench/results/gguf_exactness.json.

    python fetch.py --what=smollm2 && python bench/gguf_exactness.py
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import write_result  # noqa: E402

from convert import ConvertConfig, convert  # noqa: E402
from fetch import SMOLLM2_GGUF, cache_path  # noqa: E402
from lgpt.plumbing.checkpoint import load_model  # noqa: E402
from lgpt.plumbing.dataset import Tokenizer  # noqa: E402

TEXT = ("ROMEO: But, soft! what light through yonder window breaks? It is the east, and Juliet is the sun. Arise, "
        "fair sun, and kill the envious moon, who is already sick and pale with grief.")


def transformers_logp(path: str, ids: list[int]) -> tuple[torch.Tensor, list[int]]:
    import transformers
    folder, name = os.path.split(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    their_ids = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)(TEXT)["input_ids"]
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().log_softmax(-1), their_ids


def llama_cpp_logp(path: str, ids: list[int]) -> tuple[torch.Tensor, list[int]] | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=path, logits_all=True, n_ctx=256, verbose=False, type_k=0, type_v=0)  # 0: GGML F32
    their_ids = llm.tokenize(TEXT.encode(), add_bos=False, special=False)
    llm.eval(ids)
    return torch.tensor(np.array(llm.scores[:len(ids)])).float().log_softmax(-1), their_ids


def compare(ours: torch.Tensor, theirs: tuple | None, ids: list[int]) -> dict | None:
    if theirs is None:
        return None
    logp, their_ids = theirs
    return {"max_abs_dlogp": float((ours - logp).abs().max()), "same_tokens": their_ids == ids,
            "same_argmax": float((ours.argmax(-1) == logp.argmax(-1)).float().mean())}


def main() -> None:
    source = cache_path(SMOLLM2_GGUF)
    result = {"model": SMOLLM2_GGUF, "text_tokens": None, "threads": os.environ.get("OMP_NUM_THREADS", "default")}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.time()
        convert(ConvertConfig(from_gguf=source, out_dir=os.path.join(tmp, "ours")))
        result["import_seconds"] = round(time.time() - started, 1)
        model, ckpt = load_model(os.path.join(tmp, "ours"))
        ids = Tokenizer(ckpt["meta"]).encode(TEXT)
        result["text_tokens"] = len(ids)
        with torch.no_grad():
            ours = model.eval()(torch.tensor([ids]), all_logits=True)[0][0].float().log_softmax(-1)
        result["import_vs_transformers"] = compare(ours, transformers_logp(source, ids), ids)
        exported = os.path.join(tmp, "smollm2-f32.gguf")
        started = time.time()
        convert(ConvertConfig(in_dir=os.path.join(tmp, "ours"), to_gguf=exported))
        result["export_seconds"] = round(time.time() - started, 1)
        result["export_f32_vs_transformers"] = compare(ours, transformers_logp(exported, ids), ids)
        result["export_f32_vs_llama_cpp"] = compare(ours, llama_cpp_logp(exported, ids), ids)
        result["original_q4_1_vs_llama_cpp"] = compare(ours, llama_cpp_logp(source, ids), ids)
    try:
        import llama_cpp
        result["llama_cpp_python"] = llama_cpp.__version__
    except ImportError:
        result["llama_cpp_python"] = None
    write_result("gguf_exactness", result)


if __name__ == "__main__":
    main()
