"""The GPT model: token (+ position) embeddings -> blocks -> final norm -> linear head.

One `GPTConfig` spans a one-layer model (`seed-minimal`: one single-head attention and a linear
head, nothing else), a nanoGPT/GPT-2 pre-LayerNorm stack and the modern family (Llama, Mistral,
Qwen, GPT-NeoX, Gemma: RoPE, RMSNorm, SwiGLU / GeGLU, GQA, QK-norm, parallel residual, sliding
window, scaled embeddings). Attention math is `attention.py`'s, the norms and MLPs `layers.py`'s,
rotary embeddings `rope.py`'s, the one-token decode path is `decode.py`'s; this module wires
them, owns positions and the loss. Hugging Face weights: `hf/`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from .block import Block, norm_of
from .config import GPTConfig
from .kv_cache import KVCache
from .layers import Linear, embedding_scale, soft_cap
from .masks import Mask, build_mask
from .moe import MoE, balance_loss
from .packed import packed_size
from .rope import Rope, Rotary, layer_ropes, nope_temperatures, real_positions
from .runtime import kept_out
from .trace import EditSource, Seam, Trace


class ModelOutput(NamedTuple):
    logits: Tensor  # (B, T, V), or (B, 1, V) with last_logits_only
    loss: Tensor | None  # mean next-token cross-entropy over non-ignored targets


class GPT(nn.Module):
    """Decoder-only transformer. `forward(idx, targets, attention_mask, ...)` -> ModelOutput."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        c = self.config = config
        # creation order decides which of a seed's random draws each weight gets: token
        # table, position table, q, k, v, head (reordering changes every seeded model)
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd) if c.pos == "learned" else None
        # rotary: float32 frequencies, cos/sin computed per call (no block_size table)
        self.rotary = Rotary(c.rotary_dims, 1.0, c.rope_theta, c.rope_scaling,
                             c.rope_interleaved, c.rope_backwards) if c.pos == "rope" else None
        # the sliding-window layers' own RoPE base (Gemma 3); None: they use `rotary`
        self.local_rotary = None if c.local_rope_theta is None else Rotary(
            c.rotary_dims, 1.0, c.local_rope_theta, None, c.rope_interleaved, c.rope_backwards)
        self.drop = nn.Dropout(c.dropout)
        # nanochat's norm of the embeddings before the first block; None: none
        self.ln_emb = norm_of(c) if c.embedding_norm else None
        self.blocks = nn.ModuleList([Block(c, i) for i in range(c.n_layer)])
        self.ln_f = norm_of(c)
        self.lm_head = Linear(c.n_embd, c.vocab_size, bias=c.head_bias)
        if c.tie_weights:
            self.lm_head.weight = self.wte.weight
        # what decode streams the matrices as: "float16" after decode.half_weights(model)
        self.decode_weights = "float32"
        if c.init_std is not None:
            self._init_weights(c.init_std)
        self.lay_out_weights()  # after init: the same seed gives the same values either way

    def _init_weights(self, std: float) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("attn.sinks"):  # gpt-oss's sink logits, drawn as transformers does
                nn.init.normal_(p, mean=0.0, std=std)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer) (one per sublayer;
        # each expert's of a mixture, its shared expert's)
        for name, p in self.named_parameters():
            if name.endswith(("attn.out_proj.weight", "mlp.proj.weight",
                              "mlp.shared.proj.weight")) or (
                    ".experts." in name and name.endswith(".proj.weight")):
                nn.init.normal_(p, mean=0.0, std=std / math.sqrt(2 * self.config.n_layer))

    def lay_out_weights(self) -> None:
        """Store each Linear weight, shape (out, in), with its longer side along memory rows:
        (in, out) memory (GPT-2's Conv1D layout; `weight.t()` contiguous) when out >= in,
        else nn.Linear's own (out, in) (`laid_out`). Idempotent; copies only weights laid out
        otherwise (e.g. assigned by `load_state_dict(..., assign=True)`).

        Shapes, state dicts and results stay nn.Linear's. Why: a decode step multiplies one
        row by each matrix, and CPU BLAS streams a matrix fastest along its long rows
        (docs/performance.md#weight-layout), so `DecodeStep` uses these weights in place,
        without a copy. With tied weights the token table is the head's matrix, so its
        lookups read a column (one token: C strided reads).
        """
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and not laid_out(module):
                    w = module.weight.data  # (out, in)
                    # same Parameter: ties hold
                    module.weight.data = (w.t().contiguous().t() if _wide(module)
                                          else w.contiguous())

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without the position table (nanoGPT's convention)."""
        n = sum(p.numel() for p in self.parameters()) + packed_size(self)[0]  # and packed
        return n - self.wpe.weight.numel() if non_embedding and self.wpe is not None else n

    def new_cache(
        self, batch_size: int, max_len: int | None = None, *, dtype: torch.dtype | None = None,
        per_head: bool = False,
    ) -> KVCache:
        """A static KV cache for this model. max_len defaults to block_size for learned
        positions; other models need it (their block_size may be 32k-128k): prompt + new.
        Latent attention's holds the latents (`KVCache.latent`) unless `per_head`: each
        head's k and v, as every other attention's (`latent.py`)."""
        c = self.config
        if max_len is None and c.pos != "learned":
            raise ValueError(
                f"pass max_len (prompt + new tokens) for a pos={c.pos!r} model: its "
                f"block_size={c.block_size} is a limit, not a size to allocate"
            )
        max_len = c.block_size if max_len is None else max_len
        if max_len > c.block_size:
            raise ValueError(
                f"cache max_len={max_len} exceeds block_size={c.block_size}: positions past "
                "block_size have no embedding"
            )
        dtype, device = dtype or self.wte.weight.dtype, self.wte.weight.device
        if c.kv_latent is not None and not per_head:
            return KVCache.latent(c.n_layer, batch_size, max_len, c.kv_latent, c.rope_head_dim,
                                  dtype=dtype, device=device)
        return KVCache.static(c.n_layer, batch_size, c.n_kv_heads, max_len, c.head_size,
                              dtype=dtype, device=device)

    def _check_inputs(
        self, idx: Tensor, pos: int, attention_mask: Tensor | None, targets: Tensor | None,
        check_ids: bool = True,
    ) -> None:
        c = self.config
        check_id_batch(idx, "idx")
        B, T = idx.shape
        if pos + T > c.block_size:
            raise ValueError(
                f"sequence of {pos + T} tokens ({pos} cached + {T} new) exceeds "
                f"block_size={c.block_size}; truncate the input to the last {c.block_size} "
                "tokens or use a model with a larger block_size"
            )
        if attention_mask is not None and attention_mask.shape != (B, pos + T):
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} != (B, cached + new) = "
                f"({B}, {pos + T}); it must cover every key, cached ones included"
            )
        if targets is not None and targets.shape != (B, T):
            raise ValueError(f"targets shape {tuple(targets.shape)} != idx shape {(B, T)}; "
                             "give one target id per input id (the ids shifted by one)")
        if check_ids and not torch.compiler.is_compiling():  # a read-back breaks a graph
            check_token_ids(idx, targets, c.vocab_size)
            if attention_mask is not None:
                check_mask_values(attention_mask)

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        attention_mask: Tensor | None = None,
        *,
        kv_cache: KVCache | None = None,
        trace: Trace | None = None,
        edits: EditSource | None = None,
        fused: bool | None = None,
        last_logits_only: bool = False,
        check_ids: bool = True,
        start_at: tuple[int, Tensor] | None = None,
    ) -> ModelOutput:
        """idx (B, T) token ids -> logits (B, T, V) and, with targets (B, T), the loss.

        attention_mask (B, S): 1 for tokens, 0 for (left) padding, over cached + new tokens
        (a kv_cache keeps it: later calls without one see the same pads, their tokens real).
        Positions count real tokens only (cumsum - 1), so a left-padded row gives the same
        logits at its real positions as the row alone. Targets equal to -1 and targets at
        padded input positions are ignored by the loss (right-padded rows set their pad
        targets to -1 themselves). kv_cache: write keys/values at
        `kv_cache.seq_len` and advance it. trace: capture intermediates (explicit path where
        it wants scores or weights). edits: replace intermediates by name (`interp.edits.Edits`);
        the trace then sees the edited values. check_ids=False skips reading the ids back to
        check them against vocab_size (`check_token_ids`) and the mask's values
        (`check_mask_values`): on a GPU that read waits for all the work queued before it, at
        every call, so training checks its batches on the host.
        start_at=(layer, x): start at block `layer` from x (B, T, C), the residual stream
        entering it (a trace's "resid_pre" there, or "block_out" of the block before), skipping
        the embeddings and the blocks before it (TransformerLens's start_at_layer); idx still
        gives the positions. Activation patching restarts each patched run there.
        """
        pos = 0 if kv_cache is None else kv_cache.seq_len
        self._check_inputs(idx, pos, attention_mask, targets, check_ids)
        T = idx.shape[1]
        if kv_cache is not None:
            if len(kv_cache.layers) != self.config.n_layer:
                raise ValueError(
                    f"kv_cache has {len(kv_cache.layers)} layers, model has "
                    f"{self.config.n_layer}; create it with model.new_cache(...)"
                )
            if self.config.kv_latent is None and kv_cache.holds_latents:
                raise ValueError("kv_cache holds latents (KVCache.latent), and this model has no "
                                 "latent attention; create it with model.new_cache(...)")
            attention_mask = kv_cache.key_mask(attention_mask, T)  # (B, pos + T) or None
        if trace is not None:
            trace.begin(self.config, attention_mask)
        start = None if start_at is None else self._check_start(start_at, idx.shape, kv_cache)
        if edits is not None:
            if not hasattr(edits, "check"):
                raise TypeError(f"edits is a {type(edits).__name__}, not an Edit or Edits; "
                                "join several as Edits([...]) or edit_a + edit_b")
            edits.check(self.config, start)
        if attention_mask is not None:
            attention_mask = attention_mask.to(idx.device)
            positions = real_positions(attention_mask, T)  # (B, T)
        else:
            positions = torch.arange(pos, pos + T, device=idx.device)[None]  # (1, T)

        seam = None if trace is None and edits is None else Seam(trace, edits, pos + T)
        x = self._embed(idx, positions, seam) if start_at is None else start_at[1]  # (B, T, C)
        x = self._run_blocks(x, pos, attention_mask, kv_cache, seam, fused,
                             self.ropes(positions), start or 0, positions)  # (B, T, C)
        return self._head(x, targets, attention_mask, seam, last_logits_only)

    def _check_start(self, start_at: tuple[int, Tensor], shape: torch.Size,
                     kv_cache: KVCache | None) -> int:
        """The first block `start_at` runs, after checking it against idx's (B, T) shape."""
        (layer, x), n_layer = start_at, self.config.n_layer
        if not 0 <= layer <= n_layer:
            raise ValueError(f"start_at layer {layer} outside 0..{n_layer}: the model has "
                             f"{n_layer} blocks ({n_layer}: the final norm and head alone)")
        if x.shape != (*shape, self.config.n_embd):
            raise ValueError(f"start_at's residual stream has shape {tuple(x.shape)}, not "
                             f"(B, T, C) = {(*shape, self.config.n_embd)} of idx {tuple(shape)}")
        weights = self.wte.weight
        if (x.dtype, x.device) != (weights.dtype, weights.device):
            raise ValueError(f"start_at's residual stream is {x.dtype} on {x.device}, the model "
                             f"{weights.dtype} on {weights.device}; pass it as a trace of this "
                             "model gives it (.to(model.wte.weight))")
        if kv_cache is not None:
            raise ValueError("start_at skips the blocks before it, whose keys and values the "
                             "kv_cache would then miss; run without kv_cache")
        return layer

    def _embed(self, idx: Tensor, positions: Tensor, seam: Seam | None) -> Tensor:
        """Token (+ learned position) embeddings of idx (B, T), after dropout: (B, T, C)."""
        B, T = idx.shape
        tok_emb = self.wte(idx)  # (B, T, C)
        if self.config.scale_embeddings:
            tok_emb = tok_emb * embedding_scale(self.config.n_embd, tok_emb)  # (B, T, C)
        if self.config.embedding_multiplier != 1.0:  # Granite
            tok_emb = tok_emb * self.config.embedding_multiplier  # (B, T, C)
        pos_emb = None if self.wpe is None else self.wpe(positions).expand(B, T, -1)  # (B, T, C)
        if seam is not None:
            tok_emb = seam.record("tok_emb", tok_emb)
            if pos_emb is not None:
                pos_emb = seam.record("pos_emb", pos_emb)
        x = self.drop(tok_emb if pos_emb is None else tok_emb + pos_emb)  # (B, T, C)
        if self.ln_emb is not None:
            x = self.ln_emb(x)  # (B, T, C): what the first block reads ("emb")
        if seam is not None:
            x = seam.record("emb", x)
        return x

    def ropes(self, positions: Tensor) -> dict[bool, Rope | None]:
        """{windowed: cos, sin (B|1, 1, T, rd) each, or None without RoPE} at `positions`
        (B|1, T): the sliding-window layers' under True, the others' under False."""
        return layer_ropes(self.rotary, self.local_rotary, positions)

    def _run_blocks(
        self, x: Tensor, pos: int, attention_mask: Tensor | None, kv_cache: KVCache | None,
        seam: Seam | None, fused: bool | None, ropes: dict[bool, Rope | None],
        first: int, positions: Tensor,
    ) -> Tensor:
        """x (B, T, C) at positions (B|1, T) through the blocks from `first` on, the new
        keys/values written to kv_cache (which then advances by T): (B, T, C)."""
        T, c = x.shape[1], self.config
        # (B|1, 1, T, 1): Llama 4's NoPE layers' q factors; None without them
        temperature = nope_temperatures(positions, c.nope_temperature, c.nope_temperature_floor
                                        ) if c.nope_temperature else None
        masks: dict[int | None, Mask] = {}  # one per window size (None: no window)
        for i in range(first, self.config.n_layer):
            block = self.blocks[i]
            window = self.config.window_of(i)
            if window not in masks:
                masks[window] = build_mask(
                    T, pos + T, attention_mask, causal=True, device=x.device, window=window
                )
            sink = None if seam is None else seam.layer(i)
            layer_cache = None if kv_cache is None else kv_cache.layers[i]
            if sink is not None:
                x = sink.record("resid_pre", x)
            rotates = c.rotates(i)
            rope = ropes[window is not None] if rotates else None
            x = block(x, masks[window], layer_cache, pos, sink, fused, rope,
                      None if rotates else temperature)  # (B, T, C)
            if sink is not None:
                x = sink.record("block_out", x)
        if kv_cache is not None:
            kv_cache.seq_len = pos + T
        return x

    def _head(
        self, x: Tensor, targets: Tensor | None, attention_mask: Tensor | None,
        seam: Seam | None, last_logits_only: bool,
    ) -> ModelOutput:
        """Final norm, unembedding and cap (final_logit_softcapping) of x (B, T, C), and the
        loss of the capped logits when there are targets (transformers' Gemma 2 order)."""
        T = x.shape[1]
        x = self.ln_f(x)  # (B, T, C)
        if last_logits_only:
            x = x[:, -1:]  # (B, 1, C)
        logits = unembed_scaled(self, x)  # (B, T, V)
        logits = soft_cap(logits, self.config.final_logit_softcapping, inplace=True)  # (B, T, V)
        if seam is not None:
            logits = seam.record("logits", logits)
        if targets is None:
            return ModelOutput(logits, None)
        if last_logits_only:
            raise ValueError("targets need logits at every position; drop last_logits_only")
        if attention_mask is not None:
            targets = targets.masked_fill(attention_mask[:, -T:] == 0, -1)  # (B, T)
        loss = next_token_loss(logits, targets)
        moes = self._balanced_mixtures()
        if moes:
            mask = None if attention_mask is None else attention_mask[:, -T:]  # (B, T)
            loss = loss + self.config.router_aux_loss_coef * balance_loss(moes, mask)
        return ModelOutput(logits, loss)

    def _balanced_mixtures(self) -> list[MoE]:
        """The mixtures whose routing the load-balancing loss reads: every block's, in a
        training forward with router_aux_loss_coef > 0; else none."""
        if not (self.training and self.config.router_aux_loss_coef > 0):
            return []
        return [block.mlp for block in self.blocks if isinstance(block.mlp, MoE)]


