"""Every bad input a careless or hostile user gives, through the real command lines (in-process where possible):
a non-zero exit, one line ``error: ...`` naming the problem and the fix, no traceback, and nothing written,
overwritten or half-written (the trained checkpoint is hashed before and after every case)."""
import hashlib
import importlib
import os
import pickle
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from conftest import ROOT, TINY_MODEL, synthetic_text
from lgpt.plumbing.cli import run_cli
from lgpt.plumbing.dataset import PREPARING_MARKER, load_meta, write_meta


@dataclass
class Ctx:
    trained: str  # a trained tiny char model (never to be modified)
    data: str  # its dataset
    other_data: str  # a char dataset with another vocabulary
    tiny_data: str  # a dataset with fewer tokens than a block
    corrupt_meta_data: str  # a dataset whose meta.pkl is garbage
    unfinished_data: str  # a dataset whose preparation never finished (the marker is still there)
    cut_data: str  # a dataset whose train.bin holds fewer tokens than its meta.pkl records
    transformed: str  # trained → width 40
    copy: str  # a byte copy of trained elsewhere (another path)
    no_dataset: str  # trained, with its config emptied (as imported or hand-made checkpoints are)
    moved_data: str  # trained, with its recorded data_dir pointing nowhere
    other_tokenizer: str  # trained, with another tokenizer recorded
    no_meta_small_vocab: str  # a checkpoint without a tokenizer and a 32-token vocabulary (nanoGPT char style)
    corrupt_ckpt: str
    foreign_ckpt: str
    other_width: str  # a model of width 40 made without a transform (unrelated to trained)
    nan_weights: str  # trained, with one NaN in a weight
    inf_weights: str  # trained, with one infinite value in a weight
    a_file: str
    empty_dir: str
    binary_file: str
    bad_config: str
    raising_config: str
    exiting_config: str
    tmp: str


def _spoiled(state: dict, value: float) -> dict:
    state = {k: v.clone() for k, v in state.items()}
    state["transformer.h.0.mlp.c_fc.weight"][3, 5] = value
    return state


def _variant(src: str, dst: str, **changes) -> str:
    ckpt = torch.load(os.path.join(src, "ckpt.pt"), weights_only=False)
    ckpt.update(changes)
    os.makedirs(dst)
    torch.save(ckpt, os.path.join(dst, "ckpt.pt"))
    return dst


@pytest.fixture(scope="module")
def ctx(trained_dir, char_data_dir, tmp_path_factory):
    from lgpt.plumbing.dataset import prepare_text
    from transform import TransformConfig, transform_checkpoint
    base = tmp_path_factory.mktemp("bad_inputs")
    other = str(base / "other_data")
    prepare_text(synthetic_text(5000, seed=1).upper() + "0123456789!?", other, "char")
    tiny = str(base / "tiny_data")
    prepare_text("To be, or not to be. " * 60, tiny, "char")
    for split in ("train", "val"):  # cut to fewer tokens than a block of 16 + 1, its manifest saying so
        with open(os.path.join(tiny, f"{split}.bin"), "r+b") as f:
            f.truncate(20)
    write_meta(tiny, load_meta(tiny), {"train": 10, "val": 10})
    corrupt_meta = str(base / "corrupt_meta")
    shutil.copytree(char_data_dir, corrupt_meta)
    with open(os.path.join(corrupt_meta, "meta.pkl"), "wb") as f:
        f.write(b"\x80\x04garbage")
    unfinished = str(base / "unfinished")
    shutil.copytree(char_data_dir, unfinished)
    open(os.path.join(unfinished, PREPARING_MARKER), "w").write("pid 1")
    cut = str(base / "cut")
    shutil.copytree(char_data_dir, cut)
    with open(os.path.join(cut, "train.bin"), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(cut, "train.bin")) - 2000)
    transformed = str(base / "t40")
    transform_checkpoint(TransformConfig(in_dir=trained_dir, out_dir=transformed, width=40, eval_iters=0))
    copy = str(base / "copy")
    shutil.copytree(trained_dir, copy)
    other_meta = pickle.load(open(os.path.join(other, "meta.pkl"), "rb"))
    ckpt = torch.load(os.path.join(trained_dir, "ckpt.pt"), weights_only=False)
    args = dict(ckpt["model_args"], vocab_size=32)
    files = {name: str(base / name) for name in ("a_file", "binary_file", "bad_config.py", "raising_config.py",
                                                   "exiting_config.py", "corrupt_ckpt.pt", "foreign_ckpt.pt")}
    open(files["a_file"], "w").write("not a directory")
    open(files["binary_file"], "wb").write(bytes(range(256)))
    open(files["bad_config.py"], "w").write("n_layer = = 3\n")
    open(files["raising_config.py"], "w").write("n_layer = 1 // 0\n")
    open(files["exiting_config.py"], "w").write("import sys\nn_layer = 2\nsys.exit(0)\n")
    open(files["corrupt_ckpt.pt"], "wb").write(b"PK\x03\x04 not really a checkpoint")
    torch.save({"weights": {}}, files["foreign_ckpt.pt"])
    empty = str(base / "empty_dir")
    os.makedirs(empty)
    return Ctx(
        trained=trained_dir, data=char_data_dir, other_data=other, tiny_data=tiny, corrupt_meta_data=corrupt_meta,
        unfinished_data=unfinished, cut_data=cut,
        transformed=transformed, copy=copy,
        no_dataset=_variant(trained_dir, str(base / "no_dataset"), config={}),
        moved_data=_variant(trained_dir, str(base / "moved"), config=dict(ckpt["config"], data_dir=str(base / "gone"))),
        other_tokenizer=_variant(trained_dir, str(base / "other_tok"), meta=other_meta),
        no_meta_small_vocab=_variant(trained_dir, str(base / "nometa"), meta=None, model_args=args,
                                     model={k: v[:32] if k.startswith(("transformer.wte", "lm_head")) else v
                                            for k, v in ckpt["model"].items()}),
        other_width=_variant(transformed, str(base / "other_width"), transform=None),
        nan_weights=_variant(trained_dir, str(base / "nan"), model=_spoiled(ckpt["model"], float("nan"))),
        inf_weights=_variant(trained_dir, str(base / "inf"), model=_spoiled(ckpt["model"], float("inf"))),
        corrupt_ckpt=files["corrupt_ckpt.pt"], foreign_ckpt=files["foreign_ckpt.pt"], a_file=files["a_file"],
        empty_dir=empty, binary_file=files["binary_file"], bad_config=files["bad_config.py"],
        raising_config=files["raising_config.py"], exiting_config=files["exiting_config.py"], tmp=str(base))


def _train(c: Ctx, *extra) -> list[str]:
    return [*TINY_MODEL, f"--data_dir={c.data}", "--max_iters=2", *extra]


