"""
Checkpoints: one format for every script (train, transform, finetune, sample, eval).

A checkpoint is a dict saved with ``torch.save``:
  model       state_dict of GPT (no ``_orig_mod.``/``module.`` prefixes)
  model_args  the GPTConfig fields, so ``GPT(GPTConfig(**ckpt['model_args']))`` rebuilds the model
  config      all run settings of the script that wrote it
  iter_num, best_val_loss, optimizer (None when there is nothing to resume), rng, meta (tokenizer)
  transform   (transformed models only) the record written by transform.py
It is always written atomically: a temporary file in the same directory, then ``os.replace``.
"""
from __future__ import annotations

import fcntl
import os
import pickle
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from lgpt.plumbing.errors import CheckpointError
from model import GPT, GPTConfig, GrowthRamp, attach_ramp, detach_ramp, plain_name

CHECKPOINT_NAME = "ckpt.pt"
REQUIRED_KEYS = ("model", "model_args")
LOCK_NAME = ".lock"  # in a directory a command is writing: the holder's pid and command line


def checkpoint_path(path_or_dir: str) -> str:
    return os.path.join(path_or_dir, CHECKPOINT_NAME) if os.path.isdir(path_or_dir) else path_or_dir


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temp_files(out_dir: str) -> list[str]:
    """Delete ``ckpt.pt.tmp<pid>`` files left by writers that died mid-write (kill -9); a live writer's
    temp file is kept. Returns the removed paths."""
    removed = []
    prefix = CHECKPOINT_NAME + ".tmp"
    for name in os.listdir(out_dir) if os.path.isdir(out_dir) else []:
        pid = name[len(prefix):]
        if name.startswith(prefix) and pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            os.remove(os.path.join(out_dir, name))
            removed.append(name)
    return removed