def require_eval(model: Any, what: str) -> None:
    """Raise when `model` is in training mode with dropout: `what` would then be random,
    different on every call (nn.Module starts in training mode; generation and every
    analysis refuse it alike)."""
    if model.training and model.config.dropout > 0:
        raise ValueError(f"the model is in training mode with dropout, so {what} would be "
                         "random; call model.eval() first")


def check_position(position: int, T: int, what: str = "position") -> None:
    """Raise unless `position` indexes one of T tokens (negative counts from the end)."""
    if not -T <= position < T:
        raise ValueError(f"{what} {position} is out of range for {T} tokens; use 0 to "
                         f"{T - 1}, or -1 for the last")


def per_row_ids(ids: int | Tensor, B: int, what: str, device: torch.device) -> Tensor:
    """One id for every row, or (B,) ids, as (B,) ids on `device` (an analysis's target)."""
    ids = torch.as_tensor(ids, device=device)
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"{what} ids are {ids.dtype}; pass integer token ids "
                         "(torch.long), as the tokenizer gives them")
    if ids.dim() > 1 or ids.numel() not in (1, B):
        raise ValueError(f"{what} has shape {tuple(ids.shape)}: pass one id, or ({B},) ids, "
                         "one per row of the batch")
    return ids.expand(B)  # (B,)


