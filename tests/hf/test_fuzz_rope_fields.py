"""Fuzzing the RoPE fields longrope (Phi-3.5 / Phi-4-mini), per-layer-type RoPE (OLMo 3) and
NoPE layers (SmolLM3) brought: any value in any of their keys either loads, building a model
whose cos and sin hold no NaN (an attention factor near float32's largest makes some inf, as
transformers' do), or is refused with one ValueError line naming the field; never another
exception (a TypeError from a list where a name belongs, a KeyError from a missing key, a
ZeroDivisionError from log(1))."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab import GPT
from attnlab.hf import config_from_hf

pytest.importorskip("transformers")

VALUES = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 2, 2**63, 10**12, 0.5, -0.0, 1e-300,
                     float("inf"), float("nan"), "", "12", "longrope", "yarn", "su", "default",
                     "sliding_attention", [], [1.0], [0.0] * 2, [float("nan")] * 2, [1, "x"],
                     {}, {"rope_type": "default"}, {"rope_type": "yarn", "factor": 2.0}]),
    st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=6),
    st.lists(st.floats(allow_nan=True), max_size=3),
)
BASE = dict(vocab_size=11, hidden_size=16, intermediate_size=8, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=64)
PHI = {**BASE, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
       "original_max_position_embeddings": 16,
       "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0],
                        "long_factor": [2.0, 4.0, 8.0, 16.0]}}
OLMO3 = {**BASE, "architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3",
         "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
         "rope_parameters": {
             "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5,
                                "original_max_position_embeddings": 16},
             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
SMOLLM3 = {**BASE, "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3",
           "no_rope_layers": [1, 0], "use_sliding_window": True, "sliding_window": 4,
           "layer_types": ["full_attention", "sliding_attention"]}
# (where in the config: a top-level key, or a key inside a nested dict)
PLACES = [(PHI, ("rope_scaling", key)) for key in (
    "type", "short_factor", "long_factor", "factor", "attention_factor",
    "original_max_position_embeddings", "rope_theta", "partial_rotary_factor")] + [
    (PHI, ("original_max_position_embeddings",)), (PHI, ("partial_rotary_factor",)),
    (PHI, ("rope_scaling",)), (OLMO3, ("layer_types",)), (OLMO3, ("sliding_window",)),
    (OLMO3, ("rope_parameters",)), (OLMO3, ("rope_theta",)), (OLMO3, ("rope_scaling",)),
] + [(OLMO3, ("rope_parameters", kind, key)) for kind in ("full_attention",
                                                            "sliding_attention")
     for key in ("rope_type", "rope_theta", "factor")] + [
    (SMOLLM3, (key,)) for key in ("no_rope_layers", "no_rope_layer_interval", "layer_types",
                                  "use_sliding_window", "sliding_window", "rope_theta")]


def _with(fields: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A deep copy of `fields` with the key at `path` set to `value`."""
    if len(path) == 1:
        return {**fields, path[0]: value}
    inner = fields.get(path[0])
    return {**fields, path[0]: _with(inner if isinstance(inner, dict) else {}, path[1:], value)}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(place=st.sampled_from(PLACES), value=VALUES)
def test_any_rope_value_loads_or_is_refused_in_one_line(place: tuple, value: Any) -> None:
    fields, path = place
    try:
        model = GPT(config_from_hf(_with(fields, path, value)))  # as load_hf builds it
    except ValueError as err:
        message = str(err)
        assert message and "\n" not in message, message
        return
    for rotary in (model.rotary, model.local_rotary):
        if rotary is not None:
            for length in (4, 40):  # either side of the longrope switch (16)
                cos, sin = rotary.cos_sin(torch.arange(length)[None])
                assert not (cos.isnan().any() or sin.isnan().any()), (path, value)
