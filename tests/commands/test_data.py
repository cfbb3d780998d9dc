import os

import numpy as np
import pytest
import torch

from conftest import synthetic_text
from lgpt.plumbing.dataset import (
    BatchLoader,
    DataError,
    Tokenizer,
    ensure_prepared,
    load_meta,
    prepare_text,
    reads_of_test,
    recipes_of_test,
)


def test_char_preparation_round_trips_in_three_disjoint_splits(tmp_path):
    text = synthetic_text(5000)
    meta = prepare_text(text, str(tmp_path), "char")
    assert meta == load_meta(str(tmp_path))
    tok = Tokenizer(meta)
    split = {name: np.fromfile(tmp_path / f"{name}.bin", dtype=np.uint16) for name in ("train", "test", "val")}
    assert tok.decode(split["train"].tolist()) + tok.decode(split["test"].tolist()) + tok.decode(
        split["val"].tolist()) == text  # train, then test, then val: disjoint and complete
    assert len(split["val"]) == len(text) - int(len(text) * 0.9)  # val (dev) is nanoGPT's last 10%, as before
    assert len(split["train"]) == int(len(text) * 0.8)
    assert meta["tokens"] == {name: len(ids) for name, ids in split.items()}


def test_two_splits_on_request_remove_an_older_test_split(tmp_path):
    text = synthetic_text(5000)
    prepare_text(text, str(tmp_path), "char")
    meta = prepare_text(text, str(tmp_path), "char", test_fraction=0)
    assert not (tmp_path / "test.bin").exists()
    assert meta["tokens"]["train"] == int(len(text) * 0.9) and "test" not in meta["tokens"]
    with pytest.raises(DataError, match="no test split"):
        BatchLoader(str(tmp_path), 8, 2, test_for="recipe")


def test_the_test_split_is_read_only_by_a_named_recipe_and_every_read_is_counted(tmp_path):
    prepare_text(synthetic_text(5000), str(tmp_path), "char")
    loader = BatchLoader(str(tmp_path), 8, 2)
    with pytest.raises(DataError, match="test split is read only by the final run of a chosen recipe"):
        next(loader.full_split("test"))
    with pytest.raises(DataError, match="test split is read only"):
        loader.get_batch("test", 0)
    assert reads_of_test(str(tmp_path)) == []
    assert not (tmp_path / "test_reads.json").exists()  # refusing wrote nothing
    with pytest.raises(DataError, match="fewer tokens than block_size"):  # a loader that cannot open records nothing
        BatchLoader(str(tmp_path), 10**6, 2, test_for="too-long-windows")
    assert not (tmp_path / "test_reads.json").exists()
    for recipe in ("free25", "learned25", "free25"):  # the same name read again is a second read, not hidden
        assert list(BatchLoader(str(tmp_path), 8, 2, test_for=recipe).full_split("test"))
    assert [r["recipe"] for r in reads_of_test(str(tmp_path))] == ["free25", "learned25", "free25"]
    assert recipes_of_test(str(tmp_path)) == ["free25", "learned25"]
    (tmp_path / "test_reads.json").write_text("{not json")
    with pytest.raises(DataError, match="test_reads.json' is damaged"):
        BatchLoader(str(tmp_path), 8, 2, test_for="free50")
    assert (tmp_path / "test_reads.json").read_text() == "{not json"  # a damaged count is never rewritten


def _record_reads(data_dir: str, who: int, rounds: int) -> None:
    from lgpt.plumbing.dataset import record_test_read
    for k in range(rounds):
        record_test_read(data_dir, f"process{who}-read{k}")


def test_processes_reading_test_beside_each_other_lose_no_read(tmp_path):
    import multiprocessing
    prepare_text(synthetic_text(5000), str(tmp_path), "char")
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_record_reads, args=(str(tmp_path), who, 15)) for who in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert sorted(r["recipe"] for r in reads_of_test(str(tmp_path))) == sorted(
        f"process{who}-read{k}" for who in range(4) for k in range(15))
    assert sorted(os.listdir(tmp_path)) == ["meta.pkl", "test.bin", "test_reads.json", "train.bin", "val.bin"]


def test_nanogpts_own_datasets_keep_its_two_splits(tmp_path, monkeypatch):
    monkeypatch.setattr("lgpt.plumbing.dataset.read_shakespeare", lambda *a: synthetic_text(5000))
    ensure_prepared(str(tmp_path / "d"), "shakespeare_char")
    assert sorted(load_meta(str(tmp_path / "d"))["tokens"]) == ["train", "val"]
    assert load_meta(str(tmp_path / "d"))["tokens"]["train"] == int(5000 * 0.9)


def test_bad_split_fractions_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(DataError, match="must be fractions that leave a train split"):
        prepare_text(synthetic_text(5000), str(tmp_path / "d"), "char", val_fraction=0.5, test_fraction=0.5)
    with pytest.raises(DataError, match="the test split would hold 0 tokens"):
        prepare_text(synthetic_text(5000), str(tmp_path / "d"), "char", test_fraction=1e-20)
    assert not (tmp_path / "d").exists()


@pytest.mark.skipif(not os.environ.get("TIKTOKEN_CACHE_DIR"), reason="needs TIKTOKEN_CACHE_DIR offline")
def test_bpe_preparation_uses_gpt2(tmp_path):
    meta = prepare_text("Hello world. " * 200, str(tmp_path), "gpt2")
    assert meta["vocab_size"] == 50257
    tok = Tokenizer(meta)
    assert tok.encode("Hello world") == [15496, 995]
    ids = np.fromfile(tmp_path / "train.bin", dtype=np.uint16)
    assert tok.decode(ids.tolist()).startswith("Hello world. Hello")


