"""The names a trace can hold and an edit can replace: what each is, in which order a forward
pass reports them, which carry a head dimension, and which a given model never computes.

`trace.py` captures values under these names and `interp/edits.py` replaces them; both
import them from here (`trace` imports them too, so `attnlab.model.trace.NAMES` still reads).
Shape vocabulary as in `attention.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .summaries import LEARNED_SINK, SUMMARY_NAMES

if TYPE_CHECKING:
    from .config import GPTConfig

#: Every name a trace can hold, with its shape, in the order a forward pass reports them (a
#: block's from resid_pre to block_out, once per layer). Model-level names have layer None.
NAMES: dict[str, str] = {
    "tok_emb": "(B, T, C) token embeddings",
    "pos_emb": "(B, T, C) learned position embeddings (per row: left padding shifts them)",
    "emb": "(B, T, C) tok_emb (+ pos_emb), normed where the model norms it (embedding_norm), "
           "the input of layer 0",
    "resid_pre": "(B, T, C) the residual stream entering the block (layer 0: emb)",
    "kv_latent": "(B, T, kv_latent) the normed latent each token's keys and values are "
                 "projected up from (latent attention only: DeepSeek-V2 / V3)",
    "q_pre_rope": "(B, nh, T, hs) queries before rotary embedding, after QK-norm if any "
                  "(pos='rope' only; a layer without RoPE, nope_layers: q itself)",
    "k_pre_rope": "(B, nkv, T, hs) this call's keys before rotary embedding, after QK-norm if "
                  "any (pos='rope' only; a layer without RoPE: k itself)",
    "q": "(B, nh, T, hs) queries as scored (after QK-norm, rotary embedding, the L2 "
         "QK-norm and the NoPE temperature, where the model has them)",
    "k": "(B, nkv, S, hs) keys as scored (cached + new; cached keys are rotated)",
    "v": "(B, nkv, S, hs) values (cached + new)",
    "attn_scores": "(B, nh, T, S) raw scores q @ k^T, before scaling",
    "masked_scores": "(B, nh, T, S) raw scores with -inf where a query may not attend",
    "attn_weights": "(B, nh, T, S) softmax(masked_scores * scale), the scaled scores capped "
                    "first where the model caps them (attn_logit_softcapping); masked cells "
                    "exactly 0",
    "attn_weights_dropped": "(B, nh, T, S) attention weights after dropout (training only)",
    "attn_entropy": "(B, nh, T) -sum_j w log w over keys with w > 0, nats (summaries.py)",
    "attn_sink": "(B, nh, T) each query's weight on its row's first real key",
    "attn_received": "(B, nh, S) each key's weight summed over the query rows",
    "attn_distance": "(B, nh, T) sum_j w_ij (i - j), i the query's key index (cache included; "
                     "none in cross-attention)",
    "attn_max": "(B, nh, T) each query's largest weight",
    "attn_learned_sink": "(B, nh, T) the weight each query gives its head's learned sink, "
                         "1 - sum_j w_ij (attn_sinks only: gpt-oss)",
    "context": "(B, nh, T, hs) weighted values: attn_weights @ v, one slice per head",
    "attn_out": "(B, T, C) heads concatenated and projected (absent without out_proj); with "
                "sandwich norms, before the attention's post-norm; before a "
                "residual_multiplier (Granite)",
    "attn_out_normed": "(B, T, C) the attention's output through its post-norm (Gemma 2 / 3's "
                       "post_attention_layernorm): what joins the residual (sandwich_norm "
                       "only)",
    "resid_mid": "(B, T, C) the residual stream between attention and the MLP: the MLP's "
                 "input before its norm (absent without mlp, and with a parallel residual, "
                 "whose MLP reads resid_pre)",
    "mlp_pre": "(B, T, d_ff) the MLP's pre-activations, what its activation function reads: "
               "fc x, or gate x (SwiGLU, whose up projection fc x multiplies silu of it) "
               "(absent without mlp)",
    "mlp_hidden": "(B, T, d_ff) the MLP's hidden activations, the input of its down "
                  "projection: gelu(fc x), or silu(gate x) * fc x (absent without mlp)",
    "router_logits": "(B, T, n_experts) the router's score of each expert (a mixture of "
                     "experts only, n_experts)",
    "expert_weights": "(B, T, n_experts) each expert's weight in the token's output: its "
                      "softmax probability among the token's top experts (renormalised "
                      "where experts_normalized), 0 for the others (n_experts only)",
    "mlp_out": "(B, T, C) the MLP's output (absent without mlp); with sandwich norms, before "
               "the MLP's post-norm; before a residual_multiplier (Granite)",
    "mlp_out_normed": "(B, T, C) the MLP's output through its post-norm (Gemma 2 / 3's "
                      "post_feedforward_layernorm): what joins the residual (sandwich_norm "
                      "only)",
    "block_out": "(B, T, C) output of the block (the residual stream after it)",
    "logits": "(B, T, V) next-token logits ((B, 1, V) with last_logits_only), capped where "
              "the model caps them (final_logit_softcapping)",
}
MODEL_NAMES = ("tok_emb", "pos_emb", "emb", "logits")
#: Names whose dimension 1 is a head dimension (sliced by the `heads` filter).
HEAD_NAMES = frozenset(
    {"q_pre_rope", "k_pre_rope", "q", "k", "v", "attn_scores", "masked_scores",
     "attn_weights", "attn_weights_dropped", "context", *SUMMARY_NAMES, LEARNED_SINK}
)
#: The (B, nh, T, S) names only attention's explicit path computes: a sink that reads or edits
#: one needs it.
WEIGHT_NAMES = frozenset({"attn_scores", "masked_scores", "attn_weights", "attn_weights_dropped"})
#: Per-head summaries of the weights, streamed in tiles without a (B, nh, T, S) tensor
#: (`summaries.py`): the explicit path computes them too; they can be read, not edited.
SUMMARIES = frozenset({*SUMMARY_NAMES, LEARNED_SINK})
#: A head's inputs, in a word each: what activation patching's `qkv=True` patches
#: (`interp.patching`), and how its printout and figure name each grid.
HEAD_INPUTS = {"q": "queries", "k": "keys", "v": "values", "attn_weights": "attention weights"}


def absent_names(config: GPTConfig) -> dict[str, str]:
    """{name: why} for the names a model of `config` never computes: a trace of one stays
    empty and an edit of one would change nothing, so `get` and `Edits.check` say why."""
    absent: dict[str, str] = {}
    if config.pos != "learned":
        absent["pos_emb"] = f"its positions are pos={config.pos!r}, not a learned table"
    if config.pos != "rope":
        absent["q_pre_rope"] = absent["k_pre_rope"] = f"it has no rotary embedding (pos=" \
            f"{config.pos!r})"
    if not config.attn_out_proj:
        absent["attn_out"] = "it has no output projection (attn_out_proj=False)"
    if not config.sandwich_norm:
        absent |= dict.fromkeys(("attn_out_normed", "mlp_out_normed"), "it norms no branch's "
                                "output before its residual add (sandwich_norm=False)")
    if config.mlp == "none":
        absent |= dict.fromkeys(("resid_mid", "mlp_pre", "mlp_hidden", "mlp_out",
                                 "mlp_out_normed"), "it has no MLP")
    elif config.parallel_residual:
        absent["resid_mid"] = "its MLP reads resid_pre (parallel_residual=True)"
    if config.kv_latent is None:
        absent["kv_latent"] = "its keys and values are projected from x, not from a latent " \
            "(kv_latent=None)"
    if not config.attn_sinks:
        absent[LEARNED_SINK] = "its attention has no learned sinks (attn_sinks=False)"
    if config.n_experts is None:
        absent |= dict.fromkeys(("router_logits", "expert_weights"),
                                "its MLP is one dense MLP, not a mixture of experts")
    elif config.mlp != "none" and all(map(config.has_mixture, range(config.n_layer))):
        # a dense layer among the mixtures has them
        absent |= dict.fromkeys(("mlp_pre", "mlp_hidden"), "its mixture of experts runs each "
                                "expert on its own rows (trace expert_weights and mlp_out)")
    return absent


def position_dim(name: str) -> int:
    """The dimension of a named value that runs over sequence positions: 2 for per-head
    names (B, nh, T or S, ...), 1 for the others (B, T, ...)."""
    return 2 if name in HEAD_NAMES else 1
