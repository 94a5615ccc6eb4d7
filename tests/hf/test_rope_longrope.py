"""LongRoPE (model/rope.py, hf/phi3.py, generate's re-encoding) against transformers 5.

Phi-3.5-mini, Phi-3-mini-128k and Phi-4-mini scale RoPE by two lists of per-frequency
factors: the short list for a call whose positions all lie within
original_max_position_embeddings, the long list for every position of a call reaching past
it, and cos and sin times an attention factor. The frequencies and factor equal
`_compute_longrope_parameters`' bit for bit; logits on either side of the switch, greedy
generations that start at it, past it or cross it (eager and compiled) equal transformers';
the spellings transformers reads as longrope load, and what it refuses is refused. The
family suite (test_hf_families.py's "phi3-longrope") runs every other check on such a model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hf_families import hf_model
from test_hf_fields import PHI3_MINI, assert_read_as_transformers_reads
from test_rope_yarn import SMALL, hf_dict

from attnlab import GPT, GPTConfig, load_hf, save_hf
from attnlab.generate import generate
from attnlab.hf import config_from_hf
from attnlab.model.rope import Rotary
from helpers import left_padded

transformers = pytest.importorskip("transformers")
rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
phi3 = pytest.importorskip("transformers.models.phi3.modeling_phi3")

SWITCH = 16  # the family suite's phi3-longrope: original_max_position_embeddings


def _theirs(fields: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, float]:
    """transformers' short and long frequencies and attention factor for config.json
    `fields`, from the config class it reads them with."""
    config = transformers.AutoConfig.for_model(**fields)
    short, factor = rope_utils._compute_longrope_parameters(config)
    original = config.rope_parameters["original_max_position_embeddings"]
    long, _ = rope_utils._compute_longrope_parameters(config, seq_len=original + 1)
    return short, long, factor


def _ours(fields: dict[str, Any]) -> Rotary:
    config = config_from_hf(fields)
    return Rotary(config.head_size, config.rotary_pct, config.rope_theta, config.rope_scaling)


@st.composite
def longrope_configs(draw: Any) -> dict[str, Any]:
    """A Phi-3 config.json with random longrope parameters: whole or partial heads, factor
    lists of any positive numbers, factor and attention_factor absent, null or given, the
    original length top-level or in the dict, either spelling of the type."""
    heads, head_dim = 4, draw(st.sampled_from([8, 16, 64, 96]))
    partial = draw(st.sampled_from([1.0, 0.75, 0.5]))
    pairs = int(head_dim * partial) // 2
    factors = st.lists(st.floats(0.5, 80.0), min_size=pairs, max_size=pairs)
    original = draw(st.integers(2, 1 << 16))
    rope: dict[str, Any] = {
        draw(st.sampled_from(["rope_type", "type"])): draw(st.sampled_from(
            ["longrope", "su", "yarn"])),
        "short_factor": draw(factors), "long_factor": draw(factors),
        "rope_theta": draw(st.sampled_from([10000.0, 250000.0, 1e6])),
        "partial_rotary_factor": partial,
    }
    for key, values in (("factor", st.floats(1.0, 64.0)), ("attention_factor",
                                                          st.floats(0.5, 2.0))):
        value = draw(st.one_of(st.none(), st.just("null"), values))
        if value is not None:
            rope[key] = None if value == "null" else value
    top = draw(st.booleans())
    if not top:
        rope["original_max_position_embeddings"] = original
    fields = hf_dict("Phi3", vocab_size=11, hidden_size=heads * head_dim, intermediate_size=8,
                     num_hidden_layers=1, num_attention_heads=heads, pad_token_id=None,
                     max_position_embeddings=draw(st.integers(original, 1 << 17)))
    fields.pop("rope_parameters")
    fields["original_max_position_embeddings"] = original if top else 4096
    if not top:  # Phi3Config holds 4096 when config.json has none; a top-level one wins
        del fields["original_max_position_embeddings"]
    return {**fields, "rope_scaling": rope}


@settings(max_examples=150, deadline=None)
@given(longrope_configs())
def test_frequencies_and_attention_factor_are_transformers(fields: dict[str, Any]) -> None:
    """config.json -> attnlab's Rotary equals transformers' `_compute_longrope_parameters` on
    the config it reads from the same file: both float32 frequency sets bit for bit, the
    factor that multiplies cos and sin exactly, and the switch where it switches."""
    rope = fields["rope_scaling"]
    kind_key = "rope_type" if "rope_type" in rope else "type"
    # transformers 5 moves the original length into the dict before it renames "su" (a
    # KeyError then): it is given "longrope", which it computes for "su"
    spelled = {**fields, "rope_scaling": {**rope, kind_key: "longrope"}} \
        if rope[kind_key] == "su" else fields
    short, long, factor = _theirs(spelled)
    rotary = _ours(fields)
    assert torch.equal(rotary.inv_freq, short)
    assert rotary.long_inv_freq is not None and torch.equal(rotary.long_inv_freq, long)
    assert rotary.attention_factor == factor
    config = transformers.AutoConfig.for_model(**spelled)
    assert rotary.switch == config.rope_parameters["original_max_position_embeddings"]


def test_a_call_takes_the_long_set_once_its_last_position_passes_the_switch() -> None:
    """Positions 0..15 rotate by the short set whether the call ends at 15 or not: a call
    ending at 16 rotates all of them by the long set, as transformers picks by the call's
    largest position (its rotary class, not a copy of its rule)."""
    fields = hf_dict("Phi3", **SMALL, pad_token_id=None, original_max_position_embeddings=SWITCH,
                     rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                                      "short_factor": [1.0, 1.1, 1.5, 2.0],
                                      "long_factor": [1.2, 3.0, 7.5, 16.0]})
    rotary = _ours(fields)
    theirs = phi3.Phi3RotaryEmbedding(transformers.AutoConfig.for_model(**fields))
    x = torch.zeros(1, 1, 8)
    for length in (SWITCH, SWITCH + 1, 40):
        positions = torch.arange(length)[None]  # (1, T)
        cos, sin = rotary.cos_sin(positions)  # (1, 1, T, rd)
        their_cos, their_sin = theirs(x, positions)  # (1, T, rd)
        assert torch.equal(cos[:, 0], their_cos) and torch.equal(sin[:, 0], their_sin), length
    short = rotary.cos_sin(torch.arange(SWITCH)[None])[0]
    long = rotary.cos_sin(torch.arange(SWITCH + 1)[None])[0][..., :SWITCH, :]
    assert not torch.allclose(short, long)  # the switch changes the first 16 positions too


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    hf = hf_model("phi3-longrope")
    directory = tmp_path_factory.mktemp("phi3-longrope")
    hf.save_pretrained(directory)
    return hf, load_hf(directory)


@torch.no_grad()
@pytest.mark.parametrize("length", [SWITCH, SWITCH + 1])
def test_logits_on_either_side_of_the_switch_are_transformers(pair: tuple, length: int) -> None:
    hf, ours = pair
    ids = torch.randint(1, 97, (1, length), generator=torch.Generator().manual_seed(length))
    torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours(ids, fused=False).logits, hf(ids).logits, atol=1e-5,
                               rtol=0)


KWARGS = dict(do_sample=False, eos_token_id=None, pad_token_id=0)


@pytest.mark.parametrize("lengths", [[SWITCH], [SWITCH - 1], [SWITCH + 4], [SWITCH, 9, 3]])
def test_greedy_ids_at_past_and_across_the_switch_are_transformers(
        pair: tuple, lengths: list[int]) -> None:
    """A prompt of 16 (its first new token's call crosses), of 15 (the second's), of 20
    (prefilled with the long set: nothing to encode again), and a left-padded batch whose
    longest row crosses: 12 new tokens, the same ids as transformers' generate."""
    hf, ours = pair
    ids, mask = left_padded(lengths, vocab=97, low=1, seed=len(lengths) + lengths[0])
    expected = hf.generate(ids, attention_mask=mask, max_new_tokens=12, min_new_tokens=12,
                           **KWARGS)
    got = generate(ours, ids, mask if len(lengths) > 1 else None, max_new_tokens=12,
                   temperature=0)
    assert torch.equal(got, expected)