def save_checkpoint(ckpt: dict, out_dir: str) -> str:
    """Write ``out_dir/ckpt.pt`` atomically, so a crash mid-write never leaves a half-written file (and
    remove the temp files of earlier writers that were killed mid-write)."""
    os.makedirs(out_dir, exist_ok=True)
    remove_stale_temp_files(out_dir)
    path = os.path.join(out_dir, CHECKPOINT_NAME)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        torch.save(ckpt, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch.save reports a failed write as RuntimeError (PytorchStreamWriter)
        raise CheckpointError(f"could not write '{path}' ({write_failure(e, out_dir)}); the previous checkpoint "
                              "there, if any, is untouched: free disk space or choose another --out_dir") from e
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def write_failure(error: BaseException, directory: str) -> str:
    """A failed write's cause in words, with the free space left where it was written: a full disk, a quota or a
    file-size limit are named as such (torch.save reports them only as a failed stream write)."""
    import errno
    import shutil
    free = f"{shutil.disk_usage(directory).free / 2**30:.2f} GiB free there"
    code = getattr(error, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device, {free}"
    if code == errno.EFBIG or isinstance(error, RuntimeError):
        return f"the write stopped part-way, {free}: a full disk or a file-size limit"
    return f"{error.__class__.__name__}: {error}; {free}"


@contextmanager
def hold_run_dir(out_dir: str, command: str) -> Iterator[None]:
    """Hold ``out_dir`` exclusively while ``command`` writes it, so two writers never replace each other's
    checkpoint or interleave their metrics. The lock is an flock on ``out_dir/.lock`` (which names the holder's
    pid and command): the kernel releases it when the holder exits however it exits, so a lock file left by a
    killed process is taken over, with a note. A second writer gets one line naming the holder. On release the
    lock file goes, and so does ``out_dir`` if this call created it and nothing was written there. A path that
    cannot hold a lock (a file, an unwritable parent) is left to the command's own checks and their message."""
    created = []  # the directories this call makes, deepest first: removed again if nothing was written
    parent = os.path.abspath(out_dir)
    while parent and not os.path.exists(parent):
        created.append(parent)
        parent = os.path.dirname(parent)
    path = os.path.join(out_dir, LOCK_NAME)
    while True:
        try:
            os.makedirs(out_dir, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise CheckpointError(f"'{out_dir}' is being written by another run ({holder}); wait for it to finish "
                                  "or choose another --out_dir") from None
        if os.path.exists(path) and os.stat(path).st_ino == os.fstat(fd).st_ino:
            break
        os.close(fd)  # the holder removed the file between our open and our lock: lock the one that is there now
    left = os.read(fd, 4096).decode(errors="replace").strip()
    if left:
        print(f"note: '{out_dir}' had the lock of a run that is no longer running ({left}): taken over",
              file=sys.stderr)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}: {command}".encode(), 0)
    before = _listing(out_dir)
    try:
        yield
    except BaseException:
        _remove_unsaved(out_dir, before)
        raise
    finally:
        os.remove(path)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        for directory in created:
            if os.path.isdir(directory) and not os.listdir(directory):
                os.rmdir(directory)


def make_dirs(path: str) -> list[str]:
    """``os.makedirs(path)``, returning the folders it created (deepest first): what a failed command may remove
    again, and nothing that was there before it."""
    made = []
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        made.append(path)
        path = os.path.dirname(path)
    for folder in reversed(made):
        os.makedirs(folder, exist_ok=True)
    return made


def remove_made_dirs(made: list[str]) -> None:
    """Remove the folders ``make_dirs`` created, deepest first, each only while it is empty."""
    for folder in made:
        try:
            os.rmdir(folder)
        except OSError:  # not empty (something else wrote there) or gone: leave it, and its parents
            return


def move_in(source: str, path: str) -> None:
    """Move ``source`` to ``path``: a file replaces the file there; a folder merges into a folder there, file by
    file, so nothing already inside it that the result does not hold is removed (a training run's wandb/ logs
    beside a geometry report written into its folder)."""
    if os.path.isdir(source) and not os.path.islink(source) and os.path.isdir(path) and not os.path.islink(path):
        for name in os.listdir(source):
            move_in(os.path.join(source, name), os.path.join(path, name))
        return
    if os.path.isdir(path) and not os.path.islink(path):
        raise CheckpointError(f"'{path}' is a folder this command did not make, where its result has a file; "
                              "nothing of it was replaced: choose another output folder")
    os.replace(source, path)


@contextmanager
def staged_dir(target: str, marker: str) -> Iterator[str]:
    """Write a whole result into a staging folder inside ``target`` (yielded; inside, so the final moves never
    cross a filesystem even when ``target`` is a mount point), and only when it is complete move its files in:
    first ``marker`` — the file that makes ``target`` look complete (config.json of an export, metrics.json of a
    geometry report) — is taken away if an older result left one, then every other file goes in, the marker last.
    Whatever stops the writer (an error, Ctrl-C, SIGTERM or SIGHUP, which ``cli.run_cli`` turns into exceptions;
    not SIGKILL) leaves ``target`` as it was, and the staging folder goes in every case (with ``target`` itself
    when this call created it and it is still empty); a stop in the middle of the move leaves ``target`` without a
    marker, which reads as incomplete."""
    import shutil
    if os.path.lexists(target) and not os.path.isdir(target):  # the command's own check names it before any move
        made, staging = [], f"{os.path.abspath(target)}.tmp-{os.getpid()}"
    else:
        made = make_dirs(target)
        staging = os.path.join(os.path.abspath(target), f".staging.tmp-{os.getpid()}")
    done = False
    try:
        os.makedirs(staging)
        yield staging
        if os.path.lexists(os.path.join(target, marker)):
            os.remove(os.path.join(target, marker))
        for name in sorted(os.listdir(staging), key=lambda name: name == marker):
            move_in(os.path.join(staging, name), os.path.join(target, name))
        done = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not done:
            remove_made_dirs(made)


def _listing(out_dir: str) -> dict[str, tuple[int, int]]:
    return {name: (st.st_ino, st.st_mtime_ns) for name in os.listdir(out_dir)
            for st in [os.stat(os.path.join(out_dir, name), follow_symlinks=False)]}


def _remove_unsaved(out_dir: str, before: dict[str, tuple[int, int]]) -> None:
    """A command that failed leaves no new file that a later command could take for a result: what it created in
    ``out_dir`` goes (entries of the names the commands write; another process's files stay). Not when it saved a
    checkpoint there (complete, or marked incomplete on an interrupt), nor when it changed a file that was there
    before (a resumed run's metrics, a dataset being replaced under its 'preparing' marker): then its files stay
    together, as the command's own marks describe them."""
    import shutil
    after = _listing(out_dir) if os.path.isdir(out_dir) else {}
    if CHECKPOINT_NAME in after and after[CHECKPOINT_NAME] != before.get(CHECKPOINT_NAME) or any(
            name in after and after[name] != stamp for name, stamp in before.items() if name != LOCK_NAME):
        return
    for name in set(after) - set(before) - {LOCK_NAME}:
        if not written_by_a_command(name):  # another process's file, made while this one ran: not ours to remove
            continue
        path = os.path.join(out_dir, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)


# what the commands write into their output folder (train, finetune, transform, convert, prepare, fetch; eval_geometry
# and --to_hf stage theirs): a failed run removes only new entries of these names, never another process's file
COMMAND_OUTPUTS = {CHECKPOINT_NAME, "metrics.jsonl", "metrics.json", "finetune.json", "wandb", "train.bin", "val.bin",
                   "test.bin", "meta.pkl", "full_val_loss.json", "lm_eval", "config.json", "generation_config.json",
                   "model.safetensors", "special_tokens_map.json", "vocab.json", "merges.txt", "chat_template.jinja",
                   "added_tokens.json"}


def written_by_a_command(name: str) -> bool:
    """Whether ``name`` is one a command of ours writes in its output folder (or a temporary file of one)."""
    from lgpt.plumbing.dataset import PREPARING_MARKER
    return (name in COMMAND_OUTPUTS or name == PREPARING_MARKER or name.startswith(("tokenizer", ".staging.tmp-"))
            or ".tmp-" in name or name.endswith(".tmp"))


def check_output_dir(out_dir: str, in_dir: str = "", overwrite: bool = False,
                     also_read: dict[str, str] | None = None) -> None:
    """Before any work: refuse to write where the input checkpoint is read from (or any other checkpoint the run
    reads: ``also_read``, {flag: directory}, e.g. a teacher), where another run's checkpoint already is (unless
    ``overwrite``), or where nothing can be written. Nothing is created here."""
    out_ckpt = os.path.realpath(os.path.join(out_dir, CHECKPOINT_NAME))
    if in_dir and os.path.realpath(checkpoint_path(in_dir)) == out_ckpt:
        raise CheckpointError(f"out_dir '{out_dir}' is where the input checkpoint '{in_dir}' lives: writing there "
                              "would overwrite the model being read; choose another --out_dir")
    for flag, read in (also_read or {}).items():
        if read and os.path.realpath(checkpoint_path(read)) == out_ckpt:
            raise CheckpointError(f"out_dir '{out_dir}' is where {flag}='{read}' lives: writing there would "
                                  "overwrite a model this run reads; choose another --out_dir")
    if os.path.exists(out_ckpt) and not overwrite:
        raise CheckpointError(f"'{out_ckpt}' already exists (another run's checkpoint); choose another --out_dir, "
                              "or pass --overwrite=True to replace it")
    check_writable_dir(out_dir)


def check_writable_dir(out_dir: str) -> None:
    """Before any work: ``out_dir`` is a directory that exists or can be created, and is writable."""
    if os.path.islink(out_dir) and not os.path.exists(out_dir):
        raise CheckpointError(f"out_dir '{out_dir}' is a symbolic link to '{os.readlink(out_dir)}', which does not "
                              "exist: create the link's target first, or choose another --out_dir")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CheckpointError(f"out_dir '{out_dir}' is a file, not a directory; choose another --out_dir")
    parent = os.path.abspath(out_dir)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CheckpointError(f"cannot write to out_dir '{out_dir}' ('{parent}' is not writable); "
                              "choose another --out_dir")


# the only globals a checkpoint may name: numpy's array reconstruction, for the numpy RNG state saved with a run.
# torch.load(weights_only=True) refuses every other global, so reading a checkpoint never runs code from it.
_MULTIARRAY = getattr(np, "_core", None) or np.core  # numpy 2 names it numpy._core, numpy 1 numpy.core
SAFE_NUMPY_GLOBALS = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), _MULTIARRAY.multiarray._reconstruct]


