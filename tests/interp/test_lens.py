"""interp/lens.py: the logit lens ends at the model's logits; direct attributions sum to the logit
and put a hand-built head's contribution where it is."""

from __future__ import annotations

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.interp.edits import ablate
from attnlab.interp.lens import (
    lens_labels,
    lens_top,
    logit_attribution,
    logit_lens,
    residual_parts,
    top_tokens,
)
from attnlab.model.layers import GemmaRMSNorm
from attnlab.model.trace import Trace
from helpers import left_padded, one_head_model


def _model(**overrides: object) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("nano", init_std=0.2, **overrides)).eval()


def test_logit_lens_reads_each_layer_and_ends_at_the_logits() -> None:
    model = _model()
    idx, mask = left_padded([6, 4], seed=1)
    lens = logit_lens(model, idx, mask)
    assert lens.shape == (3, 2, 6, 65)
    assert torch.equal(lens[-1], model(idx, attention_mask=mask).logits)
    with torch.no_grad():
        emb = model.wte(idx) + model.wpe((mask.cumsum(-1) - 1).clamp(min=0))
        torch.testing.assert_close(lens[0], model.lm_head(model.ln_f(emb)))
    probs, ids = top_tokens(lens, k=3)
    assert probs.shape == ids.shape == (3, 2, 6, 3)
    assert torch.all(probs[..., :-1] >= probs[..., 1:])
    assert torch.equal(ids[-1, :, :, 0], lens[-1].argmax(-1))
    # of an edited model: its last row is the edited model's logits, its top tokens too
    edit = ablate([(0, 1), (1, 0)])
    edited = logit_lens(model, idx, mask, edits=edit)
    assert torch.equal(edited[-1], model(idx, attention_mask=mask, edits=edit).logits)
    assert not torch.equal(edited[-1], lens[-1])
    probs, ids = lens_top(model, idx, mask, k=3, edits=edit)
    assert torch.equal(probs, top_tokens(edited, k=3)[0])


@pytest.mark.parametrize("overrides", [{}, {"residual": False}])
def test_the_lens_between_attention_and_mlp_reads_resid_mid(overrides: dict) -> None:
    model = _model(**overrides)
    idx, mask = left_padded([6, 4], seed=1)
    full = logit_lens(model, idx, mask, mid=True)  # (2L + 1, B, T, V)
    assert lens_labels(model, mid=True) == ["emb", "layer 0 attn", "layer 0", "layer 1 attn",
                                            "layer 1"]
    assert torch.equal(full[::2], logit_lens(model, idx, mask))  # the rows after each layer
    trace = Trace(names="resid_mid").run(model, idx, mask)
    with torch.no_grad():
        for layer in range(2):
            mid = model.lm_head(model.ln_f(trace.get("resid_mid", layer)))  # (B, T, V)
            torch.testing.assert_close(full[2 * layer + 1], mid, atol=1e-6, rtol=0)
    probs, _ = lens_top(model, idx, mask, k=2, mid=True)
    assert torch.equal(probs, top_tokens(full, k=2)[0])
    neox = _model(parallel_residual=True)
    with pytest.raises(ValueError, match=r"never computes it, as its MLP reads resid_pre"):
        logit_lens(neox, idx, mid=True)


