"""Library code makes its tensors on the model's device: every path a GPU user runs, run on the
CPU under `fake_device.on_fake_device`, which fails where CUDA would fail because a tensor was
made on the host (see that module). The first test is the bug a GPU found: answer_accuracy
built its prompts on the CPU and crashed `attnlab train` after training.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from attnlab import GPT, GPTConfig, Trace
from attnlab.generate import generate, generate_text
from attnlab.interp.edits import Edits, ablate, head_means, patch
from attnlab.interp.heads import detect_heads, head_summaries
from attnlab.interp.lens import lens_table, logit_attribution, logit_lens
from attnlab.interp.patching import activation_patching, attribution_patching, logit_diff_metric
from attnlab.tokenizers import get_tokenizer
from attnlab.train import loop
from attnlab.train.data import load_dataset
from attnlab.train.loop import TrainConfig, evaluate, train
from attnlab.train.recipes import answer_accuracy, recipe
from fake_device import FAKE, on_fake_device, place

TEXT = "the cat sat on the mat. abcdefghijklmnopqrstuvwxyz"  # the char tokenizer's text


def _model(**overrides: object) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(**{"vocab_size": 65, "block_size": 32, "n_layer": 2, "n_head": 2,
                          "n_embd": 16, **overrides})  # type: ignore[arg-type]
    return GPT(config).eval()


def test_the_check_fails_where_cuda_would_and_passes_what_cuda_takes() -> None:
    """The helper itself: a host index into a device embedding fails (the GPU's crash), while
    ids made with the model's device, host indices into a device tensor, CPU scalars and
    copies pass."""
    model = _model()
    with on_fake_device(model):
        assert model.wte.weight.device == FAKE
        with pytest.raises(RuntimeError, match="fake device: embedding got host"):
            model(torch.tensor([[1, 2, 3]]))
        ids = torch.tensor([[1, 2, 3]], device=model.wte.weight.device)  # (1, T)
        logits = model(ids).logits  # (1, T, V)
        assert place(logits) == "device"
        assert place(logits[:, torch.tensor([0, 2])]) == "device"  # a host index: allowed
        assert place(logits * torch.tensor(2.0)) == "device"  # a CPU scalar: allowed
        assert place(torch.zeros(3).to(ids.device)) == "device"  # a copy: allowed
        assert place(logits.cpu()) == "host"
        with pytest.raises(RuntimeError, match="fake device"):
            torch.cat([ids, torch.tensor([[4]])], dim=1)


def test_answer_accuracy_makes_its_prompts_on_the_model_device() -> None:
    # before the fix: "fake device: embedding got host tensor(s) of shape (8, 9)"
    dataset = load_dataset("copy")
    model_config, _ = recipe(dataset)
    torch.manual_seed(0)
    model = GPT(model_config).eval()
    expected = answer_accuracy(model, dataset, n=8)
    with on_fake_device(model):
        assert answer_accuracy(model, dataset, n=8) == expected
        assert answer_accuracy(model, dataset, n=8, edits=ablate([(0, 1)]))[1]


def test_generation_from_host_prompts() -> None:
    """generate() and generate_text() take prompts made on the host, padded or not."""
    model = _model()
    tok = get_tokenizer("char", TEXT)
    ids = torch.tensor([[5, 6, 7], [0, 8, 9]])  # (2, 3) made on the host
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    expected = generate(model, ids, mask, max_new_tokens=4, temperature=0)
    with on_fake_device(model):
        out = generate(model, ids, mask, max_new_tokens=4, temperature=0.8, seed=1,
                       top_k=5, top_p=0.9, eot_id=3)
        assert place(out) == "device" and out.shape[1] <= 7
        assert torch.equal(generate(model, ids, mask, max_new_tokens=4, temperature=0), expected)
        texts = generate_text(model, tok, ["ab", "c"], max_new_tokens=3, temperature=0)
        assert len(texts) == 2
        assert generate_text(model, tok, ["ab"], max_new_tokens=3, row_seeds=[4],
                             edits=ablate([(1, 0)]))


def test_interventions_from_host_ids() -> None:
    """Trace, Edits, patching (both kinds), the logit lens and attribution."""
    model = _model()
    tok = get_tokenizer("char", TEXT)
    clean = torch.tensor([[10, 11, 12, 13]])  # (1, 4) host ids, as a user writes them
    corrupt = torch.tensor([[10, 11, 14, 13]])
    metric = logit_diff_metric(20, 21)
    expected = activation_patching(model, clean, corrupt, metric).heads
    with on_fake_device(model):
        device = model.wte.weight.device
        trace = Trace().run(model, clean.to(device))
        edits = Edits([patch(trace, "resid_pre", 1, positions=[2])])
        assert place(model(corrupt.to(device), edits=edits).logits) == "device"
        torch.testing.assert_close(activation_patching(model, clean, corrupt, metric).heads,
                                   expected)
        assert attribution_patching(model, clean, corrupt, metric).heads.shape == (2, 2)
        assert logit_lens(model, clean).shape == (3, 1, 4, 65)
        assert lens_table(model, tok, [10, 11, 12], 2).probs.shape == (3, 3, 2)
        attribution = logit_attribution(model, clean, 20)
        torch.testing.assert_close(attribution.total(), attribution.logit)



def test_traces_and_head_scores_from_host_ids() -> None:
    """Trace.run, the head detectors, head summaries and head means take host ids and masks
    (detect_heads used to read host ids beside the device's weights)."""
    model = _model()
    ids = torch.tensor([[0, 10, 11, 12, 10, 11], [13, 14, 15, 13, 14, 15]])  # (2, 6) host
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1] * 6])
    expected = detect_heads(model, ids, mask)
    with on_fake_device(model):
        trace = Trace(names="attn_weights").run(model, ids, mask)
        assert place(trace.get("attn_weights", 0)) == "device"
        for kind, scores in detect_heads(model, ids, mask).items():
            torch.testing.assert_close(scores.cpu(), expected[kind])
        assert head_summaries(model, ids, mask)["attn_entropy"].shape == (2, 2)
        assert len(head_means(model, ids, mask)) == 2


