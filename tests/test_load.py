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