def test_edited_generation_encodes_again_at_the_switch_too(pair: tuple) -> None:
    """With edits, every step is the model's own forward over the cache; it too encodes the
    sequence again at the switch: an empty edit set gives transformers' ids."""
    from attnlab.interp.edits import Edits

    hf, ours = pair
    ids, mask = left_padded([SWITCH - 3, 9], vocab=97, low=1, seed=7)
    expected = hf.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8,
                           **KWARGS)
    got = generate(ours, ids, mask, max_new_tokens=8, temperature=0, edits=Edits())
    assert torch.equal(got, expected)


@pytest.mark.slow
def test_compiled_decode_crosses_the_switch_as_transformers(tmp_path: Path) -> None:
    """generate(..., compile=True): the compiled step picks the set with a tensor condition
    and the static cache is filled again at the switch, so a left-padded batch's greedy ids
    are transformers' (one compilation: 10-50 s on a 2-core CPU)."""
    hf = hf_model("phi3-longrope")
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    ids, mask = left_padded([6, 14, 9], vocab=97, low=1, seed=4)
    expected = hf.generate(ids, attention_mask=mask, max_new_tokens=10, min_new_tokens=10,
                           **KWARGS)
    got = generate(ours, ids, mask, max_new_tokens=10, temperature=0, compile=True)
    assert torch.equal(got, expected)