def _wide(linear: nn.Linear) -> bool:
    return linear.out_features >= linear.in_features


def laid_out(linear: nn.Linear) -> bool:
    """Whether `linear`'s weight has the memory `GPT.lay_out_weights` gives it: (in, out)
    when out >= in, (out, in) when in > out."""
    w = linear.weight  # (out, in)
    return (w.t() if _wide(linear) else w).is_contiguous()


_BIG_LOGITS = 64 << 20  # bytes
_HEAD_COLUMNS = 512  # vocabulary entries per product in unembed


def unembed_scaled(model: GPT, x: Tensor) -> Tensor:
    """x (B, T, C) -> the logits (B, T, V) before any cap: `unembed`, scaled where the model
    scales them (Granite's logits_scaling, MiniCPM's before the head, Cohere's logit_scale:
    `GPTConfig.head_input`, `GPTConfig.scaled_logits`)."""
    logits = unembed(model.lm_head, model.config.head_input(x))  # (B, T, V)
    return model.config.scaled_logits(logits, inplace=True)  # (B, T, V)


def unembed(head: nn.Linear, x: Tensor) -> Tensor:
    """x (B, T, C) -> head(x) (B, T, V). Without autograd, logits of 64 MiB and more (GPT-2
    at T=1024: 206 MB) go into a buffer earlier logits freed, or fresh memory advised for
    huge pages (runtime.kept_out), filled 512 vocabulary columns at a time: CPU BLAS
    multiplies such (T, C) x (C, 512) blocks at a higher rate than the whole (T, V) product
    (docs/performance.md#head-blocks). Each logit is the same sum over C either
    way."""
    B, T, C = x.shape
    V = head.out_features
    big = B * T * V * x.element_size() >= _BIG_LOGITS
    out = kept_out((B * T, V), x, head.weight) if big else None  # (B*T, V)
    if out is None:
        return head(x)
    x2 = x.reshape(B * T, C)  # (B*T, C)
    for start in range(0, V, _HEAD_COLUMNS):
        cols = slice(start, start + _HEAD_COLUMNS)
        w = head.weight[cols].t()  # (C, n)
        if head.bias is None:
            torch.mm(x2, w, out=out[:, cols])  # (B*T, n) into its columns
        else:
            torch.addmm(head.bias[cols], x2, w, out=out[:, cols])
    return out.view(B, T, V)  # (B, T, V)



