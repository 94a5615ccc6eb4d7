"""`on_fake_device(*modules)`: run CPU code as if `modules` lived on a GPU, and fail where
CUDA would fail because a tensor was made on the host.

CUDA refuses an op that mixes a CUDA tensor with a CPU tensor of one dimension or more
("Expected all tensors to be on the same device, but got index is on cpu, different from
other tensors on cuda:0"); a CPU scalar (0-dim) is allowed. On a machine without a GPU every
tensor is on the CPU, so such a bug passes every test. This mode (a `TorchFunctionMode`:
every torch call, `tensor.device` included, goes through it) plays a second device, FAKE
("cpu:0": a CPU device with an index, which torch accepts and stores on the plain CPU), and
keeps beside each tensor it sees made where that tensor would live on a GPU machine:

- "device": the parameters and buffers of `modules` (and of `mark`ed ones); what a factory
  (`torch.tensor`, `arange`, `zeros`, `full`, `as_tensor`, ...) makes with `device=FAKE`;
  what `.to(FAKE)` or `.to(device_tensor)` returns; every result of an op with a device
  input. Such a tensor's `.device` answers FAKE, so code that writes `device=x.device` or
  `.to(model_device)` makes device tensors, and code that forgets makes host ones.
- "host": what a factory makes without `device=` (or with "cpu"), `torch.from_numpy`,
  `.cpu()`, `.to("cpu")`, and the results of ops on host tensors alone.
- unmarked: tensors it never saw made (before the mode, or by autograd: `.grad`); they take
  the place of what they meet.

An op whose tensor arguments hold a device tensor and a host tensor of one dimension or more
raises `RuntimeError("fake device: ...")`, as CUDA would. Allowed, as on CUDA: copies (`.to`,
`.copy_`, `t[...] = host`), a host index into a device tensor (`device_t[host_idx]`), and an
`out=` buffer.

It also records every read of a device tensor back to the host (`item`, `int(t)`, `float(t)`,
`bool(t)`, `tolist`, a blocking `.cpu()` or `.to("cpu")`), which on a GPU waits for all the
work queued before it: `reads` holds the name of the attnlab function that made each one.

What it cannot see: a `torch.Generator` made on the host but used for device draws (not a
torch call, and CPU generators serve "cpu:0" draws), and a model loaded inside the mode
(weights read by safetensors, not a torch call: `mark` it, as `fake_loads` does).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

FAKE = torch.device("cpu", 0)  # the GPU's stand-in
DEVICE, HOST = "device", "host"
_ATTR = "_fake_place"

_FACTORIES = {
    torch.tensor, torch.as_tensor, torch.arange, torch.zeros, torch.ones, torch.full,
    torch.empty, torch.eye, torch.randint, torch.rand, torch.randn, torch.randperm,
    torch.linspace, torch.empty_strided, torch.scalar_tensor, torch.from_numpy, torch.tril_indices,
}
_COPIES = {torch.Tensor.copy_, torch.Tensor.__setitem__}
_MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu}
_READS = {"item", "__int__", "__float__", "__bool__", "__index__", "tolist"}
# a property's getter and setter come as a fresh method-wrapper each time: known by __self__
_DEVICE, _DATA, _GRAD = torch.Tensor.device, torch.Tensor.data, torch.Tensor.grad


def place(t: torch.Tensor) -> str | None:
    """DEVICE, HOST or None (unmarked) for tensor `t`."""
    return t.__dict__.get(_ATTR)


def mark(module: torch.nn.Module) -> torch.nn.Module:
    """Count `module`'s parameters and buffers as on the device; returns it."""
    for t in (*module.parameters(), *module.buffers()):
        t.__dict__[_ATTR] = DEVICE
    return module


def _mark(value: Any, where: str | None) -> None:
    if where is None:
        return
    for t in tree_flatten(value)[0]:
        if isinstance(t, torch.Tensor):
            t.__dict__[_ATTR] = where


def _where(device: Any) -> str | None:
    """DEVICE for FAKE, HOST for another CPU device, None for what is no device."""
    if isinstance(device, torch.Tensor):
        return place(device) or HOST
    if isinstance(device, (str, torch.device)):
        try:
            device = torch.device(device)
        except RuntimeError:  # a string that is no device: a dtype name, say
            return None
        return DEVICE if device == FAKE else HOST
    return None


