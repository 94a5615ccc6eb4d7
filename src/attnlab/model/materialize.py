"""Build a GPT from named tensors without ever holding the model twice.

Loaders (`checkpoint.py` for attnlab directories, `hf` for Hugging Face ones) describe a
model as a config plus a stream of (attnlab name, tensor) pairs. This module:
1. builds the GPT on the meta device (no memory, no init): `meta_gpt`;
2. checks every name and shape against it before anything is allocated: `check_shapes`,
   fed meta tensors made from the files' headers, so a config that claims 4,000 layers over
   a one-tensor file is refused in one line, not by the allocator;
3. allocates each parameter on the target device in the target dtype, in the memory layout
   `GPT.lay_out_weights` gives it, and copies the tensor in: `materialize`. Only the tensor
   being copied exists twice, never the model: peak memory is the model plus its largest
   tensor as the file stores it (docs/performance.md#lazy-loading).
`OpenedWeights` is a directory at step 2, ready for 3 (`fill`) once `memory.py`'s check
agrees. What the names mean and where tensors come from is the loaders'; memory budgets are
`memory.py`'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .config import GPTConfig
from .gpt import GPT, on_meta
from .layers import kept_float32
from .memory import DoesNotFitError, Use, check_memory, params_text
from .packed import packed_layers, packed_size
from .tensorfile import WeightFiles

#: (tensors filled, tensors in all): called after each tensor a load copies in
Progress = Callable[[int, int], None]
#: dtypes a model's weights may be stored in
FLOAT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def load_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """The dtype a load asked for as torch.bfloat16 or "bfloat16" (transformers'
    torch_dtype names it so); ValueError naming the choices for any other."""
    named = {str(d).removeprefix("torch."): d for d in FLOAT_DTYPES}
    found = (named.get(dtype.removeprefix("torch.")) if isinstance(dtype, str)
             else dtype if dtype is None or dtype in FLOAT_DTYPES else None)
    if found is None and dtype is not None:
        raise ValueError(f"dtype={dtype!r}: a model loads in one of {', '.join(named)} "
                         "(as torch.bfloat16 or 'bfloat16')")
    return found


def meta_gpt(config: GPTConfig) -> GPT:
    """GPT(config) on the meta device: shapes, names and memory layout, no storage."""
    with on_meta():
        return GPT(config)


#: layers a meta model builds in about a second on a slow CPU
CHEAP_LAYERS = 256


def check_layer_count(n_layer: int, names: Iterable[str], layer: str, *, base: str = "",
                      what: str = "config.json") -> None:
    """ValueError when a config of more than CHEAP_LAYERS layers asks for more than the files
    hold tensors for. `layer` is the files' name prefix of layer i ("model.layers.{i}.";
    files may leave out `base`, "model."). Runs before `meta_gpt`, whose cost grows with
    n_layer: a config claiming 4,000 layers (or a billion) over a small file is refused at
    once; a smaller one gets `check_shapes`' message, which names the first missing tensor."""
    if n_layer <= CHEAP_LAYERS:
        return
    prefix, _, suffix = layer.removeprefix(base).partition("{i}")
    pattern = re.compile(rf"(?:{re.escape(base)})?{re.escape(prefix)}(\d+){re.escape(suffix)}")
    held = {int(m.group(1)) for name in names if (m := pattern.match(name))}
    first = next(i for i in range(len(held) + 1) if i not in held)
    if first < n_layer:
        raise ValueError(f"{what} describes {n_layer} layers but the weights have no "
                         f"{layer.format(i=first)}* tensors (they hold {len(held)} layers); "
                         "the config and the weights disagree")


def check_shapes(model: GPT, tensors: Iterable[tuple[str, Tensor]],
                 describe: Callable[[str], str] = repr) -> None:
    """ValueError naming the first tensor whose shape or dtype `model` (a meta model) cannot
    take, or the first parameter no tensor provides. `describe(name)` says where a name's
    tensor comes from ("model.layers.0.mlp.up_proj.weight in model-00002.safetensors")."""
    expected = dict(model.state_dict())
    if model.config.tie_weights:
        del expected["lm_head.weight"]  # the token table: filled once, by its own name
    seen = set()
    for name, tensor in tensors:
        if name not in expected:
            raise ValueError(f"{describe(name)} is not a tensor of this model; the weights "
                             "belong to another config")
        want = tuple(expected[name].shape)
        if tuple(tensor.shape) != want:
            raise ValueError(f"{describe(name)} has shape {tuple(tensor.shape)} but the "
                             f"config needs {want}; the config and the weights disagree")
        if expected[name].dtype == torch.uint8:  # packed bytes (`packed.PackedLinear`)
            if tensor.dtype != torch.uint8:
                raise ValueError(f"{describe(name)} is {tensor.dtype}; packed bytes (MXFP4 "
                                 "blocks and scales, FP8 weights) are uint8")
        elif tensor.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{describe(name)} is {tensor.dtype}; model weights are "
                             f"floating point ({', '.join(map(str, FLOAT_DTYPES))})")
        seen.add(name)
    missing = [n for n in expected if n not in seen]
    if missing:
        raise ValueError(f"the weights have no {missing[0]!r} ({len(missing)} of "
                         f"{len(expected)} tensors missing); the config describes another "
                         "model or the files are incomplete")


