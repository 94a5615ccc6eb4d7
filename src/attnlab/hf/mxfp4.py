"""gpt-oss's MXFP4 expert weights as its Hugging Face files store them
(`model.layers.{i}.mlp.experts.gate_up_proj_blocks` / `_scales`, `down_proj_blocks` /
`_scales`, all uint8): dequantized into the plain float tensors transformers holds after
loading (`expert_weight`, `Mxfp4Files`), or kept packed, an expert's share of each read as
its `Mxfp4Linear`'s bytes (`registry.Stacked.packed_piece`). The format, and why the
dequantization is exact: `model/mxfp4.py`.

Layout (read from transformers 5's integrations/mxfp4.py and models/gpt_oss): the files
store an expert matrix row-major in its output features, blocks (E, out, G, 16) and
scales (E, out, G) with G * 32 = in. `convert_moe_packed_tensors` dequantizes that to
(E, out, in) and itself transposes it to (E, in, out) before returning; the loader
(`Mxfp4Dequantize`) puts that result into the parameter as is, with no further transpose.
So transformers' `GptOssExperts.gate_up_proj` is (E, hidden, 2 * intermediate) (stored
blocks (E, 2 * intermediate, hidden / 32, 16); gate and up interleaved along the last dim,
gate at even columns, up at odd) and `down_proj` is (E, intermediate, hidden) (stored
(E, hidden, intermediate / 32, 16)); its forward computes `x @ gate_up_proj[e]`.
`expert_weight` returns that (E, in, out) layout; `dequantize` the untransposed one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model.mxfp4 import BLOCK_BYTES, BLOCK_VALUES, check_inputs, dequantize
from ..model.tensorfile import WeightFiles
from .derived import DerivedFiles


def expert_weight(blocks: Tensor, scales: Tensor, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """the (E, in, out) tensor transformers holds as gate_up_proj / down_proj (i.e. the layout
    after transformers' own dequantization on load) from the stored (E, out, G, 16) blocks
    and (E, out, G) scales, with in = G * 32.

    That is `dequantize(blocks, scales, dtype).transpose(1, 2)`, contiguous: transformers'
    `convert_moe_packed_tensors` transposes its (E, out, in) result to (E, in, out) itself
    and loading keeps it, so gate_up_proj is (E, hidden, 2 * intermediate) and down_proj
    (E, intermediate, hidden), used as `x @ w[e]`. Filled one expert at a time, so the peak
    is the result plus one expert's (out, in), not two full copies. Raises as `dequantize`
    does, and ValueError unless blocks are 4-D.
    """
    if blocks.dim() != 4:
        raise ValueError(
            f"MXFP4 expert blocks must be 4-D (E, out, G, {BLOCK_BYTES}) as gpt-oss stores "
            f"*_proj_blocks, got shape {tuple(blocks.shape)}; use dequantize() for "
            f"other layouts")
    check_inputs(blocks, scales, dtype)  # before allocating the result
    experts, rows, groups, _ = blocks.shape
    out = torch.empty(experts, groups * BLOCK_VALUES, rows, dtype=dtype,
                      device=blocks.device)  # (E, in, out)
    for e in range(experts):
        try:
            out[e] = dequantize(blocks[e], scales[e], dtype).T  # (out, in) -> (in, out)
        except ValueError as err:  # an overflow names its index within the expert
            raise ValueError(f"expert {e}: {err}") from err
    return out


class Mxfp4Files(DerivedFiles):
    """A directory's weight files (`WeightFiles`) with each MXFP4 pair, NAME_blocks and
    NAME_scales, shown as the one tensor NAME transformers holds: (E, in, out), dequantized
    in bfloat16 (exact: module doc) when it is read (`DerivedFiles`)."""

    kind = "MXFP4"

    def __init__(self, files: WeightFiles) -> None:
        meta = files.meta()
        pairs = {name[:-len("_blocks")]: (name, name[:-len("_blocks")] + "_scales")
                 for name in files if name.endswith("_blocks")
                 and name[:-len("_blocks")] + "_scales" in files}
        shapes = {}
        for name, (blocks, _) in pairs.items():
            E, out, G, _ = meta[blocks].shape  # (E, out, G, 16)
            shapes[name] = (E, G * BLOCK_VALUES, out)  # (E, in, out)
        super().__init__(files, pairs, shapes, torch.bfloat16)
        self.pairs = pairs
        #: what `attnlab info` says of them
        self.note = ("the experts are stored as MXFP4: a load dequantizes them, or keeps "
                     "them packed in memory (the '+ MXFP4 experts' sizes) where the "
                     "dequantized model would not fit")

    def decode(self, name: str) -> Tensor:
        blocks, scales = self.pairs[name]
        return expert_weight(self.files[blocks], self.files[scales])  # (E, in, out)