def _move_place(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Where `.to(...)`, `.cuda()` or `.cpu()` puts its result."""
    if func is torch.Tensor.cpu:
        return HOST
    if func is torch.Tensor.cuda:
        return DEVICE
    for target in (*args[1:], kwargs.get("device")):
        where = _where(target)
        if where is not None:
            return where
    return place(args[0])  # a dtype only: it stays where it was


def _check(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The place of the op's result, after refusing a host tensor beside a device one."""
    kwargs = {k: v for k, v in kwargs.items() if k != "out"}  # a buffer the op writes
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    places = [place(t) for t in tensors]
    if DEVICE not in places:
        return HOST if HOST in places else None
    host = [t for t, p in zip(tensors, places, strict=True) if p == HOST and t.dim() > 0]
    if func is torch.Tensor.__getitem__ and place(args[0]) == DEVICE:
        host = []  # CUDA takes host indices into a device tensor
    if host:
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
        shapes = ", ".join(str(tuple(t.shape)) for t in host)
        raise RuntimeError(f"fake device: {name} got host tensor(s) of shape {shapes} beside "
                           "device tensors; CUDA refuses this (Expected all tensors to be on "
                           "the same device)")
    return DEVICE


def _torch_moves() -> bool:
    """Whether this move is one torch makes inside its own functions (not one attnlab asks
    for). To the host, such a move took its target from a tensor's real device, which the
    fake cannot see: clip_grad_norm_ and fused AdamW move device scalars to their gradients'
    device, the CPU here, a no-op on a GPU."""
    caller = sys._getframe(2).f_code.co_filename  # above __torch_function__
    return f"{os.sep}torch{os.sep}" in caller


def _blocking_move_home(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a move to the host waits for the device (an attnlab `.cpu()`, `.to("cpu")`)."""
    return (func in _MOVES and not kwargs.get("non_blocking")
            and _move_place(func, args, kwargs) == HOST)


def _reader() -> str:
    """The innermost attnlab function on the stack (the one that reads a value back)."""
    for frame in reversed(traceback.extract_stack()):
        # a comprehension's frame ("<listcomp>" before Python 3.12) names its function's
        if f"{os.sep}attnlab{os.sep}" in frame.filename and not frame.name.startswith("<"):
            return frame.name
    return "(outside attnlab)"


class _FakeDevice(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []  # who read a device tensor's value back, in order

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _MOVES and _torch_moves() and _move_place(func, args, kwargs) == HOST:
            return func(*args, **kwargs)  # the tensor stays where the fake keeps it
        read = getattr(func, "__name__", None) in _READS or _blocking_move_home(func, args, kwargs)
        if read and args and isinstance(args[0], torch.Tensor) and place(args[0]) == DEVICE:
            self.reads.append(_reader())
        owner = getattr(func, "__self__", None)
        if owner is _DEVICE:  # tensor.device
            return FAKE if place(args[0]) == DEVICE else func(*args, **kwargs)
        if owner is _GRAD and func.__name__ == "__get__":  # a gradient lives by its tensor
            grad = func(*args, **kwargs)
            _mark(grad, place(args[0]))
            return grad
        if owner is _DATA and func.__name__ == "__set__":  # param.data = moved (Module.to)
            func(*args, **kwargs)
            _mark(args[0], place(args[1]))
            return None
        if func in _FACTORIES:
            where: str | None = _where(kwargs.get("device", "cpu"))
        elif func in _MOVES:
            where = _move_place(func, args, kwargs)
        elif func in _COPIES:
            where = place(args[0])
        else:
            where = _check(func, args, kwargs)
        result = func(*args, **kwargs)
        if func not in _COPIES:
            _mark(result, where)
        return result


@contextmanager
def on_fake_device(*modules: torch.nn.Module) -> Iterator[_FakeDevice]:
    """Run the body as if `modules` (their parameters and buffers) were on a GPU, FAKE; gives
    the mode, whose `reads` lists the reads back from the device."""
    for module in modules:
        mark(module)
    with _FakeDevice() as mode:
        yield mode