def test_batches_are_shifted_windows_and_deterministic(char_data_dir):
    loader = BatchLoader(char_data_dir, 16, 4)
    x, y = loader.get_batch("train", seed=7)
    x2, y2 = loader.get_batch("train", seed=7)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert not torch.equal(x, loader.get_batch("train", seed=8)[0])


def test_full_split_covers_every_window_once(char_data_dir):
    loader = BatchLoader(char_data_dir, 16, 4)
    n = len(loader.tokens("val"))
    seen = sum(x.numel() for x, _ in loader.full_split("val"))
    assert n - 2 * 16 <= seen <= n


def test_missing_data_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYSHAKESPEARE_PATH", str(tmp_path / "nope.txt"))
    with pytest.raises(DataError, match="TINYSHAKESPEARE_PATH"):
        ensure_prepared(str(tmp_path / "d"), "shakespeare_char")
    with pytest.raises(DataError, match="data/mydata/prepare.py"):
        ensure_prepared(str(tmp_path / "d"), "mydata")
    assert not os.path.exists(tmp_path / "d" / "train.bin")


def test_char_tokenizer_rejects_unknown_characters():
    tok = Tokenizer({"tokenizer": "char", "vocab_size": 2, "stoi": {"a": 0, "b": 1}, "itos": {0: "a", 1: "b"}})
    with pytest.raises(DataError, match="not in this model's vocabulary"):
        tok.encode("abc")


def test_openwebtext_prepare_on_local_text(tmp_path):
    pytest.importorskip("datasets")
    if not os.environ.get("TIKTOKEN_CACHE_DIR"):
        pytest.skip("needs TIKTOKEN_CACHE_DIR offline")
    import importlib.util
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location("owt", os.path.join(root, "data", "openwebtext", "prepare.py"))
    owt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(owt)
    src = tmp_path / "docs.txt"
    src.write_text("\n".join(f"document number {i} says hello" for i in range(200)))
    out = tmp_path / "owt"
    os.environ["HF_DATASETS_CACHE"] = str(tmp_path / "hf")
    owt.main(["--text_files", str(src), "--out_dir", str(out), "--val_fraction=0.1", "--num_proc=1"])
    tok = Tokenizer(load_meta(str(out)))
    train = np.fromfile(out / "train.bin", dtype=np.uint16)
    val = np.fromfile(out / "val.bin", dtype=np.uint16)
    assert (train == 50256).sum() == 180 and (val == 50256).sum() == 20  # one <|endoftext|> per document
    assert "says hello" in tok.decode(train[:20].tolist())


def test_evaluation_builds_no_autograd_graph_and_restores_the_mode(char_data_dir):
    """evaluate_loss runs under no_grad (a graph per eval batch would cost memory and time) and puts the model back
    in the mode it found it in."""
    from lgpt.plumbing.dataset import evaluate_loss, loss_basis
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64))
    seen = []
    model.register_forward_hook(lambda module, args, out: seen.append(torch.is_grad_enabled()))
    model.train()
    loader = BatchLoader(char_data_dir, 16, 4)
    loss = evaluate_loss(model, loader, "val", 2)
    assert seen == [False, False] and model.training and loss > 0
    assert loss_basis(loader, 2) == "2 fixed val batches of 4 × 16 tokens, eval seed 0"


def test_evaluate_loss_is_the_mean_token_cross_entropy_of_a_naive_loop(char_data_dir):
    """Against a loop that scores each window itself: the whole val split, and fixed batches. (A progress line once
    reused the loss sum's name and started it at the batch count: a bias of +batches/tokens.)"""
    from lgpt.plumbing.dataset import eval_batches, evaluate_loss
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64)).eval()
    loader = BatchLoader(char_data_dir, 16, 4)
    for eval_iters, batches in ((None, loader.full_split("val")), (3, eval_batches(loader, "val", 3, 0))):
        losses = []
        for x, y in batches:
            with torch.no_grad():
                logits = model(x, all_logits=True)[0]
            losses += torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").tolist()
        assert evaluate_loss(model, loader, "val", eval_iters) == pytest.approx(sum(losses) / len(losses), rel=1e-6)


class _RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_meta_pkl_that_runs_code_is_refused_before_it_runs(tmp_path, char_data_dir):
    """A dataset's meta.pkl is plain data (nanoGPT's and ours); one naming a function to call is refused unrun."""
    import pickle
    import shutil
    data = tmp_path / "data"
    shutil.copytree(char_data_dir, data)
    meta = load_meta(str(data))
    meta["itos"][0] = _RunsCode(str(tmp_path / "ran"))
    (data / "meta.pkl").write_bytes(pickle.dumps(meta))
    with pytest.raises(DataError, match="nothing was run"):
        load_meta(str(data))
    assert not (tmp_path / "ran").exists()


def test_a_named_dataset_lives_in_the_repos_data_folder_where_its_prepare_script_writes():
    from conftest import ROOT
    from lgpt.plumbing.dataset import dataset_dir
    assert dataset_dir("shakespeare_char") == os.path.join(ROOT, "data", "shakespeare_char")
    assert os.path.exists(os.path.join(dataset_dir("shakespeare_char"), "prepare.py"))
    assert dataset_dir("x", "/elsewhere") == "/elsewhere"