def mismatch(model: GPT, state: dict[str, Tensor], show: int = 3) -> str:
    """One line saying how `state` differs from `model`'s tensors ("" if it fits): counts,
    and the first few names with both shapes (torch lists every tensor, 32 lines for a
    2-layer model of another width)."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}

    def first(names: list[str]) -> str:
        return ", ".join(names[:show]) + (", ..." if len(names) > show else "")

    shapes = [f"{n} {tuple(state[n].shape)} vs {expected[n]}" for n in expected
              if n in state and tuple(state[n].shape) != expected[n]]
    missing = [n for n in expected if n not in state]
    unexpected = [n for n in state if n not in expected]
    parts = []
    if shapes:
        parts.append(f"{len(shapes)} of {len(expected)} tensors have other shapes (file vs "
                     f"config: {first(shapes)})")
    if missing:
        parts.append(f"{len(missing)} missing ({first(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected ({first(unexpected)})")
    return "; ".join(parts)


def materialize(model: GPT, tensors: Iterable[tuple[str, Tensor]], *,
                dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
                progress: Progress | None = None) -> GPT:
    """Fill meta model `model` from (name, tensor) pairs (checked by `check_shapes` first):
    each parameter is allocated on `device` in `dtype` (default float32; a mixture's
    correction bias and float32 router float32 always) with the layout the meta model has,
    and the tensor copied in; `progress(tensors filled, tensors in all)` after each. Returns
    the model in eval mode."""
    dtype = dtype or torch.float32
    metas = dict(model.state_dict())
    wide = kept_float32(model)
    total = len(metas) - (1 if model.config.tie_weights else 0)  # a tied head is not read
    filled: dict[str, Tensor] = {}
    with torch.no_grad():
        for name, tensor in tensors:
            meta = metas[name]
            # (the shape meta has, in its strides: a laid-out Linear keeps its (in, out) memory)
            # (packed bytes stay uint8; the tensors `KeepsFloat32` keeps float32, float32)
            target = torch.empty_strided(meta.shape, meta.stride(), device=device, dtype=(
                meta.dtype if not meta.is_floating_point()
                else torch.float32 if name in wide else dtype))
            target.copy_(tensor)
            filled[name] = target
            if progress is not None:
                progress(len(filled), total)
        if model.config.tie_weights:
            filled["lm_head.weight"] = filled["wte.weight"]
        model.load_state_dict(filled, strict=True, assign=True)
    if model.config.tie_weights:
        model.lm_head.weight = model.wte.weight  # assign gave each name its own Parameter
    return model.eval()


@dataclass
class OpenedWeights:
    """A model directory opened and checked, nothing allocated: its config and meta-device
    model, the weight files (headers read), and which file tensor fills each parameter.

    `decide` is set where the config ties the head to the token table but the files store a
    head too (Hugging Face directories): until then the head counts as its own parameter
    (the worst case), and `decided()` compares the two a slice at a time and returns the
    weights as they load: tied if equal, untied (as transformers does) if not."""

    config: GPTConfig
    model: GPT  # on the meta device
    files: WeightFiles
    #: (parameter, tensor) for every parameter but a tied head, read as it is iterated
    tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]]
    decide: Callable[[], OpenedWeights] | None = None
    #: the same weights held smaller, where the files allow it (gpt-oss's experts kept packed
    #: as MXFP4, each expert matrix an `Mxfp4Linear`; FP8 matrices kept FP8, `Fp8Linear`: the
    #: same function, a quarter or half of the memory, slower products); None elsewhere
    packed: Callable[[], OpenedWeights] | None = None

    def decided(self) -> OpenedWeights:
        """These weights with a stored head's tie settled (`decide`): reads the head and the
        token table a slice at a time, never either whole."""
        return self if self.decide is None else self.decide()

    def fill(self, dtype: torch.dtype | str | None, device: torch.device, force: bool,
             progress: Progress | None = None, uses: Sequence[Use] = (),
             packed: bool | None = None) -> GPT:
        """The model on `device` in `dtype`, once `check_memory` agrees (or `force`) that it
        fits with `uses` beside it, before any tensor is read (a stored head counted as its
        own: `decide`); progress: `materialize`'s. Where the weights can be held `packed`:
        True holds them so, False never, None only where they would not fit otherwise."""
        dtype = load_dtype(dtype) or torch.float32
        chosen = self
        if packed and self.packed is None:
            raise ValueError("packed=True: these weights have no packed form (gpt-oss's MXFP4 "
                             "experts and FP8 matrices have); load them with packed=None")
        if self.packed is not None and packed is not False and (
                packed or not self._fits(dtype, device, uses)):
            chosen = self.packed()
        try:
            chosen.check_fits(dtype, device, uses, force)
            opened = chosen.decided()
            return materialize(opened.model, opened.tensors(), dtype=dtype, device=device,
                               progress=progress)
        finally:
            self.files.forget()
            chosen.files.forget()

    def check_fits(self, dtype: torch.dtype, device: torch.device, uses: Sequence[Use] = (),
                   force: bool = False) -> None:
        """`check_memory` for these weights in `dtype` on `device` with `uses` beside them,
        packed matrices counted at their own bytes."""
        weights, nbytes = packed_size(self.model)
        if weights:
            kind = packed_layers(self.model)[0].kind
            uses = (*uses, Use(f"its {params_text(weights)} weights packed as {kind}",
                               nbytes=nbytes))
        check_memory(self.model.num_params(non_embedding=False) - weights, dtype, device,
                     extra=self.files.largest(), uses=uses, force=force)

    def _fits(self, dtype: torch.dtype, device: torch.device, uses: Sequence[Use]) -> bool:
        try:
            self.check_fits(dtype, device, uses)
        except DoesNotFitError:
            return False
        return True
