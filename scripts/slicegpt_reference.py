"""
SliceGPT's own code on SmolLM2-135M, beside ours: the same model (transformers' GGUF reader on the same file), the
same calibration tokens (tinyshakespeare's train split, 8 batches of 16 × 256, the batches our transform draws with
seed 0) and the same evaluations (whole val splits in 256-token windows, our BatchLoader's windows).

    pip install ml-collections            # SliceGPT's config module needs it (not a dependency of ours)
    python scripts/slicegpt_reference.py [--widths=432,288]     (scripts/real_model.sh --part=slicegpt runs it)

SliceGPT (Ashkboos et al., ICLR 2024) is run from ../shared/reference/slicegpt (microsoft/TransformerCompression
src/slicegpt at 6b12cde, unmodified): its own steps — ``layernorm_fusion.replace_layers``, ``fuse_modules``,
``rotate.rotate_and_slice`` with a ``ConstSlicingScheduler`` — on a LlamaForCausalLM. Its Llama adapter targets
transformers 4.41, whose decoder layer returned a tuple and took ``past_key_value``; ``V5ShortcutLayer`` is its
``CompressedLlamaDecoderLayer`` rewritten for the installed transformers' layer call (same shortcut arithmetic:
h ← h·Q_attn + attention, h ← h·Q_mlp + MLP), and nothing else of SliceGPT is changed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(os.path.dirname(ROOT), "shared", "reference", "slicegpt")
sys.path[:0] = [ROOT, REFERENCE]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from lgpt.plumbing.dataset import BatchLoader  # noqa: E402

BLOCK, CALIB_BATCHES, CALIB_BATCH_SIZE = 256, 8, 16  # as scripts/real_model.py's transforms


def shortcut_layer_class():
    """SliceGPT's CompressedLlamaDecoderLayer for the installed transformers (the layer returns a tensor and takes
    ``cache``/``position_embeddings``); the shortcut matrices act exactly as in SliceGPT's own class."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    class V5ShortcutLayer(LlamaDecoderLayer):  # SliceGPT registers attn_shortcut_Q / mlp_shortcut_Q on it
        def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                    position_embeddings=None, **kwargs):
            residual = hidden_states
            hidden_states, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states),
                                              attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                                              use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
            skip = residual if self.attn_shortcut_Q is None else torch.matmul(residual, self.attn_shortcut_Q)
            hidden_states = skip + hidden_states
            residual = hidden_states
            hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
            skip = residual if self.mlp_shortcut_Q is None else torch.matmul(residual, self.mlp_shortcut_Q)
            return skip + hidden_states

    return V5ShortcutLayer


def adapter(model):
    """SliceGPT's LlamaModelAdapter, its compressed layer swapped for ``V5ShortcutLayer``."""
    from slicegpt.adapters.llama_adapter import LlamaModelAdapter
    layer_class = shortcut_layer_class()

    class Adapter(LlamaModelAdapter):
        @property
        def compressed_layer_type(self) -> type:
            return layer_class

        def convert_layer_to_compressed(self, layer, layer_idx):
            compressed = layer_class(self.config, layer_idx).to(next(layer.parameters()).dtype)
            compressed.load_state_dict(layer.state_dict(), strict=True)
            return compressed

    return Adapter(model)


def calibration(data_dir: str) -> list[dict]:
    """Our transform's calibration batches (seeds 0…7 of the train split), as SliceGPT's batch dicts."""
    loader = BatchLoader(data_dir, BLOCK, CALIB_BATCH_SIZE, "cpu")
    batches = []
    for k in range(CALIB_BATCHES):
        x, _ = loader.get_batch("train", seed=k)
        batches.append({"input_ids": x, "attention_mask": torch.ones_like(x)})
    return batches


def slice_model(model, batches: list[dict], width: int):
    """SliceGPT's own steps: fuse the norms, then rotate and slice every block to ``width`` (the head rotated, not
    sliced: SliceGPT's default)."""
    from slicegpt import layernorm_fusion, rotate
    from slicegpt.slicing_scheduler import ConstSlicingScheduler
    wrapped = adapter(model)
    layernorm_fusion.replace_layers(wrapped, verbose=False)
    layernorm_fusion.fuse_modules(wrapped)
    rotate.rotate_and_slice(wrapped, batches, ConstSlicingScheduler(width), final_orientation="pca")
    return wrapped.model.eval()


@torch.no_grad()
def full_val_loss(model, data_dir: str) -> float:
    """Mean cross-entropy over the whole val split in our BatchLoader's 256-token windows (evaluate_loss's)."""
    loader = BatchLoader(data_dir, BLOCK, 8, "cpu")
    total, count = 0.0, 0
    for x, y in loader.full_split("val"):
        logits = model(input_ids=x).logits
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="sum").item()
        count += y.numel()
    return total / count


def parameters(model) -> int:
    """Parameters with shared tensors counted once."""
    return sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())


def load_gguf(path: str):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                             dtype=torch.float32).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", required=True, help="SmolLM2's GGUF file (fetch.py --what=smollm2)")
    parser.add_argument("--calib_dir", required=True, help="prepared tinyshakespeare in SmolLM2's tokens")
    parser.add_argument("--eval_dirs", required=True, help="name=DIR,… prepared texts to evaluate on")
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--out", required=True, help="a JSON file for the results")
    args = parser.parse_args()
    import json
    torch.manual_seed(0)
    started = time.time()
    model = slice_model(load_gguf(args.gguf), calibration(args.calib_dir), args.width)
    seconds = time.time() - started
    result = {"width": args.width, "slice_seconds": round(seconds, 1), "parameters": parameters(model), "losses": {}}
    for pair in args.eval_dirs.split(","):
        name, directory = pair.split("=", 1)
        result["losses"][name] = full_val_loss(model, directory)
    tmp = f"{args.out}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2)
    os.replace(tmp, args.out)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