def count_params(config: GPTConfig) -> int:
    """Parameters of GPT(config), embeddings included, counted on the meta device (nothing
    allocated or initialised)."""
    with on_meta():
        return GPT(config).num_params(non_embedding=False)


class _SkipInit(TorchFunctionMode):
    """torch.nn.init functions do nothing: on the meta device there is nothing to draw, and
    normal_ there goes through torch._refs, whose first call imports torch._dynamo, a cost
    every command that loads a checkpoint would pay (docs/performance.md#loading-without-init)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


@contextmanager
def on_meta() -> Iterator[None]:
    """Build modules on the meta device without drawing their initial weights."""
    with torch.device("meta"), _SkipInit():
        yield


def check_id_batch(ids: Tensor, name: str) -> None:
    """Raise ValueError unless `ids` (`name` in the message) is a batch of token ids: a
    (B, T) int64 or int32 tensor with T >= 1. Reads no values (`check_token_ids` does)."""
    if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        integer = ids.dtype in (torch.int64, torch.int32)
        fix = (f"add a batch dimension with {name}[None]" if ids.dim() == 1 and integer
               else "pass the tokenizer's ids as torch.long, one row per sequence")
        raise ValueError(f"{name} must be a (B, T) integer tensor of token ids, got "
                         f"{ids.dtype} of shape {tuple(ids.shape)}; {fix}")
    if ids.shape[1] == 0:
        raise ValueError(f"{name} has no tokens (T=0); pass at least one token id")


def check_token_ids(idx: Tensor, targets: Tensor | None, vocab_size: int) -> None:
    """Raise ValueError if an id in idx is outside [0, vocab_size) or a target outside it and
    not -1. Reads the values back: on a GPU a wait for all the work queued before it."""
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(
            f"token id {bad} is outside the vocabulary [0, {vocab_size}); the tokenizer "
            "and the model disagree on vocab_size"
        )
    if targets is not None and (int(targets.min()) < -1 or int(targets.max()) >= vocab_size):
        raise ValueError(
            f"targets must be token ids in [0, {vocab_size}) or -1 (ignored), got "
            f"values in [{int(targets.min())}, {int(targets.max())}]"
        )


def check_mask_values(attention_mask: Tensor) -> None:
    """Raise ValueError unless attention_mask holds only 1 (token) and 0 (padding): positions
    count its 1s (cumsum), so a 2 would silently move every later position. Reads one value
    back unless the mask is bool."""
    if attention_mask.dtype == torch.bool:
        return
    odd = (attention_mask != 0) & (attention_mask != 1)  # (B, S)
    if bool(odd.any()):
        raise ValueError(
            f"attention_mask holds {attention_mask[odd][0].item()}; it must be 1 for tokens "
            "and 0 for (left) padding, or a bool mask"
        )


def next_token_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of logits (B, T, V) against targets (B, T), ignoring target -1.

    Zero (not NaN) when every target is ignored, e.g. a batch of padding only.
    """
    V = logits.shape[-1]
    total = F.cross_entropy(
        logits.reshape(-1, V).float(), targets.reshape(-1), ignore_index=-1, reduction="sum"
    )  # (B * T, V) vs (B * T,)
    count = (targets != -1).sum().clamp(min=1)
    return total / count