def _fresh(c: Ctx, name: str) -> str:
    return os.path.join(c.tmp, "fresh", name)  # never created by a failing command


def _holding(c: Ctx, name: str, *files: str) -> str:
    """A directory that already holds ``files`` (another command's output), made once."""
    path = os.path.join(c.tmp, "holding", name)
    os.makedirs(path, exist_ok=True)
    for file in files:
        open(os.path.join(path, file), "a").close()
    return path


# (script, argv from the context, words the one-line error must contain)
CASES = [
    # train.py: config values
    ("train", lambda c: ["--n_layr=2"], ["unknown config key 'n_layr'", "Did you mean 'n_layer'", "--help"]),
    ("train", lambda c: ["--max_iters=abc"], ["max_iters='abc' has the wrong type", "accepts int"]),
    ("train", lambda c: ["--max_iters"], ["must have the form --key=value"]),
    ("train", lambda c: _train(c, "--mlp_hidden=0"), ["mlp_hidden must be a positive integer"]),
    ("train", lambda c: _train(c, "--head_dim=0"), ["head_dim must be a positive integer"]),
    ("train", lambda c: _train(c, "--grad_clip=-1"), ["grad_clip must be >= 0"]),
    ("train", lambda c: _train(c, "--warmup_iters=-1"), ["warmup_iters must be >= 0"]),
    ("train", lambda c: _train(c, "--min_lr=0.1"), ["min_lr=0.1 is above learning_rate", "--min_lr"]),
    ("train", lambda c: _train(c, "--beta1=1.5"), ["beta1 must lie in [0, 1)"]),
    ("train", lambda c: _train(c, "--beta2=-0.1"), ["beta2 must lie in [0, 1)"]),
    ("train", lambda c: _train(c, "--batch_size=0"), ["batch_size must be a positive integer"]),
    ("train", lambda c: _train(c, "--dtype=fp8"), ["dtype='fp8' is not one of"]),
    ("train", lambda c: _train(c, "--dtype=float16", "--device=cpu"), ["needs a CUDA GPU", "--dtype=bfloat16"]),
    ("train", lambda c: _train(c, "--device=gpu"), ["device='gpu' is not a torch device"]),
    ("train", lambda c: _train(c, "--device=cuda"), ["CUDA is not available", "--device=cpu"]),
    ("train", lambda c: _train(c, "--norm_eps=-1e-5"), ["norm_eps must be > 0"]),
    ("train", lambda c: _train(c, "--pos=rope", "--rope_base=0"), ["rope_base must be > 0"]),
    ("train", lambda c: _train(c, "--init_from=bogus"), ["init_from='bogus' is not one of"]),
    # train.py: config files
    ("train", lambda c: [os.path.join(c.tmp, "missing.py")], ["does not exist", "configs/"]),
    ("train", lambda c: [c.tmp], ["is a directory"]),
    ("train", lambda c: [c.bad_config], ["syntax error at line 1"]),
    ("train", lambda c: [c.exiting_config, *_train(c)], ["called exit(0)", "plain assignments"]),
    ("finetune", lambda c: [c.exiting_config, f"--in_dir={c.transformed}", f"--out_dir={_fresh(c, 'f')}"],
     ["called exit(0)"]),
    ("train", lambda c: [c.raising_config], ["raised ZeroDivisionError"]),
    # train.py: data
    ("train", lambda c: [*TINY_MODEL, f"--data_dir={c.empty_dir}", f"--out_dir={_fresh(c, 'a')}"],
     ["train.bin' is missing"]),
    ("train", lambda c: [*TINY_MODEL, f"--data_dir={c.tiny_data}", f"--out_dir={_fresh(c, 'b')}"],
     ["fewer tokens than block_size=16"]),
    ("train", lambda c: [*TINY_MODEL, f"--data_dir={c.corrupt_meta_data}", f"--out_dir={_fresh(c, 'c')}"],
     ["not a readable meta.pkl", "prepare the dataset"]),
    ("train", lambda c: [*TINY_MODEL, f"--data_dir={c.unfinished_data}", f"--out_dir={_fresh(c, 'c')}"],
     ["was not completely prepared", "prepare it again"]),
    ("train", lambda c: [*TINY_MODEL, f"--data_dir={c.cut_data}", f"--out_dir={_fresh(c, 'c')}"],
     ["meta.pkl records", "prepare the dataset again"]),
    ("finetune", lambda c: [f"--in_dir={c.transformed}", f"--data_dir={c.unfinished_data}",
                            f"--out_dir={_fresh(c, 'f')}"], ["was not completely prepared"]),
    ("eval_geometry", lambda c: [f"--ref_dir={c.trained}", f"--data_dir={c.cut_data}", f"--out_dir={_fresh(c, 'g')}"],
     ["meta.pkl records"]),
    # train.py: output and resume
    ("train", lambda c: _train(c, f"--out_dir={c.trained}"), ["already exists", "--overwrite=True"]),
    ("train", lambda c: _train(c, f"--out_dir={c.a_file}"), ["is a file"]),
    ("train", lambda c: _train(c, f"--out_dir={c.empty_dir}", "--init_from=resume"), ["no checkpoint at"]),
    ("train", lambda c: _train(c, f"--out_dir={c.trained}", "--init_from=resume", "--n_layer=3"),
     ["contradict", "n_layer=3 (checkpoint: 2)"]),
    ("train", lambda c: _train(c, f"--out_dir={c.corrupt_ckpt}", "--init_from=resume"),
     ["not a readable PyTorch checkpoint"]),
    ("train", lambda c: _train(c, f"--out_dir={c.trained}", "--init_from=resume", f"--data_dir={c.other_data}"),
     ["differs from the data's", "--data_dir"]),
    # transform.py
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=16", "--device=cuda"],
     ["CUDA is not available", "--device=cpu"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=16", "--device=mps"],
     ["MPS backend is not available", "--device=cpu"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=16", "--device=cpu:1"],
     ["device='cpu:1' is not a torch device"]),
    ("eval_geometry", lambda c: [f"--ref_dir={c.trained}", f"--out_dir={_fresh(c, 'g')}", "--device=cuda"],
     ["CUDA is not available", "--device=cpu"]),
    ("finetune", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 'f')}", "--device=cuda"],
     ["CUDA is not available", "--device=cpu"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=0"],
     ["width must be a positive integer"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=33",
                             "--porting=sandwich"], ["must be divisible by n_head=2"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=64", "--kind=pca"],
     ["kind='pca' shrinks or keeps the width"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=16", "--kind=jl"],
     ["kind='jl' is not one of"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=16", "--kind=pca",
                             "--learn_decay=cosine"],
     ["learn_decay='cosine' schedules a learned map", "--learn_steps"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=16", "--kind=pca",
                             "--learn_steps=2", "--learn_label_weight=2"],
     ["learn_label_weight=2", "a number in [0, 1]"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=32",
                             "--grow_mask_iters=50"], ["grow_mask_iters need width > d=32"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=64",
                             "--grow_reader_std=-0.02"], ["grow_reader_std must be >= 0"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=16",
                             "--porting=heads"], ["porting='heads' is not one of"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=16", "--norms=fodl"],
     ["norms='fodl' is not one of"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={c.trained}", "--width=40"],
     ["where the input checkpoint", "another --out_dir"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={c.trained}", "--width=40", "--overwrite=True"],
     ["where the input checkpoint"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={c.transformed}", "--width=40"],
     ["already exists", "--overwrite=True"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={c.a_file}", "--width=40"], ["is a file"]),
    ("transform", lambda c: [f"--in_dir={c.empty_dir}", f"--out_dir={_fresh(c, 't')}", "--width=8"],
     ["no checkpoint at"]),
    ("transform", lambda c: [f"--in_dir={c.foreign_ckpt}", f"--out_dir={_fresh(c, 't')}", "--width=8"],
     ["not a nanoLGPT/nanoGPT checkpoint"]),
    ("transform", lambda c: [f"--in_dir={c.corrupt_ckpt}", f"--out_dir={_fresh(c, 't')}", "--width=8"],
     ["not a readable PyTorch checkpoint"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=40",
                             f"--data_dir={c.other_data}"], ["differs from the data's", "--data_dir"]),
    ("transform", lambda c: [f"--in_dir={c.no_dataset}", f"--out_dir={_fresh(c, 't')}", "--width=40"],
     ["records no dataset", "--data_dir"]),
    ("transform", lambda c: [f"--in_dir={c.moved_data}", f"--out_dir={_fresh(c, 't')}", "--width=40"],
     ["holds no train.bin (moved or deleted?)", "--data_dir"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=16",
                             "--grow_noise=0.5"], ["grow_noise applies when growing"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=40",
                             "--kind=gaussian", "--keep_layernorm=True"], ["keep_layernorm needs kind='orthogonal'"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=16",
                             "--calib_batches=0"], ["calib_batches must be a positive integer"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=16",
                             "--eval_iters=-1"], ["eval_iters must be >= 0"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=16", "--jl_eps=2"],
     ["jl_eps must lie in [0.001, 1)"]),
    # finetune.py
    ("finetune", lambda c: [f"--out_dir={_fresh(c, 'f')}"], ["in_dir is required"]),
    ("finetune", lambda c: [f"--in_dir={c.transformed}", f"--out_dir={c.transformed}"],
     ["where the input checkpoint"]),
    ("finetune", lambda c: [f"--in_dir={c.transformed}", f"--out_dir={c.trained}"],
     ["already exists", "--overwrite=True"]),
    ("finetune", lambda c: [f"--in_dir={c.transformed}", f"--out_dir={_fresh(c, 'f')}", f"--data_dir={c.other_data}"],
     ["differs from the data's"]),
    ("finetune", lambda c: [f"--in_dir={c.transformed}", f"--out_dir={_fresh(c, 'f')}", "--recover_tol=-1"],
     ["recover_tol must be >= 0"]),
    ("finetune", lambda c: [f"--in_dir={c.transformed}", f"--out_dir={_fresh(c, 'f')}", "--n_layer=3"],
     ["contradict", "n_layer=3"]),
    ("finetune", lambda c: [f"--in_dir={c.transformed}", f"--out_dir={_fresh(c, 'f')}", "--block_size=999"],
     ["contradict", "block_size=999 (checkpoint: 16)", "a smaller block_size"]),
    ("finetune", lambda c: [f"--in_dir={c.no_dataset}", f"--out_dir={_fresh(c, 'f')}"], ["records no dataset"]),
    # eval_geometry.py
    ("eval_geometry", lambda c: [f"--in_dir={c.transformed}"], ["ref_dir is required"]),
    ("eval_geometry", lambda c: [f"--ref_dir={c.trained}", f"--out_dir={_fresh(c, 'g')}", "--n_probes=100000000"],
     ["n_probes=100000000", "GiB", "is available", "lower --n_probes"]),
    ("eval_geometry", lambda c: [f"--ref_dir={c.copy}", f"--in_dir={c.transformed}", f"--out_dir={_fresh(c, 'g')}"],
     ["was transformed from", "--allow_unrelated=True"]),
    ("eval_geometry", lambda c: [f"--ref_dir={c.trained}", f"--in_dir={c.other_tokenizer}",
                                 f"--out_dir={_fresh(c, 'g')}"], ["different tokenizers"]),
    ("eval_geometry", lambda c: [f"--ref_dir={c.trained}", f"--out_dir={c.a_file}"], ["is a file"]),
    ("eval_geometry", lambda c: [f"--ref_dir={c.trained}", f"--out_dir={_fresh(c, 'g')}", "--n_probes=0"],
     ["n_probes must be a positive integer"]),
    ("eval_geometry", lambda c: [f"--ref_dir={c.trained}", f"--out_dir={_fresh(c, 'g')}",
                                 f"--data_dir={c.other_data}"], ["differs from the data's"]),
    # sample.py
    ("sample", lambda c: [f"--out_dir={c.trained}", "--top_k=0"], ["top_k must be a positive integer"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", "--temperature=0"], ["temperature must be > 0"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", f"--start=FILE:{c.tmp}/nope.txt"], ["no such file"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", f"--start=FILE:{c.empty_dir}"], ["no such file"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", f"--start=FILE:{c.binary_file}"], ["is not UTF-8 text"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", "--device=cuda"], ["CUDA is not available"]),
    ("sample", lambda c: [f"--out_dir={c.empty_dir}"], ["no checkpoint at"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", "--batch_size=4"], ["needs --save_to"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", f"--save_to={c.tmp}/no/such/s.txt"], ["does not exist"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", f"--save_to={c.empty_dir}"], ["is a directory"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", "--dtype=float64"], ["dtype must be one of", "bfloat16"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", f"--continue_data={c.data}"], ["go together"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", f"--continue_data={c.empty_dir}", f"--data_out={_fresh(c, 'd')}"],
     ["holds no train.bin", "prepare it first"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", f"--continue_data={c.data}", f"--data_out={c.data}"],
     ["another folder"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", f"--continue_data={c.data}", f"--data_out={c.empty_dir}"],
     ["exists", "--overwrite=True"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", f"--continue_data={c.data}", f"--data_out={_fresh(c, 'd')}",
                          "--prompt_tokens=0"], ["must be > 0 with --data_out"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", f"--continue_data={c.other_data}",
                          f"--data_out={_fresh(c, 'd')}"], ["is tokenized with", "prepare the data with the model's"]),
    ("sample", lambda c: [f"--out_dir={c.no_meta_small_vocab}"], ["records no tokenizer that fits", "--from_nanogpt"]),
    ("sample", lambda c: [f"--out_dir={c.trained}", "--start=ÆØÅ"], ["are not in this model's vocabulary"]),
    # convert.py
    ("convert", lambda c: [f"--out_dir={_fresh(c, 'c')}"], ["give exactly one of"]),
    ("convert", lambda c: [f"--from_nanogpt={c.empty_dir}", f"--out_dir={_fresh(c, 'c')}"], ["no checkpoint at"]),
    ("convert", lambda c: [f"--to_hf={_fresh(c, 'hf')}"], ["--in_dir=DIR (our checkpoint) is required"]),
    ("convert", lambda c: [f"--from_nanogpt={c.trained}", f"--out_dir={c.trained}"], ["where the input checkpoint"]),
    ("train", lambda c: _train(c, "--max_iters=0"), ["max_iters=0 trains nothing", "--eval_only=True"]),
    ("finetune", lambda c: [f"--in_dir={c.transformed}", f"--out_dir={_fresh(c, 'f')}", "--reference_val_loss=0"],
     ["reference_val_loss must be > 0"]),
    ("transform", lambda c: [f"--in_dir={c.trained}", f"--out_dir={_fresh(c, 't')}", "--width=16", "--block_size=999"],
     ["block_size=999 exceeds the model's context of 16"]),
    ("eval_geometry", lambda c: [f"--ref_dir={c.trained}", f"--out_dir={_fresh(c, 'g')}", "--block_size=-1"],
     ["block_size must be >= 0"]),
    ("prepare", lambda c: [f"--out_dir={_fresh(c, 'p')}"], ["give exactly one of --tokenizer_from"]),
    ("prepare", lambda c: ["--tokenizer=bpe", f"--out_dir={_fresh(c, 'p')}"], ["--tokenizer='bpe' is not one of"]),
    ("prepare", lambda c: ["--tokenizer=char", f"--input={c.tmp}/nope.txt", f"--out_dir={_fresh(c, 'p')}"],
     ["--input=", "no such file"]),
    ("prepare", lambda c: [f"--tokenizer_from={c.tmp}/nothing", f"--out_dir={_fresh(c, 'p')}"],
     ["no such directory"]),
    ("prepare", lambda c: [f"--tokenizer_from={c.empty_dir}", f"--out_dir={_fresh(c, 'p')}"],
     ["has no tokenizer.json"]),
    # models that are not what they claim
    ("transform", lambda c: [f"--in_dir={c.nan_weights}", f"--out_dir={_fresh(c, 't')}", "--width=16"],
     ["holds NaN in transformer.h.0.mlp.c_fc.weight", "train it again"]),
    ("finetune", lambda c: [f"--in_dir={c.inf_weights}", f"--out_dir={_fresh(c, 'f')}"],
     ["holds infinite values in transformer.h.0.mlp.c_fc.weight"]),
    ("train", lambda c: _train(c, f"--out_dir={c.nan_weights}", "--init_from=resume"), ["holds NaN"]),
    ("eval_geometry", lambda c: [f"--ref_dir={c.nan_weights}", f"--out_dir={_fresh(c, 'g')}"], ["holds NaN"]),
    ("sample", lambda c: [f"--out_dir={c.inf_weights}"], ["holds infinite values"]),
    ("convert", lambda c: [f"--from_nanogpt={c.nan_weights}", f"--out_dir={_fresh(c, 'c')}"], ["holds NaN"]),
    ("eval_geometry", lambda c: [f"--ref_dir={c.trained}", f"--in_dir={c.other_width}", f"--out_dir={_fresh(c, 'g')}"],
     ["(width 40) records no transform", "--allow_unrelated=True"]),
    # writers that would replace what they did not make
    ("eval_geometry", lambda c: [f"--ref_dir={c.trained}", f"--out_dir={_holding(c, 'g', 'metrics.json')}"],
     ["already holds a geometry report", "--overwrite=True"]),
    ("convert", lambda c: [f"--in_dir={c.trained}", f"--to_hf={_holding(c, 'hf', 'config.json')}"],
     ["already holds an export (config.json)", "--overwrite=True"]),
    ("convert", lambda c: [f"--in_dir={c.trained}", f"--to_hf={c.a_file}"], ["is a file", "give a directory"]),
]


def _hash(path: str) -> str:
    return hashlib.sha256(open(os.path.join(path, "ckpt.pt"), "rb").read()).hexdigest()


@pytest.mark.filterwarnings("error::UserWarning")  # a warning before the error line is noise a newcomer reads first
@pytest.mark.parametrize("script,argv,words", CASES, ids=[f"{s}-{i}" for i, (s, _, _) in enumerate(CASES)])
def test_bad_input_gets_one_clear_line_and_changes_nothing(ctx, script, argv, words, capsys):
    protected = [ctx.trained, ctx.transformed]
    before = [_hash(p) for p in protected]
    rc = run_cli(importlib.import_module(script).main, argv(ctx))
    err = capsys.readouterr().err.strip()
    assert rc == 1, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
    assert [_hash(p) for p in protected] == before
    assert not os.path.exists(os.path.join(ctx.tmp, "fresh")), "a failing command created its out_dir"


@pytest.mark.parametrize("script", ["transform", "sample", "eval_geometry", "finetune"])
def test_a_huge_finite_weight_is_refused_by_name(ctx, script, capsys):
    """3e38 is finite: it once passed every check, was transformed into a model predicting uniformly (exit 0),
    and made sample and eval_geometry raise tracebacks."""
    ckpt = torch.load(os.path.join(ctx.trained, "ckpt.pt"), weights_only=False)
    huge = os.path.join(ctx.tmp, "huge-weight")
    if not os.path.exists(huge):
        _variant(ctx.trained, huge, model=_spoiled(ckpt["model"], 3e38))
    argv = {"transform": [f"--in_dir={huge}", f"--out_dir={_fresh(ctx, 't')}", "--width=40", "--eval_iters=0"],
            "sample": [f"--out_dir={huge}", "--max_new_tokens=5"],
            "eval_geometry": [f"--ref_dir={huge}", f"--out_dir={_fresh(ctx, 'g')}"],
            "finetune": [f"--in_dir={huge}", f"--out_dir={_fresh(ctx, 'f')}", "--max_iters=2"]}[script]
    rc = run_cli(importlib.import_module(script).main, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "magnitude 3e+38 in transformer.h.0.mlp.c_fc.weight" in err[0], err
    assert not os.path.exists(os.path.join(ctx.tmp, "fresh")), "a failing command created its out_dir"


def test_convert_from_an_empty_directory_names_the_directory_not_the_cache(ctx, capsys):
    pytest.importorskip("transformers")
    argv = [f"--from_hf={ctx.empty_dir}", f"--out_dir={_fresh(ctx, 'h')}"]
    rc = run_cli(importlib.import_module("convert").main, argv)
    err = capsys.readouterr().err
    assert rc == 1 and "without config.json" in err and "HF_HUB_OFFLINE" not in err


@pytest.mark.slow
@pytest.mark.parametrize("args,words", [
    (["data/shakespeare_char/prepare.py", "--input=/no/such/file"], ["does not exist", "--input"]),
    (["data/shakespeare_char/prepare.py", "--input={short}"], ["has 18 characters", "at least 1000"]),
    (["data/openwebtext/prepare.py", "--text_files", "/no/such.txt"], ["no such file"]),
])
def test_data_preparation_errors(tmp_path, args, words):
    short = tmp_path / "short.txt"
    short.write_text("To be or not to be")
    cmd = [sys.executable, os.path.join(ROOT, args[0]), *[a.format(short=short) for a in args[1:]],
           f"--out_dir={tmp_path / 'out'}"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    err = result.stderr.strip()
    assert result.returncode == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert not (tmp_path / "out").exists()


def test_overwrite_replaces_a_run_and_starts_its_metrics_afresh(ctx, tmp_path):
    from lgpt.plumbing.configurator import load_config
    from train import TrainConfig, train
    out = tmp_path / "run"
    train(load_config(TrainConfig, _train(ctx, f"--out_dir={out}", "--eval_interval=2")))
    first = (out / "metrics.jsonl").read_text()
    train(load_config(TrainConfig, _train(ctx, f"--out_dir={out}", "--eval_interval=2", "--overwrite=True")))
    assert (out / "metrics.jsonl").read_text().count("\n") == first.count("\n")


def test_stale_temp_files_of_killed_writers_are_removed(tmp_path):
    from lgpt.plumbing.checkpoint import save_checkpoint
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"ckpt.pt.tmp{dead.pid}"
    stale.write_bytes(b"half a checkpoint")
    live = tmp_path / f"ckpt.pt.tmp{os.getppid()}"  # a running writer's file is left alone
    live.write_bytes(b"in progress")
    save_checkpoint({"model": {}, "model_args": {}}, str(tmp_path))
    assert not stale.exists() and live.exists() and (tmp_path / "ckpt.pt").exists()


def test_resume_from_a_transform_output_starts_a_fresh_optimizer(ctx, tmp_path, capsys):
    from lgpt.plumbing.configurator import load_config
    from train import TrainConfig, train
    out = tmp_path / "resumed"
    shutil.copytree(ctx.transformed, out)
    summary = train(load_config(TrainConfig, [*TINY_MODEL[1:3], "--n_embd=40", "--max_iters=3", "--eval_interval=3",
                                              f"--data_dir={ctx.data}", f"--out_dir={out}", "--init_from=resume"]))
    assert summary["iter_num"] == 3 and "a fresh optimizer starts" in capsys.readouterr().out


def test_an_interrupted_run_is_not_complete_for_the_experiment_harness(ctx, tmp_path, monkeypatch):
    """A SIGINT'd training run raises Interrupted: the harness writes no done.json, and the next call trains
    again (overwriting the partial run) instead of reusing it."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import harness
    import train as train_module
    from lgpt.plumbing.cli import Interrupted
    monkeypatch.setattr(harness, "RUNS", str(tmp_path))
    setting = harness.Setting(quick=True)
    args = [*TINY_MODEL, f"--data_dir={ctx.data}", "--max_iters=6", "--eval_interval=3"]
    real_check = train_module.stop_requested

    def signalled_at_iter_2(state, rt):
        if state.iter_num == 2:
            state.stop_signal = "SIGINT"  # what the SIGINT handler does
        return real_check(state, rt)

    monkeypatch.setattr(train_module, "stop_requested", signalled_at_iter_2)
    with pytest.raises(Interrupted):
        harness.trained(setting, "partial", args=args)
    (out,) = [p for p in tmp_path.iterdir() if p.name.startswith("train-partial") and p.is_dir()]
    is_complete = importlib.import_module("lgpt.plumbing.checkpoint").is_complete
    assert not (out / "done.json").exists() and not is_complete(str(out))
    monkeypatch.setattr(train_module, "stop_requested", real_check)
    assert harness.trained(setting, "partial", args=args) == str(out)
    assert (out / "done.json").exists() and torch.load(out / "ckpt.pt", weights_only=False)["iter_num"] == 6


def test_eval_only_reports_and_leaves_the_run_as_it_was(ctx, tmp_path, capsys):
    import shutil

    import train
    run = tmp_path / "run"
    shutil.copytree(ctx.trained, run)
    metrics = (run / "metrics.jsonl").read_bytes() if (run / "metrics.jsonl").exists() else None
    before = _hash(str(run))
    assert run_cli(train.main, [f"--out_dir={run}", "--init_from=resume", "--eval_only=True", "--eval_iters=2",
                                f"--data_dir={ctx.data}", "--block_size=16",
                                "--progress_bar=False"]) == 0
    out = capsys.readouterr()
    assert "evaluated at iter" in out.out and "Traceback" not in out.err
    assert _hash(str(run)) == before
    assert ((run / "metrics.jsonl").read_bytes() if (run / "metrics.jsonl").exists() else None) == metrics


def test_generation_never_samples_ids_past_the_tokenizer():
    """A vocabulary padded past its tokenizer (GPT-2: 50304 > 50257) has ids that decode to nothing."""
    import torch

    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64)).eval()
    with torch.no_grad():
        model.lm_head.weight[40:] += 5.0  # the padded ids would win almost every draw
    out = model.generate(torch.zeros(4, 1, dtype=torch.long), 30, vocab_limit=40)
    assert int(out.max()) < 40
    assert int(model.generate(torch.zeros(4, 1, dtype=torch.long), 30).max()) >= 40  # the test can fail


@pytest.mark.parametrize("script", ["train", "finetune", "transform", "eval_geometry", "convert", "prepare"])
def test_a_second_writer_of_a_run_directory_is_refused_while_the_first_holds_it(ctx, script, tmp_path, capsys):
    from lgpt.plumbing.checkpoint import LOCK_NAME, hold_run_dir
    out = str(tmp_path / "run")
    text = tmp_path / "input.txt"
    text.write_text(synthetic_text(3000))
    argv = {"train": _train(ctx, f"--out_dir={out}"),
            "finetune": [f"--in_dir={ctx.transformed}", f"--out_dir={out}", "--max_iters=2"],
            "transform": [f"--in_dir={ctx.trained}", f"--out_dir={out}", "--width=16", "--eval_iters=0"],
            "eval_geometry": [f"--ref_dir={ctx.trained}", f"--out_dir={out}", "--wandb_log=False"],
            "convert": [f"--from_nanogpt={ctx.trained}", f"--out_dir={out}"],
            "prepare": ["--tokenizer=char", f"--input={text}", f"--out_dir={out}"]}[script]
    with hold_run_dir(out, "the first writer"):  # an flock from another open file: as another process holds it
        rc = run_cli(importlib.import_module(script).main, argv)
        err = capsys.readouterr().err.strip()
        assert rc == 1 and err == (f"error: '{out}' is being written by another run (pid {os.getpid()}: the first "
                                   "writer); wait for it to finish or choose another --out_dir"), err
        assert os.listdir(out) == [LOCK_NAME]  # nothing of the second writer's
    assert not os.path.exists(out)  # the holder made the directory for its lock and wrote nothing: gone again


def test_a_lock_left_by_a_killed_writer_is_taken_over_with_a_note(ctx, tmp_path, capsys):
    from lgpt.plumbing.checkpoint import LOCK_NAME
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).write_text("pid 999999: train.py")  # its holder died (kill -9) without removing it
    assert run_cli(importlib.import_module("train").main, _train(ctx, f"--out_dir={out}")) == 0
    err = capsys.readouterr().err
    assert "had the lock of a run that is no longer running (pid 999999: train.py): taken over" in err
    assert (out / "ckpt.pt").exists() and not (out / LOCK_NAME).exists()


def test_two_train_processes_on_one_out_dir_one_trains_the_other_is_refused(ctx, tmp_path):
    out = str(tmp_path / "run")
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *_train(ctx, f"--out_dir={out}", "--max_iters=300",
                                                                   "--eval_interval=300")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):  # until the first holds the directory
            if os.path.exists(os.path.join(out, ".lock")):
                break
            first.poll()
            assert first.returncode is None, first.communicate()
            import time
            time.sleep(0.05)
        second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    finally:
        out_first, err_first = first.communicate(timeout=300)
    assert first.returncode == 0, err_first
    assert second.returncode == 1 and "is being written by another run (pid" in second.stderr, second.stderr
    assert "train.py" in second.stderr and second.stdout == ""


def test_a_source_changed_since_its_transform_is_refused_as_the_reference(ctx, tmp_path, capsys):
    """Retraining a transform's source in place must not silently make the new model the reference."""
    from transform import TransformConfig, transform_checkpoint
    source, out = str(tmp_path / "source"), str(tmp_path / "t")
    shutil.copytree(ctx.trained, source)
    transform_checkpoint(TransformConfig(in_dir=source, out_dir=out, width=48, kind="orthogonal", eval_iters=0))
    ckpt = torch.load(os.path.join(source, "ckpt.pt"), weights_only=False)
    ckpt["model"]["transformer.h.0.mlp.c_fc.weight"] += 0.01  # the source "retrained" in place
    torch.save(ckpt, os.path.join(source, "ckpt.pt"))
    for script, argv in [("eval_geometry", [f"--ref_dir={source}", f"--in_dir={out}", f"--out_dir={tmp_path / 'g'}",
                                            "--wandb_log=False"]),
                         ("finetune", [f"--in_dir={out}", f"--out_dir={tmp_path / 'f'}", "--max_iters=2"]),
                         ("finetune", [f"--in_dir={out}", f"--out_dir={tmp_path / 'f'}", "--max_iters=2",
                                       "--distill=True"])]:
        assert run_cli(importlib.import_module(script).main, argv) == 1
        err = capsys.readouterr().err
        assert f"'{source}' has changed since the transform read it" in err, err
    assert not os.path.exists(tmp_path / "g") and not os.path.exists(tmp_path / "f")


def test_an_interrupted_source_gives_a_transform_marked_incomplete_with_a_note(ctx, tmp_path, capsys):
    from lgpt.plumbing.checkpoint import is_complete
    interrupted = _variant(ctx.trained, str(tmp_path / "interrupted"), complete=False)
    out = str(tmp_path / "t")
    argv = [f"--in_dir={interrupted}", f"--out_dir={out}", "--width=16", "--eval_iters=0"]
    assert run_cli(importlib.import_module("transform").main, argv) == 0
    assert "in_dir is an interrupted training run" in capsys.readouterr().out
    assert not is_complete(out) and is_complete(ctx.transformed)


def test_checkpoint_py_on_a_cut_off_checkpoint_exits_1_without_a_traceback(ctx, tmp_path):
    """python -m lgpt.plumbing.checkpoint DIR (for shell scripts) once raised the zip reader's RuntimeError on a
    cut-off file."""
    cut = tmp_path / "cut"
    cut.mkdir()
    data = open(os.path.join(ctx.trained, "ckpt.pt"), "rb").read()
    (cut / "ckpt.pt").write_bytes(data[: len(data) // 3])
    done = subprocess.run([sys.executable, "-m", "lgpt.plumbing.checkpoint", str(cut)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr


def test_the_reference_counts_the_table():
    readme = open(os.path.join(ROOT, "docs", "reference.md")).read()
    assert f"holds the table: {len(CASES)} bad command lines" in readme


def test_resuming_with_the_config_file_the_run_started_with_takes_the_architecture_from_the_checkpoint(
        ctx, tmp_path, capsys):
    """A transformed model (width 40) resumed with a config file that says another width: the checkpoint's
    architecture is used, with a note; the run's records hold what was used, not the file's values."""
    from lgpt.plumbing.checkpoint import load_checkpoint
    run = str(tmp_path / "run")
    shutil.copytree(ctx.transformed, run)
    config = tmp_path / "original.py"
    config.write_text("n_layer = 2\nn_embd = 32\nn_head = 2\nblock_size = 16\nbias = True\n")
    argv = [str(config), f"--out_dir={run}", "--init_from=resume", f"--data_dir={ctx.data}", "--max_iters=2",
            "--eval_iters=1", "--eval_interval=1", "--batch_size=2"]
    assert run_cli(importlib.import_module("train").main, argv) == 0
    err = capsys.readouterr().err
    assert "note: the architecture comes from the checkpoint" in err and "n_embd=32 (checkpoint: 40)" in err
    ckpt = load_checkpoint(run)
    assert ckpt["config"]["n_embd"] == ckpt["model_args"]["n_embd"] == 40
    assert {k: ckpt["config"][k] for k in ("n_layer", "bias", "block_size")} == {
        k: ckpt["model_args"][k] for k in ("n_layer", "bias", "block_size")}


# ----------------------------------------------------------------------------------------------
# A full disk, a killed preparation, unbounded work


def _limited_file_size(limit: int):
    import resource

    def apply() -> None:  # in the child: writes past ``limit`` bytes fail with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_at_save_is_one_line_and_the_previous_checkpoint_survives(ctx, tmp_path):
    run = str(tmp_path / "run")
    shutil.copytree(ctx.trained, run)
    before = _hash(run)
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *_train(ctx, f"--out_dir={run}", "--init_from=resume",
                                                                   "--max_iters=64", "--eval_interval=2")]
    done = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=300, preexec_fn=_limited_file_size(60_000))
    err = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert err[-1].startswith("error: could not write") and "free disk space" in err[-1], err
    assert _hash(run) == before and sorted(os.listdir(run)) == ["ckpt.pt", "metrics.jsonl"]  # no temp file left


def test_a_full_disk_in_any_other_writer_is_one_line(ctx, tmp_path):
    out, text = str(tmp_path / "data"), str(tmp_path / "text.txt")
    open(text, "w").write(synthetic_text(60_000))
    cmd = [sys.executable, os.path.join(ROOT, "prepare.py"), "--tokenizer=char", f"--input={text}", f"--out_dir={out}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          preexec_fn=_limited_file_size(20_000))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().startswith("error: could not write") and "File too large" in done.stderr
    assert not os.path.exists(out)  # a failed preparation into a new directory leaves nothing behind


def test_a_killed_preparation_leaves_a_dataset_every_reader_refuses_until_prepared_again(ctx, tmp_path, capsys,
                                                                                        monkeypatch):
    import prepare
    from lgpt.plumbing import dataset
    data = str(tmp_path / "data")
    text = str(tmp_path / "text.txt")
    open(text, "w").write(synthetic_text(20_000))
    assert run_cli(prepare.main, ["--tokenizer=char", f"--input={text}", f"--out_dir={data}"]) == 0
    other = str(tmp_path / "other.txt")  # another vocabulary: new ids must never sit beside the old meta.pkl
    open(other, "w").write(synthetic_text(20_000, seed=3).upper())

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the kill between the token files and meta.pkl
    monkeypatch.setattr(dataset, "write_meta", killed)
    assert run_cli(prepare.main, ["--tokenizer=char", f"--input={other}", f"--out_dir={data}",
                                  "--overwrite=True"]) == 130
    monkeypatch.undo()
    capsys.readouterr()
    out = _fresh(ctx, "after_kill")
    assert run_cli(importlib.import_module("train").main, [*TINY_MODEL, f"--data_dir={data}", f"--out_dir={out}",
                                                           "--max_iters=2"]) == 1
    assert "was not completely prepared" in capsys.readouterr().err and not os.path.exists(out)
    assert run_cli(prepare.main, ["--tokenizer=char", f"--input={other}", f"--out_dir={data}",
                                  "--overwrite=True"]) == 0
    assert dataset.load_meta(data)["stoi"].keys() == set(open(other).read())
    assert not os.path.exists(os.path.join(data, PREPARING_MARKER))


def test_resume_drops_the_metrics_rows_a_run_logged_past_its_last_checkpoint(ctx, tmp_path, capsys):
    from lgpt.plumbing.logger import read_metrics
    run = str(tmp_path / "run")
    shutil.copytree(ctx.trained, run)
    path = os.path.join(run, "metrics.jsonl")
    last = torch.load(os.path.join(run, "ckpt.pt"), weights_only=False)["iter_num"]
    rows = read_metrics(path)
    with open(path, "a") as f:  # what a run killed (or whose save failed) after its checkpoint had logged
        f.write(f'{{"iter": {last}, "train/lm_loss": 9.0}}\n{{"iter": {last + 1}, "val/loss": 9.0}}\n'
                f'{{"iter": {last + 2}, "tr')
    assert run_cli(importlib.import_module("train").main, _train(ctx, f"--out_dir={run}", "--init_from=resume",
                                                                 f"--max_iters={last + 2}")) == 0
    assert "3 metrics rows logged after the checkpoint's iteration" in capsys.readouterr().out
    after = read_metrics(path)
    assert after[:len(rows)] == rows and 9.0 not in [r.get("val/loss", r.get("train/lm_loss")) for r in after]
    iters = [(r["iter"], "val/loss" in r) for r in after]
    assert len(iters) == len(set(iters))  # no step logged twice


def test_sample_streams_tokens_as_they_come_and_stops_cleanly_on_ctrl_c(ctx):
    import signal
    import time
    cmd = [sys.executable, os.path.join(ROOT, "sample.py"), f"--out_dir={ctx.trained}", "--max_new_tokens=100000000",
           "--num_samples=1", "--start=The "]
    def as_a_shell_starts_it() -> None:  # SIGINT unblocked and at its default, whatever the test process inherited
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=as_a_shell_starts_it)
    try:
        first = proc.stdout.read(40)  # arrives while the 10^8 tokens are still being generated
        time.sleep(0.5)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert first.startswith(b"The ") and len(first) == 40
    assert proc.returncode == 130 and b"Ctrl-C stops" in err and b"Traceback" not in err, err


def test_streamed_text_equals_the_whole_decode_even_across_multibyte_characters():
    from lgpt.plumbing.dataset import Tokenizer
    from sample import text_pieces
    tokenizer = Tokenizer({"tokenizer": "gpt2", "vocab_size": 50257})
    text = "Ünïcödé — 漢字 and emoji 🎭🎭 in a stream"
    ids = tokenizer.encode(text)
    pieces = list(text_pieces(iter(ids), tokenizer))
    assert "".join(pieces) == text and len(pieces) > 1 and not any("\ufffd" in p for p in pieces)


def test_the_geometry_memory_estimate_covers_the_probes_it_builds(ctx):
    from eval_geometry import GeometryConfig, collect_probes, geometry_memory
    from lgpt.plumbing.checkpoint import load_model
    ref, _ = load_model(ctx.trained)
    new, _ = load_model(ctx.transformed)
    from lgpt.plumbing.dataset import BatchLoader
    loader = BatchLoader(ctx.data, 16, 16)
    cfg = GeometryConfig(ref_dir=ctx.trained, n_probes=2048)
    probes = collect_probes(ref, new, loader, cfg.n_probes, cfg.probe_batches, cfg.seed, False)
    built = probes["X"].nbytes + probes["Y"].nbytes + sum(h.nbytes for h in probes["ref_hidden"] + probes["new_hidden"])
    assert geometry_memory(cfg, ref, new, 16) >= built
    double = GeometryConfig(ref_dir=ctx.trained, n_probes=4096)
    assert geometry_memory(double, ref, new, 16) - geometry_memory(cfg, ref, new, 16) >= probes["X"].nbytes * 2


def test_a_staged_result_appears_whole_or_leaves_the_old_one_as_it_was(tmp_path, monkeypatch):
    """checkpoint.staged_dir: the files move in with the marker last; an error while writing leaves an older
    complete result untouched; an error in the middle of the move leaves no marker (reads as incomplete)."""
    from lgpt.plumbing.checkpoint import staged_dir
    target = tmp_path / "report"
    with staged_dir(str(target), "metrics.json") as staging:
        for name in ("metrics.json", "a.png", "b.png"):
            (tmp_path / staging / name).write_text("first")
    assert sorted(os.listdir(target)) == ["a.png", "b.png", "metrics.json"]
    with pytest.raises(RuntimeError), staged_dir(str(target), "metrics.json") as staging:
        (tmp_path / staging / "a.png").write_text("second")
        raise RuntimeError("the figures failed")
    assert {p.name: p.read_text() for p in target.iterdir()} == {"a.png": "first", "b.png": "first",
                                                                "metrics.json": "first"}
    moved = []
    real_replace = os.replace

    def replace(src, dst):
        if moved:
            raise OSError("the move stopped")
        moved.append(os.path.basename(dst))
        real_replace(src, dst)
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError), staged_dir(str(target), "metrics.json") as staging:
        for name in ("metrics.json", "a.png", "b.png"):
            (tmp_path / staging / name).write_text("third")
    assert moved == ["a.png"] and not (target / "metrics.json").exists()  # the marker goes first, comes last
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


SIGTERM_MID_WRITE = """
import os, signal, sys
sys.path.insert(0, {root!r})
from lgpt.plumbing.checkpoint import staged_dir
from lgpt.plumbing.cli import run_cli

def main(argv):
    with staged_dir(argv[0], "config.json") as staging:
        open(os.path.join(staging, "model.safetensors"), "w").write("weights")
        os.kill(os.getpid(), signal.SIG{sig})
        open(os.path.join(staging, "config.json"), "w").write("never")

raise SystemExit(run_cli(main, [{target!r}]))
"""


@pytest.mark.parametrize("sig", ["TERM", "HUP"])
def test_sigterm_or_sighup_in_the_middle_of_a_write_leaves_nothing_half_made(sig, tmp_path):
    target = str(tmp_path / "export")
    proc = subprocess.run([sys.executable, "-c", SIGTERM_MID_WRITE.format(root=ROOT, sig=sig, target=target)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130 and f"interrupted (SIG{sig})" in proc.stderr and "Traceback" not in proc.stderr
    assert os.listdir(tmp_path) == []  # neither the export nor its staging directory


def test_eval_geometry_stopped_by_sigterm_after_its_figures_leaves_no_report(ctx, tmp_path):
    out = str(tmp_path / "geom")
    script = f"""
import os, signal, sys
sys.path.insert(0, {ROOT!r})
import eval_geometry
from lgpt.plumbing.cli import run_cli
drawn = eval_geometry.cosine_heatmaps
def then_stop(*args, **kwargs):
    path = drawn(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return path
eval_geometry.cosine_heatmaps = then_stop
raise SystemExit(run_cli(eval_geometry.main, ["--ref_dir={ctx.trained}", "--in_dir={ctx.transformed}",
                 "--out_dir={out}", "--n_probes=300", "--eval_iters=2", "--probe_batches=1", "--wandb_log=False"]))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 130 and "SIGTERM" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert os.listdir(tmp_path) == []  # no out_dir with figures and no metrics.json, no staging directory


def test_a_staged_result_merges_into_folders_it_did_not_make(tmp_path):
    """eval_geometry into a training run's folder once replaced the run's wandb/ logs with its own (rmtree of a
    folder it did not make); a folder of the result now merges in, and a file never replaces a folder."""
    from lgpt.plumbing.checkpoint import staged_dir
    from lgpt.plumbing.errors import CheckpointError
    (tmp_path / "run" / "wandb" / "offline-run-1").mkdir(parents=True)
    (tmp_path / "run" / "wandb" / "offline-run-1" / "log").write_text("the training run's")
    with staged_dir(str(tmp_path / "run"), "metrics.json") as staging:
        os.makedirs(os.path.join(staging, "wandb", "offline-run-2"))
        open(os.path.join(staging, "wandb", "offline-run-2", "log"), "w").write("the report's")
        open(os.path.join(staging, "metrics.json"), "w").write("{}")
    assert sorted(os.listdir(tmp_path / "run" / "wandb")) == ["offline-run-1", "offline-run-2"]
    assert (tmp_path / "run" / "wandb" / "offline-run-1" / "log").read_text() == "the training run's"
    with pytest.raises(CheckpointError, match="did not make"), staged_dir(str(tmp_path / "run"), "x") as staging:
        open(os.path.join(staging, "wandb"), "w").write("a file where a folder is")
    assert (tmp_path / "run" / "wandb" / "offline-run-1" / "log").exists()


def test_a_dict_that_is_not_a_checkpoint_is_not_a_complete_run(tmp_path):
    from lgpt.plumbing.checkpoint import is_complete
    (tmp_path / "bogus").mkdir()
    torch.save({"hello": 1}, tmp_path / "bogus" / "ckpt.pt")
    assert not is_complete(str(tmp_path / "bogus"))


def test_a_failed_run_removes_its_own_new_files_only(tmp_path):
    """A failed command cleans up what it wrote (metrics.jsonl, wandb/), not a file another process made in the same
    folder meanwhile (a shared results folder once lost a colleague's notes/)."""
    from lgpt.plumbing.checkpoint import hold_run_dir
    out = tmp_path / "shared"
    out.mkdir()
    (out / "keep.txt").write_text("there before")
    with pytest.raises(RuntimeError), hold_run_dir(str(out), "train.py"):
        (out / "metrics.jsonl").write_text("{}\n")
        (out / "wandb").mkdir()
        (out / "notes").mkdir()
        (out / "notes" / "n.txt").write_text("another process's")
        raise RuntimeError("training diverged")
    assert sorted(os.listdir(out)) == ["keep.txt", "notes"]


def test_the_second_attack_passes_inputs_are_one_line_each(tmp_path, trained_dir, char_data_dir):
    """A damaged control's finetune.json, a jl_eps of 1e-300, a ridge of 1e308 and a single geometry probe each
    ended in a traceback."""
    import json

    from eval_geometry import GeometryConfig
    from finetune import FinetuneConfig, read_control
    from lgpt.plumbing.errors import ConfigError, TransformError
    from transform import TransformConfig, transform_checkpoint
    control = tmp_path / "control"
    control.mkdir()
    for damaged in ("{bad", "[1, 2]", json.dumps({"config": {"eval_seed": None}, "curve": []})):
        (control / "finetune.json").write_text(damaged)
        with pytest.raises(ConfigError, match="its finetune.json is damaged"):
            read_control(FinetuneConfig(in_dir=trained_dir, control_dir=str(control), data_dir=char_data_dir))
    for option, words in ((dict(jl_eps=1e-300), "jl_eps must lie in"), (dict(refit="all", refit_ridge=1e308),
                                                                          "refit_ridge=1e\\+308 is beyond 1e6")):
        with pytest.raises((TransformError, ConfigError), match=words):
            cfg = TransformConfig(in_dir=trained_dir, out_dir=str(tmp_path / "t"), width=16, data_dir=char_data_dir,
                                  eval_iters=0, **option)
            cfg.validate()  # what the command line runs first
            transform_checkpoint(cfg)
        assert not (tmp_path / "t").exists()
    with pytest.raises(ConfigError, match="n_probes=1: .* at least 2"):
        GeometryConfig(ref_dir=trained_dir, n_probes=1).validate()