def read_checkpoint_file(path: str, map_location: str = "cpu", mmap: bool = False):
    """torch.load of a checkpoint file without running anything it holds: tensors, containers, numbers, strings
    and numpy arrays only (a pickle that names any other class or function is refused by torch's weights-only
    unpickler, with an UnpicklingError). ``mmap``: tensors stay on disk until read (for reading a field or two)."""
    with torch.serialization.safe_globals(SAFE_NUMPY_GLOBALS):
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)


def load_checkpoint(path_or_dir: str, map_location: str = "cpu") -> dict:
    """Read and validate a checkpoint (a ckpt.pt file or a directory holding one)."""
    path = checkpoint_path(path_or_dir)
    if not os.path.exists(path):
        raise CheckpointError(f"no checkpoint at '{path}'; train one first (python train.py configs/...) "
                              "or point the directory option at a folder holding ckpt.pt")
    try:
        ckpt = read_checkpoint_file(path, map_location)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"'{path}' holds more than tensors and plain data (it names code to run on loading: "
                              f"{str(e).splitlines()[-1][:200]}); nothing was run. A checkpoint from train.py or "
                              "nanoGPT holds only data: re-save it from a trusted copy") from e
    except Exception as e:
        raise CheckpointError(f"'{path}' is not a readable PyTorch checkpoint ({e.__class__.__name__}: {e})") from e
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in REQUIRED_KEYS):
        found = sorted(ckpt)[:10] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(f"'{path}' is not a nanoLGPT/nanoGPT checkpoint: it lacks {REQUIRED_KEYS} "
                              f"(found {found}). Hugging Face GPT-2 directories are imported with "
                              "python convert.py --from_hf=DIR --out_dir=OUT")
    check_structure(ckpt, path)
    check_finite(ckpt["model"], path)
    return ckpt


