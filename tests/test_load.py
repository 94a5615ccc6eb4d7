"""`load_checkpoint` opens both kinds of directory, and directories written before the
package move (tests/data/v0.2_*: an attnlab checkpoint and a Llama-family Hugging Face export,
written by attnlab 0.2 with the logits it computed) load and compute the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab import load_checkpoint

DATA = Path(__file__).parent / "data"
EXPECTED = json.loads((DATA / "v0.2_logits.json").read_text())


@pytest.mark.parametrize(("directory", "key", "source"), [
    ("v0.2_checkpoint", "checkpoint", None),
    ("v0.2_hf_llama", "hf_llama", "huggingface"),
])
def test_a_directory_written_before_the_move_loads_with_the_same_logits(
    directory: str, key: str, source: str | None
) -> None:
    ckpt = load_checkpoint(DATA / directory)
    assert ckpt.meta.get("source") == source
    ids = torch.tensor([ckpt.tokenizer.encode(EXPECTED["text"])])
    with torch.no_grad():
        logits = ckpt.model(ids).logits[0, -1]
    torch.testing.assert_close(logits, torch.tensor(EXPECTED[key]), rtol=0, atol=1e-6)


def test_the_hugging_face_export_names_its_family() -> None:
    assert load_checkpoint(DATA / "v0.2_hf_llama").meta["family"] == "llama"


def test_a_directory_of_neither_kind_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("directory", ["v0.2_checkpoint", "v0.2_hf_llama"])
def test_a_load_reports_each_tensor_it_reads(directory: str) -> None:
    """`attnlab` commands draw a bar from these calls: a 16 GB model took tens of seconds to
    load with nothing on the screen."""
    heard: list[tuple[int, int]] = []
    ckpt = load_checkpoint(DATA / directory, progress=lambda *n: heard.append(n))
    config = ckpt.model.config
    total = len(ckpt.model.state_dict()) - (1 if config.tie_weights else 0)  # a tied head
    assert heard == [(i, total) for i in range(1, total + 1)]  # is the token table, read once


@pytest.mark.parametrize("directory", ["v0.2_checkpoint", "v0.2_hf_llama"])
def test_a_dtype_may_be_named_as_transformers_names_it(directory: str) -> None:
    """dtype="bfloat16" loads what dtype=torch.bfloat16 loads; a dtype no model holds is
    refused naming the choices, before anything is allocated (was an AttributeError on
    'str'.itemsize, or a screen of load_state_dict errors for torch.int8)."""
    by_object = load_checkpoint(DATA / directory, dtype=torch.bfloat16).model
    for name in ("bfloat16", "torch.bfloat16"):
        by_name = load_checkpoint(DATA / directory, dtype=name).model
        assert by_name.wte.weight.dtype == torch.bfloat16
        for (key, a), (_, b) in zip(by_object.state_dict().items(),
                                    by_name.state_dict().items(), strict=True):
            assert torch.equal(a, b), key
    for bad in ("int8", torch.int8, "bf16"):
        with pytest.raises(ValueError, match=r"dtype=.*: a model loads in one of float64, "
                                             r"float32, float16, bfloat16"):
            load_checkpoint(DATA / directory, dtype=bad)
