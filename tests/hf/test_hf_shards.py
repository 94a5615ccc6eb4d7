"""save_hf in shards: Hugging Face's sharded layout (model-0000i-of-0000N.safetensors and
model.safetensors.index.json) that transformers and attnlab both read, split as
huggingface_hub splits, made one shard at a time, and `attnlab export --max_shard_size`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import load_hf, save_hf
from attnlab.cli import main
from attnlab.hf import MAX_SHARD_SIZE, hf_layout
from attnlab.hf.files import SAFETENSORS_FILE, SAFETENSORS_INDEX, shards_of

transformers = pytest.importorskip("transformers")

SHARD = 6000  # bytes: a few small tensors per shard; the token tables (12 kB) alone
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # Conv1D transposes and a fused c_attn, tied head
    "gpt2": ("GPT2", dict(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4)),
    # grouped-query attention 4:2, untied head
    "llama-gqa": ("Llama", dict(vocab_size=97, hidden_size=32, intermediate_size=48,
                                num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, max_position_embeddings=32,
                                tie_word_embeddings=False)),
    # q/k/v fused per head, parallel residual, partial rotary, untied embed_out
    "neox": ("GPTNeoX", dict(vocab_size=97, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=2, num_attention_heads=4,
                             max_position_embeddings=32, tie_word_embeddings=False,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "partial_rotary_factor": 0.25})),
}


def hf_model(case: str) -> Any:
    prefix, fields = CASES[case]
    torch.manual_seed(0)
    config = getattr(transformers, f"{prefix}Config")(
        **fields, initializer_range=0.2, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    config._attn_implementation = "eager"
    head = "LMHeadModel" if prefix == "GPT2" else "ForCausalLM"
    model = getattr(transformers, f"{prefix}{head}")(config).eval()
    with torch.no_grad():  # norms start at 1 and biases at 0: give them values to map
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias") or "ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def weights_of(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a directory's safetensors files, by name."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(path))
    return out


@pytest.mark.parametrize("case", sorted(CASES))
@torch.no_grad()
def test_a_sharded_export_loads_in_transformers_and_attnlab_with_the_same_logits(
        case: str, tmp_path: Path) -> None:
    hf = hf_model(case)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf(tmp_path / "hf")
    out = tmp_path / "sharded"
    save_hf(out, ours, max_shard_size=SHARD)
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 2 and not (out / SAFETENSORS_FILE).exists()
    assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                      for i in range(1, len(shards) + 1)]
    index = json.loads((out / SAFETENSORS_INDEX).read_text())
    written = weights_of(out)
    assert set(index["weight_map"].values()) == set(shards)
    assert index["weight_map"].keys() == written.keys()
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in written.values())
    for shard in shards:  # none over the limit but a tensor larger than it, alone
        held = [t.nbytes for t in weights_of_one(out / shard)]
        assert sum(held) <= SHARD or len(held) == 1, (shard, held)

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation="eager").eval()
    assert type(reloaded) is type(hf)
    for name, tensor in hf.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    ids = torch.randint(1, 97, (2, 20), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(reloaded(ids).logits, ours(ids).logits, atol=1e-4, rtol=0)
    again = load_hf(out)  # attnlab reads the index and its shards
    assert torch.equal(again(ids).logits, ours(ids).logits)
    # a loaded sharded directory exports again to the same tensors, in one file or shards
    save_hf(tmp_path / "one", again)
    assert sorted(p.name for p in (tmp_path / "one").glob("*.safetensors")) == [SAFETENSORS_FILE]
    save_hf(tmp_path / "again", again, max_shard_size=SHARD)
    for directory in (tmp_path / "one", tmp_path / "again"):
        assert {k: v.tolist() for k, v in weights_of(directory).items()} == {
            k: v.tolist() for k, v in written.items()}
    assert (tmp_path / "again" / SAFETENSORS_INDEX).read_text() == \
        (out / SAFETENSORS_INDEX).read_text()


def weights_of_one(path: Path) -> list[torch.Tensor]:
    from safetensors.torch import load_file

    return list(load_file(path).values())


@pytest.mark.parametrize("limit", [20000, 10**9])
def test_shards_split_as_huggingface_hubs_split(limit: int, tmp_path: Path) -> None:
    """The same shards as `split_torch_state_dict_into_shards` (which save_pretrained uses)
    where no tensor is larger than a shard (the hub then keeps filling the shard it holds;
    attnlab closes it, so shards hold tensors in the order they are made: the sharded test
    above checks that case)."""
    hub = pytest.importorskip("huggingface_hub")
    layout = hf_layout(attnlab_model("llama-gqa", tmp_path))
    real = {name: torch.zeros(t.shape, dtype=t.dtype) for name, t in layout.items()}
    split = hub.split_torch_state_dict_into_shards(real, max_shard_size=limit)
    expected = [split.filename_to_tensors[f] for f in sorted(split.filename_to_tensors)]
    assert (len(expected) == 1) == (limit == 10**9)
    assert shards_of({n: t.numel() * t.element_size() for n, t in layout.items()},
                     limit) == expected


def attnlab_model(case: str, tmp_path: Path) -> Any:
    """The attnlab model of `case`, read from the directory transformers saves."""
    hf_model(case).save_pretrained(tmp_path / case)
    return load_hf(tmp_path / case)


def test_save_hf_makes_one_shard_at_a_time(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each shard is written before the next one's tensors are made (the converted tensors
    of a whole model were held at once: twice the model's memory)."""
    from attnlab.hf import files as hf_files
    from attnlab.hf.registry import WeightMap

    ours = attnlab_model("gpt2", tmp_path)
    made: list[str] = []  # the names of the real (not meta) tensors made so far
    real_iter = WeightMap.iter_to_hf

    def counting(self: WeightMap, state: Any, config: Any) -> Any:
        for name, tensor in real_iter(self, state, config):
            if tensor.device.type != "meta":
                made.append(name)
            yield name, tensor

    monkeypatch.setattr(WeightMap, "iter_to_hf", counting)
    saved: list[tuple[list[str], list[str]]] = []
    real_write = hf_files.write_tensors

    def write_tensors(path: Path, tensors: dict[str, torch.Tensor], *args: Any) -> int:
        saved.append((list(tensors), list(made)))
        return real_write(path, tensors, *args)

    monkeypatch.setattr(hf_files, "write_tensors", write_tensors)
    save_hf(tmp_path / "out", ours, max_shard_size=SHARD)
    assert len(saved) > 2
    written: list[str] = []
    for shard, made_by_then in saved:
        written += shard
        assert made_by_then == written  # nothing of the next shard made yet