# what each top-level field of a checkpoint may hold (a field may be absent: older and foreign checkpoints)
FIELD_TYPES = {"model": (dict,), "model_args": (dict,), "config": (dict, type(None)), "meta": (dict, type(None)),
               "optimizer": (dict, type(None)), "iter_num": (int,), "best_val_loss": (int, float, type(None)),
               "rng": (dict, type(None)), "transform": (dict, type(None)), "complete": (bool,)}


def check_structure(ckpt: dict, path: str) -> None:
    """Refuse a damaged checkpoint before anything reads it: every field of the right type, ``model_args`` a valid
    GPTConfig, every weight a floating tensor whose name and shape are the ones that config builds, and a readable
    tokenizer description. One CheckpointError naming the field, instead of a traceback wherever it is first used."""
    from lgpt.plumbing.configurator import config_from_dict
    from lgpt.plumbing.dataset import check_meta
    fix = "the file is damaged or was edited: use the run's original checkpoint, or train/convert it again"
    loss = ckpt.get("best_val_loss")
    if torch.is_tensor(loss) and loss.numel() == 1 and loss.is_floating_point():
        ckpt["best_val_loss"] = float(loss)  # karpathy/nanoGPT's train.py saves it as a 0-d tensor
    for key, allowed in FIELD_TYPES.items():
        if key not in ckpt:
            continue
        if not isinstance(ckpt[key], allowed) or isinstance(ckpt[key], bool) and bool not in allowed:
            raise CheckpointError(f"'{path}': its field '{key}' holds a {type(ckpt[key]).__name__}, not a "
                                  f"{' or '.join(t.__name__ for t in allowed)}; {fix}")
    try:
        config = config_from_dict(GPTConfig, clean_model_args(ckpt["model_args"]), f"'{path}' model_args")
    except ValueError as e:  # ConfigError (a wrong type) or GPTConfig's own check (an impossible value)
        raise CheckpointError(f"{str(e).rstrip('.')}; {fix}") from None
    state = clean_state_dict(ckpt["model"])
    for name, value in state.items():
        if not torch.is_tensor(value) or not value.is_floating_point():
            what = f"a {value.dtype} tensor" if torch.is_tensor(value) else f"a {type(value).__name__}"
            raise CheckpointError(f"'{path}': weight '{name}' is {what}, not a floating-point tensor; {fix}")
    blocks = {int(k.split(".")[2]) for k in state if k.startswith("transformer.h.") and k.split(".")[2].isdigit()}
    if len(blocks) != config.n_layer:  # checked before building: n_layer = 10**9 would never finish
        raise CheckpointError(f"'{path}': model_args says n_layer={config.n_layer} but its weights hold {len(blocks)} "
                              f"blocks; {fix}")
    with torch.device("meta"):
        expected = {k: v.shape for k, v in GPT(config).state_dict().items()}
    if config.head == "tied":
        expected.pop("lm_head.weight")
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    for name in sorted(set(expected) | set(state)):
        if name not in state or name not in expected or state[name].shape != expected[name]:
            problem = ("is missing" if name not in state else "is not part of this model" if name not in expected
                       else f"has shape {tuple(state[name].shape)}, model_args builds {tuple(expected[name])}")
            raise CheckpointError(f"'{path}': weight '{name}' {problem}; {fix}")
    if ckpt.get("meta") is not None:
        check_meta(ckpt["meta"], f"'{path}'")
    check_steering_records(ckpt, config, expected, path, fix)