def test_lens_top_is_the_lens_top_tokens_one_layer_at_a_time() -> None:
    # the CLI and the viewer read only the top tokens: the whole (L + 1, B, T, V) lens of a
    # 50k vocabulary at 1000 tokens and 12 layers is 2.6 GB
    model = _model()
    idx, mask = left_padded([6, 4], seed=1)
    for vocab in (None, 40):
        probs, ids = lens_top(model, idx, mask, k=3, vocab=vocab)
        want_probs, want_ids = top_tokens(logit_lens(model, idx, mask)[..., :vocab], k=3)
        assert torch.equal(probs, want_probs) and torch.equal(ids, want_ids)
    assert int(ids.max()) < 40
    for bad in ({"k": 0}, {"vocab": 0}):  # an empty (L + 1, B, T, 0) answer before
        with pytest.raises(ValueError, match="must be >= 1"):
            lens_top(model, idx, **bad)
    # the arguments before k are logit_lens's; k in the mask's place is named
    with pytest.raises(TypeError, match=r"lens_top\(model, ids, 3\): the third argument is "
                                        r"attention_mask; pass k by name \(k=3\)"):
        lens_top(model, idx, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("overrides", [{}, {"norm": "none"}, {"mlp": "none"},
                                       {"n_head": 4, "n_kv_head": 2}, {"attn_out_proj": False},
                                       {"norm": "rmsnorm", "mlp": "swiglu", "pos": "rope"},
                                       {"norm": "gemma_rmsnorm", "mlp": "geglu", "pos": "rope",
                                        "scale_embeddings": True},
                                       {"pos": "rope", "parallel_residual": True,
                                        "shared_norm": True, "head_bias": True},
                                       {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu",
                                        "embedding_multiplier": 3.0, "residual_multiplier": 0.5,
                                        "logits_scaling": 2.0},
                                       # nanochat's unscaled norms, one on the embeddings
                                       {"pos": "rope", "norm": "unit_rmsnorm", "mlp": "relu2",
                                        "embedding_norm": True, "qk_l2_norm": True,
                                        "rope_backwards": True},
                                       # OLMo 1's LayerNorm without scale or bias
                                       {"pos": "rope", "norm": "unit_layernorm",
                                        "mlp": "swiglu", "qkv_clip": 0.5},
                                       # MiniCPM3's head input divided, not the logits
                                       {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu",
                                        "logits_scaling": 3.2, "logits_scaled_first": True,
                                        "embedding_multiplier": 3.0}])
def test_attributions_sum_to_the_logit(overrides: dict) -> None:
    model = _model(**overrides)
    if model.lm_head.bias is not None:  # Phi's head bias, 0 at init: give it values
        with torch.no_grad():
            model.lm_head.bias.normal_(0.0, 1.0)
    idx = torch.randint(0, 65, (3, 7), generator=torch.Generator().manual_seed(2))
    for position in (-1, 2):
        parts = logit_attribution(model, idx, torch.tensor([5, 6, 7]), position)
        assert parts.heads.shape == (3, 2, model.config.n_head)
        torch.testing.assert_close(parts.total(), parts.logit, atol=1e-4, rtol=1e-5)
        assert parts.heads.abs().sum() > 0
        logits = model(idx).logits[:, position]  # (3, V): the logit is the model's own
        torch.testing.assert_close(parts.logit, logits[torch.arange(3), [5, 6, 7]],
                                   atol=1e-6, rtol=0)
    if overrides.get("mlp") == "none":
        assert torch.all(parts.mlp == 0)


def test_the_answer_carrying_head_holds_the_whole_logit() -> None:
    model = one_head_model()
    parts = logit_attribution(model, torch.tensor([[1, 0, 0, 3]]), target=1)
    expected = torch.zeros(1, 2, 2)
    expected[0, 1, 0] = 0.25  # uniform over 4 keys, one of which is token 1
    assert torch.equal(parts.heads, expected)
    assert parts.emb.item() == 0 and parts.mlp.abs().sum() == 0
    assert parts.logit.item() == pytest.approx(0.25)


def test_needs_a_residual_stream() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("seed-minimal", vocab_size=17, n_embd=5))
    with pytest.raises(ValueError, match="residual"):
        logit_attribution(model, torch.tensor([[1, 2]]), 3)


def test_a_target_or_position_out_of_range_is_named() -> None:
    model, idx = _model(), torch.tensor([[1, 2, 3]])  # vocabulary of 65
    with pytest.raises(ValueError, match=r"target \[999\]: token ids are 0 to 64"):
        logit_attribution(model, idx, 999)
    with pytest.raises(ValueError, match=r"target \[-2\]"):
        logit_attribution(model, idx, -2)
    with pytest.raises(ValueError, match="position 3 is out of range for 3 tokens"):
        logit_attribution(model, idx, 5, position=3)
    assert logit_attribution(model, idx, 5, position=-3).logit.shape == (1,)


