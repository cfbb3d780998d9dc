"""``--porting=paper_code`` against the LGPT paper's published script itself.

The script (klei22/nanoGPT ``initializations/jl_transform_ckpt.py``, commit 1a852d9b, MIT) lies unmodified in
``../shared/reference/paper_jl/``; it is run from there, never copied. A small adapter writes our checkpoint in its
repository's layout (separate ``c_attn_q/k/v`` matrices, its config keys) and reads its output back, renaming and
splitting tensors only. The script samples its own T (``--jl_type`` with its own generator) and saves it
(``--proj_out``); our ``transform.py --porting=paper_code --map_file=`` then ports with that T, and the two models
must agree weight by weight (≤ 1e-6) and in loss. So what the README says of the published code rests on running it.
"""
import os
import subprocess
import sys

import pytest
import torch

from lgpt.plumbing.checkpoint import load_checkpoint, model_from_checkpoint
from lgpt.plumbing.dataset import BatchLoader, evaluate_loss

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.path.join(os.path.dirname(ROOT), "shared", "reference", "paper_jl")
SCRIPT = os.path.join(REFERENCE, "jl_transform_ckpt.py")
JL_TYPES = ("gaussian", "sign", "sparse", "srht", "qr")  # every projection kind of the script

pytestmark = pytest.mark.skipif(not os.path.exists(SCRIPT), reason="../shared/reference/paper_jl is not beside the "
                                                                   "project")


def to_paper_layout(ckpt: dict) -> dict:
    """Our checkpoint in klei22/nanoGPT's layout: c_attn split into c_attn_q/k/v, n_head in its config."""
    args = ckpt["model_args"]
    d, n_head = args["n_embd"], args["n_head"]
    state = {}
    for name, t in ckpt["model"].items():
        if ".attn.c_attn." in name:
            for part, block in zip("qkv", t.split(d)):
                state[name.replace(".c_attn.", f".c_attn_{part}.")] = block.clone()
        else:
            state[name] = t.clone()
    config = {"n_embd": d, "n_head": n_head, "n_layer": args["n_layer"], "block_size": args["block_size"]}
    return {"model": state, "model_args": dict(config, vocab_size=args["vocab_size"]), "config": config,
            "iter_num": 0}


def from_paper_layout(paper: dict, ours_like: dict) -> dict:
    """The script's output back in our layout (c_attn_q/k/v stacked again), as a state dict."""
    state = {}
    for name, t in paper["model"].items():
        if ".attn.c_attn_q." in name:
            parts = [paper["model"][name.replace("c_attn_q", f"c_attn_{p}")] for p in "qkv"]
            state[name.replace(".c_attn_q.", ".c_attn.")] = torch.cat(parts)
        elif ".attn.c_attn_k." not in name and ".attn.c_attn_v." not in name:
            state[name] = t
    assert set(state) == set(ours_like), set(state) ^ set(ours_like)
    return state


def run_published_script(source: str, out: str, m: int, jl_type: str, seed: int, proj: str) -> dict:
    done = subprocess.run([sys.executable, SCRIPT, source, f"--out_dir={out}", f"--out_embd={m}", f"--seed={seed}",
                           f"--jl_type={jl_type}", f"--proj_out={proj}"], cwd=REFERENCE, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="100"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)


D = 64  # ≠ vocab_size (32), block_size (16) and mlp_hidden: the script maps every axis of length d by shape


@pytest.fixture(scope="module")
def trained(char_data_dir, tmp_path_factory):
    """A small trained char model of width D = 64 (2 layers, 2 heads, learned positions, LayerNorm, biases)."""
    from conftest import TINY_MODEL
    from lgpt.plumbing.configurator import load_config
    from train import TrainConfig, train
    out = str(tmp_path_factory.mktemp("paper_trained"))
    train(load_config(TrainConfig, TINY_MODEL + [f"--n_embd={D}", f"--data_dir={char_data_dir}", f"--out_dir={out}",
                                                 "--max_iters=40", "--eval_interval=40", "--learning_rate=3e-3"]))
    return out


