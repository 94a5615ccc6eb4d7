"""Hugging Face interop: load a local model directory of a supported family into attnlab's
GPT, and export a GPT back to a directory transformers loads.

Families (one module each, listed in `FAMILIES`): GPT2LMHeadModel, LlamaForCausalLM,
MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, GPTNeoXForCausalLM,
GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, PhiForCausalLM, Phi3ForCausalLM,
Olmo2ForCausalLM, Olmo3ForCausalLM, SmolLM3ForCausalLM, GPTJForCausalLM, GPTNeoForCausalLM,
OPTForCausalLM, StableLmForCausalLM, GraniteForCausalLM, FalconForCausalLM, the mixtures
MixtralForCausalLM, OlmoeForCausalLM, Qwen3MoeForCausalLM, GraniteMoeForCausalLM,
Qwen2MoeForCausalLM and GptOssForCausalLM, GlmForCausalLM, Glm4ForCausalLM,
Starcoder2ForCausalLM, Exaone4ForCausalLM, CohereForCausalLM, Cohere2ForCausalLM,
SeedOssForCausalLM, Ernie4_5ForCausalLM, HeliumForCausalLM, ArceeForCausalLM, and the
DeepSeek-V3-style mixtures Glm4MoeForCausalLM and Dots1ForCausalLM, ERNIE 4.5's mixture
Ernie4_5_MoeForCausalLM, DeepSeek's own with latent attention, DeepseekV2ForCausalLM and
DeepseekV3ForCausalLM, and Llama 4's Llama4ForCausalLM (and the language model of its
multimodal Llama4ForConditionalGeneration releases), MiniCPM3ForCausalLM (latent attention in
a dense block), nanochat's NanoChatForCausalLM,
BigCode's GPTBigCodeForCausalLM (StarCoder, SantaCoder), OLMo 1's OlmoForCausalLM,
MinistralForCausalLM, Hunyuan's HunYuanDenseV1ForCausalLM, VaultGemmaForCausalLM and EXAONE 3
(model_type "exaone", run as LlamaForCausalLM).
`registry.py` holds the Family / WeightMap machinery, `fields.py` the config-field
bookkeeping (every field is honoured, refused by name, or listed there as irrelevant),
`files.py` the directory reading and writing (the tokenizer files themselves are
`attnlab.tokenizers.hf_dir`'s). Nothing is downloaded; `transformers` is never imported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..checkpoint import Checkpoint, OpenedCheckpoint
from ..model.fp8 import pack_fp8
from ..model.gpt import GPT, GPTConfig
from ..model.materialize import (
    OpenedWeights,
    Progress,
    check_layer_count,
    check_shapes,
    materialize,
    meta_gpt,
)
from ..model.mxfp4 import pack_experts
from ..model.packed import refuse_packed
from ..model.runtime import resolve_device
from ..model.tensorfile import TensorFiles
from ..tokenizers import Tokenizer, check_fits
from ..tokenizers.hf_dir import (
    CONFIG_FILE,
    HFDirTokenizer,
    eos_field,
    is_hf_dir,
    load_hf_tokenizer,
    read_hf_config,
)
from .arcee import ARCEE
from .cohere import COHERE, COHERE2
from .deepseek import DEEPSEEK_V2, DEEPSEEK_V3
from .dots1 import DOTS1
from .ernie4_5 import ERNIE4_5
from .ernie4_5_moe import ERNIE4_5_MOE
from .exaone import EXAONE
from .exaone4 import EXAONE4
from .falcon import FALCON
from .files import (
    MAX_SHARD_SIZE,
    SAFETENSORS_FILE,
    SHARD_FILE,
    BinTensors,
    chosen_weights,
    read_weights,
    write_hf_dir,
)
from .fp8 import FP8, Fp8Files, fp8_block
from .gemma import GEMMA
from .gemma2 import GEMMA2
from .gemma3 import GEMMA3
from .gemma3 import NEAR_MISSES as GEMMA3_NEAR_MISSES
from .glm import GLM, GLM4
from .glm4_moe import GLM4_MOE
from .gpt2 import GPT2
from .gpt_bigcode import GPT_BIGCODE
from .gpt_neo import GPT_NEO
from .gpt_neox import GPT_NEOX
from .gpt_oss import GPT_OSS, MXFP4
from .gptj import GPTJ
from .granite import GRANITE
from .granitemoe import GRANITEMOE
from .helium import HELIUM
from .hunyuan import HUNYUAN_DENSE
from .llama import LLAMA, MISTRAL
from .llama4 import LLAMA4, LLAMA4_MULTIMODAL
from .minicpm3 import MINICPM3
from .ministral import MINISTRAL
from .mixtral import MIXTRAL
from .mxfp4 import Mxfp4Files
from .nanochat import NANOCHAT
from .olmo import OLMO
from .olmo2 import OLMO2
from .olmo3 import OLMO3
from .olmoe import OLMOE
from .opt import OPT
from .phi import PHI
from .phi3 import PHI3
from .qwen2 import QWEN2
from .qwen2_moe import QWEN2_MOE
from .qwen3 import QWEN3
from .qwen3_moe import QWEN3_MOE
from .registry import Family
from .seed_oss import SEED_OSS
from .smollm3 import SMOLLM3
from .stablelm import STABLELM
from .starcoder2 import STARCODER2
from .vaultgemma import VAULTGEMMA

#: what a Hugging Face directory's tensors are read through
_Files = TensorFiles | BinTensors | Mxfp4Files | Fp8Files

# export picks the first family a GPTConfig fits, so the plainest comes first
FAMILIES: tuple[Family, ...] = (GPT2, LLAMA, MISTRAL, MINISTRAL, QWEN2, QWEN3, GPT_NEOX, GEMMA,
                                GEMMA2, GEMMA3, PHI, PHI3, OLMO, OLMO2, OLMO3, SMOLLM3, GPTJ,
                                GPT_NEO, OPT, STABLELM, GRANITE, FALCON, GPT_BIGCODE, MIXTRAL,
                                OLMOE, QWEN3_MOE, GRANITEMOE, QWEN2_MOE, GPT_OSS, GLM, GLM4,
                                STARCODER2, EXAONE, EXAONE4, COHERE, COHERE2, SEED_OSS, ERNIE4_5,
                                HELIUM, ARCEE, GLM4_MOE, DOTS1, ERNIE4_5_MOE, DEEPSEEK_V2,
                                DEEPSEEK_V3, MINICPM3, LLAMA4, LLAMA4_MULTIMODAL, NANOCHAT,
                                HUNYUAN_DENSE, VAULTGEMMA)
FAMILY_BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}

__all__ = [
    "CONFIG_FILE",
    "FAMILIES",
    "MAX_SHARD_SIZE",
    "SAFETENSORS_FILE",
    "SHARD_FILE",
    "Family",
    "config_from_hf",
    "config_to_hf",
    "family_for_config",
    "family_of",
    "gpt_from_hf",
    "hf_layout",
    "is_hf_dir",
    "load_hf",
    "load_hf_checkpoint",
    "load_hf_gpt2",
    "load_hf_tokenizer",
    "open_hf_checkpoint",
    "save_hf",
    "save_hf_gpt2",
]


def family_of(hf_config: Mapping[str, Any]) -> Family:
    """The family of a Hugging Face config dict, by model_type (architectures must agree)."""
    model_type = hf_config.get("model_type")
    if model_type == "mistral" and "layer_types" in hf_config:
        model_type = "ministral"  # transformers' AutoConfig reads such a Mistral so
    by_type = {f.model_type: f for f in FAMILIES}
    if isinstance(model_type, str) and model_type in GEMMA3_NEAR_MISSES:
        raise ValueError(f"config.json has model_type={model_type!r}: "
                         f"{GEMMA3_NEAR_MISSES[model_type]}")
    if not isinstance(model_type, str) or model_type not in by_type:
        raise ValueError(
            f"config.json has model_type={model_type!r}; attnlab imports "
            f"{', '.join(f.model_type for f in FAMILIES)} "
            f"({', '.join(f.architecture for f in FAMILIES)})"
        )
    family = by_type[model_type]
    architectures = hf_config.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ValueError(f"config.json has architectures={architectures!r}; expected a list of "
                         f"class names, e.g. [{family.architecture!r}]")
    for arch in architectures:
        if arch not in (family.architecture, family.base_architecture, *family.aliases):
            raise ValueError(
                f"{family.name} config.json has architectures={hf_config['architectures']!r}: "
                f"attnlab builds {family.architecture} (a causal LM head); {arch} is another "
                "model"
            )
    return family


def config_from_hf(hf_config: Mapping[str, Any], *, dropout: float = 0.0) -> GPTConfig:
    """GPTConfig for a Hugging Face config dict of any supported family; ValueError with one
    line naming the first field (and its value) attnlab cannot honour."""
    return family_of(hf_config).read(hf_config, dropout=dropout)


def family_for_config(config: GPTConfig) -> Family:
    """The first family in FAMILIES whose architecture expresses `config` exactly."""
    reasons = []
    for family in (f for f in FAMILIES if f.exports):
        misfits = family.misfits(config)
        if not misfits:
            return family
        reasons.append(f"{family.name} needs {', '.join(misfits)}")
    raise ValueError("no Hugging Face family expresses this model: " + "; ".join(reasons))


def config_to_hf(config: GPTConfig, *, family: Family | None = None,
                 special: Mapping[str, int | list[int] | None] | None = None) -> dict[str, Any]:
    """config.json dict for `config` as `family` (default: family_for_config)."""
    family = family or family_for_config(config)
    if not family.exports:
        raise ValueError(f"{family.architecture} is read, not written: attnlab holds its "
                         "language model alone; export it as another family (--family)")
    misfits = family.misfits(config)
    if misfits:
        raise ValueError(f"{family.architecture} cannot express this model: it needs "
                         f"{', '.join(misfits)} (config: {config})")
    hf = family.config_to_hf(config)
    for kind, token_id in (special or {}).items():
        hf[f"{kind}_token_id"] = token_id
    return hf


def gpt_from_hf(
    hf_config: Mapping[str, Any], hf_state: Mapping[str, Tensor], *, dropout: float = 0.0
) -> GPT:
    """attnlab GPT (float32, eval mode) from a Hugging Face config dict and state dict in
    memory, e.g. `gpt_from_hf(hf_model.config.to_dict(), hf_model.state_dict())`."""
    config = config_from_hf(hf_config, dropout=dropout)
    family = family_of(hf_config)
    if family.from_memory is not None:  # a mixture's experts, as transformers holds them
        hf_state = family.from_memory(hf_state)
    if config.tie_weights and family.weights.head_is_untied(hf_state):
        config = dataclasses.replace(config, tie_weights=False)
    model = meta_gpt(config)
    keys = list(model.state_dict())
    check_shapes(model, family.weights.iter_from_hf(hf_state, config, keys, family.name))
    return materialize(model, family.weights.iter_from_hf(hf_state, config, keys, family.name))


def load_hf(
    path: str | Path, dtype: torch.dtype | str | None = None, *, dropout: float = 0.0,
    map_location: str | torch.device = "cpu", force: bool = False,
    progress: Progress | None = None, packed: bool | None = None,
) -> GPT:
    """A local Hugging Face model directory of any supported family -> attnlab GPT in eval
    mode, float32 unless `dtype` (torch.bfloat16 or "bfloat16"), on `map_location`.
    gpt-oss's MXFP4 experts and FP8 matrices are dequantized, or with `packed` kept packed
    in memory (`model.mxfp4.Mxfp4Linear`, `model.fp8.Fp8Linear`: the same logits, a quarter
    of the experts' bfloat16 bytes, or half of the matrices', slower); packed=None keeps them
    packed only where the dequantized model would not fit.

    Nothing is allocated before config.json and every tensor's name, shape and dtype (the
    safetensors headers) agree, and the model fits in the memory `map_location` has free
    (`force=True` skips that check: `attnlab.model.memory`). Tensors are then read one at a
    time into the model's own memory on the device: peak memory is the model plus its largest
    tensor, never a second copy (docs/performance.md#lazy-loading). `progress(tensors
    read, tensors in all)` hears after each tensor."""
    device = resolve_device(str(map_location))  # a missing CUDA named before any reading
    return open_hf_weights(path, dropout=dropout).fill(dtype, device, force, progress,
                                                       packed=packed)


def open_hf_weights(path: str | Path, *, dropout: float = 0.0) -> OpenedWeights:
    """A Hugging Face directory's config and weight files, checked against each other by
    the headers alone, nothing allocated or read; ValueError naming the first tensor that
    does not fit. A tied config whose files store a head too opens untied, the head counted
    as its own (the worst case), with `decide` set: `OpenedWeights.decided()` compares head
    and token table a slice at a time and ties them if equal (transformers 5 unties them
    otherwise), after the fit check (`fill`) or for `inspect_dir`."""
    directory = Path(path)
    hf_config = read_hf_config(directory)
    config = config_from_hf(hf_config, dropout=dropout)  # before the weights are opened
    family = family_of(hf_config)
    raw = read_weights(directory)
    if family.renames:  # a release's own tensor names (EXAONE 3's)
        if not isinstance(raw, TensorFiles):
            raise ValueError(f"{directory} holds {family.name} weights in a pytorch_model.bin, "
                             "whose names attnlab does not rewrite; save them as "
                             "model.safetensors (transformers' save_pretrained) and load that")
        raw = raw.renamed(family.renamed)
    quantized = hf_config.get("quantization_config") or {}
    method = quantized.get("quant_method")
    # gpt-oss's experts and FP8 weights (config_from_hf checked the config): dequantized as
    # they are read, or kept packed (`OpenedWeights.packed`)
    files: _Files = Mxfp4Files(raw) if method == MXFP4 else Fp8Files(
        raw, fp8_block(quantized)) if method == FP8 else raw
    try:
        check_layer_count(config.n_layer, files, family.weights.layer,
                          base=family.weights.base)
        opened = _settled(config, files, family)
    except ValueError as err:
        raise ValueError(f"{err}{chosen_weights(directory)}") from None
    if isinstance(files, Mxfp4Files):
        opened = dataclasses.replace(
            opened, packed=lambda: _settled(config, raw, family, packed=pack_experts))
    elif isinstance(files, Fp8Files):
        kept, pack = _fp8_kept(opened.model, files, family)
        if kept:
            opened = dataclasses.replace(opened, packed=lambda: _settled(
                config, Fp8Files(raw, files.block, kept), family, packed=pack))
    return opened


def _fp8_kept(model: GPT, files: Fp8Files, family: Family
              ) -> tuple[frozenset[str], Callable[[GPT], object]]:
    """(the FP8 matrices of `files` that can stay FP8 in memory: each the weight of one of
    `model`'s Linear layers as the files store it, not fused, stacked or transposed; what
    packs a meta model's Linear layers for them, `model.fp8.pack_fp8`)."""
    ours = {}
    for name, module in model.named_modules():
        hf_name = family.weights.plain_name(f"{name}.weight") if isinstance(
            module, nn.Linear) else None
        if hf_name is not None and hf_name in files.derived:
            ours[f"{name}.weight"] = hf_name
    kept = frozenset(ours.values())
    return kept, lambda meta: pack_fp8(meta, set(ours), files.block)


def _settled(config: GPTConfig, files: _Files, family: Family,
             packed: Callable[[GPT], object] | None = None) -> OpenedWeights:
    """`_opened`, untied (the head counted as its own) where the config ties the head but
    the files store one too, with `decide` set to settle that (`open_hf_weights`)."""
    stored = family.weights.stored_head(files) if config.tie_weights else None
    untied = config if stored is None else dataclasses.replace(config, tie_weights=False)
    opened = _opened(untied, files, family, packed=packed)
    if stored is None:
        return opened

    def decide() -> OpenedWeights:
        # the head was checked in its own right; tied, it is the token table, checked too
        return (_opened(config, files, family, check=False, packed=packed)
                if files.same(*stored) else dataclasses.replace(opened, decide=None))

    return dataclasses.replace(opened, decide=decide)


def _opened(config: GPTConfig, files: _Files, family: Family, check: bool = True,
            packed: Callable[[GPT], object] | None = None) -> OpenedWeights:
    """`config`'s meta model (with matrices kept as the files store them where `packed`
    makes them so: `Mxfp4Linear`s, `Fp8Linear`s) and the file tensors that fill it, their
    names, shapes and dtypes checked from the headers (`check`)."""
    names = family.weights
    model = meta_gpt(config)
    if packed is not None:
        packed(model)
    keys = list(model.state_dict())
    if check:
        meta = _Recording(files.meta())
        check_shapes(model, names.iter_from_hf(meta, config, keys, family.name),
                     lambda ours: f"{ours} ({files.describe(meta.last)})")
    return OpenedWeights(config, model, files,
                         lambda: names.iter_from_hf(files, config, keys, family.name))


class _Recording(dict[str, Tensor]):
    """A dict that remembers the last name read: which file tensor a check was looking at."""

    last = ""

    def __getitem__(self, name: str) -> Tensor:
        self.last = name
        return super().__getitem__(name)


def load_hf_gpt2(
    directory: str | Path, *, dropout: float = 0.0, map_location: str | torch.device = "cpu"
) -> GPT:
    """A Hugging Face GPT-2 directory -> attnlab GPT (other families: `load_hf`)."""
    hf_config = read_hf_config(directory)
    if hf_config.get("model_type") != "gpt2":
        raise ValueError(
            f"model_type={hf_config.get('model_type')!r}: load_hf_gpt2 reads GPT-2 only "
            "(model_type 'gpt2'); load_hf reads every supported family"
        )
    return load_hf(directory, dropout=dropout, map_location=map_location)


def open_hf_checkpoint(directory: str | Path) -> OpenedCheckpoint:
    """A Hugging Face directory opened as `attnlab.load.open_checkpoint` opens one: the
    weights' headers checked against the config, then the tokenizer read and checked
    (before the weights: a directory without one fails at once, not after the load)."""
    opened = open_hf_weights(directory)
    tokenizer = load_hf_tokenizer(directory, opened.config.vocab_size)
    check_fits(tokenizer, opened.config.vocab_size)
    family = family_of(read_hf_config(directory))
    meta = {"source": "huggingface", "family": family.name,
            "architecture": family.architecture}
    return OpenedCheckpoint(Path(directory), opened, tokenizer, meta)


def load_hf_checkpoint(
    directory: str | Path, *, map_location: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None, force: bool = False,
    progress: Progress | None = None,
) -> Checkpoint:
    """Model and tokenizer of a Hugging Face directory, as `load_checkpoint` returns them;
    meta names the family and architecture."""
    resolve_device(str(map_location))  # a missing CUDA named before any reading
    return open_hf_checkpoint(directory).load(map_location=map_location, dtype=dtype,
                                              force=force, progress=progress)


def save_hf(path: str | Path, model: GPT, tokenizer: Tokenizer | None = None, *,
            family: Family | str | None = None, max_shard_size: int = MAX_SHARD_SIZE,
            progress: Progress | None = None) -> Path:
    """Write config.json + the weights (+ the tokenizer's files) so that transformers'
    `AutoModelForCausalLM.from_pretrained(path)` loads the same model.

    family: a Family or its name ("llama", "mistral", ...; a loaded directory's is
    `load_checkpoint(dir).meta["family"]`); default: the first family that expresses the
    config exactly (`family_for_config`), e.g. Llama for a Mistral without a window
    (Mistral-7B v0.2 and later), the same computation.

    max_shard_size: bytes per weight file (default 5 GB). A model that fits in one is
    written as model.safetensors; a larger one as Hugging Face's shards
    (model-00001-of-0000N.safetensors and model.safetensors.index.json), made and written
    one at a time: the export holds one shard's worth of tensors beside the model at most
    (the tensors Hugging Face lays out otherwise: transposes, joined q/k/v), never a copy of
    the whole model (docs/models.md#export). progress: called as (bytes written, bytes to
    write) as the files are written, a piece of a few tens of MB at a time."""
    if not isinstance(model, GPT):
        raise TypeError(f"save_hf(path, model, tokenizer): model is a {type(model).__name__}, "
                        "not an attnlab GPT (the directory comes first)")
    refuse_packed(model, "save_hf")
    family = _family(family) or family_for_config(model.config)
    # null ids without a tokenizer: transformers would fill in the family's own (GPT-2's
    # 50256), outside a small vocabulary. Padding is always null: Phi-3's default (32000)
    # is an Embedding's padding_idx, refused past a small vocabulary, and the padding id
    # changes no number a forward computes
    special: dict[str, int | list[int] | None] = {"bos": None, "eos": None, "pad": None}
    if tokenizer is not None:
        special |= {"bos": getattr(tokenizer, "bos_id", None),
                    "eos": eos_field(tokenizer.stop_ids)}
    config = config_to_hf(model.config, family=family, special=special)
    # the weights' dtype, as save_pretrained writes it: from_pretrained loads a bfloat16
    # file in bfloat16 (without it, float32 at twice the memory)
    config["dtype"] = str(model.wte.weight.dtype).removeprefix("torch.")
    state = model.state_dict()
    sizes = {name: t.numel() * t.element_size() for name, t in hf_layout(model, family).items()}
    sources = [tokenizer.source] if isinstance(tokenizer, HFDirTokenizer) and tokenizer.source \
        else []
    directory = Path(path)
    write_hf_dir(directory, config, family.weights.iter_to_hf(state, model.config), sizes,
                 tokenizer, sources, max_shard_size=max_shard_size, progress=progress)
    return directory


def hf_layout(model: GPT, family: Family | str | None = None) -> dict[str, Tensor]:
    """The tensors `save_hf` writes for `model` as `family` (default: `family_for_config`),
    by Hugging Face name, in the order written, as meta tensors (names, shapes, dtypes):
    `model` may be on the meta device itself (an opened checkpoint's, sized before it is
    loaded); nothing is allocated."""
    family = _family(family) or family_for_config(model.config)
    meta = {name: tensor.to("meta") for name, tensor in model.state_dict().items()}
    return dict(family.weights.iter_to_hf(meta, model.config))


def _family(family: Family | str | None) -> Family | None:
    """A Family given by itself or by its name; ValueError listing the names for another."""
    if isinstance(family, str):
        if family not in FAMILY_BY_NAME:
            raise ValueError(f"unknown family {family!r}; choose one of "
                             f"{sorted(FAMILY_BY_NAME)}")
        return FAMILY_BY_NAME[family]
    return family


def save_hf_gpt2(directory: str | Path, model: GPT, tokenizer: Tokenizer | None = None) -> Path:
    """save_hf as GPT2LMHeadModel; ValueError if the model is not GPT-2 shaped."""
    return save_hf(directory, model, tokenizer, family=GPT2)