@torch.no_grad()
def test_imported_gpt2(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    from attnlab.hf import load_hf_gpt2

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2,
                                      n_head=4, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    model = load_hf_gpt2(tmp_path).eval()
    idx = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    parts = logit_attribution(model, idx, target=torch.tensor([3, 4]))
    torch.testing.assert_close(parts.total(), parts.logit, atol=1e-4, rtol=1e-5)
    assert torch.equal(logit_lens(model, idx)[-1], model(idx).logits)


@torch.no_grad()
def test_imported_gpt2_against_a_plain_torch_reference(tmp_path) -> None:
    """The numbers TransformerLens 4.3 gives (`accumulated_resid(apply_ln=True)` then `unembed`;
    `logit_attrs` of `stack_head_results` with only the final norm folded), computed here from
    Hugging Face GPT-2's own modules with plain hooks: each lens row is ln_f of the residual
    entering that layer through W_U, and a head's term is its output through its rows of c_proj,
    value bias included, centred, divided by the final residual's norm scale, times gamma, dotted
    with W_U[target]. Random weights *and biases* (Hugging Face initializes biases to 0, which
    hides where the value bias goes)."""
    transformers = pytest.importorskip("transformers")
    from attnlab.hf import load_hf

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2,
                                      n_head=4, attn_implementation="eager")
    hf = transformers.GPT2LMHeadModel(config).eval()
    for p in hf.parameters():
        p.normal_(0, 0.2)
    hf.save_pretrained(tmp_path)
    model = load_hf(tmp_path)
    idx = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    target = torch.tensor([3, 4])
    heads_in, final = [], []  # (B, T, nh * hs) entering c_proj; (B, T, C) entering ln_f
    hooks = [block.attn.c_proj.register_forward_pre_hook(lambda m, a: heads_in.append(a[0]))
             for block in hf.transformer.h]
    hooks.append(hf.transformer.ln_f.register_forward_pre_hook(lambda m, a: final.append(a[0])))
    out = hf(idx, output_hidden_states=True)
    for hook in hooks:
        hook.remove()
    ln_f, w_u = hf.transformer.ln_f, hf.lm_head.weight  # (V, C)
    resid = [*out.hidden_states[:-1], final[0]]  # entering each layer, then the final residual
    expected_lens = torch.stack([ln_f(x) @ w_u.t() for x in resid])  # (L + 1, B, T, V)
    torch.testing.assert_close(logit_lens(model, idx), expected_lens, atol=2e-5, rtol=0)

    x = final[0][:, -1]  # (B, C)
    sigma = (x.var(-1, unbiased=False, keepdim=True) + ln_f.eps).sqrt()  # (B, 1)
    direction = ln_f.weight * w_u[target]  # (B, C)
    hs = 32 // 4
    expected = torch.zeros(2, 2, 4)
    for layer, z in enumerate(heads_in):
        w_o = hf.transformer.h[layer].attn.c_proj.weight  # (nh * hs, C): Conv1D is (in, out)
        for h in range(4):
            part = z[:, -1, h * hs:(h + 1) * hs] @ w_o[h * hs:(h + 1) * hs]  # (B, C)
            part = (part - part.mean(-1, keepdim=True)) / sigma
            expected[:, layer, h] = (part * direction).sum(-1)
    parts = logit_attribution(model, idx, target)
    torch.testing.assert_close(parts.heads, expected, atol=1e-5, rtol=0)
    assert expected.abs().max() > 0.1  # terms large enough for the tolerance to mean something


@pytest.mark.parametrize("overrides", [{}, {"norm": "none"}])
def test_every_term_is_on_the_model_device(overrides: dict) -> None:
    """With the model on a GPU, heads, attn_bias, mlp (and bias without a final norm) were
    made on the default device, the CPU, and `total()` raised a device mismatch. No GPU here:
    the meta device as the default stands in for "a device other than the model's"."""
    model, idx = _model(**overrides), torch.tensor([[1, 2, 3, 4]])
    with torch.device("meta"):
        parts = logit_attribution(model, idx, 5)
    for name in ("emb", "heads", "attn_bias", "mlp", "bias", "logit"):
        assert getattr(parts, name).device == idx.device, name
    torch.testing.assert_close(parts.total(), parts.logit, atol=1e-4, rtol=1e-5)