def _bad(path: str, field: str, what: str, fix: str) -> CheckpointError:
    return CheckpointError(f"'{path}': its field '{field}' {what}; {fix}")


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62


def check_steering_records(ckpt: dict, config: GPTConfig, shapes: dict, path: str, fix: str) -> None:
    """The records that change what a command does — the schedule's position (iter_num, source_iter_num), carried
    AdamW moments and MSG's growth ramp — checked in Python before any of them reaches an optimizer or a tensor
    operation: a negative count would schedule a negative learning rate, a misshapen moment crashes natively, a
    NaN writes NaN weights."""
    for field in ("iter_num", "source_iter_num"):
        if field in ckpt and not _count(ckpt[field]):
            raise _bad(path, field, f"is {ckpt[field]!r}, not a count of iterations (an integer ≥ 0)", fix)
    carried = ckpt.get("optimizer_moments")
    if carried is not None:
        if not isinstance(carried, dict) or not isinstance(carried.get("moments"), dict):
            raise _bad(path, "optimizer_moments", "is not a record of carried moments ({'step', 'moments'})", fix)
        step = carried.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 <= step < 2**62:
            raise _bad(path, "optimizer_moments", f"has step {step!r}, not a number of steps ≥ 0", fix)
        for raw, moments in carried["moments"].items():
            name = plain_name(raw) if isinstance(raw, str) else raw  # a masked parameter's raw name
            if name not in shapes or not isinstance(moments, dict) or set(moments) != {"exp_avg", "exp_avg_sq"}:
                raise _bad(path, "optimizer_moments", f"holds an entry '{name}' that is not a weight's "
                           "(exp_avg, exp_avg_sq) pair of this model", fix)
            for key, value in moments.items():
                if not torch.is_tensor(value) or value.shape != shapes[name] or not value.is_floating_point():
                    got = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
                    raise _bad(path, "optimizer_moments", f"holds {name}.{key} of shape {got}, not the weight's "
                               f"{tuple(shapes[name])}", fix)
                if not torch.isfinite(value).all() or key == "exp_avg_sq" and (value < 0).any():
                    raise _bad(path, "optimizer_moments", f"holds {name}.{key} with non-finite"
                               + (" or negative" if key == "exp_avg_sq" else "") + " values", fix)
    ramp = ckpt.get("growth_ramp")
    if ramp is not None:
        null = ramp.get("null") if isinstance(ramp, dict) else None
        if not torch.is_tensor(null) or null.shape != (config.n_embd, config.n_embd) \
                or not torch.isfinite(null).all():
            raise _bad(path, "growth_ramp", f"lacks a finite {config.n_embd}×{config.n_embd} projection 'null'", fix)
        if not (_count(ramp.get("iters")) and ramp["iters"] > 0 and _count(ramp.get("done"))):
            raise _bad(path, "growth_ramp", "needs counts iters > 0 and done ≥ 0", fix)
        tensors = ramp.get("tensors")
        if not isinstance(tensors, list) or any(
                not isinstance(t, (list, tuple)) or len(t) != 3 or not isinstance(t[0], str)
                or plain_name(t[0]) not in shapes or t[1] not in ("rows", "columns")
                or not (t[2] is None or _count(t[2])) for t in tensors):
            raise _bad(path, "growth_ramp", "names tensors that are not (weight of this model, 'rows' | 'columns', "
                       "first new unit) triples", fix)


