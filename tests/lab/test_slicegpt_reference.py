"""scripts/slicegpt_reference.py runs SliceGPT's own code (../shared/reference/slicegpt) through an adapter for the
installed transformers: its rotation must be exact against SliceGPT's own fused model, as SliceGPT's is."""
import copy
import os
import sys

import pytest
import torch

from conftest import ROOT

pytest.importorskip("transformers")
pytest.importorskip("ml_collections", reason="SliceGPT's config module needs ml-collections (not our dependency)")
if not os.path.isdir(os.path.join(os.path.dirname(ROOT), "shared", "reference", "slicegpt")):
    pytest.skip("../shared/reference/slicegpt is not beside the repository", allow_module_level=True)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import slicegpt_reference as sr  # noqa: E402
from hf_models import llama  # noqa: E402


def test_slicegpts_rotation_through_the_adapter_keeps_its_fused_model():
    from slicegpt import layernorm_fusion, rotate
    from slicegpt.slicing_scheduler import ConstSlicingScheduler
    model = llama(n_head=4, n_kv_head=2, hidden=64, layers=2)
    x = torch.randint(0, 320, (2, 16), generator=torch.Generator().manual_seed(0))
    wrapped = sr.adapter(copy.deepcopy(model))
    layernorm_fusion.replace_layers(wrapped, verbose=False)
    layernorm_fusion.fuse_modules(wrapped)
    with torch.no_grad():
        fused = torch.log_softmax(wrapped.model(input_ids=x).logits, -1)
    batches = [{"input_ids": torch.randint(0, 320, (4, 16), generator=torch.Generator().manual_seed(k)),
                "attention_mask": torch.ones(4, 16, dtype=torch.long)} for k in range(2)]
    rotate.rotate_and_slice(wrapped, batches, ConstSlicingScheduler(64), final_orientation="pca")
    with torch.no_grad():
        rotated = torch.log_softmax(wrapped.model(input_ids=x).logits, -1)
    assert (rotated - fused).abs().max() < 1e-4
    sliced = sr.slice_model(copy.deepcopy(model), batches, 48)
    assert sr.parameters(sliced) < sr.parameters(model) + 2 * 2 * 64 * 64  # sliced blocks, shortcut matrices added
