"""The family registry: which Hugging Face architecture maps onto which GPTConfig, and the
one weight-renaming engine every family declares its names to.

A family (one small module each: gpt2.py, gpt_neo.py, llama.py, ministral.py, qwen2.py,
qwen3.py, gpt_neox.py, gptj.py, opt.py, the gemma*.py, vaultgemma.py, phi.py, phi3.py, the
olmo*.py (OLMo 1 to 3), smollm3.py, stablelm.py, granite.py, falcon.py, gpt_bigcode.py,
glm.py, starcoder2.py, exaone.py, exaone4.py, cohere.py, seed_oss.py, ernie4_5.py,
helium.py, arcee.py, nanochat.py, hunyuan.py; the mixtures of experts mixtral.py, olmoe.py,
qwen3_moe.py, qwen2_moe.py, granitemoe.py, gpt_oss.py, glm4_moe.py, dots1.py,
ernie4_5_moe.py, llama4.py; with latent attention, DeepSeek's deepseek.py and minicpm3.py)
is a `Family`:
its model_type and architecture names, a config mapping each way (`Fields` in, a config.json
dict out, which `misfits` reads back to know whether the family holds a GPTConfig) and a
`WeightMap` (attnlab's state-dict names <-> Hugging Face's, with the modules a family fuses
into one Linear: `Fused`, and a mixture's experts held as one 3-D tensor: `Stacked`). Adding
a family is one new module and one line in `FAMILIES` (hf/__init__.py). Directory reading is
`files.py`'s.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor

from ..model.gpt import GPTConfig
from .fields import Fields

#: the attention projections a fused q/k/v module holds, in its rows' usual order
QKV = ("attn.query", "attn.key", "attn.value")
# Buffers older checkpoints saved next to the weights: causal-mask tables and RoPE
# frequencies, which attnlab recomputes (GPT-2 `attn.bias` / `attn.masked_bias`,
# GPT-NeoX `attention.bias` / `attention.masked_bias`, `rotary_emb.inv_freq`).
BUFFERS = re.compile(r"(\.attn\.(masked_)?bias|\.attention\.(masked_)?bias|rotary_emb\.inv_freq)$")



Reshape = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class Fused:
    """Block modules a family holds in one Linear: attnlab's `parts` (in the order of the
    fused output's rows) from Hugging Face's `module`, whose weight (and bias) `split`
    cuts into one tensor per part, (out, in) as nn.Linear stores them, and `join` puts
    back together (GPT-2's c_attn, Phi-3's qkv_proj and gate_up_proj)."""

    module: str  # the Hugging Face module in the block: "self_attn.qkv_proj"
    parts: tuple[str, ...]  # attnlab's modules in the block: ("attn.query", ...)
    split: Callable[[Tensor, GPTConfig], tuple[Tensor, ...]]
    join: Callable[[Sequence[Tensor], GPTConfig], Tensor]


@dataclass(frozen=True)
class Stacked:
    """A mixture's expert matrices a family holds in one 3-D tensor a layer: Hugging Face's
    `weight`, (n_experts, rows, in) or with `transposed` (n_experts, in, rows), holds expert
    e's `parts` (attnlab modules of mlp.experts.{e}) one after the other along its rows
    (GraniteMoE's input_linear: gate, then up) or, `interleaved`, row by row in turn
    (gpt-oss's gate_up_proj: gate row 0, up row 0, gate row 1, ...); `bias`, where the
    experts have biases, the (n_experts, rows) tensor that holds them alike."""

    weight: str  # the Hugging Face tensor in the block: "block_sparse_moe.input_linear.weight"
    parts: tuple[str, ...]  # each expert's modules, in the rows' order: ("gate", "fc")
    bias: str | None = None  # "mlp.experts.gate_up_proj_bias"
    interleaved: bool = False
    transposed: bool = False

    def piece(self, t: Tensor, e: int, index: int) -> Tensor:
        """Expert e's part `index` of the stacked weight (E, rows, in) or bias (E, rows):
        (out, in) as nn.Linear stores it, or its bias (out,)."""
        x = t[e].t() if self.transposed and t.dim() == 3 else t[e]  # (rows, in) or (rows,)
        n = len(self.parts)
        return x[index::n] if self.interleaved else x.chunk(n)[index]

    def packed_piece(self, t: Tensor, e: int, index: int) -> Tensor:
        """Expert e's part `index` of the weight's MXFP4 blocks (E, rows, G, 16) or scales
        (E, rows, G), which the files store (out, in)-major whether or not the weight is
        `transposed`: its `Mxfp4Linear`'s blocks (out, G, 16) or scales (out, G)."""
        n = len(self.parts)
        return t[e][index::n] if self.interleaved else t[e].chunk(n)[index]

    def join(self, pieces: Sequence[Tensor]) -> Tensor:
        """`piece` the other way for one expert: its parts' weights (out, in) or biases (out,)
        -> its slice of the stacked tensor, (rows, in) ((in, rows) transposed) or (rows,)."""
        parts = list(pieces)
        x = torch.stack(parts, dim=1).flatten(0, 1) if self.interleaved else torch.cat(parts)
        return x.t() if self.transposed and x.dim() == 2 else x


@dataclass(frozen=True)
class WeightMap:
    """attnlab state-dict names <-> one family's Hugging Face names.

    top: attnlab module -> HF module outside the blocks ("wte" -> "model.embed_tokens").
    layer: the HF prefix of block i ("model.layers.{i}.").
    block: attnlab module inside a block -> HF module ("attn.query" -> "self_attn.q_proj");
    a mixture's experts once, "{e}" for the index ("mlp.experts.{e}.fc"); a tensor whose
    module HF names apart from its module's other tensors by its full name (ERNIE 4.5's
    correction bias: "mlp.router.e_score_correction_bias" ->
    "mlp.moe_statics.e_score_correction_bias").
    transposed: block modules HF stores (in, out) (GPT-2's Conv1D).
    fused: block modules HF holds in one Linear (`Fused`); the others `block` names.
    base: the prefix of the body; files of the bare body (GPT2Model, LlamaModel) lack it.
    reshaped: tensors HF stores in another shape: attnlab name, a block's without its
    "blocks.{i}." -> (from HF, to HF) (OPT's position table, two rows longer; ERNIE 4.5's
    correction bias, (1, E)).
    stacked: a mixture's experts HF holds in one 3-D tensor a layer (`Stacked`).
    gathered: block tensors HF holds one row a tensor: attnlab's name in the block -> HF's
    with "{h}" for the row (StableLM's per-head QK-norm: "attn.q_norm.weight" ->
    "self_attn.q_layernorm.norms.{h}.weight"), the rows stacked in order on the way in.
    later_layers: whether the files may hold layers past the config's n_layer that no
    forward reads (GLM-4.5's multi-token-prediction layer, which transformers leaves
    unread too): their tensors are not weights left over.
    unread: a pattern of file tensor names no forward reads, left unread as transformers
    leaves them (its `_keys_to_ignore_on_load_unexpected`: ERNIE 4.5 MoE's "mtp" tensors).
    """

    top: Mapping[str, str]
    layer: str
    block: Mapping[str, str]
    base: str
    transposed: frozenset[str] = frozenset()
    fused: tuple[Fused, ...] = ()
    reshaped: Mapping[str, tuple[Reshape, Reshape]] = field(default_factory=dict)
    stacked: tuple[Stacked, ...] = ()
    gathered: Mapping[str, str] = field(default_factory=dict)
    later_layers: bool = False
    unread: str | None = None

    def stored_head(self, hf_state: Container[str]) -> tuple[str, str] | None:
        """(the head's name, the token table's name) as the file stores them, where it
        stores both; None otherwise. A tied config's file may hold the head too."""
        head = f"{self.top['lm_head']}.weight"
        table = f"{self.top['wte']}.weight"
        stored = next((k for k in (table, table.removeprefix(self.base)) if k in hf_state),
                      None)  # a bare body's file lacks the base prefix
        return (head, stored) if head in hf_state and stored is not None else None

    def head_is_untied(self, hf_state: Mapping[str, Tensor]) -> bool:
        """Whether a state dict in memory stores an output head that differs from the token
        embedding: transformers 5 then leaves a tie_word_embeddings=true model untied (with a
        warning), so attnlab does the same. (Files compare a slice at a time: `same`.)"""
        pair = self.stored_head(hf_state)
        return pair is not None and not torch.equal(hf_state[pair[0]], hf_state[pair[1]])

    def _name(self, ours: str) -> str:
        """The HF name of an attnlab (non-q/k/v-fused) parameter name."""
        module, param = ours.rsplit(".", 1)
        if module.startswith("blocks."):
            _, i, inner = module.split(".", 2)
            if f"{inner}.{param}" in self.block:  # a tensor named apart from its module
                return f"{self.layer.format(i=i)}{self.block[f'{inner}.{param}']}"
            return f"{self.layer.format(i=i)}{self._block_module(inner)}.{param}"
        return f"{self.top[module]}.{param}"

    def _block_module(self, inner: str) -> str:
        """The HF module of a block's module: `block`'s entry, or for an expert of a mixture
        the entry with "{e}" for its index ("mlp.experts.{e}.fc")."""
        expert = re.fullmatch(r"(.*\.experts\.)(\d+)(\..*)", inner)
        if inner in self.block or expert is None:
            return self.block[inner]
        return self.block[f"{expert[1]}{{e}}{expert[3]}"].format(e=expert[2])

    def _is_fused(self, ours: str) -> tuple[Fused, str, str] | None:
        """(its fusion, the HF name of the fused tensor, the block's prefix "blocks.i.")
        where `ours` is a weight or bias a fused module holds."""
        match = re.fullmatch(r"blocks\.(\d+)\.(.+)\.(weight|bias)", ours)
        if match is None:
            return None
        i, inner, param = match.groups()
        for fused in self.fused:
            if inner in fused.parts:
                return fused, f"{self.layer.format(i=i)}{fused.module}.{param}", f"blocks.{i}."
        return None

    def _gathered(self, ours: str) -> str | None:
        """The HF name, "{h}" for the row, of a block tensor `gathered` names, else None."""
        match = re.fullmatch(r"blocks\.(\d+)\.(.+)", ours)
        if match is None or match[2] not in self.gathered:
            return None
        return f"{self.layer.format(i=match[1])}{self.gathered[match[2]]}"

    def _is_stacked(self, ours: str) -> tuple[Stacked, str, int, int] | None:
        """(its stacking, the HF name of the stacked tensor, the expert, the part's index)
        where `ours` is an expert's weight or bias a stacked tensor holds, or the blocks or
        scales of its packed weight (`Mxfp4Linear`: the stacked tensor's NAME_blocks,
        NAME_scales)."""
        match = re.fullmatch(
            r"blocks\.(\d+)\.mlp\.experts\.(\d+)\.(\w+)\.(weight|bias|blocks|scales)", ours)
        if match is None:
            return None
        i, e, part, param = match.groups()
        for stacked in self.stacked:
            name = (stacked.bias if param == "bias" else stacked.weight if param == "weight"
                    else f"{stacked.weight}_{param}")
            if part in stacked.parts and name is not None:
                return (stacked, f"{self.layer.format(i=i)}{name}", int(e),
                        stacked.parts.index(part))
        return None

    def _source(self, ours: str, config: GPTConfig) -> tuple[str, Reshape]:
        """The HF tensor an attnlab name is read from, and its piece of it: a fused module's
        share, an expert's rows of a stacked tensor, the tensor reshaped or transposed, or
        the tensor itself."""
        fused = self._is_fused(ours)
        if fused is not None:
            fusion, name, block = fused
            index = fusion.parts.index(ours.removeprefix(block).rsplit(".", 1)[0])
            return name, lambda t: fusion.split(t, config)[index]
        stacked = self._is_stacked(ours)
        if stacked is not None:
            spec, name, e, index = stacked
            if ours.endswith((".blocks", ".scales")):  # (out, G, 16) or (out, G)
                return name, lambda t: spec.packed_piece(t, e, index)
            return name, lambda t: spec.piece(t, e, index)  # (out, in) or (out,)
        name, reshape = self._name(ours), self._reshape(ours)
        if reshape is not None:
            return name, reshape[0]
        return name, self._transpose if self._transposed(ours) else lambda t: t

    def plain_name(self, ours: str) -> str | None:
        """The HF name of attnlab's tensor `ours` where the files hold it as it is (not
        fused, stacked, reshaped or transposed): a matrix that can stay as the files store
        it (FP8, `model.fp8.Fp8Linear`); None otherwise."""
        if (self._is_fused(ours) or self._is_stacked(ours) or self._reshape(ours)
                or self._transposed(ours) or self._gathered(ours)):
            return None
        return self._name(ours)

    def _reshape(self, ours: str) -> tuple[Reshape, Reshape] | None:
        """`reshaped`'s pair for an attnlab name (a block's looked up without "blocks.i.")."""
        inner = ours.split(".", 2)[-1] if ours.startswith("blocks.") else ours
        return self.reshaped.get(ours, self.reshaped.get(inner))

    def _transposed(self, ours: str) -> bool:
        """Whether HF stores the block module of `ours` (in, out) (GPT-2's Conv1D)."""
        inner = ours.split(".", 2)[-1].rsplit(".", 1)[0] if ours.startswith("blocks.") else ""
        return inner in self.transposed

    @staticmethod
    def _transpose(t: Tensor) -> Tensor:
        return t.t() if t.dim() == 2 else t  # a Conv1D's bias stays as it is

    def iter_from_hf(self, hf_state: Mapping[str, Tensor], config: GPTConfig,
                     keys: Iterable[str], family: str) -> Iterator[tuple[str, Tensor]]:
        """(attnlab name, tensor) for every name in `keys` but a tied head, reading each
        `hf_state[name]` only when its turn comes (a lazy mapping holds one at a time);
        ValueError for a missing weight, a missing untied head, or a weight left over."""
        head = f"{self.top['lm_head']}.weight"
        outside = f"{self.top['lm_head']}."  # the head lies outside the body: no base
        names = {k if k.startswith((self.base, outside)) else self.base + k: k
                 for k in hf_state}  # full name -> the file's name (a bare body lacks base)
        used: set[str] = set()

        def take(name: str) -> Tensor:
            if name not in names:
                raise ValueError(
                    f"{family} checkpoint has no weight {name!r} ({len(names)} tensors, e.g. "
                    f"{sorted(names)[:3]}); the file is incomplete or belongs to another "
                    "architecture"
                )
            used.add(name)
            return hf_state[names[name]]

        sources: dict[str, tuple[str, Reshape]] = {}  # ours -> (HF name, its piece of it)
        gathered: dict[str, str] = {}  # ours -> HF's name of each row, "{h}" the row
        for ours in keys:
            row = self._gathered(ours)
            if row is not None:
                gathered[ours] = row
                continue
            if ours == "lm_head.weight" and config.tie_weights:
                used.add(head)  # a tied file may store the head too; transformers ignores it
                continue
            if ours == "lm_head.weight" and head not in names:
                # GPT-NeoX's module is lm_head in transformers 5, saved as embed_out: a
                # state_dict written without save_pretrained keeps the module's name
                found = [names[k] for k in names if k.endswith("lm_head.weight")]
                raise ValueError(
                    f"{family} config.json has tie_word_embeddings=false but the checkpoint "
                    f"has no {head}" + (f" (it has {found[0]}: a state_dict saved without "
                    f"save_pretrained? rename it {head})" if found else "")
                    + "; refusing to run with a random output head"
                )
            sources[ours] = self._source(ours, config)
        # the names one HF tensor gives (fused q/k/v, stacked experts) one after the other,
        # so each is read once and held alone
        first = {name: i for i, (name, _) in reversed(list(enumerate(sources.values())))}
        held: tuple[str, Tensor] | None = None
        for ours in sorted(sources, key=lambda k: first[sources[k][0]]):
            name, piece = sources[ours]
            if held is None or held[0] != name:
                held = None  # the last one freed before the next is read
                held = name, take(name)
            yield ours, piece(held[1])
        for ours, row in gathered.items():  # small tensors, one a row: read together
            rows = next(h for h in itertools.count() if row.format(h=h) not in names)
            yield ours, torch.stack([take(row.format(h=h)) for h in range(max(rows, 1))])
        leftover = sorted(k for k in set(names) - used
                          if not BUFFERS.search(k) and not self._later(k, config.n_layer)
                          and not (self.unread and re.search(self.unread, k)))
        if leftover:
            raise ValueError(
                f"{family} checkpoint has weights the config does not account for: "
                f"{leftover[:3]}{' ...' if len(leftover) > 3 else ''}; config.json and the "
                "weights disagree (e.g. a bias flag)"
            )

    def _later(self, name: str, n_layer: int) -> bool:
        """Whether `name` (with the base prefix) is a tensor of a layer at or past n_layer
        that `later_layers` lets the files hold."""
        prefix, _, _ = self.layer.partition("{i}")
        index = name.removeprefix(prefix).partition(".")[0] if name.startswith(prefix) else ""
        return self.later_layers and index.isdigit() and int(index) >= n_layer

    def iter_to_hf(self, state: Mapping[str, Tensor], config: GPTConfig
                   ) -> Iterator[tuple[str, Tensor]]:
        """(Hugging Face name, tensor) for an attnlab state dict, one at a time in the state
        dict's order, each made only when its turn comes: a view of the model's own tensor
        where the name alone or a transpose differs (no memory), a new tensor where q, k and
        v are joined into one; a tied head is left out (transformers ties it on load). A view
        may not be contiguous (`.contiguous()` copies that tensor alone). Works on the meta
        device too: the names, shapes and dtypes an export writes, nothing allocated."""
        for ours, tensor in state.items():
            if ours == "lm_head.weight" and config.tie_weights:
                continue
            fused = self._is_fused(ours)
            if fused is not None:
                fusion, name, block = fused
                param = ours.rsplit(".", 1)[1]
                if ours != f"{block}{fusion.parts[0]}.{param}":
                    continue  # written with the first part
                yield name, fusion.join([state[f"{block}{p}.{param}"] for p in fusion.parts],
                                        config)
                continue
            stacked = self._is_stacked(ours)
            if stacked is not None:
                spec, name, e, index = stacked
                if (e, index) == (0, 0):  # written with the first expert's first part
                    experts = ours.rsplit(".experts.", 1)[0] + ".experts"
                    param = ours.rsplit(".", 1)[1]
                    yield name, torch.stack([spec.join(
                        [state[f"{experts}.{j}.{part}.{param}"] for part in spec.parts])
                        for j in range(cast(int, config.n_experts))])  # (E, rows, in)
                continue
            row = self._gathered(ours)
            if row is not None:
                yield from ((row.format(h=h), t) for h, t in enumerate(tensor))
                continue
            reshape = self._reshape(ours)
            if reshape is not None:
                tensor = reshape[1](tensor)
            yield self._name(ours), self._transpose(tensor) if self._transposed(ours) else tensor

    def to_hf(self, state: Mapping[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
        """Every tensor of `iter_to_hf` at once, contiguous and unshared (ready for one
        safetensors file): a second copy of the weights (`save_hf` writes shard by shard)."""
        return {k: v.detach().contiguous().clone() for k, v in self.iter_to_hf(state, config)}


@dataclass(frozen=True)
class Family:
    """One Hugging Face architecture (see module doc)."""

    name: str  # shown to users: "llama"
    model_type: str  # config.json model_type
    architecture: str  # the *ForCausalLM class save_hf writes
    base_architecture: str  # the bare body's class (no head), also accepted
    config_from_hf: Callable[[Fields], dict[str, Any]]  # GPTConfig keyword arguments
    config_to_hf: Callable[[GPTConfig], dict[str, Any]]
    weights: WeightMap
    irrelevant: frozenset[str] = field(default_factory=frozenset)  # see fields.py
    # a transformers model's state dict in memory -> the names its files use, where they
    # differ (transformers 5 holds a mixture's experts in other tensors than it writes)
    from_memory: Callable[[Mapping[str, Tensor]], Mapping[str, Tensor]] | None = None
    # the files' tensor names rewritten before anything reads them, (pattern, replacement)
    # in turn: releases that name their tensors otherwise than transformers writes them
    # (EXAONE 3's, which transformers renames as it loads them)
    renames: tuple[tuple[str, str], ...] = ()
    # other architecture names its config.json may give (Ministral's releases say
    # MistralForCausalLM, and transformers reads them as Ministral by their layer_types)
    aliases: tuple[str, ...] = ()
    # whether an export may write this architecture (False: Llama 4's multimodal releases,
    # whose language model alone attnlab reads; it exports as the text-only family)
    exports: bool = True

    def renamed(self, name: str) -> str:
        """A file tensor's name as this family reads it (`renames`)."""
        for pattern, replacement in self.renames:
            name = re.sub(pattern, replacement, name)
        return name

    def read(self, hf_config: Mapping[str, Any], *, dropout: float = 0.0) -> GPTConfig:
        """The GPTConfig of this family's config.json dict; ValueError naming the first field
        (and its value) attnlab cannot honour."""
        fields = Fields(hf_config, self.name)
        values = self.config_from_hf(fields)
        fields.finish(self.irrelevant)
        return GPTConfig(**values, dropout=dropout, init_std=None)

    def misfits(self, config: GPTConfig) -> list[str]:
        """Why this family cannot hold `config`, or [] when it can: the config.json it would
        write is read back, and each field that reads back as another model is named with the
        value this family holds instead ("shared_norm=False (not True)"). A switch a family
        has no field for therefore refuses the export, never drops out of it."""
        try:
            back = self.read(self.config_to_hf(config)).computed()
        except ValueError as err:  # e.g. a RoPE scaling only another family reads
            return [f"a config.json it can read back ({err})"]
        ours = config.computed()  # a field idle on one side follows from one named here
        return [f"{name}={back[name]!r} (not {ours[name]!r})" for name in ours
                if name in back and ours[name] != back[name]]


def window_layers_from(windowed: Sequence[int], n_layer: int) -> list[int] | None:
    """`window_layers_to_hf` the other way: the layers with a window as
    `GPTConfig.window_layers` holds them, None where every layer has it (or none does)."""
    return None if len(windowed) in (0, n_layer) else list(windowed)


def window_layers_to_hf(config: GPTConfig) -> list[str]:
    """Hugging Face layer_types for a GPTConfig's sliding_window / window_layers."""
    windowed = set(range(config.n_layer) if config.window_layers is None
                   else config.window_layers)
    if config.sliding_window is None:
        windowed = set()
    return ["sliding_attention" if i in windowed else "full_attention"
            for i in range(config.n_layer)]
