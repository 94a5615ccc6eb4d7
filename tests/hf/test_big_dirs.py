"""Model directories of any size: described from metadata alone, checked before anything is
allocated, refused in one line when they cannot fit, and loaded one tensor at a time.

The 70B-shaped directory is sparse (141 GB of bf16 weights that take no disk), so these run
in the suite; peak memory is each subprocess's own VmHWM (benchmarks/loading.py).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab.model.tensorfile as tensorfile
from attnlab import inspect_dir, load_hf
from attnlab.model.memory import DoesNotFitError, check_memory

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.loading import (
    CLI_RUN,
    LLAMA_1B,
    LLAMA_70B,
    LOAD_RUN,
    hf_shapes,
    measure,
    sparse_hf_dir,
    write_safetensors,
)

TINY = {**LLAMA_1B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96,
        "max_position_embeddings": 128}


@pytest.fixture(scope="module")
def llama_70b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = sparse_hf_dir(tmp_path_factory.mktemp("big") / "llama-70b", LLAMA_70B)
    # a tokenizer: a directory without one is refused for that first, before the fit check
    tokenizer = Path(__file__).resolve().parents[1] / "data" / "v0.2_hf_llama" / "tokenizer.json"
    (directory / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    return directory


def test_info_on_a_70b_directory_reads_metadata_only(llama_70b: Path) -> None:
    """Seconds and a few hundred MB, where building the model filled a 24 GB machine."""
    run = measure(CLI_RUN, argv=["info", str(llama_70b), "--json"])
    assert run["exit"] == 0 and run["seconds"] < 10, run
    assert run["peak_mb"] < 600, run  # torch + attnlab alone are ~220 MB
    info = inspect_dir(llama_70b)
    assert info.parameters == 70_553_706_496  # Llama-3.1-70B's published count
    assert info.stored == {"bfloat16": 2 * info.parameters} and info.tensors == 723
    assert len(info.weight_files) == 8 and info.family == "llama"
    memory = info.memory("cpu")
    assert memory["bfloat16"]["bytes"] == 2 * info.parameters + info.largest_tensor
    assert memory["float32"]["fits"] is False  # 282 GB: no CI machine has it
    if not torch.cuda.is_available():  # a device type this machine lacks: fits unknown
        assert info.memory("cuda")["bfloat16"]["fits"] is None


def test_loading_what_cannot_fit_is_one_line(llama_70b: Path) -> None:
    run = measure(CLI_RUN, argv=["generate", str(llama_70b), "hat", "--max_new_tokens", "1"])
    line = run["stderr"]
    assert run["exit"] == 1 and len(line.splitlines()) == 1 and "Traceback" not in line, run
    assert "needs 284.3 GB in float32 (70.55B parameters)" in line and "--force" in line
    assert run["peak_mb"] < 600, run
    with pytest.raises(DoesNotFitError, match=r"even bfloat16 needs 143\.2 GB"):
        load_hf(llama_70b)


def test_the_message_names_what_would_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    import attnlab.model.memory as memory

    monkeypatch.setattr(memory, "available_bytes", lambda device: 10 * 10**9)
    with pytest.raises(DoesNotFitError, match=r"in bfloat16 it needs 8\.0 GB, which fits: "
                                              r"dtype=torch\.bfloat16; force=True tries"):
        check_memory(4 * 10**9, torch.float32, "cpu")
    with pytest.raises(DoesNotFitError, match=r"about 5\.00B parameters fit here"):
        check_memory(8 * 10**9, torch.bfloat16, "cpu")
    check_memory(8 * 10**9, torch.bfloat16, "cpu", force=True)  # an expert's choice
    check_memory(2 * 10**9, torch.float32, "cpu")


def test_a_config_far_bigger_than_its_weights_is_refused_before_allocating(
        tmp_path: Path) -> None:
    """4,000 layers over a one-tensor file: 524 GB that were once allocated, then refused."""
    directory = tmp_path / "liar"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({**LLAMA_70B, "num_hidden_layers": 4000}))
    write_safetensors(directory / "model.safetensors", {"model.embed_tokens.weight": (4, 4)})
    for argv in (["info", str(directory)], ["generate", str(directory), "hi"]):
        run = measure(CLI_RUN, argv=argv)
        assert run["exit"] == 1 and run["peak_mb"] < 600, run
        assert run["stderr"].count("\n") == 0 and "Traceback" not in run["stderr"], run
        assert "describes 4000 layers but the weights have no model.layers.0.* tensors" \
            in run["stderr"], run


def test_a_wrong_shape_is_named_with_both_shapes(tmp_path: Path) -> None:
    directory = sparse_hf_dir(tmp_path / "tiny", TINY, shards=2)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    with pytest.raises(ValueError, match=r"blocks\.0\.mlp\.fc\.weight \(tensor "
                       r"'model\.layers\.0\.mlp\.up_proj\.weight' of model-00001-of-00002"
                       r"\.safetensors\) has shape \(128, 64\) but the config needs \(96, 64\)"):
        load_hf(directory)


def test_a_missing_tensor_or_layer_is_named(tmp_path: Path) -> None:
    directory = sparse_hf_dir(tmp_path / "tiny", TINY, shards=1)
    shapes = hf_shapes(TINY)
    del shapes["model.layers.1.post_attention_layernorm.weight"]
    write_safetensors(directory / "model-00001-of-00001.safetensors", shapes)
    (directory / "model.safetensors.index.json").unlink()
    (directory / "model-00001-of-00001.safetensors").rename(directory / "model.safetensors")
    with pytest.raises(ValueError, match=r"no weight 'model\.layers\.1\.post_attention_"):
        inspect_dir(directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 300}))
    with pytest.raises(ValueError, match=r"describes 300 layers but the weights have no "
                                         r"model\.layers\.2\.\* tensors \(they hold 2 layers\)"):
        inspect_dir(directory)  # (before building 300 layers)


def test_lazy_load_peaks_at_the_model_plus_one_tensor(tmp_path: Path) -> None:
    """A random ~200 MB bf16 model loads with (peak - RSS before) within 1.25x its size."""
    shape = {**LLAMA_1B, "num_hidden_layers": 2, "vocab_size": 8000}
    directory = sparse_hf_dir(tmp_path / "real", shape, shards=3, seed=0)
    run = measure(LOAD_RUN, path=str(directory), packed=False)
    assert 150 < run["model_mb"] < 300, run
    assert run["peak_mb"] - run["before_mb"] <= 1.25 * run["model_mb"], run


def test_lazy_load_equals_the_files(tmp_path: Path) -> None:
    """Every parameter equals its tensor in the shards, in the model's own memory layout."""
    from safetensors.torch import load_file

    directory = sparse_hf_dir(tmp_path / "tiny", TINY, shards=2, seed=3)
    model = load_hf(directory, torch.bfloat16)
    files = {}
    for shard in sorted(directory.glob("*.safetensors")):
        files.update(load_file(shard))
    assert torch.equal(model.blocks[1].attn.query.weight, files[
        "model.layers.1.self_attn.q_proj.weight"])
    assert torch.equal(model.lm_head.weight, files["lm_head.weight"])
    assert model.blocks[0].mlp.fc.weight.t().is_contiguous()  # (in, out) memory, laid out
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    again = load_hf(directory)
    assert torch.equal(again.wte.weight, files["model.embed_tokens.weight"].float())


