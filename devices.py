"""
Where a command runs: one device resolution for every entry point, and the accelerator facts the training log
needs (the peak FLOP/s that MFU is measured against).

``resolve_device('auto' | 'cpu' | 'cuda' | 'cuda:N' | 'mps')`` returns a torch device string, or raises one
``ConfigError`` naming the fix when the device is not here — before any work is done.
"""
from __future__ import annotations

import torch

from errors import ConfigError

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