def test_viewer_payloads_and_show(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from attnlab.viewer.notebook import show
    from attnlab.viewer.payloads import (
        attention_payload,
        heads_payload,
        lens_payload,
        token_stream,
    )

    model = _model()
    tok = get_tokenizer("char", TEXT)
    ids = tok.encode("the cat sat")
    with on_fake_device(model):
        assert len(attention_payload(model, ids, tok)["layers"]) == 2
        assert heads_payload(model, tok, ids, [(0, 1)])["prediction"]["ablated"]
        assert lens_payload(model, tok, ids)["top"]
        assert len(list(token_stream(model, ids, max_new_tokens=3, temperature=0, top_k=None,
                                     top_p=None, seed=None, eot_ids=(), vocab_size=65))) == 3
        trace = Trace().run(model, torch.tensor([ids], device=model.wte.weight.device))
        assert "the" in show(trace, tok, ids=ids).save(tmp_path / "view.html").read_text()


def test_training_on_the_device_evaluates_and_scores_there(tmp_path: Path) -> None:
    """train() with device "cpu:0" (the fake device's name): batches, evaluation and the
    task score all meet the model on it."""
    dataset = load_dataset("copy")
    model_config, config = recipe(dataset)
    config = TrainConfig(**{**config.__dict__, "max_iters": 4, "eval_interval": 2,
                            "eval_iters": 1, "device": str(FAKE)})
    with on_fake_device():
        result = train(model_config, config, dataset, tmp_path, callback=None)
        assert place(result.model.wte.weight) == "device"
        assert set(evaluate(result.model, dataset, config, dataset.max_block_size)) == {
            "train_loss", "val_loss"}
        assert 0 <= answer_accuracy(result.model, dataset, n=4)[0] <= 1


def test_training_waits_for_the_device_only_to_read_its_losses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU every read of a device value back to the host waits for all the queued work,
    so a training step must make none: losses are read every READ_EVERY steps (read_losses)
    and an evaluation reads one sum per split (_split_loss). GPT.forward's id check used to
    read four values every step; training now checks its batches on the host."""
    dataset = load_dataset("copy")
    model_config, config = recipe(dataset)
    config = TrainConfig(**{**config.__dict__, "max_iters": 45, "eval_interval": 40,
                            "eval_iters": 1, "device": str(FAKE), "patience": None})
    # the fake device is a CPU, where losses are read every step: read as on a GPU
    monkeypatch.setattr(loop, "read_interval", lambda device, config: loop.READ_EVERY)
    with on_fake_device() as fake:
        train(model_config, config, dataset, tmp_path, callback=None)
    reads = Counter(fake.reads)  # by the attnlab function that made them
    # losses read (world.mean_all) after the first step, 20 later, before the evaluation at
    # 40 and at the end; one sum per split at each of the two evaluations
    assert (reads.pop("mean_all"), reads.pop("_split_loss")) == (4, 4)
    assert set(reads) == {"_host_copy"}  # the two checkpoints' copies to the host
