"""
Token datasets: preparation (text → train.bin / test.bin / val.bin / meta.pkl), the tokenizer recorded in
meta.pkl, the one batch loader every script uses, and the one loss-evaluation helper.

A prepared dataset directory holds ``train.bin``, ``val.bin`` and ``test.bin`` (uint16 token ids, memory-mapped;
uint32 when the vocabulary exceeds 65536 symbols, recorded as meta['dtype']) and ``meta.pkl`` ({'tokenizer': 'char'
| 'gpt2' | 'hf', 'vocab_size', for 'char' 'stoi'/'itos', for 'hf' the Hugging Face tokenizer's files}): nanoGPT's
layout plus a test split. The three splits are the protocol's (docs/findings.md, "The protocol"): train
(calibration, finetuning), val — the *dev* split, where every choice is made — and test, read only by the final run
of a chosen recipe: a loader refuses it unless opened with ``test_for=RECIPE``, which appends the opening to the
dataset's ``test_reads.json`` (so how many recipes, and how many times, read test is counted, never hidden).
nanoGPT's own datasets (``prepare_main``, ``ensure_prepared``) keep its two splits: NANOGPT_TEST_FRACTION.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import threading
import urllib.request
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import numpy as np
import torch

from lgpt.plumbing.errors import DataError
from lgpt.plumbing.logger import progress

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_ENV = "TINYSHAKESPEARE_PATH"  # a local copy of tinyshakespeare's input.txt
DATASETS = {"shakespeare_char": "char", "shakespeare": "gpt2"}
# nanoGPT's own datasets (data/shakespeare*/prepare.py and train.py's automatic preparation) keep its two splits,
# train 90% / val 10%, so nanoGPT's numbers and every char-model result in results/ reproduce; prepare.py writes
# three (the protocol's) for any text
NANOGPT_TEST_FRACTION = 0.0
REPO_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # lgpt/plumbing/ → the repo
GPT2_META = {"tokenizer": "gpt2", "vocab_size": 50257}  # what nanoGPT assumes when a checkpoint names no tokenizer


def dataset_dir(dataset: str, data_dir: str = "") -> str:
    """The one rule for where a dataset lives: an explicit ``data_dir`` wins, else data/<dataset> in the repo."""
    return data_dir or os.path.join(REPO_DIR, "data", dataset)


# ----------------------------------------------------------------------------------------------
# Preparation


def read_shakespeare(input_path: str | None = None) -> str:
    """tinyshakespeare from ``input_path``, else $TINYSHAKESPEARE_PATH, else the nanoGPT download URL."""
    path = input_path or os.environ.get(SHAKESPEARE_ENV)
    if path:
        if not os.path.isfile(path):
            raise DataError(f"tinyshakespeare input '{path}' does not exist; pass --input PATH or set "
                            f"{SHAKESPEARE_ENV} to the path of tinyshakespeare.txt")
        with open(path, encoding="utf-8") as f:
            return f.read()
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=30) as response:
            return response.read().decode("utf-8")
    except OSError as e:
        raise DataError(f"could not download tinyshakespeare from {SHAKESPEARE_URL} ({e}). Offline, point at a "
                        f"local copy: --input PATH, or export {SHAKESPEARE_ENV}=PATH "
                        "(here: ../shared/data/tinyshakespeare.txt)") from e


def read_text_file(path: str, flag: str) -> str:
    """A UTF-8 text file's contents, or one DataError naming ``flag`` (the option that gave the path)."""
    if not os.path.isfile(path):
        raise DataError(f"{flag}{path}: no such file; give the path of a UTF-8 text file")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise DataError(f"{flag}{path} is not UTF-8 text ({e.reason}); give a text file") from e


def gpt2_encoding():
    import tiktoken
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # tiktoken raises requests/ssl errors when offline without a cache
        raise DataError(f"tiktoken could not load the GPT-2 BPE ({e.__class__.__name__}: {e}). Offline, set "
                        "TIKTOKEN_CACHE_DIR to a directory holding its cached files "
                        "(here: ../shared/tiktoken_cache)") from e


def atomic_write(path: str, write) -> None:
    """Write ``path`` through ``write(file)`` into a temporary file, then rename it into place: a failed or
    interrupted write leaves no half-written file."""
    tmp = f"{path}.tmp{os.getpid()}-{threading.get_ident()}"  # threads of one process never share a temp file
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):  # a failed write (a full disk) leaves nothing behind
            os.remove(tmp)


