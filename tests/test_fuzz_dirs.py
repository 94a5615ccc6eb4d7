"""Fuzzing model directories: config.json fields and safetensors files broken every way a
download, a hand edit or a hostile file can break them. Every case ends in `attnlab info`
exiting 0 (the change was harmless) or 1 with one line and no traceback, and the loader
raising ValueError / FileNotFoundError or loading, in bounded time and memory: huge shapes
are refused from the headers, before anything is allocated (a 10^12-element tensor would
be a MemoryError or a RuntimeError, which fail these tests)."""

from __future__ import annotations

import json
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import load_hf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.loading import LLAMA_1B, sparse_hf_dir

from test_fuzz import assert_one_line_error, run_cli

TINY = {**LLAMA_1B, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 24,
        "max_position_embeddings": 32}
FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
          "rope_theta", "tie_word_embeddings", "head_dim", "rope_scaling", "model_type",
          "architectures", "sliding_window", "attention_bias", "hidden_act")
BAD_VALUES = st.one_of(
    st.sampled_from([None, True, False, 0, -1, -(2**63), 2**63, 10**12, 2**31, 0.5, -0.0,
                     float("inf"), float("nan"), "", "12", "llama", [], [16], {}, {"a": 1}]),
    st.integers(-5, 10**15), st.text(max_size=8), st.floats(allow_nan=True),
)
CASES = settings(max_examples=120, deadline=5000)
PEAK_MB = 2048  # what any case may add to the test process's high-water mark


def _peak_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def _check(directory: Path) -> None:
    """`attnlab info` and `load_hf` both end cleanly on `directory`."""
    code, err = run_cli(["info", str(directory)])
    if code != 0:
        assert_one_line_error(code, err, str(directory.name), "config", "tensor", "shard",
                              "layers", "weight", "safetensors", "header", "model")
    try:
        model = load_hf(directory)
    except (ValueError, FileNotFoundError) as e:
        assert "\n" not in str(e).strip(), str(e)
    else:
        assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.fixture(scope="module")
def before_mb() -> float:
    return _peak_mb()


@CASES
@given(field=st.sampled_from(FIELDS), value=BAD_VALUES, drop=st.booleans())
def test_config_fields(field: str, value: Any, drop: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = sparse_hf_dir(Path(tmp) / "m", TINY, shards=2, seed=0)
        config = json.loads((directory / "config.json").read_text())
        if drop:
            config.pop(field, None)
        else:
            config[field] = value
        (directory / "config.json").write_text(json.dumps(config))
        _check(directory)


def _mutate_header(header: dict[str, Any], kind: str, n: int) -> None:
    """Break one tensor's entry of a safetensors header in place."""
    names = sorted(k for k in header if k != "__metadata__")
    entry = header[names[n % len(names)]]
    other = header[names[(n + 1) % len(names)]]
    begin, end = entry["data_offsets"]
    if kind == "offsets_past_end":
        entry["data_offsets"] = [begin, end + 10**12]
    elif kind == "offsets_overlap":
        entry["data_offsets"] = list(other["data_offsets"])
    elif kind == "offsets_reversed":
        entry["data_offsets"] = [end, begin]
    elif kind == "offsets_negative":
        entry["data_offsets"] = [-8, end]
    elif kind == "dtype_disagrees":
        entry["dtype"] = "F16" if entry["dtype"] != "F16" else "F32"
    elif kind == "dtype_unknown":
        entry["dtype"] = "Q4_K"
    elif kind == "dtype_integer":
        entry["dtype"], entry["shape"] = "U8", [end - begin]
    elif kind == "shape_huge":
        entry["shape"] = [10**6, 10**6]
        entry["data_offsets"] = [begin, begin + 2 * 10**12]
    elif kind == "shape_negative":
        entry["shape"] = [-1, *entry["shape"][1:]]
    elif kind == "shape_not_list":
        entry["shape"] = "16x16"
    elif kind == "entry_not_table":
        header[names[n % len(names)]] = [1, 2]


HEADER_KINDS = ("offsets_past_end", "offsets_overlap", "offsets_reversed", "offsets_negative",
                "dtype_disagrees", "dtype_unknown", "dtype_integer", "shape_huge",
                "shape_negative", "shape_not_list", "entry_not_table")
FILE_KINDS = ("length_past_end", "length_huge", "truncated", "header_garbage",
              "header_not_table", "empty")


def _break_file(path: Path, kind: str, n: int) -> None:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header, data = json.loads(raw[8:8 + length]), raw[8 + length:]
    if kind in HEADER_KINDS:
        _mutate_header(header, kind, n)
        text = json.dumps(header).encode()
        path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    elif kind == "length_past_end":
        path.write_bytes(struct.pack("<Q", len(raw)) + raw[8:])
    elif kind == "length_huge":
        path.write_bytes(struct.pack("<Q", 2**64 - 1) + raw[8:])
    elif kind == "truncated":
        path.write_bytes(raw[:n % len(raw)])
    elif kind == "header_garbage":
        path.write_bytes(raw[:8] + bytes([0xFF, 0xFE]) * (length // 2) + raw[8 + length:])
    elif kind == "header_not_table":
        text = b"[1, 2, 3]".ljust(length)
        path.write_bytes(raw[:8] + text + data)
    elif kind == "empty":
        path.write_bytes(b"")


@CASES
@given(kind=st.sampled_from(HEADER_KINDS + FILE_KINDS), shard=st.integers(0, 1),
       n=st.integers(0, 10**6))
def test_safetensors_files(kind: str, shard: int, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = sparse_hf_dir(Path(tmp) / "m", TINY, shards=2, seed=0)
        _break_file(sorted(directory.glob("*.safetensors"))[shard], kind, n)
        _check(directory)


INDEX_KINDS = ("shard_listed_twice", "tensor_in_two_shards", "missing_shard", "wrong_shard",
               "outside", "not_json", "no_weight_map", "map_not_strings")


@CASES
@given(kind=st.sampled_from(INDEX_KINDS), n=st.integers(0, 1000))
def test_shard_index(kind: str, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = sparse_hf_dir(Path(tmp) / "m", TINY, shards=2, seed=0)
        path = directory / "model.safetensors.index.json"
        index = json.loads(path.read_text())
        weight_map = index["weight_map"]
        name = sorted(weight_map)[n % len(weight_map)]
        shards = sorted(set(weight_map.values()))
        if kind == "shard_listed_twice":  # the same file under a second name
            (directory / "copy.safetensors").write_bytes((directory / shards[0]).read_bytes())
            weight_map[name] = "copy.safetensors"
        elif kind == "tensor_in_two_shards":
            (directory / shards[1]).write_bytes((directory / shards[0]).read_bytes())
        elif kind == "missing_shard":
            (directory / shards[n % 2]).unlink()
        elif kind == "wrong_shard":
            weight_map[name] = shards[1] if weight_map[name] == shards[0] else shards[0]
        elif kind == "outside":
            weight_map[name] = "../" + weight_map[name]
        elif kind == "map_not_strings":
            weight_map[name] = 7
        path.write_text(json.dumps(index) if kind not in ("not_json", "no_weight_map")
                        else "{not json" if kind == "not_json" else "{}")
        _check(directory)


def test_memory_stayed_bounded(before_mb: float) -> None:
    """Runs after the cases above (file order): none of them grew the process's peak by more
    than PEAK_MB, though several describe tensors of terabytes."""
    assert _peak_mb() - before_mb < PEAK_MB
