"""hf.py: attnlab on GPT-2 weights equals Hugging Face's GPT2LMHeadModel on the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.generate import generate
from attnlab.hf import (
    gpt_from_hf,
    is_hf_dir,
    load_hf_checkpoint,
    load_hf_gpt2,
    save_hf,
    save_hf_gpt2,
)
from helpers import (
    assert_logits_match_hf,
    assert_ngrams_and_typical_p_match_hf,
    left_padded,
    linears_laid_out,
)

transformers = pytest.importorskip("transformers")

# Two shapes: tied head with scaled scores, and an untied head with unscaled scores; and a
# third with the exact (erf) GELU, GPTConfig.gelu="exact".
SHAPES = {
    "tied": dict(vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4),
    "untied": dict(
        vocab_size=131, n_positions=48, n_embd=48, n_layer=3, n_head=3,
        tie_word_embeddings=False, scale_attn_weights=False,
    ),
    "exact-gelu": dict(vocab_size=89, n_positions=40, n_embd=32, n_layer=2, n_head=2,
                       activation_function="gelu"),
}


def _hf_model(shape: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        **SHAPES[shape],
        # a wide init gives peaked logits, so greedy argmax never hinges on a 1e-6 near-tie
        initializer_range=0.2, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module", params=sorted(SHAPES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    hf = _hf_model(request.param)
    directory = tmp_path_factory.mktemp(f"gpt2-{request.param}")
    hf.save_pretrained(directory)
    return hf, load_hf_gpt2(directory), directory


def test_logits_agree_single_and_left_padded(pair: tuple) -> None:
    hf, ours, _ = pair
    assert_logits_match_hf(ours, hf, [5, 12, 9], low=0)


def test_greedy_generation_gives_hugging_faces_ids(pair: tuple) -> None:
    hf, ours, _ = pair
    V = ours.config.vocab_size
    ids, mask = left_padded([4, 11, 7], vocab=V, low=1, seed=1)
    n = ours.config.block_size - ids.shape[1]  # up to the end of the position table
    expected = hf.generate(
        ids, attention_mask=mask, max_new_tokens=n, do_sample=False, eos_token_id=None,
        pad_token_id=0,
    )
    assert torch.equal(generate(ours, ids, mask, max_new_tokens=n, temperature=0), expected)
    single = ids[1:2]
    expected = hf.generate(
        single, attention_mask=torch.ones_like(single), max_new_tokens=n, do_sample=False,
        eos_token_id=None, pad_token_id=0,
    )
    assert torch.equal(generate(ours, single, max_new_tokens=n, temperature=0), expected)


def test_no_repeat_ngrams_and_typical_p_are_hugging_faces(pair: tuple) -> None:
    hf, ours, _ = pair
    assert_ngrams_and_typical_p_match_hf(ours, hf)


@torch.no_grad()
def test_export_round_trip(pair: tuple, tmp_path: Path) -> None:
    hf, ours, _ = pair
    save_hf_gpt2(tmp_path, ours)
    assert is_hf_dir(tmp_path)
    reloaded_hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    # no tokenizer, no special ids (transformers would fill in GPT-2's 50256)
    assert reloaded_hf.config.bos_token_id is None and reloaded_hf.config.eos_token_id is None
    for name, tensor in hf.state_dict().items():
        assert torch.equal(reloaded_hf.state_dict()[name], tensor), name
    again = load_hf_gpt2(tmp_path)
    for name, tensor in ours.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name
    ids = torch.randint(0, ours.config.vocab_size, (2, 9), generator=torch.Generator())
    torch.testing.assert_close(reloaded_hf(ids).logits, ours(ids).logits, atol=1e-4, rtol=0)


def test_pytorch_model_bin_loads_the_same(pair: tuple, tmp_path: Path) -> None:
    hf, ours, directory = pair
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    from_bin = load_hf_gpt2(tmp_path)
    for name, tensor in ours.state_dict().items():
        assert torch.equal(from_bin.state_dict()[name], tensor), name


def test_imported_weights_are_laid_out_and_owned(pair: tuple) -> None:
    """GPT's (in, out) Linear layout (Conv1D's own), the tie kept, and no tensor shared with
    the Hugging Face state dict it came from."""
    hf, _, _ = pair
    ours = gpt_from_hf(hf.config.to_dict(), hf.state_dict())
    assert linears_laid_out(ours)
    assert (ours.lm_head.weight is ours.wte.weight) == hf.config.tie_word_embeddings
    theirs = {t.untyped_storage().data_ptr() for t in hf.state_dict().values()}
    assert not theirs & {t.untyped_storage().data_ptr() for t in ours.state_dict().values()}


def test_checkpoint_needs_a_tokenizer(pair: tuple) -> None:
    _, _, directory = pair
    with pytest.raises(FileNotFoundError, match=r"has no tokenizer: add tokenizer\.json"):
        load_hf_checkpoint(directory)


def test_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hf_gpt2(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        load_hf_gpt2(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match=r"model_type=.llama.: load_hf_gpt2 reads GPT-2 only"):
        load_hf_gpt2(tmp_path)
    config = {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8, "vocab_size": 11}
    (tmp_path / "config.json").write_text(json.dumps({**config, "activation_function": "relu"}))
    with pytest.raises(ValueError, match="activation_function='relu'"):
        load_hf_gpt2(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match=r"has no weights: expected model\.safetensors"):
        load_hf_gpt2(tmp_path)
    torch.save({"wte.weight": torch.zeros(11, 8)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"no weight 'transformer\.wpe\.weight'"):
        load_hf_gpt2(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model": {}, "meta": {}}))
    assert not is_hf_dir(tmp_path)  # an attnlab checkpoint's config.json


def test_export_refuses_models_gpt2_cannot_express(tmp_path: Path) -> None:
    from attnlab import GPT, GPTConfig
    model = GPT(GPTConfig.from_name("nano", n_kv_head=1))
    with pytest.raises(ValueError, match=r"it needs n_kv_head=2 \(not 1\)"):
        save_hf_gpt2(tmp_path, model)


def test_save_hf_writes_the_weights_dtype_so_from_pretrained_keeps_it(tmp_path: Path) -> None:
    model = GPT(GPTConfig.from_name("llama-tiny")).eval().to(torch.bfloat16)
    save_hf(tmp_path, model)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    assert transformers.AutoModelForCausalLM.from_pretrained(tmp_path).dtype == torch.bfloat16