def token_dtype(meta: dict | None) -> type:
    """The integer type of a dataset's token files: uint16 (nanoGPT's), or uint32 for vocabularies above 2^16."""
    return np.uint32 if (meta or {}).get("dtype") == "uint32" else np.uint16


def write_split(ids: np.ndarray, path: str, dtype: type = np.uint16) -> None:
    if ids.size and int(ids.max()) >= np.iinfo(dtype).max + 1:
        raise DataError(f"token id {int(ids.max())} does not fit {np.dtype(dtype).name}")
    atomic_write(path, lambda f: f.write(ids.astype(dtype).tobytes()))


MIN_TEXT_CHARS = 1000


def split_points(chars: int, val_fraction: float, test_fraction: float) -> tuple[int, int]:
    """Where train ends and where val begins: train = [0, a), test = [a, b), val = [b, chars). Val keeps nanoGPT's
    place (the text's last ``val_fraction``), so a dev number measured before test existed still reads the same
    text; test is carved from just before it, where no choice was ever scored (calibration before the three splits
    did draw windows there: a run on this protocol calibrates on train alone)."""
    b = int(chars * (1 - val_fraction))
    return int(chars * (1 - val_fraction - test_fraction)), b


def prepare_text(text: str, out_dir: str, tokenizer: str | dict, val_fraction: float = 0.1,
                 test_fraction: float = 0.1) -> dict:
    """Tokenize ``text`` and write the dataset to ``out_dir``: train (the first 80%), test (the next 10%), val = dev
    (the last 10%, as nanoGPT's val). ``test_fraction=0`` writes nanoGPT's two splits (90% / 10%).
    ``tokenizer``: 'char' (built from the text), 'gpt2', or a tokenizer description (a checkpoint's meta)."""
    if not (0 < val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise DataError(f"val_fraction={val_fraction} and test_fraction={test_fraction} must be fractions that leave "
                        "a train split (0 < val, 0 ≤ test, val + test < 1)")
    if len(text) < MIN_TEXT_CHARS:
        raise DataError(f"the input text has {len(text)} characters; a dataset needs at least {MIN_TEXT_CHARS} "
                        "(its val split is the last 10%) — give a larger text file")
    train_end, val_start = split_points(len(text), val_fraction, test_fraction)
    if isinstance(tokenizer, dict):
        meta = {k: v for k, v in tokenizer.items() if k not in ("fingerprint", "dtype", "tokens")}
    elif tokenizer == "char":
        chars = sorted(set(text))
        meta = {"tokenizer": "char", "vocab_size": len(chars),
                "stoi": {ch: i for i, ch in enumerate(chars)}, "itos": dict(enumerate(chars))}
    elif tokenizer == "gpt2":
        meta = {"tokenizer": "gpt2", "vocab_size": gpt2_encoding().n_vocab}
    else:
        raise DataError(f"tokenizer={tokenizer!r} is not one of ('char', 'gpt2') or a checkpoint's tokenizer")
    meta["fingerprint"] = tokenizer_fingerprint(meta)
    if meta["vocab_size"] > 2**16:
        meta["dtype"] = "uint32"
    tok = Tokenizer(meta)
    parts = [("train", text[:train_end]), ("val", text[val_start:])]
    if test_fraction:
        parts.insert(1, ("test", text[train_end:val_start]))
    splits = [(name, np.array(tok.encode(part), dtype=np.int64)) for name, part in parts]  # all encoded first
    for name, ids in splits:
        if len(ids) < 2:
            raise DataError(f"the {name} split would hold {len(ids)} tokens: give a larger text, or a larger "
                            f"--{'test' if name == 'test' else 'val'}_fraction (--test_fraction=0: no test split)")
    with writing_dataset(out_dir) as tokens:
        if not test_fraction and os.path.exists(os.path.join(out_dir, "test.bin")):
            os.remove(os.path.join(out_dir, "test.bin"))  # a two-split dataset keeps no test of an older text
        for name, ids in splits:
            write_split(ids, os.path.join(out_dir, f"{name}.bin"), token_dtype(meta))
            tokens[name] = len(ids)
            print(f"{name}: {len(ids):,} tokens")
        meta = write_meta(out_dir, meta, tokens)
    return meta


TEST_READS = "test_reads.json"  # in a dataset directory: every opening of its test split, oldest first


def reads_of_test(data_dir: str) -> list[dict]:
    """Every opening of ``data_dir``'s test split: [{'recipe', 'fingerprint', 'tokens', 'time', 'pid'}], oldest
    first (``recipes_of_test`` counts the distinct recipes)."""
    path = os.path.join(data_dir, TEST_READS)
    if not os.path.exists(path):
        return []
    try:
        with open(path, encoding="utf-8") as f:
            reads = json.load(f)
        if not isinstance(reads, list) or not all(isinstance(r, dict) and isinstance(r.get("recipe"), str)
                                                  for r in reads):
            raise ValueError("not a list of {'recipe': ...}")
    except (OSError, ValueError) as e:
        raise DataError(f"'{path}' is damaged ({e}); it counts the reads of the test split, so it is never "
                        "rewritten from scratch: restore it from version control or a backup") from None
    return reads


def recipes_of_test(data_dir: str) -> list[str]:
    """The distinct recipes that have read ``data_dir``'s test split, in the order of their first read."""
    return list(dict.fromkeys(r["recipe"] for r in reads_of_test(data_dir)))


@contextmanager
def directory_lock(path: str) -> Iterator[None]:
    """An exclusive advisory lock on the directory ``path`` itself (no lock file left behind): the read-modify-write
    of test_reads.json by two processes that evaluate beside each other loses no entry."""
    import fcntl
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def record_test_read(data_dir: str, recipe: str) -> None:
    """Append one opening of the test split by ``recipe`` to the dataset's test_reads.json — every opening, so a
    recipe changed under the same name and read again shows as a second read; what a headline quotes is the
    number of distinct recipes (``recipes_of_test``) and of reads."""
    import time
    meta = load_meta(data_dir) or {}
    entry = {"recipe": recipe, "fingerprint": meta.get("fingerprint"),
             "tokens": (meta.get("tokens") or {}).get("test"), "time": round(time.time(), 3), "pid": os.getpid()}
    with directory_lock(data_dir):
        reads = reads_of_test(data_dir)
        atomic_write(os.path.join(data_dir, TEST_READS),
                     lambda f: f.write(json.dumps(reads + [entry], indent=1).encode()))


PREPARING_MARKER = ".preparing"  # in a dataset directory while it is written: not yet one dataset


@contextmanager
def writing_dataset(out_dir: str) -> Iterator[dict]:
    """Write a dataset in place so that no reader ever takes a part-written one for a dataset: a marker file names
    the directory unfinished from before the first byte (the old meta.pkl goes at once, so new ids never sit beside
    an old vocabulary) until after the new meta.pkl, which records the token count of each split (the manifest the
    BatchLoader checks). A kill anywhere in between leaves a directory every reader refuses. Yields the dict the
    writer fills with {split: tokens}."""
    os.makedirs(out_dir, exist_ok=True)
    marker = os.path.join(out_dir, PREPARING_MARKER)
    with open(marker, "w") as f:
        f.write(f"pid {os.getpid()}")
    if os.path.exists(os.path.join(out_dir, "meta.pkl")):
        os.remove(os.path.join(out_dir, "meta.pkl"))
    tokens: dict[str, int] = {}
    yield tokens
    os.remove(marker)


def write_meta(out_dir: str, meta: dict, tokens: dict[str, int]) -> dict:
    """meta.pkl, the tokenizer description plus the manifest: how many tokens each split's .bin holds."""
    meta = dict(meta, tokens=dict(tokens))
    atomic_write(os.path.join(out_dir, "meta.pkl"), lambda f: pickle.dump(meta, f))
    return meta


def check_prepared(data_dir: str) -> None:
    """Refuse a dataset directory whose preparation never finished (killed or still running)."""
    if os.path.exists(os.path.join(data_dir, PREPARING_MARKER)):
        raise DataError(f"the dataset in '{data_dir}' was not completely prepared (its preparation was interrupted "
                        "or is still running); prepare it again (prepare.py --overwrite=True, or "
                        "data/<name>/prepare.py)")


def data_dir_for_checkpoint(ckpt: dict, data_dir: str = "", flag: str = "--data_dir") -> str:
    """The data a checkpoint's model reads: an explicit ``data_dir`` wins, then the one its config records
    (data_dir, else data/<dataset>). A checkpoint that records no dataset (imported, hand-made) needs ``flag``:
    there is no silent default. A recorded directory that is gone is an error too (never re-created there),
    except the repo's own data/<dataset> of a dataset the project can prepare itself."""
    if data_dir:
        return data_dir
    config = ckpt.get("config") or {}
    dataset = config.get("dataset") or ""
    recorded = config.get("data_dir") or (dataset_dir(dataset) if dataset else "")
    if not recorded:
        raise DataError(f"the checkpoint records no dataset (imported or hand-made); pass {flag}=DIR, a dataset "
                        "prepared with the model's tokenizer")
    if not os.path.exists(os.path.join(recorded, "train.bin")):
        if recorded == dataset_dir(dataset) and dataset in DATASETS:
            ensure_prepared(recorded, dataset)
        else:
            raise DataError(f"the data directory '{recorded}' recorded in the checkpoint holds no train.bin (moved "
                            f"or deleted?); pass {flag}=DIR, a dataset prepared with the model's tokenizer")
    return recorded


def tokenizer_fingerprint(meta: dict | None) -> str | None:
    """A short identity of a tokenizer: its kind, vocabulary size and (char) a hash of its symbol table."""
    if not meta:
        return None
    kind = meta.get("tokenizer", "char" if "stoi" in meta else "gpt2")
    if kind == "char":
        table = json.dumps(sorted(meta["stoi"].items()), ensure_ascii=False).encode()
        return f"char-{meta['vocab_size']}-{hashlib.sha1(table).hexdigest()[:12]}"
    if kind == "hf":
        return f"hf-{meta['vocab_size']}-{hashlib.sha1(meta['files'][HF_TOKENIZER_FILE].encode()).hexdigest()[:12]}"
    return f"{kind}-{meta['vocab_size']}"


def describe_tokenizer(meta: dict | None) -> str:
    if not meta:
        return "no recorded tokenizer"
    kind = meta.get("tokenizer", "char" if "stoi" in meta else "gpt2")
    name = {"hf": "Hugging Face"}.get(kind, kind)
    return f"{name} tokenizer, {meta['vocab_size']} symbols" + (f" ({tokenizer_fingerprint(meta)})"
                                                                if kind in ("char", "hf") else "")


def check_tokenizer(model_meta: dict | None, data_dir: str, flag: str = "--data_dir",
                    vocab_size: int | None = None) -> dict | None:
    """Stop with one line when the data in ``data_dir`` was tokenized differently from the model's tokenizer
    (``model_meta``, or a checkpoint dict holding it): the model would silently read other token ids.
    Also checks the data's vocabulary fits the model's ``vocab_size``. Returns the data's meta."""
    if model_meta is not None and "model_args" in model_meta:  # a checkpoint
        vocab_size = vocab_size or model_meta["model_args"].get("vocab_size")
        model_meta = model_meta.get("meta")
    data_meta = load_meta(data_dir)
    if data_meta is None and not any(os.path.exists(os.path.join(data_dir, f"{s}.bin")) for s in ("train", "val")):
        return None  # no data at all: the loader says so in one line, a tokenizer warning first would be noise
    if data_meta is None:
        warnings.warn(f"no meta.pkl in '{data_dir}': its tokenizer cannot be checked against the model's",
                      stacklevel=2)
        return None
    ours, theirs = tokenizer_fingerprint(model_meta), tokenizer_fingerprint(data_meta)
    if ours is not None and ours != theirs:
        raise DataError(f"the model's tokenizer ({describe_tokenizer(model_meta)}) differs from the data's in "
                        f"'{data_dir}' ({describe_tokenizer(data_meta)}): the model would read other token ids. "
                        f"Pass {flag}=DIR, a dataset prepared with the model's tokenizer")
    if vocab_size is not None and data_meta["vocab_size"] > vocab_size:
        raise DataError(f"the data in '{data_dir}' has vocab_size {data_meta['vocab_size']} but the model only "
                        f"{vocab_size}; pass {flag}=DIR, a dataset prepared with the model's tokenizer")
    return data_meta


def ensure_prepared(data_dir: str, dataset: str) -> None:
    """Prepare a known dataset in place if train.bin is missing; otherwise name the command that does."""
    unfinished = os.path.exists(os.path.join(data_dir, PREPARING_MARKER))
    if os.path.exists(os.path.join(data_dir, "train.bin")) and not (unfinished and dataset in DATASETS):
        return
    if dataset not in DATASETS:
        raise DataError(f"no prepared data in '{data_dir}' (train.bin missing). Run data/{dataset}/prepare.py "
                        "first, or set data_dir to a prepared dataset directory")
    print(f"{'an unfinished dataset' if unfinished else 'no prepared data'} in {data_dir}; preparing {dataset} now")
    prepare_text(read_shakespeare(), data_dir, DATASETS[dataset], test_fraction=NANOGPT_TEST_FRACTION)


# ----------------------------------------------------------------------------------------------
# Tokenizer


HF_TOKENIZER_FILE = "tokenizer.json"  # a Hugging Face fast tokenizer, the one file that defines its ids
HF_TOKENIZER_FILES = (HF_TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def read_tokenizer_files(directory: str) -> dict[str, str]:
    """The Hugging Face tokenizer files (tokenizer.json and its configs) in ``directory``, verbatim."""
    files = {}
    for name in HF_TOKENIZER_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                files[name] = f.read()
    return files


def hf_tokenizer_meta(files: dict[str, str], special_ids: dict | None = None) -> dict:
    """The tokenizer description of a Hugging Face tokenizer: its saved files (name → text, as
    ``save_pretrained`` writes them; tokenizer.json defines the ids) and the model's special token ids."""
    from tokenizers import Tokenizer as HFTokenizer
    if HF_TOKENIZER_FILE not in files:
        raise DataError("the Hugging Face tokenizer has no tokenizer.json (a slow tokenizer only); save a fast one")
    try:
        size = max(HFTokenizer.from_str(files[HF_TOKENIZER_FILE]).get_vocab(with_added_tokens=True).values()) + 1
    except Exception as e:  # the tokenizers library raises a bare Exception for a file it cannot parse
        raise DataError(f"the Hugging Face tokenizer.json cannot be read ({str(e).splitlines()[0][:120]}); it is "
                        "damaged: save the tokenizer again (tokenizer.save_pretrained(DIR))") from e
    meta = {"tokenizer": "hf", "vocab_size": size, "files": dict(files), "special_ids": dict(special_ids or {})}
    meta["fingerprint"] = tokenizer_fingerprint(meta)
    return meta


class Tokenizer:
    """encode/decode for the tokenizer described by a dataset's meta dict (stored in every checkpoint)."""

    def __init__(self, meta: dict):
        self.meta = meta
        self.kind = meta.get("tokenizer", "char" if "stoi" in meta else "gpt2")
        self.vocab_size = meta["vocab_size"]
        if self.kind == "gpt2":
            self._enc = gpt2_encoding()
        elif self.kind == "hf":
            from tokenizers import Tokenizer as HFTokenizer
            self._hf = HFTokenizer.from_str(meta["files"][HF_TOKENIZER_FILE])

    def encode(self, text: str) -> list[int]:
        if self.kind == "char":
            stoi = self.meta["stoi"]
            unknown = sorted(set(text) - set(stoi))
            if unknown:
                raise DataError(f"characters {unknown!r} are not in this model's vocabulary")
            return [stoi[c] for c in text]
        if self.kind == "hf":  # the text as it is: no BOS/EOS added (a dataset is one stream, as nanoGPT's)
            return self._hf.encode(text, add_special_tokens=False).ids
        return self._enc.encode(text, allowed_special={"<|endoftext|>"})

    def encode_prompt(self, text: str) -> list[int]:
        """A generation prompt: as ``encode``, plus the special tokens a Hugging Face tokenizer adds itself (Llama's
        BOS), as ``tokenizer(text)`` gives them to ``generate`` in transformers."""
        if self.kind == "hf":
            return self._hf.encode(text, add_special_tokens=True).ids
        return self.encode(text)

    def decode(self, ids: list[int]) -> str:
        if self.kind == "char":
            return "".join(self.meta["itos"][i] for i in ids)
        if self.kind == "hf":
            return self._hf.decode(ids, skip_special_tokens=False)
        return self._enc.decode(ids)


class _NamesCode(pickle.UnpicklingError):
    """A pickle that names a class or function: refused before it is called."""


class _DataOnlyUnpickler(pickle.Unpickler):
    """Unpickles plain data only — dicts, lists, tuples, strings, numbers, bytes, None — which is all a meta.pkl
    holds (nanoGPT's and ours): any class or function the file names is refused before it can be called, so
    reading a meta.pkl never runs code from it."""

    def find_class(self, module: str, name: str):
        raise _NamesCode(f"it names {module}.{name}, and a meta.pkl may hold plain data only")


def load_meta(data_dir: str) -> dict | None:
    """A dataset's meta.pkl (None if it has none, as nanoGPT's OpenWebText); a half-prepared dataset is refused."""
    check_prepared(data_dir)
    path = os.path.join(data_dir, "meta.pkl")
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            meta = _DataOnlyUnpickler(f).load()
    except _NamesCode as e:
        raise DataError(f"'{path}' is not plain data ({e}); nothing was run. Prepare the dataset again "
                        "(data/<name>/prepare.py or prepare.py)") from e
    except Exception as e:  # a truncated or foreign file: UnpicklingError, EOFError, ...
        raise DataError(f"'{path}' is not a readable meta.pkl ({e.__class__.__name__}: {e}); prepare the dataset "
                        "again (data/<name>/prepare.py)") from e
    if not isinstance(meta, dict) or "vocab_size" not in meta:
        raise DataError(f"'{path}' holds no tokenizer description (a dict with vocab_size); prepare the dataset again")
    check_meta(meta, f"'{path}'")
    return meta


TOKENIZER_KINDS = ("char", "gpt2", "hf")


def check_meta(meta: object, source: str) -> None:
    """Refuse a tokenizer description (meta.pkl, or a checkpoint's 'meta') that ``Tokenizer`` could not use: the
    kind, a positive vocab_size, and for 'char' the two symbol tables, inverse to each other; for 'hf' the
    tokenizer.json text. One DataError naming what is wrong, instead of a KeyError at the first decode."""
    def bad(what: str) -> DataError:
        return DataError(f"{source}: its tokenizer description (meta) {what}; it is damaged: prepare the dataset or "
                         "train/convert the model again")
    if not isinstance(meta, dict):
        raise bad(f"is a {type(meta).__name__}, not a dict")
    kind = meta.get("tokenizer", "char" if "stoi" in meta else "gpt2")
    if kind not in TOKENIZER_KINDS:
        raise bad(f"names tokenizer {kind!r}, not one of {TOKENIZER_KINDS}")
    size = meta.get("vocab_size")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise bad(f"has vocab_size {size!r}, not a positive integer")
    if kind == "char":
        stoi, itos = meta.get("stoi"), meta.get("itos")
        if not (isinstance(stoi, dict) and isinstance(itos, dict)):
            raise bad("lacks its symbol tables (stoi and itos, two dicts)")
        if len(stoi) != size or any(not isinstance(c, str) or itos.get(i) != c for c, i in stoi.items()) \
                or len(itos) != size:
            raise bad(f"has symbol tables that do not list the same {size} symbols both ways")
    if kind == "hf" and not (isinstance(meta.get("files"), dict)
                             and isinstance(meta["files"].get(HF_TOKENIZER_FILE), str)):
        raise bad(f"lacks the Hugging Face tokenizer's {HF_TOKENIZER_FILE}")


# ----------------------------------------------------------------------------------------------
# Batches


class BatchLoader:
    """Random (x, y) windows from a prepared dataset; y is x shifted by one token.

    A batch is a pure function of (seed, iteration, micro-step, rank), so resuming from a checkpoint
    draws exactly the batches an uninterrupted run would have drawn.
    """

    def __init__(self, data_dir: str, block_size: int, batch_size: int, device: str = "cpu", test_for: str = ""):
        """``test_for``: the name of the chosen recipe whose final run this is; only then is the test split
        readable, and the read is recorded in the dataset's test_reads.json (``record_test_read``)."""
        self.data_dir, self.block_size, self.batch_size, self.device = data_dir, block_size, batch_size, device
        meta = load_meta(data_dir)
        self.dtype = token_dtype(meta)
        self.test_for = test_for
        if test_for and "test" not in ((meta or {}).get("tokens") or {}):
            raise DataError(f"the dataset in '{data_dir}' has no test split (prepared with two splits, or before "
                            "there were three); prepare it again: prepare.py --overwrite=True")
        for split in ("train", "val", "test") if test_for else ("train", "val"):
            path = os.path.join(data_dir, f"{split}.bin")
            if not os.path.exists(path):
                raise DataError(f"'{path}' is missing; prepare the dataset first (data/<name>/prepare.py)")
            size = os.path.getsize(path) // np.dtype(self.dtype).itemsize
            recorded = ((meta or {}).get("tokens") or {}).get(split)
            if recorded is not None and recorded != size:
                raise DataError(f"'{path}' holds {size:,} tokens but the dataset's meta.pkl records {recorded:,}: the "
                                "file is not the one prepared with this vocabulary (cut short, or replaced); prepare "
                                "the dataset again")
            if size <= block_size + 1:
                raise DataError(f"'{path}' holds fewer tokens than block_size={block_size} + 1")
        if test_for:  # recorded only once the loader is sure to open: a refused loader writes nothing
            record_test_read(data_dir, test_for)
        self.generator = torch.Generator()

    def tokens(self, split: str) -> np.memmap:
        if split == "test" and not self.test_for:
            raise DataError("the test split is read only by the final run of a chosen recipe: choose on val (the dev "
                            "split), then open the loader with test_for=RECIPE (it records the read)")
        if split not in ("train", "val", "test"):
            raise DataError(f"split={split!r} is not one of 'train', 'val' (dev), 'test'")
        # a fresh memmap per call avoids the memory leak nanoGPT notes for long-lived memmaps
        return np.memmap(os.path.join(self.data_dir, f"{split}.bin"), dtype=self.dtype, mode="r")

    def _to_device(self, x: torch.Tensor, y: torch.Tensor):
        if self.device.startswith("cuda"):
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def windows(self, data: np.ndarray, starts) -> tuple[torch.Tensor, torch.Tensor]:
        T = self.block_size
        x = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in starts])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype(np.int64)) for i in starts])
        return self._to_device(x, y)

    def get_batch(self, split: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of ``batch_size`` random windows, determined by ``seed``."""
        data = self.tokens(split)
        self.generator.manual_seed(seed)
        starts = torch.randint(len(data) - self.block_size - 1, (self.batch_size,), generator=self.generator)
        return self.windows(data, starts.tolist())

    def full_split_starts(self, split: str) -> list[int]:
        """Where the consecutive non-overlapping windows of ``full_split`` start."""
        return list(range(0, len(self.tokens(split)) - self.block_size - 1, self.block_size))

    def full_split(self, split: str):
        """Every token of ``split`` once, as consecutive non-overlapping windows of block_size."""
        data = self.tokens(split)
        starts = self.full_split_starts(split)
        for i in range(0, len(starts), self.batch_size):
            yield self.windows(data, starts[i:i + self.batch_size])


def window_size(asked: int, context: int) -> int:
    """The tokens per data window: ``asked`` (0: the model's ``context``), never beyond the context."""
    if asked > context:
        raise DataError(f"block_size={asked} exceeds the model's context of {context} tokens; pass at most {context}")
    return asked or context


def batch_seed(seed: int, iter_num: int, micro_step: int, rank: int = 0) -> int:
    """The seed of one training micro-batch; distinct across iterations, micro-steps and DDP ranks."""
    return hash((seed, iter_num, micro_step, rank)) & 0x7FFF_FFFF_FFFF


CALIBRATION_SEED_STRIDE = 100_000  # draws of calibration text: seed s reads batches s·STRIDE + k
# the scheme's name, recorded in a transform's checkpoint and in the experiments' cache keys for seeds ≥ 1 (seed 0
# reads what it read under the old scheme, s + k, which made draws 0–2 of 8 batches share 6–7 of them)
CALIBRATION_SEEDS = "seed * 100000 + k"


def calibration_seed(seed: int, k: int) -> int:
    """The seed of calibration batch ``k`` of draw ``seed``: seed · CALIBRATION_SEED_STRIDE + k. Two draws never
    share a batch seed for k < STRIDE — independent draws of random windows (which may still overlap by chance),
    where ``seed + k`` made draws 0–2 of 8 batches share 6–7 batches and understated the calibration's sampling
    error; draw 0 reads batch k at seed k, as it always did."""
    return seed * CALIBRATION_SEED_STRIDE + k


def calibration_scheme(seed: int) -> dict[str, str]:
    """What a cache key adds for a calibration draw: the scheme for seeds ≥ 1 (another draw than before the change),
    nothing for seed 0 (the same batches in both schemes, so its cached runs stay valid)."""
    return {"calibration_seeds": CALIBRATION_SEEDS} if seed else {}


EVAL_SEED_OFFSET = 1_000_003  # eval batches use their own fixed seeds, the same at every evaluation


def eval_batches(loader: BatchLoader, split: str, eval_iters: int, seed: int = 0):
    """The fixed evaluation batches: the same ``eval_iters`` batches at every evaluation and in every script."""
    return (loader.get_batch(split, seed + EVAL_SEED_OFFSET + k) for k in range(eval_iters))


# elements of one block of logits that evaluation holds at once (1 GiB in float32): GPT-2's 50k vocabulary would
# otherwise need (batch × context × 50257) logits, 3.3 GB for 16 × 1024, and float64 copies of them
LOGITS_BUDGET = 1 << 28


def head_rows(vocab_size: int, budget: int = LOGITS_BUDGET) -> int:
    """How many positions' logits fit in ``budget`` elements."""
    return max(1, budget // max(vocab_size, 1))


def chunked_logits(model, h: torch.Tensor, budget: int = LOGITS_BUDGET) -> Iterator[tuple[slice, torch.Tensor]]:
    """(rows, logits of those rows) for the final normed states ``h`` (..., d) flattened to (N, d), the head applied
    ``head_rows`` positions at a time, so peak memory is bounded whatever the vocabulary and batch."""
    flat = h.flatten(0, -2)
    rows = head_rows(model.config.vocab_size, budget)
    for start in range(0, len(flat), rows):
        part = slice(start, start + rows)
        yield part, model.lm_head(flat[part])


def loss_basis(loader: BatchLoader, eval_iters: int | None, seed: int = 0, split: str | None = "val") -> str:
    """What a loss from ``evaluate_loss`` was measured on, in words every printed loss carries: the same words mean
    the same tokens, so the same model gives the same number. ``split=None``: the words for losses of every split,
    each on its own fixed batches (the training log)."""
    if eval_iters is None:
        return f"full {split} split" if split else "full splits"
    batches = "batch" if eval_iters == 1 else "batches"
    kind, per = (f"{split} ", "") if split else ("", " per split")
    return (f"{eval_iters} fixed {kind}{batches} of {loader.batch_size} × {loader.block_size} tokens{per}, "
            f"eval seed {seed}")


class BosFirstLoader:
    """A BatchLoader whose random windows read ``bos`` first: (BOS, t₀ … t_{T−2}) with targets (t₀ … t_{T−1}), the
    way a model trained with a BOS token at every sequence's start reads text. Only ``get_batch`` changes (what
    calibration draws); every other attribute is the wrapped loader's."""

    def __init__(self, loader: BatchLoader, bos: int):
        self.loader, self.bos = loader, int(bos)

    def __getattr__(self, name: str):
        return getattr(self.loader, name)

    def get_batch(self, split: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, _ = self.loader.get_batch(split, seed)
        return torch.cat([torch.full_like(x[:, :1], self.bos), x[:, :-1]], 1), x


def token_losses(model, batches, ctx=None) -> Iterator[torch.Tensor]:
    """Each batch's next-token cross-entropies, shaped like its targets (batch, T), on the batch's device. The head
    is applied in chunks (``chunked_logits``): one chunk, the whole batch, unless its logits exceed LOGITS_BUDGET."""
    ctx = ctx or nullcontext()
    for x, y in batches:
        targets = y.flatten()
        nll = torch.empty(targets.numel(), device=targets.device)
        with ctx:
            h, _ = model(x, features=True)
            for part, logits in chunked_logits(model, h):
                nll[part] = torch.nn.functional.cross_entropy(logits.float(), targets[part], reduction="none")
        yield nll.view(y.shape)


def whole_split_batches(loader: BatchLoader, split: str):
    """Every window of ``split`` once, with a progress line (its count of batches known)."""
    n_batches = -(-len(loader.full_split_starts(split)) // loader.batch_size)
    return progress(loader.full_split(split), f"evaluate ({split})", n_batches, unit="batch")


@torch.no_grad()
def evaluate_loss(model, loader: BatchLoader, split: str, eval_iters: int | None, seed: int = 0,
                  ctx=None) -> float:
    """Mean LM cross-entropy of ``model`` on ``split``: over ``eval_iters`` fixed random batches, or over
    the whole split when ``eval_iters`` is None. The model is put in eval mode and restored after."""
    was_training = model.training
    model.eval()
    batches = (whole_split_batches(loader, split) if eval_iters is None else
               progress(eval_batches(loader, split, eval_iters, seed), f"evaluate ({split})", eval_iters,
                        unit="batch"))
    total, count = 0.0, 0
    for nll in token_losses(model, batches, ctx):
        total += nll.double().sum().item()
        count += nll.numel()
    model.train(was_training)
    return total / count


@torch.no_grad()
def window_losses(model, loader: BatchLoader, split: str, ctx=None) -> np.ndarray:
    """Each window's mean next-token loss over the whole ``split`` (the windows of ``full_split``, in order): the
    per-window values whose mean is ``evaluate_loss``'s whole-split loss and whose spread is its sampling error."""
    was_training = model.training
    model.eval()
    out = [nll.mean(1).double().cpu() for nll in token_losses(model, whole_split_batches(loader, split), ctx)]
    model.train(was_training)
    return torch.cat(out).numpy()


def prepare_main(tokenizer: str, default_out_dir: str, argv: list[str] | None = None) -> None:
    """The command line of data/shakespeare*/prepare.py: tokenize tinyshakespeare into ``default_out_dir``."""
    import argparse
    parser = argparse.ArgumentParser(description=f"Prepare tinyshakespeare with the {tokenizer} tokenizer.")
    parser.add_argument("--input", help=f"local tinyshakespeare.txt (default: ${SHAKESPEARE_ENV}, else download)")
    parser.add_argument("--out_dir", default=default_out_dir, help="where train.bin, val.bin, meta.pkl go")
    args = parser.parse_args(argv)
    prepare_text(read_shakespeare(args.input), args.out_dir, tokenizer, test_fraction=NANOGPT_TEST_FRACTION)
