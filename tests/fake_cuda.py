"""CUDA's device rules checked on a CPU-only machine: ``with fake_cuda(): ...`` runs code that asks for
``device='cuda'`` on the CPU, with every tensor that went to "cuda" tagged, and raises ``DeviceMixError`` —
the error CUDA raises — wherever an operation mixes a tagged tensor with a non-scalar CPU tensor, and
``TypeError`` where ``.numpy()`` touches a tagged tensor.

How: a ``__torch_function__`` mode. Tensors stay real CPU tensors (values, autograd, optimizers all work),
tagged by identity when they are created on or moved to "cuda" (``.to``, ``.cuda``, ``device=`` in a
factory, ``.data =``) and when they are the result of an operation on a tagged tensor; ``.device`` and
``.is_cuda`` of a tagged tensor report ``cuda:0``, so ``torch.zeros(n, device=x.device)`` is tagged too.
``torch.cuda.is_available`` and friends are patched to a one-GPU machine.

Limits (why a real GPU run is still worth having):
- only code that goes through Python's torch API is seen: ops inside C++ kernels and autograd's backward are
  not checked (gradients are tagged when read through ``.grad``);
- one fake device: ``cuda:0`` and ``cuda:1`` are not told apart;
- nothing about CUDA numerics, bf16 kernels, memory or streams; ``torch.compile`` is not traced (keep it off).
Why not FakeTensorMode or the meta device: they carry no values (``.item()`` and data-dependent control flow
fail), and autograd on a fake CUDA tensor needs a CUDA device guard that CPU builds of PyTorch lack.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

CUDA = torch.device("cuda", 0)
# functions that take tensors of two devices on CUDA too: copies across devices, metadata queries
# (CUDA indexes a CUDA tensor with CPU indices, and assigns CPU values into it)
EXEMPT = {"copy_", "__set__", "__get__", "set_", "__getitem__", "__setitem__", "_has_compatible_shallow_copy_type",
          "is_same_size", "_is_view",
          "is_set_to", "__setstate__", "__reduce_ex__", "_make_subclass"}


class DeviceMixError(RuntimeError):
    """An operation mixed a (fake) CUDA tensor with a CPU tensor: CUDA would raise here."""


class FakeCudaMode(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.on_cuda = WeakIdKeyDictionary()
        self.mixes: list[str] = []

    def tagged(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t in self.on_cuda

    def tag(self, out):
        def one(t):
            if isinstance(t, torch.Tensor):
                self.on_cuda[t] = True
            return t
        return tree_map(one, out)

    def target_device(self, args, kwargs):
        """Where ``Tensor.to(*args, **kwargs)`` goes: a device argument, or another tensor's (fake) device."""
        device = kwargs.get("device")
        for a in args:
            if isinstance(a, (str, torch.device)):
                device = a
            elif isinstance(a, torch.Tensor):
                device = CUDA if self.tagged(a) else torch.device("cpu")
        return device

    def move(self, func, args, kwargs):
        """``Tensor.to`` / ``Tensor.cuda``: run on the CPU; a move to "cuda" makes a new, tagged tensor."""
        source = args[0]
        device = "cuda" if func is torch.Tensor.cuda else self.target_device(args[1:], kwargs)
        if func is torch.Tensor.cuda:
            out = source
        else:
            cpu_args = ["cpu" if isinstance(a, (str, torch.device)) else a for a in args[1:]]
            cpu_kwargs = {k: ("cpu" if k == "device" else v) for k, v in kwargs.items()}
            cpu_args = [a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in cpu_args]
            out = torch.Tensor.to(source, *cpu_args, **cpu_kwargs)
        if device is None:  # a dtype change stays where it is
            return self.tag(out) if self.tagged(source) else out
        to_cuda = torch.device(device).type == "cuda"
        if out is source and to_cuda != self.tagged(out):  # a real device change makes a new tensor
            out = out.detach().clone().requires_grad_(out.requires_grad)
        return self.tag(out) if to_cuda else out

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if func == torch.Tensor.device.__get__:
            return CUDA if self.tagged(args[0]) else func(*args)
        if func == torch.Tensor.is_cuda.__get__:
            return self.tagged(args[0])
        if func == torch.Tensor.data.__set__:
            func(*args)
            if self.tagged(args[1]):
                self.on_cuda[args[0]] = True
            else:
                self.on_cuda.pop(args[0], None)
            return None
        if func == torch.Tensor.grad.__get__:
            grad = func(*args)
            return self.tag(grad) if grad is not None and self.tagged(args[0]) else grad
        if func in (torch.Tensor.numpy, torch.Tensor.__array__) and self.tagged(args[0]):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first.")
        if func is torch.Tensor.pin_memory:
            return args[0]
        if func is torch.Tensor.cpu:
            out = func(*args, **kwargs)
            return out.clone() if self.tagged(args[0]) else out  # a copy on the host, untagged
        if func in (torch.Tensor.to, torch.Tensor.cuda):
            return self.move(func, args, kwargs)
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        on_cuda = any(self.tagged(t) for t in tensors)
        on_cpu = [tuple(t.shape) for t in tensors if not self.tagged(t) and t.dim() > 0]
        if on_cuda and on_cpu and name not in EXEMPT:
            message = (f"Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
                       f"cpu! ({name}: cpu operands of shapes {on_cpu})")
            self.mixes.append(message)
            raise DeviceMixError(message)
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs = dict(kwargs, device="cpu")
            on_cuda = True
        out = func(*args, **kwargs)
        return self.tag(out) if on_cuda else out


@contextlib.contextmanager
def fake_cuda() -> Iterator[FakeCudaMode]:
    """Run the body as on a machine with one CUDA GPU (see the module docstring)."""
    mode = FakeCudaMode()
    patches = [mock.patch("torch.cuda.is_available", lambda: True),
               mock.patch("torch.cuda.is_bf16_supported", lambda *a, **k: True),
               mock.patch("torch.cuda.synchronize", lambda *a, **k: None),
               # as torch's: a device without an index ('cuda') is refused
               mock.patch("torch.cuda.set_device", lambda d: torch._utils._get_device_index(d, optional=False)),
               mock.patch("torch.cuda.device_count", lambda: 1),
               mock.patch("torch.cuda.get_device_name", lambda *a, **k: "fake CUDA device"),
               mock.patch("torch.cuda.max_memory_allocated", lambda *a, **k: 0),
               mock.patch("torch.cuda.reset_peak_memory_stats", lambda *a, **k: None),
               mock.patch("torch.cuda.empty_cache", lambda *a, **k: None)]
    original_new = torch.nn.Parameter.__new__

    def parameter_new(cls, data=None, requires_grad=True):  # Parameter(x) makes a new tensor outside the mode
        out = original_new(cls, data, requires_grad)
        if mode.tagged(data):
            mode.on_cuda[out] = True
        return out

    patches.append(mock.patch.object(torch.nn.Parameter, "__new__", parameter_new))
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        stack.enter_context(mode)
        yield mode
