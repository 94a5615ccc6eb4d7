"""hf/files.py at its edges, with no model around it: the shard index checked against the
shards it names, shards split at their size limit, and what `write_weights` and
`write_hf_dir` write (tensors in the listed order, tensors sharing memory, progress, the
tokenizer files copied as they are). Each case is one flaw or one boundary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from attnlab.hf.files import (
    SAFETENSORS_INDEX,
    read_weights,
    shards_of,
    write_hf_dir,
    write_weights,
)


def _sharded_dir(directory: Path, weight_map: dict[str, str]) -> Path:
    """Shard one.safetensors holding "a", two.safetensors holding "b", and an index."""
    directory.mkdir()
    save_file({"a": torch.ones(2)}, str(directory / "one.safetensors"))
    save_file({"b": torch.zeros(3)}, str(directory / "two.safetensors"))
    (directory / SAFETENSORS_INDEX).write_text(json.dumps({"weight_map": weight_map}))
    return directory


def test_an_index_naming_a_shard_by_a_path_outside_its_directory_is_refused(
        tmp_path: Path) -> None:
    """An index names files next to it: "../x" (a file that exists, one level up) would let
    a downloaded directory read any file its user can."""
    save_file({"b": torch.zeros(3)}, str(tmp_path / "outside.safetensors"))
    directory = _sharded_dir(tmp_path / "model", {"a": "one.safetensors"})
    (directory / SAFETENSORS_INDEX).write_text(json.dumps(
        {"weight_map": {"a": "one.safetensors", "b": "../outside.safetensors"}}))
    with pytest.raises(ValueError, match=r"names shard '\.\./outside\.safetensors' outside "
                                         r"the directory"):
        read_weights(directory)


def test_an_index_that_puts_a_tensor_in_another_shard_than_holds_it_is_refused(
        tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"puts tensor 'a' in two\.safetensors but "
                                         r"one\.safetensors holds it"):
        read_weights(_sharded_dir(tmp_path / "swapped", {"a": "two.safetensors",
                                                          "b": "one.safetensors"}))
    files = read_weights(_sharded_dir(tmp_path / "right", {"a": "one.safetensors",
                                                            "b": "two.safetensors"}))
    assert torch.equal(files["a"], torch.ones(2)) and torch.equal(files["b"], torch.zeros(3))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=8), limit=st.integers(1, 16))
def test_shards_fill_up_to_their_limit_and_no_further(sizes: list[int], limit: int) -> None:
    """Every shard holds the most tensors that fit: up to exactly `limit` bytes (a tensor
    that brings it to the limit joins it), and the next shard's first tensor would not have
    fit; a tensor over the limit has a shard of its own."""
    named = {f"t{i}": n for i, n in enumerate(sizes)}
    groups = shards_of(named, limit)
    assert [name for group in groups for name in group] == list(named)
    totals = [sum(named[name] for name in group) for group in groups]
    for group, total in zip(groups, totals, strict=True):
        assert total <= limit or len(group) == 1
    for total, following in zip(totals, groups[1:], strict=False):
        assert total + named[following[0]] > limit


def test_a_shard_filled_to_exactly_its_limit_takes_both_tensors() -> None:
    assert shards_of({"a": 2, "b": 2, "c": 1}, 4) == [["a", "b"], ["c"]]


def test_weights_that_come_in_another_order_than_their_sizes_are_refused(
        tmp_path: Path) -> None:
    """The sizes decide the shards before the tensors come: a tensor out of order would land
    in a shard the index does not name for it."""
    weights = [("b", torch.zeros(2)), ("a", torch.ones(2))]
    with pytest.raises(ValueError, match=r"weights came as 'b' where the sizes listed 'a'"):
        write_weights(tmp_path, iter(weights), {"a": 8, "b": 8})


def test_tensors_sharing_memory_are_written_each_whole(tmp_path: Path) -> None:
    """Two views of one tensor (a fused q/k/v weight split, a tied head) in one shard:
    safetensors refuses tensors that share memory, so each is written as a copy."""
    fused = torch.arange(12.0).view(4, 3)
    weights = [("q", fused[:2]), ("k", fused[2:]), ("tied", fused)]
    assert write_weights(tmp_path, iter(weights), {"q": 24, "k": 24, "tied": 48}) == \
        ["model.safetensors"]
    back = load_file(tmp_path / "model.safetensors")
    assert torch.equal(back["q"], fused[:2]) and torch.equal(back["k"], fused[2:])
    assert torch.equal(back["tied"], fused)


def test_progress_counts_the_bytes_written_over_the_shards(tmp_path: Path) -> None:
    heard: list[tuple[int, int]] = []
    weights = [(name, torch.zeros(2)) for name in "abc"]
    written = write_weights(tmp_path, iter(weights), dict.fromkeys("abc", 8), 8,
                            progress=lambda done, total: heard.append((done, total)))
    # three shards of one (2,) float32 tensor each: 8 bytes apiece, 24 in all
    assert heard == [(8, 24), (16, 24), (24, 24)]
    assert written[-1] == SAFETENSORS_INDEX and len(written) == 4


def test_tokenizer_files_copied_from_the_source_are_kept_as_they_are(tmp_path: Path) -> None:
    """A source directory's tokenizer.json and tokenizer_config.json are the model's own
    (special tokens, added tokens, the class transformers reads it with): copied, they are
    not written over with the export's own forms of the tokenizer."""
    pytest.importorskip("tokenizers")
    from attnlab.tokenizers import get_tokenizer

    char = get_tokenizer("char", "abc")
    weights, sizes = [("a", torch.zeros(1))], {"a": 4}
    full = tmp_path / "full"  # tokenizer.json and its config, both the source's
    full.mkdir()
    (full / "tokenizer.json").write_text('{"source": "its own"}')
    (full / "tokenizer_config.json").write_text('{"add_bos_token": true}')
    write_hf_dir(tmp_path / "out", {}, iter(weights), sizes, char, [full])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "out" / name).read_text() == (full / name).read_text()
    config_only = tmp_path / "config-only"  # vocab.json + merges.txt's kind: no tokenizer.json
    config_only.mkdir()
    (config_only / "tokenizer_config.json").write_text('{"add_bos_token": true}')
    write_hf_dir(tmp_path / "out2", {}, iter(weights), sizes, char, [config_only])
    assert (tmp_path / "out2" / "tokenizer_config.json").read_text() == \
        '{"add_bos_token": true}'
    assert (tmp_path / "out2" / "tokenizer.json").is_file()  # written from the tokenizer