#: Phi-3.5-mini-instruct's shape: 131,072 positions from 4,096, longrope under the older
#: "type" key; its 48 published factors stand in as numbers rising from 1 to 64
PHI35_MINI = {
    **PHI3_MINI, "_name_or_path": "Phi-3.5-mini-instruct", "max_position_embeddings": 131072,
    "sliding_window": 262144, "rope_scaling": {
        "type": "longrope", "short_factor": [1.0 + i / 47 for i in range(48)],
        "long_factor": [1.0 + 63 * (i / 47) ** 2 for i in range(48)]},
}


def test_a_phi35_mini_config_reads_as_transformers_reads_it() -> None:
    assert_read_as_transformers_reads(PHI35_MINI)
    config = config_from_hf(PHI35_MINI)
    assert config.rope_scaling is not None and config.rope_scaling["factor"] == 32.0
    rotary = _ours(PHI35_MINI)
    assert rotary.switch == 4096
    assert rotary.attention_factor == math.sqrt(1 + math.log(32) / math.log(4096))
    short, long, _ = _theirs(PHI35_MINI)
    assert torch.equal(rotary.inv_freq, short) and torch.equal(rotary.long_inv_freq, long)


#: Phi-4-mini-instruct's config.json as published (its custom-code fields included)
PHI4_MINI = {
    "_name_or_path": "Phi-4-mini-instruct", "architectures": ["Phi3ForCausalLM"],
    "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                 "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM",
                 "AutoTokenizer": "Xenova/gpt-4o"},
    "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 199999, "full_attn_mod": 1,
    "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
    "intermediate_size": 8192, "interpolate_factor": 1, "lm_head_bias": False,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "phi3",
    "num_attention_heads": 24, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "original_max_position_embeddings": 4096, "pad_token_id": 199999,
    "partial_rotary_factor": 0.75, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "long_factor": [
            1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817,
            2.187582649, 2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687,
            4.279200023, 4.785517845, 5.351743533, 5.984965424, 6.693110555, 7.485043894,
            8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
            16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884,
            32.03, 32.1, 32.13, 32.23, 32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97,
            33.28, 33.49, 33.5, 44.16, 47.77],
        "short_factor": [1.0] * 48, "type": "longrope"},
    "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.45.0", "use_cache": True,
    "vocab_size": 200064,
}