def test_force_loads_what_the_check_would_refuse(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Every command that loads a model takes --force: an expert's way past the fit check."""
    import attnlab.model.memory as memory
    from attnlab.cli import main

    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000)  # 1 kB free
    data = Path(__file__).resolve().parents[1] / "data" / "v0.2_checkpoint"
    argv = ["generate", str(data), "cat", "--max-new-tokens", "1", "--device", "cpu"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the model needs 32.2 kB in float32" in err, err
    assert "(7,024 parameters), the KV cache for 1 row of 4 positions" in err, err
    assert "but this machine has 1.0 kB free" in err and "--force tries anyway" in err, err
    assert main([*argv, "--force"]) == 0
    assert main(["heads", str(data), "--force"]) == 0


def _tied_with_a_stored_head(directory: Path, **values: Any) -> Path:
    """TINY's files (which store lm_head.weight) under a config that ties the head."""
    sparse_hf_dir(directory, TINY, shards=2, **values)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    return directory


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(tensor, bytes) of every read from a safetensors file from now on."""
    reads: list[tuple[str, int]] = []
    read_tensor, read_rows = tensorfile.read_tensor, tensorfile.read_rows

    def whole(info: Any) -> torch.Tensor:
        reads.append((info.name, info.nbytes))
        return read_tensor(info)

    def rows(info: Any, start: int, stop: int) -> torch.Tensor:
        out = read_rows(info, start, stop)
        reads.append((info.name, out.nbytes))
        return out

    monkeypatch.setattr(tensorfile, "read_tensor", whole)
    monkeypatch.setattr(tensorfile, "read_rows", rows)
    return reads


UNTIED = sum(math.prod(shape) for shape in hf_shapes(TINY).values())  # a head of its own


def test_a_stored_head_of_a_tied_config_is_counted_before_it_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fit check comes first and counts the head as its own (the worst case): a 70B-shaped
    directory read its head and token table whole (3.1 GB, 14 s) only to be refused."""
    import attnlab.model.memory as memory

    directory = _tied_with_a_stored_head(tmp_path / "tied", seed=0)
    reads = _reads(monkeypatch)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000)
    with pytest.raises(DoesNotFitError, match=rf"\({UNTIED:,} parameters\)"):
        load_hf(directory)
    assert reads == []


