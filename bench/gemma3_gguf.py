"""
How exactly a Gemma 3 GGUF of ours is read by llama.cpp and by transformers (no real Gemma weights install offline):
a random-weight Gemma3ForCausalLM built as tests/formats/test_gemma3.py builds it (6 blocks, every 6th global, a 6-token
window shorter than the text, head_dim 256, weights far from uniform) with a Gemma-style tokenizer (transformers'
GemmaTokenizer, 640 tokens), imported with convert.py --from_hf and written with --to_gguf (f32).

1. transformers' GGUF reader on our file, against the original Hugging Face model;
2. llama.cpp (llama-cpp-python, when installed: built from source, f32 KV cache) on our file, against the original,
   with its own tokenizer; and against our model with the GELU's input and output rounded to float16 — ggml
   evaluates GELU from a float16 table, which is where most of the difference from an exact float32 model comes
   from (SmolLM2's SiLU shows 1e-4: bench/gguf_exactness.py).

Each is the max |Δ log p| over every position and vocabulary entry of one text (n = 1), plus whether the token ids
agree. Writes bench/results/gemma3_gguf.json.

    python bench/gemma3_gguf.py
"""
from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import write_result  # noqa: E402

from convert import ConvertConfig, convert  # noqa: E402
from hf_models import gemma3, hf_logprobs, save, train_gemma_tokenizer  # noqa: E402
from lgpt.plumbing.checkpoint import load_model  # noqa: E402

TEXT = "ROMEO: But, soft! what light through yonder window breaks?  Two  spaces — and é."


def fp16_gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x.half().float(), approximate="tanh").half().float()


def main() -> None:
    import transformers
    result = {"text": TEXT, "llama_cpp_python": None}
    tokenizer = train_gemma_tokenizer()
    original = gemma3(layers=6, global_every=6, head_dim=256, pre_attn_scalar=256, vocab=640, seed=4).eval()
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    result["text_tokens"] = len(ids)
    reference = hf_logprobs(original, torch.tensor([ids]))[0]
    with tempfile.TemporaryDirectory() as tmp:
        convert(ConvertConfig(from_hf=save(original, os.path.join(tmp, "hf"), tokenizer),
                              out_dir=os.path.join(tmp, "ours")))
        path = os.path.join(tmp, "gguf", "model.gguf")
        convert(ConvertConfig(in_dir=os.path.join(tmp, "ours"), to_gguf=path))
        theirs = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file="model.gguf")
        result["transformers"] = {"max_abs_dlogp": float((hf_logprobs(theirs.eval(), torch.tensor([ids]))[0]
                                                          - reference).abs().max())}
        try:
            import llama_cpp
        except ImportError:
            llama_cpp = None
        if llama_cpp is not None:
            result["llama_cpp_python"] = llama_cpp.__version__
            llm = llama_cpp.Llama(model_path=path, logits_all=True, n_ctx=64, verbose=False, type_k=0, type_v=0)
            their_ids = llm.tokenize(TEXT.encode(), add_bos=False, special=False)
            llm.eval(ids)
            logp = torch.tensor(np.array(llm.scores[:len(ids)])).float().log_softmax(-1)
            ours, _ = load_model(os.path.join(tmp, "ours"))
            for block in ours.transformer.h:
                block.mlp.gate = fp16_gelu
            with torch.no_grad():
                emulated = ours(torch.tensor([ids]), all_logits=True)[0][0].float().log_softmax(-1)
            result["llama_cpp"] = {"same_tokens": their_ids == ids,
                                   "max_abs_dlogp": float((logp - reference).abs().max()),
                                   "max_abs_dlogp_vs_fp16_gelu": float((logp - emulated).abs().max())}
    write_result("gemma3_gguf", result)


if __name__ == "__main__":
    main()
