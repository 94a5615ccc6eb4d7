"""Which Hugging Face family holds a GPTConfig (`Family.misfits`): the config.json a family
would write is read back, and every field that comes back as another model is named, so a
switch a family has no field for refuses the export instead of dropping out of it; and
`GPTConfig.computed`, which that comparison rests on: configs it calls equal make the same
function of the same weights."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import GPT, GPTConfig
from attnlab.hf import FAMILIES, FAMILY_BY_NAME, config_from_hf, family_for_config
from attnlab.hf.llama import LLAMA
from helpers import modern_switches

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=97, block_size=32, n_layer=2, n_head=4, n_embd=32)
# each family's own shape, as transformers writes a small config of it
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": ("GPT2", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=97)),
    "llama": ("Llama", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=97)),
    "gpt_neox": ("GPTNeoX", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, rotary_pct=0.5, vocab_size=97)),
    "phi": ("Phi", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, partial_rotary_factor=0.5, vocab_size=97)),
    "gemma2": ("Gemma2", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                              sliding_window=4, vocab_size=97)),
}
# one switch each, away from every family's default
SWITCHES = [dict(head_bias=True), dict(qk_norm=True), dict(sliding_window=3),
            dict(embedding_multiplier=2.0), dict(rotary_pct=0.5), dict(mlp="relu"),
            dict(norm="rmsnorm"), dict(norm_bias=False), dict(scores_in_float32=True),
            dict(attn_logit_softcapping=20.0), dict(n_kv_head=1)]


def _config(family: str) -> GPTConfig:
    prefix, fields = SHAPES[family]
    head = "LMHeadModel" if prefix == "GPT2" else "ForCausalLM"
    config = getattr(transformers, f"{prefix}Config")(**fields)
    return config_from_hf({**config.to_dict(), "architectures": [f"{prefix}{head}"]})


@pytest.mark.parametrize("family", sorted(SHAPES))
def test_a_family_holds_its_own_config_and_names_each_switch_it_cannot_hold(
        family: str) -> None:
    config = _config(family)
    assert FAMILY_BY_NAME[family].misfits(config) == []
    assert family_for_config(config).name == family
    for switch in SWITCHES:
        try:
            changed = dataclasses.replace(config, **switch)
        except ValueError:
            continue  # not a model at all (qk_norm on a model without RoPE is one)
        misfits = FAMILY_BY_NAME[family].misfits(changed)
        if changed.computed() == config.computed():
            assert misfits == [], switch  # an idle switch (norm_bias beside RMSNorm)
            continue
        name, value = next(iter(switch.items()))
        # refused naming the switch, or read back as the switch asks: never both lost
        named = [m for m in misfits if m.startswith(f"{name}=") and f"(not {value!r})" in m]
        back = FAMILY_BY_NAME[family].read(FAMILY_BY_NAME[family].config_to_hf(changed))
        assert named or (not misfits and back.computed() == changed.computed()), (switch,
                                                                                  misfits)


def test_a_family_whose_config_json_drops_a_switch_refuses_it() -> None:
    """A family that wrote no field for a switch would otherwise export the model without it:
    here Llama with its attention_bias field left out of config.json."""
    def lossy(config: GPTConfig) -> dict[str, Any]:
        return {k: v for k, v in LLAMA.config_to_hf(config).items() if k != "attention_bias"}

    family = dataclasses.replace(LLAMA, config_to_hf=lossy)
    plain = GPTConfig.from_name("llama-tiny")
    assert family.misfits(plain) == []
    biased = dataclasses.replace(plain, qkv_bias=True, out_bias=True)
    assert LLAMA.misfits(biased) == []
    assert family.misfits(biased) == ["qkv_bias=False (not True)", "out_bias=False (not True)"]


def test_a_config_no_family_holds_names_each_familys_needs() -> None:
    config = GPTConfig.from_name("llama-tiny", head_bias=True)  # Phi's alone, beside RMSNorm
    with pytest.raises(ValueError) as err:
        family_for_config(config)
    reasons = str(err.value).removeprefix("no Hugging Face family expresses this model: ")
    needs = dict(reason.split(" needs ", 1) for reason in reasons.split("; "))
    assert list(needs) == [family.name for family in FAMILIES if family.exports]
    assert needs["llama"] == needs["granite"] == "head_bias=False (not True)"
    assert "norm='layernorm' (not 'rmsnorm')" in needs["phi"].split(", ")  # its bias is Phi's
    assert "head_bias=False (not True)" not in needs["phi"]


# another value for each field `computed` may call idle
OTHER: dict[str, Any] = dict(
    rope_theta=123.0, rotary_pct=0.5, rope_scaling=None, rope_in_float32=False,
    rope_interleaved=False, nope_layers=None, local_rope_theta=None,
    gelu={"tanh": "exact", "exact": "tanh"}, norm_bias={True: False, False: True, None: False},
    bias={True: False, False: True}, experts_per_token=1,
    experts_normalized=True, experts_from_top_logits=True,  # the one needs the other
    expert_weights_in_float32={True: False, False: True}, shared_expert_size=None,
    router_bias={True: False, False: True}, swiglu_alpha=2.0, swiglu_limit=3.0,
    rope_tables_rounded={True: False, False: True}, router_scoring="softmax",
    expert_groups=1, expert_groups_chosen=1, routed_scaling=2.0,
    shared_expert_gated={True: False, False: True}, dense_layers=0, dense_d_ff=20,
    router_norm_min=0.0, mixture_layers=None,  # (the only values a dense config takes)
    q_latent=3, rope_head_dim={64: 2, 2: 4}, v_head_dim=5, nope_temperature_floor=100,
    embedding_norm={True: False, False: True},
    logits_scaled_first={True: False, False: True})


def _same_model_spelled_otherwise(config: GPTConfig) -> GPTConfig:
    """`config` with each default `computed` resolves written out, each field it calls idle
    set to another value, and training's changed."""
    computed = config.computed()
    fields = config.to_dict()
    spelled = {name: computed[name] for name in computed if computed[name] != fields[name]}
    for name in set(fields) - set(computed) - {"dropout", "init_std", "router_aux_loss_coef"}:
        other = OTHER[name]  # KeyError: give the newly idle field another value here
        spelled[name] = other[fields[name]] if isinstance(other, dict) else other
    return dataclasses.replace(config, **spelled, dropout=0.1, init_std=None,
                               router_aux_loss_coef=0.5)


@settings(max_examples=40, deadline=None)
@given(switches=modern_switches(), seed=st.integers(0, 100))
def test_configs_computed_alike_make_the_same_function(switches: dict[str, Any],
                                                        seed: int) -> None:
    config = GPTConfig(**BASE, **switches)
    twin = _same_model_spelled_otherwise(config)
    assert twin != config and twin.computed() == config.computed()
    torch.manual_seed(seed)
    model = GPT(config).eval()
    other = GPT(twin).eval()
    other.load_state_dict(model.state_dict())  # strict: the same tensors, the same shapes
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, other(ids).logits)