def test_a_padded_position_is_refused() -> None:
    """A right-padded batch's last column is a pad in the shorter rows: their terms were
    computed for a pad's logit and summed to it, meaningless numbers without a word."""
    model = _model()
    idx = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with pytest.raises(ValueError, match=r"position -1 is padding in rows \[1\].*pad on the left"):
        logit_attribution(model, idx, 7, attention_mask=mask)
    left, left_mask = left_padded([4, 2], seed=3)
    assert logit_attribution(model, left, 7, attention_mask=left_mask).logit.shape == (2,)
    assert logit_attribution(model, idx, 7, position=1, attention_mask=mask).logit.shape == (2,)


def test_a_float64_model_is_attributed_in_float64() -> None:
    # every term was cast to float32: a float64 model's logit came back 8.8e-10 off, its
    # terms' sum 2e-8
    model = _model().double()
    idx = torch.randint(0, 65, (2, 7), generator=torch.Generator().manual_seed(4))
    parts = logit_attribution(model, idx, 5)
    assert parts.logit.dtype == parts.heads.dtype == parts.mlp.dtype == torch.float64
    logits = model(idx).logits[:, -1, 5]  # (2,) float64
    torch.testing.assert_close(parts.logit, logits.detach(), atol=1e-12, rtol=0)
    torch.testing.assert_close(parts.total(), parts.logit, atol=1e-12, rtol=0)


def test_a_float64_models_lens_probabilities_stay_float64() -> None:
    # top_tokens cast every lens to float32, so lens_top of a float64 model was float32
    # (as logit_attribution and logit_diff_metric were before they kept float64)
    model = _model().double()
    idx = torch.randint(0, 65, (2, 7), generator=torch.Generator().manual_seed(5))
    probs, top = lens_top(model, idx, k=3)
    assert probs.dtype == torch.float64
    want = torch.softmax(model(idx).logits.detach(), dim=-1).topk(3, dim=-1)
    torch.testing.assert_close(probs[-1], want.values, atol=1e-15, rtol=0)
    assert torch.equal(top[-1], want.indices)


@pytest.mark.parametrize("overrides", [
    {}, {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "n_kv_head": 1},
    {"parallel_residual": True}, {"mlp": "none"}, {"attn_out_proj": False},
    {"norm": "gemma_rmsnorm", "mlp": "geglu", "pos": "rope", "sandwich_norm": True},
    {"norm": "gemma_rmsnorm", "mlp": "none", "pos": "rope", "sandwich_norm": True},
    # Granite's scalars: embeddings x 3, branches x 0.5, logits / 2
    {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "embedding_multiplier": 3.0,
     "residual_multiplier": 0.5, "logits_scaling": 2.0},
])
def test_residual_parts_sum_to_the_residual_stream(overrides: dict) -> None:
    """decompose_resid: the parts of the stream entering each block, and after the last,
    sum to the traced stream there; their labels name what wrote them. With sandwich norms
    (Gemma 2 / 3) a block's parts are its branches after their post-norms."""
    model = _model(**overrides)
    idx, mask = left_padded([6, 4], seed=1)
    trace = Trace(names=["emb", "resid_pre", "block_out"]).run(model, idx, mask)
    c = model.config
    for layer in (0, 1, None):
        labels, parts = residual_parts(model, idx, mask, layer=layer)
        want = trace.get("block_out", 1) if layer is None else trace.get("resid_pre", layer)
        torch.testing.assert_close(parts.sum(0), want, atol=1e-5, rtol=0)
        blocks = 2 if layer is None else layer
        per_block = ["attn", "mlp"] if c.mlp != "none" else ["attn"]
        assert labels == (["tok_emb"] + ["pos_emb"] * (c.pos == "learned")
                          + [f"{i} {p}" for i in range(blocks) for p in per_block])
        assert parts.shape == (len(labels), 2, 6, c.n_embd)
    edit = ablate([(0, 0), (0, 1)])  # layer 0's attention output is its biases alone then
    labels, parts = residual_parts(model, idx, mask, edits=edit)
    if c.attn_out_proj:
        bias = model.blocks[0].attn.out_proj.bias
        alone = torch.zeros_like(parts[0]) + (0 if bias is None else bias)  # (B, T, C)
        post = model.blocks[0].ln_attn_post
        torch.testing.assert_close(parts[labels.index("0 attn")],
                                   alone if post is None else post(alone))
    with pytest.raises(ValueError, match="layer=3: the residual stream enters blocks 0 to 1"):
        residual_parts(model, idx, layer=3)
    with pytest.raises(ValueError, match="only with residual connections"):
        residual_parts(_model(residual=False), idx)