def clean_model_args(model_args: dict) -> dict:
    """The GPTConfig fields of a checkpoint's model_args (nanoGPT and older checkpoints hold other keys too)."""
    return {k: v for k, v in model_args.items() if k in GPTConfig.field_names()}


MAX_WEIGHT = 1e15  # beyond any trained network by orders of magnitude; one matmul of such a weight with a
#                   normalised input of a few thousand coordinates already nears float32's 3.4e38


def check_finite(state_dict: dict, source: str) -> None:
    """Refuse a model with a NaN, infinite or overflow-prone (|w| > MAX_WEIGHT) weight: everything computed from
    it would be NaN, infinite or a uniform prediction, silently."""
    for name, value in state_dict.items():
        if not (torch.is_tensor(value) and value.is_floating_point()):
            continue
        if not torch.isfinite(value).all():
            what = "NaN" if torch.isnan(value).any() else "infinite values"
            raise CheckpointError(f"'{source}' holds {what} in {name}: the model cannot be used; train it again, or "
                                  "resume from a checkpoint saved before its weights went bad")
        largest = value.abs().max().item() if value.numel() else 0.0
        if largest > MAX_WEIGHT:
            raise CheckpointError(f"'{source}' holds a weight of magnitude {largest:.3g} in {name} (over "
                                  f"{MAX_WEIGHT:.0e}: float32 arithmetic overflows on it); the file is damaged or the "
                                  "run diverged: use a checkpoint saved before its weights went bad")


def weights_fingerprint(state_dict: dict) -> str:
    """A hash of a model's weights (names, shapes, dtypes and the exact bytes of every tensor): what a transform
    records of its source, so a consumer of the record notices a source retrained or replaced in place. Bytes, not
    sums: a float sum's last bits depend on the thread count and the device, a hash of the bytes does not."""
    import hashlib
    digest = hashlib.sha1()
    for name in sorted(state_dict):
        value = state_dict[name]
        if torch.is_tensor(value):
            value = value.detach().cpu().contiguous()
            digest.update(f"{name}{tuple(value.shape)}{value.dtype}".encode())
            digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def check_transform_source(record: dict | None, source_ckpt: dict, source: str) -> None:
    """``source`` (read as ``source_ckpt``) must still be the model the transform ``record`` was made from."""
    recorded = (record or {}).get("source_fingerprint")
    if recorded and weights_fingerprint(source_ckpt["model"]) != recorded:
        raise CheckpointError(f"'{source}' has changed since the transform read it (its weights are not the ones the "
                              "transform recorded: retrained or replaced in place), so it is no longer this model's "
                              "reference; transform it again, or point to the original model")


