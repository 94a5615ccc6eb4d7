"""hf/exaone.py: an EXAONE 3 release's directory (its own tensor names and config spellings,
which transformers renames as it loads) reads as the model transformers builds from it, and a
directory transformers saved (Llama's names) reads the same."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnlab import load_hf

transformers = pytest.importorskip("transformers")

# Llama's names -> the releases' (transformers' conversion mapping for "exaone", reversed)
RELEASE_NAMES = (
    (r"^model\.embed_tokens\.", "transformer.wte."), (r"^model\.layers\.", "transformer.h."),
    (r"^model\.norm\.", "transformer.ln_f."),
    (r"\.self_attn\.o_proj\.", ".attn.attention.out_proj."),
    (r"\.self_attn\.", ".attn.attention."), (r"\.input_layernorm\.", ".ln_1."),
    (r"\.post_attention_layernorm\.", ".ln_2."), (r"\.mlp\.gate_proj\.", ".mlp.c_fc_0."),
    (r"\.mlp\.up_proj\.", ".mlp.c_fc_1."), (r"\.mlp\.down_proj\.", ".mlp.c_proj."))


def _release_name(name: str) -> str:
    for pattern, replacement in RELEASE_NAMES:
        name = re.sub(pattern, replacement, name)
    return name


@torch.no_grad()
def test_a_release_directory_reads_as_transformers_reads_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = transformers.ExaoneConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        initializer_range=0.2, tie_word_embeddings=False)
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.save_pretrained(tmp_path / "saved")
    release = tmp_path / "release"
    release.mkdir()
    fields = json.loads((tmp_path / "saved" / "config.json").read_text())
    for llama, spelling in (("num_hidden_layers", "num_layers"),
                            ("rms_norm_eps", "layer_norm_epsilon"),
                            ("hidden_act", "activation_function")):
        fields[spelling] = fields.pop(llama)
    fields.update(architectures=["ExaoneForCausalLM"],
                  auto_map={"AutoModelForCausalLM": "modeling_exaone.ExaoneForCausalLM"})
    (release / "config.json").write_text(json.dumps(fields))
    tensors = load_file(tmp_path / "saved" / "model.safetensors")
    names = {_release_name(k): v for k, v in tensors.items()}
    assert "transformer.h.0.attn.attention.out_proj.weight" in names
    assert "transformer.h.1.mlp.c_fc_0.weight" in names
    save_file(names, release / "model.safetensors")

    ids = torch.randint(1, 97, (2, 9), generator=torch.Generator().manual_seed(3))
    expected = hf(ids).logits
    back = transformers.AutoModelForCausalLM.from_pretrained(release).eval()
    torch.testing.assert_close(back(ids).logits, expected, atol=0, rtol=0)  # the same model
    for directory in (release, tmp_path / "saved"):
        torch.testing.assert_close(load_hf(directory)(ids).logits, expected, atol=1e-5, rtol=0)