def test_the_output_projections_bias_is_its_own_term_of_the_logit() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_layer=2, init_std=0.3)).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.out_proj.bias.normal_(0.0, 1.0)  # trained or loaded biases are not 0
    idx = torch.randint(0, 65, (3, 7), generator=torch.Generator().manual_seed(2))
    parts = logit_attribution(model, idx, torch.tensor([5, 6, 7]), -1)
    assert parts.attn_bias.abs().min() > 0
    torch.testing.assert_close(parts.total(), parts.logit, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("overrides", [
    {"norm": "gemma_rmsnorm", "mlp": "geglu", "pos": "rope", "sandwich_norm": True},
    {"sandwich_norm": True},  # LayerNorms with biases: the post-norm's bias is a constant
    {"sandwich_norm": True, "attn_out_proj": False, "mlp": "none"},
    # OLMo 2: no pre-norms, QK-norm over whole q and k
    {"norm": "rmsnorm", "mlp": "swiglu", "pos": "rope", "sandwich_norm": True,
     "pre_norm": False, "qk_norm": True, "qk_norm_whole": True},
])
def test_attribution_through_sandwich_norms(overrides: dict) -> None:
    """A Gemma 2 / 3 block norms its attention's output before adding it: each head's term
    goes through that post-norm with its scale frozen at the whole attention output, so the
    terms sum to the logit, and one layer's heads and attn_bias sum to the direct term of
    what the block adds (attn_out_normed through the final norm frozen at the final
    residual). This was refused before."""
    model = _model(**overrides)
    with torch.no_grad():  # Gemma's norms start at the identity scale: make them matter
        for name, p in model.named_parameters():
            if name.startswith(("blocks.", "ln_f")) and ".ln_" in f".{name}":
                p.normal_(0.0, 0.5)
    idx = torch.randint(0, 65, (3, 7), generator=torch.Generator().manual_seed(2))
    target = torch.tensor([5, 6, 7])
    parts = logit_attribution(model, idx, target, -1)
    torch.testing.assert_close(parts.total(), parts.logit, atol=1e-4, rtol=1e-5)
    logits = model(idx).logits[:, -1]  # (3, V)
    torch.testing.assert_close(parts.logit, logits[torch.arange(3), target], atol=1e-6, rtol=0)
    trace = Trace(names=["attn_out_normed", "block_out"]).run(model, idx)
    final = trace.get("block_out", 1)[:, -1]  # (3, C)
    ln_f = model.ln_f
    layer_norm = isinstance(ln_f, torch.nn.LayerNorm)  # else an RMSNorm
    moment = final.var(-1, unbiased=False, keepdim=True) if layer_norm else final.pow(2).mean(
        -1, keepdim=True)  # (3, 1)
    sigma = (moment + ln_f.eps).sqrt()  # (3, 1)
    gemma = isinstance(ln_f, GemmaRMSNorm)  # scales by 1 + w
    gamma = 1.0 + ln_f.weight if gemma else ln_f.weight  # (C,)
    w_u = model.lm_head.weight[target]  # (3, C)
    for layer in range(2):
        added = trace.get("attn_out_normed", layer)[:, -1]  # (3, C): what the block adds
        if layer_norm:
            added = added - added.mean(-1, keepdim=True)
        expected = (added / sigma * gamma * w_u).sum(-1)  # (3,)
        torch.testing.assert_close(parts.heads[:, layer].sum(1) + parts.attn_bias[:, layer],
                                   expected, atol=1e-5, rtol=1e-5)
        assert parts.heads[:, layer].abs().min() > 0
