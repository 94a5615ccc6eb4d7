"""`GPTConfig`: the shape and switches of a GPT, their validation, and the named presets.

Every field is flat so that each is a CLI flag (`attnlab train --n_layer 6`). The names of
the modern-family switches are the contract with the Hugging Face mapping (`hf`): change
them only together with it. Building the model from a config is `gpt.py`'s job.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .experts_config import check_experts
from .latent_config import check_latent
from .layers import GELUS, MLPS, NORMS
from .position_config import check_positions
from .presets import PRESETS as PRESETS

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class GPTConfig:
    """Shape and structure of a GPT. Presets: `GPTConfig.from_name(name)`, see `PRESETS`.

    The defaults are GPT-2's. The modern-family switches (RoPE, RMSNorm, SwiGLU, head_dim,
    QK-norm, separate attention biases, parallel residual, sliding window) keep the names
    the Hugging Face mapping (`hf`) reads. Saved configs with the older `layer_norm: bool`
    and `mlp: bool` load through `from_dict` (`upgrade`).
    """

    vocab_size: int = 65  # V: number of token ids (65 = tiny Shakespeare characters)
    block_size: int = 64  # longest sequence (cache included) the model supports
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # query heads per block
    n_kv_head: int | None = None  # key/value heads (grouped-query attention); None = n_head
    n_embd: int = 128  # C: residual stream width
    dropout: float = 0.0  # on embeddings, attention weights and residual branches (training)
    bias: bool = True  # biases in MLP Linears and LayerNorms (GPT-2: True)
    # bias on the LayerNorms; None = bias (StableLM: True beside bias=False)
    norm_bias: bool | None = None
    # "gelu": proj(gelu(fc(x))); "relu" (OPT): proj(relu(fc(x))); "relu2" (Arcee):
    # proj(relu(fc(x))^2); "swiglu": proj(silu(gate(x)) * fc(x)); "geglu" (Gemma):
    # proj(gelu(gate(x)) * fc(x)), with the `gelu` form; "clamped_swiglu" (gpt-oss):
    # proj(g * sigmoid(swiglu_alpha * g) * (u + 1)), g = gate(x) capped at swiglu_limit, u =
    # fc(x) clamped to +-swiglu_limit; "none"
    mlp: str = "gelu"
    gelu: str = "tanh"  # "tanh" (GPT-2's approximation) or "exact" (erf: nanoGPT, faster on CPU)
    # pre-norm in blocks and final norm: "layernorm", "rmsnorm", "gemma_rmsnorm" (scaled by
    # 1 + weight, in float32), "olmo_rmsnorm" (scaled before the cast back), "unit_rmsnorm"
    # (no learned scale: nanochat's), "unit_layernorm" (no scale or bias, in float32: OLMo
    # 1's), "none"
    norm: str = "layernorm"
    residual: bool = True  # residual connections (False: attention output feeds the head)
    attn_out_proj: bool = True  # output projection after the heads are concatenated
    tie_weights: bool = True  # lm_head shares the token embedding matrix
    attn_scale: float | None = None  # score multiplier; None = 1/sqrt(head size)
    # Gemma 2's soft caps, cap * tanh(x / cap), of the scaled scores before the mask and of
    # the logits; a capped model takes attention's explicit path (SDPA cannot cap its scores)
    attn_logit_softcapping: float | None = None  # scores' cap (Gemma 2: 50); None: no cap
    final_logit_softcapping: float | None = None  # logits' cap (Gemma 2: 30); None: no cap
    init_std: float | None = 0.02  # normal init std (GPT-2); None keeps PyTorch's defaults
    pos: str = "learned"  # positions: "learned" (wpe table), "rope" (rotary), "none"
    rope_theta: float = 10000.0  # RoPE base
    rotary_pct: float = 1.0  # fraction of each head's dims rotated (Pythia: 0.25)
    rope_scaling: dict[str, Any] | None = None  # HF's: linear, llama3, yarn, longrope
    norm_eps: float = 1e-5  # epsilon of every norm (QK-norm included)
    d_ff: int | None = None  # MLP hidden width; None = 4 * n_embd
    head_dim: int | None = None  # hs; None = n_embd // n_head
    qk_norm: bool = False  # RMSNorm on each head's q and k before RoPE (Qwen3)
    # QK-norm over each token's whole q (nh * hs) and k (nkv * hs), not each head's (OLMo 2)
    qk_norm_whole: bool = False
    # QK-norm a LayerNorm without bias with a weight row per head, rounded as "cohere" (in
    # float32, once: Command R+) or "stablelm" (torch's, head by head: StableLM-2-12B)
    qk_norm_heads: str | None = None
    # QK-norm after RoPE, not before it (Hunyuan's)
    qk_norm_after_rope: bool = False
    # q and k rotated in float32 and cast back (OLMo's), not in their own dtype (Llama's): the
    # same in float32, not in 16 bits
    rope_in_float32: bool = False
    # with rope_in_float32: cos and sin rounded to the model's dtype before that float32
    # rotation (Cohere's), not kept in float32 (OLMo's); float32: the same
    rope_tables_rounded: bool = False
    # RoPE turns adjacent pairs of dims (GPT-J's rotate_every_two), not the two halves of the
    # rotated part (Llama's and GPT-NeoX's rotate_half)
    rope_interleaved: bool = False
    qkv_bias: bool | None = None  # bias on query/key/value; None = bias
    # q, k and v clamped to +-qkv_clip as they leave their projections (OLMo 1's clip_qkv)
    qkv_clip: float | None = None
    out_bias: bool | None = None  # bias on the attention output projection; None = bias
    parallel_residual: bool = False  # x + attn(ln_1(x)) + mlp(ln_2(x)) (GPT-NeoX)
    # the parallel residual's branches read one norm: x + attn(ln_1(x)) + mlp(ln_1(x)), no
    # ln_2 (Phi-1 / 1.5 / 2, GPT-J)
    shared_norm: bool = False
    head_bias: bool = False  # a bias on the output head, lm_head (Phi-1 / 1.5 / 2, GPT-J)
    # the model's attention window: query i sees keys i - sliding_window < j <= i (not
    # generate's --sliding-window, which keeps the last block_size tokens of a long text)
    sliding_window: int | None = None
    window_layers: list[int] | None = None  # layers with the window; None = all
    # token embeddings times sqrt(n_embd), rounded to the weights' dtype first (Gemma); the
    # tied head reads the table unscaled
    scale_embeddings: bool = False
    # a norm on each branch's output too, before its residual add (Gemma 2 and 3's "sandwich")
    sandwich_norm: bool = False
    # a norm on each branch's input (False: none, OLMo 2's blocks, which with sandwich_norm
    # norm only each branch's output)
    pre_norm: bool = True
    # RoPE base of the layers with a sliding window, unscaled (Gemma 3: 10,000 there, the
    # others rope_theta and rope_scaling); None = every layer the same
    local_rope_theta: float | None = None
    # in 16 bits, the explicit and traced paths multiply q and k in float32 and give the
    # weights back to v's dtype (GPT-J's and GPT-Neo's eager attention); float32: the same
    scores_in_float32: bool = False
    # layers that rotate no q or k (NoPE: SmolLM3's every fourth); None = every layer rotates
    nope_layers: list[int] | None = None
    # each head's q and k divided by their root mean square (no weight, eps norm_eps, in
    # float32) after RoPE, in the layers that rotate (Llama 4's, nanochat's)
    qk_l2_norm: bool = False
    # RoPE turns each pair the other way, by minus its angle (nanochat's rotate_half is
    # (x2, -x1), Llama's (-x2, x1))
    rope_backwards: bool = False
    # the embeddings normed (a `norm` of their own) before the first block (nanochat's)
    embedding_norm: bool = False
    # Llama 4's temperature: a NoPE layer's q times 1 + nope_temperature * log(1 + floor((p +
    # 1) / nope_temperature_floor)) at position p, in float32 (0.0: none), so that its scores
    # sharpen as the context grows
    nope_temperature: float = 0.0
    nope_temperature_floor: int = 8192
    # Granite's three scalars: token embeddings times embedding_multiplier, each branch's
    # output times residual_multiplier before its residual add, logits divided by
    # logits_scaling (1.0: none of them)
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    # logits_scaling divides the final norm's output before the head (MiniCPM's), not the
    # logits after it (Granite's): the same in exact arithmetic, rounded apart
    logits_scaled_first: bool = False
    logit_scale: float = 1.0  # logits times this (Cohere's logit_scale); 1.0: none
    # a sparse mixture of n_experts MLPs (each of the `mlp` kind, d_ff wide) in every block,
    # each token through the experts_per_token its router ranks first, weighted by their
    # softmax probabilities, renormalised over the chosen where experts_normalized (Mixtral:
    # True, OLMoE: False); None: one dense MLP (`moe.py`)
    n_experts: int | None = None
    experts_per_token: int = 2
    experts_normalized: bool = True
    # in 16 bits, each expert's output times its weight in float32 (Mixtral's), not with the
    # weight rounded to the model's dtype first (OLMoE's, Qwen3-MoE's); float32: the same
    expert_weights_in_float32: bool = True
    # the chosen experts' weights as the softmax of their logits alone (GraniteMoE's), not
    # their probabilities renormalised: the same numbers, rounded otherwise; needs
    # experts_normalized
    experts_from_top_logits: bool = False
    # an expert this wide that every token goes through beside its routed ones, its output
    # times sigmoid(a gate's score) where shared_expert_gated (Qwen2-MoE's shared expert);
    # None: none
    shared_expert_size: int | None = None
    # training: the loss adds this times Mixtral's load-balancing term (Switch Transformer's:
    # n_experts * sum_e share of picks_e * mean probability_e, over every layer's tokens), which
    # keeps a mixture from sending every token to a few experts; 0: none. A sigmoid router's
    # "probabilities" are its scores normalised to sum 1 (DeepSeek-V3's balance loss's)
    router_aux_loss_coef: float = 0.0
    router_bias: bool = False  # a bias on the router's Linear (gpt-oss)
    # how the router scores the experts: "softmax" (the probabilities above); "sigmoid"
    # (DeepSeek-V3's, GLM-4.5's, dots.llm1's): float32 logits of the float32 input, each
    # expert's score sigmoid(logit), the top experts picked by score + a correction bias (the
    # float32 buffer router.e_score_correction_bias, read from the files, never trained: it
    # steers the load without a loss) and weighted by their unbiased scores;
    # "softmax_corrected" (ERNIE 4.5's): the same float32 logits and correction bias, each
    # score the softmax probability; "softmax_float32" (DeepSeek-V2's): that, with no bias;
    # "sigmoid_input" (Llama 4's): the top logits, each chosen expert's input times its sigmoid
    router_scoring: str = "softmax"
    # a softmax router renormalises its chosen weights by their sum clamped at this floor
    # (ERNIE 4.5's moe_norm_min): picks the correction bias made among near-zero
    # probabilities stay small instead of blown up to sum 1; 0.0: no clamp
    router_norm_min: float = 0.0
    # "sigmoid" scoring in groups: the experts split into expert_groups runs of equal size, a
    # token picks among the expert_groups_chosen groups whose two best biased scores sum
    # highest ("softmax_float32": whose best probability is highest; DeepSeek's n_group /
    # topk_group, which bound a token's devices); 1, 1: none
    expert_groups: int = 1
    expert_groups_chosen: int = 1
    # the chosen experts' weights times this, after any renormalising (DeepSeek-V3's
    # routed_scaling_factor: sigmoid scores are small beside softmax probabilities); 1.0: none
    routed_scaling: float = 1.0
    # the shared expert's output times sigmoid(a gate's score) (Qwen2-MoE's), or added as it
    # is (False: DeepSeek-V3's, GLM-4.5's, dots.llm1's)
    shared_expert_gated: bool = True
    # the first dense_layers blocks have one dense MLP dense_d_ff wide (None: d_ff) in place
    # of the mixture (DeepSeek-V3's first_k_dense_replace: the early layers stay dense)
    dense_layers: int = 0
    dense_d_ff: int | None = None
    # the blocks that hold the mixture, in order, the others dense as above (ERNIE 4.5's
    # moe_layer_start_index / end / interval: a mixture every few layers); None: every block
    # from dense_layers on. Needs dense_layers=0
    mixture_layers: list[int] | None = None
    swiglu_alpha: float = 1.702  # "clamped_swiglu"'s sigmoid slope (gpt-oss: 1.702)
    swiglu_limit: float = 7.0  # "clamped_swiglu"'s clamp of gate and up (gpt-oss: 7.0)
    # a learned logit per query head in each layer's softmax, which takes weight and adds
    # nothing to the context: the weights over the keys sum to less than 1 (gpt-oss's
    # attention sinks); the model then takes attention's explicit path, as transformers does
    attn_sinks: bool = False
    # DeepSeek-V2 / V3's multi-head latent attention where kv_latent is set (`latent.py`): k
    # and v projected up from one normed kv_latent-wide latent per token, q from a q_latent-
    # wide one (None: straight from x); the last rope_head_dim of each head's head_size q and
    # k dims rotated (k's shared by every head); values v_head_dim wide (None: head_size)
    kv_latent: int | None = None
    q_latent: int | None = None
    rope_head_dim: int = 64
    v_head_dim: int | None = None

    def __post_init__(self) -> None:
        positive = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name}={value!r} must be a positive integer")
        for name in ("d_ff", "head_dim", "sliding_window", "dense_d_ff"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"GPTConfig.{name}={value!r} must be a positive integer or None")
        if self.head_dim is None and self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                f"choose n_head among the divisors of {self.n_embd}, or set head_dim"
            )
        kv = self.n_kv_heads
        if kv < 1 or self.n_head % kv:
            raise ValueError(
                f"n_kv_head={self.n_kv_head} must divide n_head={self.n_head} "
                "(each key/value head serves a whole number of query heads)"
            )
        for name in ("dropout", "norm_eps", "rope_theta", "rotary_pct", "attn_scale", "init_std",
                     "local_rope_theta"):
            value = getattr(self, name)  # "0.1" would fail below with a bare TypeError
            if value is not None and (isinstance(value, bool) or
                                      not isinstance(value, int | float)):
                raise ValueError(f"GPTConfig.{name}={value!r} must be a number")
            if value is not None and not math.isfinite(value):
                raise ValueError(f"GPTConfig.{name}={value!r} must be a finite number")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")
        if self.attn_scale is not None and not self.attn_scale > 0:  # 0 * -inf masks: NaN
            raise ValueError(f"attn_scale={self.attn_scale} must be > 0 (None: 1/sqrt of the "
                             "head size)")
        if not self.attn_out_proj and self.n_head * self.head_size != self.n_embd:
            raise ValueError(
                f"attn_out_proj=False feeds the heads' n_head * head_size = "
                f"{self.n_head * self.head_size} dims on as the n_embd={self.n_embd} stream; "
                "make them equal (head_dim=None) or keep the output projection"
            )
        for name, allowed in (("gelu", GELUS), ("norm", NORMS), ("mlp", MLPS), ("pos", POS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} must be one of {sorted(allowed)}")
        self._check_modern()

    def _check_modern(self) -> None:
        for name in ("embedding_multiplier", "residual_multiplier", "logits_scaling",
                     "logit_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    math.isfinite(value) and value > 0):
                raise ValueError(f"GPTConfig.{name}={value!r} must be a positive finite "
                                 "number (Granite's; 1.0 leaves the model as it is)")
        check_experts(self)
        check_latent(self)
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps={self.norm_eps} must be > 0")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta={self.rope_theta} must be > 0")
        rotary_dims = self.rotary_dims
        if not 0.0 < self.rotary_pct <= 1.0 or (self.pos == "rope" and rotary_dims % 2):
            raise ValueError(
                f"rotary_pct={self.rotary_pct} must be in (0, 1] and rotate an even number of "
                f"dims: int(head_size {self.head_size} * rotary_pct) = {rotary_dims}"
            )
        if self.pos == "rope" and rotary_dims < 2:
            raise ValueError(
                f"rotary_pct={self.rotary_pct} rotates {rotary_dims} of {self.head_size} dims; "
                "RoPE needs at least 2: raise rotary_pct or head_dim"
            )
        for name in ("attn_logit_softcapping", "final_logit_softcapping", "qkv_clip"):
            cap = getattr(self, name)
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int | float)
                                    or not math.isfinite(cap) or not cap > 0):
                raise ValueError(f"GPTConfig.{name}={cap!r} must be a positive finite number "
                                 "(a soft cap's cap * tanh(x / cap), Gemma 2's 50.0 and 30.0; "
                                 "qkv_clip's clamp, OLMo 1's 8.0), or None for no cap")
        check_positions(self)
        if self.sandwich_norm and (self.parallel_residual or not self.residual):
            raise ValueError("sandwich_norm norms each branch before its residual add: it needs "
                             "residual=True and parallel_residual=False")
        if self.shared_norm and not self.parallel_residual:
            raise ValueError("shared_norm=True has both branches of a parallel residual read "
                             "ln_1: it needs parallel_residual=True")
        if self.qk_norm_heads not in (None, "cohere", "stablelm"):
            raise ValueError(f"qk_norm_heads={self.qk_norm_heads!r} must be 'cohere', "
                             "'stablelm' or None")
        for name in ("qk_norm_whole", "qk_norm_heads"):
            both = self.qk_norm_whole and self.qk_norm_heads
            if getattr(self, name) and (not self.qk_norm or both):
                raise ValueError(f"{name}={getattr(self, name)!r} says how QK-norm is made: it "
                                 "needs qk_norm=True (and one of qk_norm_whole and qk_norm_heads)")
        if self.window_layers is not None:
            if self.sliding_window is None:
                raise ValueError(
                    f"window_layers={self.window_layers} needs sliding_window; set it or drop "
                    "window_layers"
                )
            bad = [i for i in self.window_layers if not 0 <= i < self.n_layer]
            if bad:
                raise ValueError(f"window_layers has {bad}, outside layers 0..{self.n_layer - 1}")

    @property
    def norm_biased(self) -> bool:
        """Whether the LayerNorms have a bias: norm_bias, or bias where it is None."""
        return self.bias if self.norm_bias is None else self.norm_bias

    @property
    def qkv_biased(self) -> bool:
        """Whether query, key and value have a bias: qkv_bias, or bias where it is None."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def out_biased(self) -> bool:
        """Whether the attention's output projection has a bias: out_bias, or bias."""
        return self.bias if self.out_bias is None else self.out_bias

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head if self.head_dim is None else self.head_dim

    @property
    def rotary_dims(self) -> int:
        """The dims of each head RoPE turns: rope_head_dim with latent attention, else the
        first int(head_size * rotary_pct)."""
        return self.rope_head_dim if self.kv_latent is not None else int(
            self.head_size * self.rotary_pct)

    @property
    def score_scale(self) -> float:
        """The multiplier of the attention scores: attn_scale, or 1/sqrt(head size)."""
        return self.head_size ** -0.5 if self.attn_scale is None else self.attn_scale

    @property
    def n_kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    def head_input(self, x: Tensor) -> Tensor:
        """The final norm's output (..., C) as the head reads it: divided by logits_scaling
        where logits_scaled_first (MiniCPM's), else as it is."""
        return x / self.logits_scaling if self.logits_scaled_first else x

    def scaled_logits(self, logits: Tensor, inplace: bool = False) -> Tensor:
        """The head's output as logits: divided by logits_scaling (Granite; MiniCPM's went
        before the head, `head_input`), times logit_scale (Cohere), each where it is not 1;
        in place where `inplace`."""
        if self.logits_scaling != 1.0 and not self.logits_scaled_first:
            logits = logits.div_(self.logits_scaling) if inplace else (
                logits / self.logits_scaling)
        if self.logit_scale != 1.0:
            logits = logits.mul_(self.logit_scale) if inplace else logits * self.logit_scale
        return logits

    @property
    def mlp_activations(self) -> tuple[str, str]:
        """The MLP's activations for `layers.activation`: (the ungated form's, the gate's)."""
        return (self.mlp if self.mlp in ("relu", "relu2") else "gelu",
                "gelu" if self.mlp == "geglu" else "silu")

    @property
    def swiglu_clamp(self) -> tuple[float, float] | None:
        """"clamped_swiglu"'s (alpha, limit) for `layers.glu`; None for every other MLP."""
        return (self.swiglu_alpha, self.swiglu_limit) if self.mlp == "clamped_swiglu" else None

    @property
    def ff_size(self) -> int:
        """The MLP hidden width: d_ff, or 4 * n_embd."""
        return 4 * self.n_embd if self.d_ff is None else self.d_ff

    def has_mixture(self, layer: int) -> bool:
        """Whether block `layer` routes through a mixture of experts: one of mixture_layers,
        or where that is None, not one of the first dense_layers."""
        if self.n_experts is None:
            return False
        return layer >= self.dense_layers if self.mixture_layers is None else (
            layer in self.mixture_layers)

    def rotates(self, layer: int) -> bool:
        """Whether `layer` turns q and k by RoPE (not where pos != "rope", nor a NoPE layer)."""
        return self.pos == "rope" and (self.nope_layers is None or layer not in self.nope_layers)

    def window_of(self, layer: int) -> int | None:
        """The sliding window of `layer`, or None when it attends to the whole context."""
        if self.window_layers is not None and layer not in self.window_layers:
            return None
        return self.sliding_window

    def computed(self) -> dict[str, Any]:
        """Every field as what the model computes: each default resolved (n_kv_head, head_dim,
        d_ff, the three biases, attn_scale, window_layers) and the fields that change nothing
        under the other switches left out (RoPE's without RoPE, `gelu` without a GELU, the
        LayerNorms' bias without LayerNorms, `bias` without an MLP), training's too (dropout,
        init_std, router_aux_loss_coef). Configs with equal `computed()` make the same function
        of the same weights; the Hugging Face export compares them to know what a family's
        config.json holds."""
        fields = self.to_dict()
        for name in ("dropout", "init_std", "router_aux_loss_coef"):
            del fields[name]
        fields.update(n_kv_head=self.n_kv_heads, head_dim=self.head_size, d_ff=self.ff_size,
                      qkv_bias=self.qkv_biased, out_bias=self.out_biased,
                      norm_bias=self.norm_biased, attn_scale=self.score_scale)
        if self.sliding_window is not None:
            fields["window_layers"] = [i for i in range(self.n_layer) if self.window_of(i)]
        idle = {"rope_theta", "rotary_pct", "rope_scaling", "rope_in_float32", "rope_interleaved",
                "nope_layers", "local_rope_theta"} if self.pos != "rope" else set()
        # the tables are rounded to the dtype either way without a float32 rotation
        idle |= {"rope_tables_rounded"} if not self.rope_in_float32 else set()
        idle |= {"nope_temperature_floor"} if not self.nope_temperature else set()
        idle |= {"gelu"} if self.mlp not in ("gelu", "geglu") else set()
        idle |= {"swiglu_alpha", "swiglu_limit"} if self.mlp != "clamped_swiglu" else set()
        idle |= {"norm_bias"} if self.norm != "layernorm" else set()
        idle |= {"embedding_norm"} if self.norm == "none" else set()  # an Identity either way
        idle |= {"logits_scaled_first"} if self.logits_scaling == 1.0 else set()
        idle |= {"bias"} if self.mlp == "none" else set()
        idle |= {"experts_per_token", "experts_normalized", "expert_weights_in_float32",
                 "experts_from_top_logits", "shared_expert_size", "router_bias",
                 "router_scoring", "expert_groups", "expert_groups_chosen", "routed_scaling",
                 "shared_expert_gated", "dense_layers", "dense_d_ff", "router_norm_min",
                 "mixture_layers"} \
            if self.n_experts is None \
            else set()
        idle |= {"shared_expert_gated"} if self.shared_expert_size is None else set()
        idle |= {"q_latent", "rope_head_dim", "v_head_dim"} if self.kv_latent is None else {
            "rotary_pct"}
        # which layers are dense, however said: the mixtures' layers, in one spelling
        idle.add("dense_layers")
        if self.n_experts is not None:
            fields["mixture_layers"] = [i for i in range(self.n_layer) if self.has_mixture(i)]
        if self.n_experts is not None and len(fields["mixture_layers"]) < self.n_layer:
            fields["dense_d_ff"] = self.dense_d_ff or self.ff_size
        else:
            idle.add("dense_d_ff")
        return {name: value for name, value in fields.items() if name not in idle}

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> GPTConfig:
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    @staticmethod
    def upgrade(values: dict[str, Any]) -> dict[str, Any]:
        """A saved config dict in today's spelling (checkpoints saved before the modern-family
        switches): boolean `mlp` becomes "gelu"/"none", boolean `layer_norm` becomes `norm`
        "layernorm"/"none", `qk_norm_head_weights` becomes `qk_norm_heads`. Anything else is
        returned as it is, for validation to judge."""
        values = dict(values)
        if isinstance(values.get("mlp"), bool):
            values["mlp"] = "gelu" if values["mlp"] else "none"
        if isinstance(values.get("layer_norm"), bool):
            layer_norm = values.pop("layer_norm")
            values.setdefault("norm", "layernorm" if layer_norm else "none")
        if "qk_norm_head_weights" in values:  # a few commits' spelling of Cohere's per-head norm
            values.setdefault("qk_norm_heads", "cohere" if values.pop("qk_norm_head_weights")
                              else None)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GPTConfig:
        values = cls.upgrade(values)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown GPTConfig fields {unknown}; known fields: {sorted(known)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


POS = ("learned", "rope", "none")
