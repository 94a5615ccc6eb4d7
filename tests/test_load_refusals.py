"""The layer-count refusal before loading (materialize.check_layer_count) and what
`inspect_dir` reports from the headers alone (mutation testing, round 3)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from attnlab import inspect_dir
from attnlab.model.materialize import CHEAP_LAYERS, check_layer_count

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.loading import LLAMA_1B, sparse_hf_dir


def test_a_deep_config_whose_files_hold_every_layer_passes_the_layer_count() -> None:
    """300 layers, all 300 in the files: nothing to refuse (HF names and attnlab names)."""
    n = CHEAP_LAYERS + 44
    hf = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(n)]
    check_layer_count(n, hf, "model.layers.{i}.", base="model.")
    check_layer_count(n, [name.removeprefix("model.") for name in hf], "model.layers.{i}.",
                      base="model.")  # files that leave out the base
    check_layer_count(n, [f"blocks.{i}.attn.query.weight" for i in range(n)], "blocks.{i}.")
    with pytest.raises(ValueError, match=r"describes 300 layers but the weights have no "
                                         r"blocks\.299\.\* tensors \(they hold 299 layers\)"):
        check_layer_count(n, [f"blocks.{i}.attn.query.weight" for i in range(n - 1)],
                          "blocks.{i}.")


def _tiny_hf(directory: Path, tie: bool) -> Path:
    config = {**LLAMA_1B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96,
              "max_position_embeddings": 128, "tie_word_embeddings": tie}
    return sparse_hf_dir(directory, config, shards=2)


@pytest.mark.parametrize("tie", [False, True])
def test_info_counts_a_tied_table_once_and_names_the_largest_tensor(tmp_path: Path,
                                                                    tie: bool) -> None:
    """Counted by hand: per layer q 64x64, k and v 64x32, o 64x64, three 64x128 MLP matrices
    and two norms; the 96x64 token table (and head, untied), the final norm."""
    info = inspect_dir(_tiny_hf(tmp_path / "m", tie))
    layer = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64
    parameters = 2 * layer + 96 * 64 * (1 if tie else 2) + 64
    assert info.parameters == parameters
    assert info.stored == {"bfloat16": 2 * parameters}
    assert info.tensors == 2 * 9 + 1 + (1 if tie else 2)
    assert info.largest_tensor == 64 * 128 * 2  # an MLP matrix in bfloat16, not the table
    assert info.memory("cpu")["float32"]["bytes"] == 4 * parameters + 64 * 128 * 2