def test_info_cuts_the_factor_lists_short_and_its_json_keeps_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Twelve factors per list (heads of 24): the config line shows six of each."""
    from attnlab.cli import main

    long = [1.0 + i for i in range(12)]
    transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **{**SMALL, "hidden_size": 48, "num_attention_heads": 2, "num_key_value_heads": 2},
        pad_token_id=None, original_max_position_embeddings=16,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "long_factor": long,
                         "short_factor": [1.0] * 12})).save_pretrained(tmp_path)
    assert main(["info", str(tmp_path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("config"))
    assert "'long_factor': [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, ...]" in line
    assert main(["info", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["rope_scaling"]["long_factor"] == long


def test_phi4_minis_config_as_published_reads_as_transformers_reads_it() -> None:
    """3/4 of each 128-wide head rotated (48 factors), grouped-query heads, tied; the custom
    code's fields transformers ignores are ignored, a true bias among them refused."""
    assert_read_as_transformers_reads(PHI4_MINI)
    rotary = _ours(PHI4_MINI)
    short, long, factor = _theirs(PHI4_MINI)
    assert rotary.dims == 96 and torch.equal(rotary.inv_freq, short)
    assert torch.equal(rotary.long_inv_freq, long) and rotary.attention_factor == factor
    with pytest.raises(ValueError, match=r"phi3 config.json has mlp_bias=True: transformers' "
                                         r"Phi-3 builds no such bias"):
        config_from_hf({**PHI4_MINI, "mlp_bias": True})


LONGROPE = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 4,
            "long_factor": [2.0] * 4, "original_max_position_embeddings": 16, "factor": 8.0}


@pytest.mark.parametrize("fields, line", [
    (lambda: hf_dict("Phi3", **SMALL, pad_token_id=None) | {"rope_parameters": {
        "rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}},
     "phi3 config.json has rope_parameters.rope_type='linear': not a RoPE type attnlab knows; "
     "attnlab supports RoPE types default, longrope"),
    (lambda: hf_dict("Phi3", **SMALL, pad_token_id=None) | {"rope_parameters": {
        **LONGROPE, "long_factor": [2.0] * 3}},
     "rope_scaling.long_factor has 3 numbers; a head rotating 8 dims needs 4, one per pair "
     "(head_dim x partial_rotary_factor / 2)"),
    (lambda: hf_dict("Phi3", **SMALL, pad_token_id=None) | {"rope_parameters": {
        **LONGROPE, "short_factor": [1.0, "x", 1.0, 1.0]}},
     "phi3 config.json has rope_parameters.short_factor=[1.0, 'x', 1.0, 1.0]: expected a list "
     "of finite numbers > 0, one per pair of rotated dims"),
    (lambda: hf_dict("Qwen2", **SMALL) | {"rope_parameters": LONGROPE},
     "qwen2 config.json has rope_parameters.rope_type='longrope': transformers' qwen2 would "
     "keep the cached keys' frequencies when a generation crosses longrope's switch (only "
     "Phi-3 encodes again); attnlab supports RoPE types default, linear, llama3, yarn"),
])
def test_what_transformers_would_compute_otherwise_is_refused(fields: Any, line: str) -> None:
    with pytest.raises(ValueError) as err:
        config_from_hf(fields())
    assert str(err.value) == line


def test_a_config_without_a_factor_is_refused_and_no_other_family_exports_it(
        tmp_path: Path) -> None:
    rope = {k: v for k, v in LONGROPE.items() if k not in ("rope_theta", "factor")}
    with pytest.raises(ValueError, match=r"rope_scaling of rope_type 'longrope' needs factor "
                                         r"\(max_position_embeddings / "):
        GPTConfig(n_embd=32, n_head=4, pos="rope", rope_scaling=rope)
    config = GPTConfig(n_embd=32, n_head=4, n_layer=1, vocab_size=97, pos="rope",
                       norm="rmsnorm", mlp="swiglu", bias=False,
                       rope_scaling={**rope, "factor": 8.0})
    model = GPT(config)
    with pytest.raises(ValueError, match=r"llama config.json has rope_parameters.rope_type="
                       r"'longrope': transformers' llama would keep the cached keys' "):
        save_hf(tmp_path / "llama", model, family="llama")
    save_hf(tmp_path / "phi3", model, family="phi3")
    again = load_hf(tmp_path / "phi3")
    assert again.config.rope_scaling == config.rope_scaling
    ids = torch.randint(0, 97, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