def is_interrupted(ckpt: dict) -> bool:
    """A training run stopped before max_iters (SIGINT/SIGTERM): its checkpoint is marked ``complete: False``."""
    return ckpt.get("complete", True) is False


def clean_state_dict(state_dict: dict) -> dict:
    """Strip the prefixes torch.compile (``_orig_mod.``) and DDP (``module.``) add to parameter names, and
    nanoGPT's causal-mask buffers, so nanoGPT checkpoints load directly."""
    out = {}
    for k, v in state_dict.items():
        for prefix in ("_orig_mod.", "module."):
            if k.startswith(prefix):
                k = k[len(prefix):]
        if k.endswith(".attn.bias") and v.dim() == 4:
            continue  # the causal-mask buffer of nanoGPT's non-flash attention: not a parameter
        out[k] = v
    return out


def model_from_checkpoint(ckpt: dict, growth_masks: bool = False, **overrides) -> GPT:
    """Rebuild the GPT a checkpoint describes and load its weights (``overrides`` e.g. dropout=0.0). A checkpoint
    saved while MSG growth masks were opening (``growth_ramp``, grow.py) gives a plain model computing what the
    masked one did (the masked weights baked in), or with ``growth_masks`` the live masks (to train on)."""
    from lgpt.plumbing.configurator import config_from_dict
    args = clean_model_args(ckpt["model_args"])
    args.update(overrides)
    state = {k: v.clone() for k, v in clean_state_dict(ckpt["model"]).items()}  # the model owns its weights
    try:  # typed: an int where a float belongs (norm_eps = 1) becomes the float every consumer expects
        model = GPT.from_state_dict(config_from_dict(GPTConfig, args, "model_args"), state)
    except ValueError as e:
        raise CheckpointError(f"checkpoint weights do not match its model_args: {e}") from e
    if ckpt.get("growth_ramp"):  # grown with MSG masks not yet fully open: the model computes through them
        attach_ramp(model, GrowthRamp.from_record(ckpt["growth_ramp"]))
        if not growth_masks:
            detach_ramp(model)
    return model


def load_model(path_or_dir: str, device: str = "cpu", **overrides) -> tuple[GPT, dict]:
    """(model in eval mode on ``device``, checkpoint dict) from a checkpoint file or directory."""
    ckpt = load_checkpoint(path_or_dir)
    model = model_from_checkpoint(ckpt, **overrides).to(device)
    model.eval()
    return model, ckpt


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def is_complete(path_or_dir: str) -> bool:
    """True when a checkpoint exists and its run finished (a SIGINT/SIGTERM or mid-run save is marked
    ``complete: False``; checkpoints of transform/convert and of older versions carry no mark and count as complete)."""
    path = checkpoint_path(path_or_dir)
    if not os.path.exists(path):
        return False
    try:
        ckpt = read_checkpoint_file(path)
    except Exception:  # noqa: BLE001 - cut off or not a checkpoint (torch raises RuntimeError, EOFError, pickle's)
        return False  # a damaged file is not a complete run
    return (isinstance(ckpt, dict) and all(k in ckpt for k in REQUIRED_KEYS)  # a dict of something else is no run
            and ckpt.get("complete", True) is not False)


if __name__ == "__main__":  # for shell scripts: exit 0 iff DIR holds a complete run
    import sys
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print("usage: python -m lgpt.plumbing.checkpoint DIR   (exit 0 if DIR/ckpt.pt is a complete run, "
              "1 otherwise)")
        sys.exit(0 if len(sys.argv) == 2 else 2)
    sys.exit(0 if is_complete(sys.argv[1]) else 1)
