"""
Where a command runs: one device resolution for every entry point, and the accelerator facts the training log
needs (the peak FLOP/s that MFU is measured against).

``resolve_device('auto' | 'cpu' | 'cuda' | 'cuda:N' | 'mps')`` returns a torch device string, or raises one
``ConfigError`` naming the fix when the device is not here — before any work is done. ``setup_runtime`` adds
the precision and the DDP process: the ``Runtime`` a training run executes in.
"""
from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch.distributed import init_process_group

from lgpt.plumbing.errors import ConfigError

DEVICE_TYPES = ("cpu", "cuda", "mps")

# dense bf16/fp16 tensor-core peaks (TFLOP/s, no sparsity) from the vendors' data sheets; matched in order against
# torch.cuda.get_device_name(). float32 runs use TF32 (allow_tf32 is on), whose dense peak is half of these on
# Ampere and Hopper. --peak_tflops overrides; an unknown GPU reports no MFU rather than a wrong one.
PEAK_TFLOPS_BF16 = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("GH200", 989.0), ("A100", 312.0),
                    ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0),
                    ("RTX 4090", 165.0), ("RTX 3090", 71.0), ("V100", 125.0), ("T4", 65.0))


def resolve_device(device: str) -> str:
    """The device a command runs on; 'auto' is CUDA when a GPU is visible, else the CPU."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, index = device.partition(":")
    if kind not in DEVICE_TYPES or (index and not index.isdigit()) or (index and kind != "cuda"):
        raise ConfigError(f"device={device!r} is not a torch device; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
    if kind == "cuda":
        if not torch.cuda.is_available():
            build = "this PyTorch build has no CUDA" if torch.version.cuda is None else "no GPU is visible"
            raise ConfigError(f"device={device!r} but CUDA is not available here ({build}); use --device=cpu "
                              "(or auto)")
        if index and int(index) >= torch.cuda.device_count():
            raise ConfigError(f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA device(s) "
                              f"(cuda:0 … cuda:{torch.cuda.device_count() - 1}); pick one of them")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device={device!r} but Apple's MPS backend is not available here; use --device=cpu "
                          "(or auto)")
    return device


def peak_flops(device: str, dtype: torch.dtype, override_tflops: float = 0.0) -> float | None:
    """The peak FLOP/s MFU is measured against: ``override_tflops`` when given, else the GPU's dense bf16 peak
    from PEAK_TFLOPS_BF16 (halved for float32, which runs as TF32); None for a CPU, MPS or an unknown GPU."""
    if override_tflops > 0:
        return override_tflops * 1e12
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    for key, tflops in PEAK_TFLOPS_BF16:
        if key in name:
            return tflops * 1e12 / (2 if dtype == torch.float32 else 1)
    return None


def available_memory(device: str) -> int | None:
    """Bytes a new allocation on ``device`` can take now: the GPU's free memory, or the host's available memory
    (MemAvailable: free plus reclaimable caches). None where it cannot be told."""
    try:
        if device.startswith("cuda"):
            return torch.cuda.mem_get_info(torch.device(device))[0]
        if device == "cpu":
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
            import os
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, RuntimeError, AssertionError, AttributeError):
        return None
    return None


def check_memory(needed: int, device: str, what: str, fix: str) -> None:
    """Before starting: refuse work whose estimated memory (``needed`` bytes) exceeds what ``device`` has free,
    with one line naming ``what`` needs it and the ``fix``, instead of an out-of-memory kill minutes later."""
    free = available_memory(device)
    if free is not None and needed > free:
        raise ConfigError(f"{what} would need about {needed / 2**30:.1f} GiB on {device}, but only "
                          f"{free / 2**30:.1f} GiB is available; {fix}")


# ----------------------------------------------------------------------------------------------
# CPU threads. Torch's intra-op threads wait for each other at every operation: on a 2-core machine with the
# other core busy, two threads run up to 40× slower than one. So a command takes as many threads as there are
# idle cores when it starts (--threads=N or OMP_NUM_THREADS choose instead) and says so in its first line.

THREADS_NOTE = ""  # set by use_threads; announce_threads prints it once


def busy_cores(window: float = 0.25) -> float | None:
    """How many cores other processes keep busy now: /proc/stat's non-idle share over ``window`` seconds × the
    core count. None where /proc/stat does not exist (not Linux)."""
    import os
    import time

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    try:
        total0, idle0 = sample()
        time.sleep(window)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (1 - (idle1 - idle0) / (total1 - total0)) * (os.cpu_count() or 1)


def use_threads(requested: int | None) -> int:
    """Set torch's CPU threads: ``requested`` (--threads), else OMP_NUM_THREADS when set, else the cores not busy
    now (at least 1, at most torch's default). Records the note ``announce_threads`` prints."""
    import os
    global THREADS_NOTE
    cores = os.cpu_count() or 1
    if requested is not None:
        n, why = requested, "--threads"
    elif os.environ.get("OMP_NUM_THREADS", "").isdigit() and 0 < int(os.environ["OMP_NUM_THREADS"]) <= 1024:
        n, why = int(os.environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS"
    else:
        busy = busy_cores()
        default = torch.get_num_threads()
        n = default if busy is None else max(1, min(default, round(cores - busy)))
        why = "torch's default" if busy is None else f"{busy:.1f} of {cores} cores busy when it started"
    torch.set_num_threads(n)
    THREADS_NOTE = f"CPU threads: {n} ({why}; --threads=N chooses)"
    return n


def announce_threads(device: str, file=None) -> None:
    """Print the thread note once per process, for work on the CPU (each command's first line of work;
    sample.py: on stderr)."""
    global THREADS_NOTE
    if THREADS_NOTE and str(device).startswith("cpu"):
        print(THREADS_NOTE, file=file)
        THREADS_NOTE = ""


@dataclass
class Runtime:
    """Where and how this process runs: device, precision, DDP rank."""
    device: str
    device_type: str
    ptdtype: torch.dtype
    ddp: bool
    rank: int
    local_rank: int
    world_size: int
    peak_flops: float | None = None  # what MFU is measured against (None: not reported)

    @property
    def master(self) -> bool:
        return self.rank == 0

    def autocast(self) -> AbstractContextManager:
        """Autocast to the run's dtype (nothing in float32)."""
        if self.ptdtype == torch.float32:
            return nullcontext()
        return torch.amp.autocast(device_type=self.device_type, dtype=self.ptdtype)

    def synchronize(self) -> None:
        """Wait for this process's GPU (timings); nothing elsewhere."""
        if self.device_type == "cuda":
            torch.cuda.synchronize(self.device)


def setup_runtime(device: str, dtype: str, peak_tflops: float = 0.0) -> Runtime:
    """Pick the device (``resolve_device``) and the dtype ('auto': bfloat16 on a GPU that has it, else float32);
    join the DDP process group when launched by torchrun (RANK in the environment)."""
    ddp = int(os.environ.get("RANK", -1)) != -1
    device = resolve_device(device)
    device_type = device.split(":")[0]
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if device_type != "cuda" and dtype == "float16":
        raise ConfigError(f"dtype='float16' needs a CUDA GPU (its loss scaling is CUDA's); on {device_type} use "
                          "--dtype=bfloat16 (autocast) or float32")
    rank, local_rank, world_size = 0, 0, 1
    if ddp:
        rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
        if device_type == "cuda":
            device = f"cuda:{local_rank}"
    if device_type == "cuda":
        if ":" in device:  # cuda:N without DDP too: synchronize() and new tensors then mean that GPU
            torch.cuda.set_device(torch.device(device))
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    return Runtime(device, device_type, ptdtype, ddp, rank, local_rank, world_size,
                   peak_flops(device, ptdtype, peak_tflops))