def test_an_export_replaces_the_weight_files_of_an_earlier_one(tmp_path: Path) -> None:
    """A model.safetensors left beside new shards would be what every reader loads (it
    comes first), and shards of an older count would be stale files."""
    small, large = attnlab_model("llama-gqa", tmp_path), attnlab_model("neox", tmp_path)
    tmp_path = tmp_path / "out"
    save_hf(tmp_path, small)
    save_hf(tmp_path, large, max_shard_size=SHARD)
    assert not (tmp_path / SAFETENSORS_FILE).exists()
    assert torch.equal(load_hf(tmp_path).lm_head.weight, large.lm_head.weight)
    count = len(list(tmp_path.glob("model-*.safetensors")))
    save_hf(tmp_path, small, max_shard_size=4 * SHARD)  # fewer shards: the others go
    assert 1 < len(list(tmp_path.glob("model-*.safetensors"))) < count
    save_hf(tmp_path, small)
    assert sorted(p.name for p in tmp_path.glob("model*")) == [SAFETENSORS_FILE]
    assert torch.equal(load_hf(tmp_path).lm_head.weight, small.lm_head.weight)
    (tmp_path / "model-notes.safetensors").write_text("mine")  # not a shard's name: kept
    save_hf(tmp_path, small, max_shard_size=SHARD)
    assert (tmp_path / "model-notes.safetensors").read_text() == "mine"


def test_max_shard_size_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"max_shard_size=0 bytes; give a positive size"):
        save_hf(tmp_path / "out", attnlab_model("gpt2", tmp_path), max_shard_size=0)


def test_export_max_shard_size_sizes_the_files_and_the_fit_check(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fit check counted a copy of the whole model beside it; it counts one shard, so a
    machine with room for the model and one small shard exports with --max_shard_size."""
    import attnlab.model.memory as memory
    from attnlab.cli.export import DEFAULT_SHARD, shard_size

    assert shard_size(DEFAULT_SHARD) == MAX_SHARD_SIZE
    hf = hf_model("llama-gqa")
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text(json.dumps(_word_tokenizer()))
    params = sum(p.numel() for p in hf.parameters())
    largest = max(p.numel() for p in hf.parameters()) * 4
    free = params * 4 + largest + 3 * largest  # the model, its largest tensor, a bit more
    monkeypatch.setattr(memory, "available_bytes", lambda device: free)
    out = str(tmp_path / "out")
    assert main(["export", str(tmp_path / "hf"), out]) == 1  # the default: one shard, whole
    err = capsys.readouterr().err
    assert f"the shard being written (--max_shard_size) {memory.gb(params * 4)} more" in err
    assert "to hold less beside it: a smaller --max_shard_size" in err
    assert main(["export", str(tmp_path / "hf"), out, "--max_shard_size", "12kB"]) == 0
    line = capsys.readouterr().out.split("\n")[0]
    shards = sorted(p.name for p in Path(out).glob("model-*.safetensors"))
    assert len(shards) > 2
    assert f"{shards[0]} ..., {shards[-1]}, model.safetensors.index.json" in line
    with torch.no_grad():
        ids = torch.randint(1, 97, (1, 12), generator=torch.Generator().manual_seed(2))
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        torch.testing.assert_close(reloaded(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("text, nbytes", [("5GB", 5 * 10**9), ("2GiB", 2 * 2**30),
                                          ("500mb", 500 * 10**6), ("123", 123),
                                          ("12kB", 12000)])
def test_max_shard_size_reads_units_as_huggingface_hub_does(text: str, nbytes: int) -> None:
    from attnlab.cli.export import shard_size

    assert shard_size(text) == nbytes


@pytest.mark.parametrize("text", ["0", "5 GBs", "1.5GB", "", "0x10"])
def test_max_shard_size_refuses_what_is_not_a_size(
        text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["export", str(tmp_path / "in"), str(tmp_path / "out"), "--max_shard_size", text])
    assert f"{text!r} is not a size; write a positive whole number and a unit" in \
        capsys.readouterr().err


def _word_tokenizer() -> dict[str, Any]:
    """A tokenizer.json of a few words (fewer ids than the model's 97: a padded vocab)."""
    import tokenizers

    words = ["<s>", "</s>", "the", "fox"]
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {w: i for i, w in enumerate(words)}, unk_token="<s>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    result: dict[str, Any] = json.loads(backend.to_str())
    return result