@pytest.fixture(scope="module")
def paper_source(trained, tmp_path_factory):
    """The trained model in the published code's layout."""
    source = str(tmp_path_factory.mktemp("paper_layout"))
    torch.save(to_paper_layout(load_checkpoint(trained)), os.path.join(source, "ckpt.pt"))
    return source


@pytest.mark.parametrize("jl_type", JL_TYPES)
def test_paper_code_porting_equals_the_published_script(jl_type, trained, paper_source, char_data_dir, tmp_path):
    from lgpt.plumbing.cli import run_cli
    from transform import main as transform_main
    m = 48  # shrinking, the paper's domain
    proj = str(tmp_path / "T.pt")
    paper = run_published_script(paper_source, str(tmp_path / "paper"), m, jl_type, 7, proj)
    T = torch.load(proj)
    assert T.shape == (m, D)
    ours_dir = str(tmp_path / "ours")
    assert run_cli(transform_main, [f"--in_dir={trained}", f"--out_dir={ours_dir}", f"--width={m}",
                                    "--porting=paper_code", f"--map_file={proj}", "--eval_iters=0"]) == 0
    ours = load_checkpoint(ours_dir)
    assert ours["transform"]["kind"] == "file" and torch.equal(ours["transform"]["T"], T.float())
    theirs = from_paper_layout(paper, ours["model"])
    worst = max((theirs[k] - ours["model"][k]).abs().max().item() for k in theirs)
    assert worst <= 1e-6, worst
    # the same loss: our model class runs the script's tensors (heads re-split to m / n_head, as our rule does)
    loader = BatchLoader(char_data_dir, 16, 8)
    ours_model = model_from_checkpoint(ours).eval()
    theirs_model = model_from_checkpoint(dict(ours, model=theirs)).eval()
    ours_loss = evaluate_loss(ours_model, loader, "val", 4)
    assert abs(evaluate_loss(theirs_model, loader, "val", 4) - ours_loss) <= 1e-5
    # what the script writes into its record: the old head size, not the m / n_head its tensors are split into
    assert paper["model_args"]["n_embd"] == m and paper["model_args"]["n_qk_head_dim"] == D // 2


def test_our_orthogonal_paper_code_map_is_the_scripts_qr_map_scaling(trained, paper_source, tmp_path):
    """Our paper_code with kind='orthogonal' uses Qᵀ/√m, as the script's 'qr' kind: rows orthogonal, of norm 1/√m."""
    paper = tmp_path / "paper"
    run_published_script(paper_source, str(paper), 24, "qr", 3, str(tmp_path / "T.pt"))
    T = torch.load(tmp_path / "T.pt").double()
    assert torch.allclose(T @ T.T, torch.eye(24, dtype=torch.float64) / 24, atol=1e-6)
    from lgpt.method.maps import make_projection
    from lgpt.method.paper_rules import paper_code_projection
    ours = paper_code_projection("orthogonal", make_projection("orthogonal", D, 24, seed=3)[0])
    assert torch.allclose(ours @ ours.T, torch.eye(24, dtype=torch.float64) / 24, atol=1e-9)


def test_a_bad_map_file_is_one_line(trained, tmp_path, capsys):
    from lgpt.plumbing.cli import run_cli
    from transform import main as transform_main
    wrong = tmp_path / "wrong.pt"
    torch.save(torch.randn(8, D), wrong)
    for path, expected in ((tmp_path / "none.pt", "does not exist"), (wrong, f"must be a floating (16, {D})")):
        out = tmp_path / "out"
        assert run_cli(transform_main, [f"--in_dir={trained}", f"--out_dir={out}", "--width=16",
                                        f"--map_file={path}", "--eval_iters=0"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: map_file") and expected in err[0], err
        assert not out.exists()