@pytest.mark.parametrize("equal", [False, True])
def test_info_compares_a_stored_head_in_slices_and_agrees_with_the_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, equal: bool) -> None:
    """info counted a stored head that differs from the table as tied (fewer parameters and
    bytes than the load holds); now it compares them, COMPARE_PIECE bytes at a time."""
    directory = _tied_with_a_stored_head(tmp_path / "tied", **(
        {"fill": b"\x3c\x3f"} if equal else {"seed": 0}))  # fill: every tensor alike
    monkeypatch.setattr(tensorfile, "COMPARE_PIECE", 1000)
    reads = _reads(monkeypatch)
    info = inspect_dir(directory)
    table = TINY["vocab_size"] * TINY["hidden_size"] * 2  # bf16 bytes
    assert reads and all(nbytes <= 1000 for _, nbytes in reads), reads
    assert {name for name, _ in reads} == {"lm_head.weight", "model.embed_tokens.weight"}
    assert sum(nbytes for _, nbytes in reads) == (2 * table if equal else 2 * 896)  # (7, 64)
    tied = UNTIED - TINY["vocab_size"] * TINY["hidden_size"]
    assert info.parameters == (tied if equal else UNTIED)
    assert info.config.tie_weights is equal
    assert any(("equal to the table" if equal else "differs from it") in n for n in info.notes)
    model = load_hf(directory)
    assert model.num_params(non_embedding=False) == info.parameters
    assert (model.lm_head.weight is model.wte.weight) is equal


def test_a_directory_without_a_tokenizer_fails_before_its_weights_are_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1B directory without a tokenizer was loaded whole (21 s, 2.7 GB) before it failed."""
    from attnlab.load import load_checkpoint
    from attnlab.tokenizers import NoTokenizerError

    directory = sparse_hf_dir(tmp_path / "notok", TINY, shards=2)
    reads = _reads(monkeypatch)
    with pytest.raises(NoTokenizerError):
        load_checkpoint(directory)
    assert reads == []


def test_generate_counts_its_kv_cache_and_packed_weights_before_loading(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The fit check counted the weights and one tensor; a 131,000-token generation then
    allocated its KV cache (GBs) past what was free. Now it counts the cache for the batch
    and prompt + new tokens, the decode step's stacked q/k/v copy (2 layers of three 16 x 16
    float32 matrices here) and --weights float16's packed copies."""
    import attnlab.model.memory as memory
    from attnlab.cli import main

    data = Path(__file__).resolve().parents[1] / "data" / "v0.2_checkpoint"
    weights = inspect_dir(data).memory("cpu")["float32"]["bytes"]
    stacked = 2 * 3 * 16 * 16 * 4
    monkeypatch.setattr(memory, "available_bytes", lambda device: weights + stacked + 2000)
    argv = ["generate", str(data), "cat", "--device", "cpu", "--temperature", "0"]
    assert main([*argv, "--max-new-tokens", "1"]) == 0  # 4 positions: 1,024 bytes
    capsys.readouterr()
    assert main([*argv, "--max-new-tokens", "13"]) == 1  # 16 positions: 4,096 bytes
    err = capsys.readouterr().err
    assert "the KV cache for 1 row of 16 positions 4.1 kB more" in err, err
    assert "the decode step's stacked q/k/v matrices 6.1 kB more" in err, err
    assert main([*argv, "--max-new-tokens", "13", "--force"]) == 0
    capsys.readouterr()
    assert main([*argv, "--max-new-tokens", "1", "--weights", "float16"]) == 1
    assert "the packed float16 copies of the matrices" in capsys.readouterr().err
