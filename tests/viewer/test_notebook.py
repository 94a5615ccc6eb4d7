"""attnlab.show(): the HTML fragment's payload decodes back to the trace, masks stay masks,
the fragment is self-contained, and `attnlab inspect --format html` writes it as a file.

The page itself (hover, network blocked, two views) is test_notebook_browser.py's;
show(..., summary=True) is test_notebook_summary.py's.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attnlab import GPT, GPTConfig, Trace, show
from attnlab.checkpoint import save_checkpoint
from attnlab.cli import main
from attnlab.tokenizers import CharTokenizer
from attnlab.viewer.notebook import THUMB, View

TOK = CharTokenizer(sorted(set("abcdefghijklmnopqrstuvwxyz .")))


def model(**overrides: Any) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig.from_name("nano", vocab_size=TOK.vocab_size, block_size=64)
    return GPT(GPTConfig(**{**config.__dict__, **overrides})).eval()


def payload(view: View) -> dict[str, Any]:
    """The JSON the fragment hands to mount()."""
    found = re.search(r"\]\(root, (\{.*\})\);\n\}\)\(\);\n</script>", view.html, re.S)
    assert found, "no mount call in the fragment"
    return json.loads(found.group(1))


def unz(b64: str, dtype: Any = np.uint8) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(b64)), dtype=dtype)


def decoded(data: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(weights (full layers, nh, T, S) with NaN where masked, masks (layers, T, S)): what
    view.js reads from the payload, decoded the same way."""
    T, S, nh = data["T"], data["S"], len(data["heads"])
    codes, tops = unz(data["weights"]), unz(data["rowmax"], np.float32)
    masks = [np.unpackbits(unz(m))[: T * S].reshape(T, S).astype(bool) for m in data["masks"]]
    tri = np.tril(np.ones((T, S), dtype=bool), k=S - T)  # (T, S) keys 0..off+i
    out = np.full((len(data["full"]), nh, T, S), np.nan)
    cells = int(tri.sum()) if data["tri"] else T * S
    for f in range(len(data["full"])):
        for h in range(nh):
            block = codes[(f * nh + h) * cells:(f * nh + h + 1) * cells]
            grid = np.full((T, S), 255, dtype=np.uint8)
            if data["tri"]:
                grid[tri] = block
            else:
                grid[:] = block.reshape(T, S)
            top = tops[(f * nh + h) * T:(f * nh + h + 1) * T]  # (T,)
            out[f, h] = np.where(grid == 255, np.nan, grid / 254 * top[:, None])
    return out, np.stack([masks[k] for k in data["layerMask"]])


def check_weights(data: dict[str, Any], weights: torch.Tensor, may: torch.Tensor) -> None:
    """weights (layers, nh, T, S) of the traced row; may (T, S) or (layers, T, S)."""
    got, masks = decoded(data)
    may = may.expand(masks.shape).numpy()
    assert (masks == may).all()
    want = weights[data["full"]].double().numpy()  # (full, nh, T, S)
    full_may = may[data["full"]][:, None]  # (full, 1, T, S)
    assert np.isnan(got[~np.broadcast_to(full_may, got.shape)]).all()  # masked: never a number
    top = np.where(full_may, want, 0).max(-1, keepdims=True)  # (full, nh, T, 1)
    err = np.abs(np.where(np.isnan(got), 0, got) - np.where(full_may, want, 0))
    assert (err <= top / 508 + 1e-7).all(), err.max()


def test_payload_decodes_to_the_traced_weights() -> None:
    m = model()
    ids = TOK.encode("the cat sat on the mat.")
    trace = Trace()
    m(torch.tensor([ids]), trace=trace)
    view = show(trace, TOK, ids=ids)
    data = payload(view)
    weights = torch.stack([trace.get("attn_weights", la)[0] for la in range(2)])
    T = len(ids)
    check_weights(data, weights, torch.ones(T, T, dtype=torch.bool).tril())
    assert data["tokens"] == [TOK.decode([i]) for i in ids]
    assert data["tri"] and data["full"] == [0, 1] and data["steps"]["head"] == 0
    scores = unz(data["steps"]["scores"], np.float32).reshape(T, T)
    np.testing.assert_allclose(scores, trace.get("attn_scores", 0)[0, 0].numpy())
    assert data["thumb"]["T"] == min(T, THUMB)


def test_left_padding_and_a_kv_cache_step_keep_their_masks() -> None:
    m = model()
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6]])
    attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    trace = Trace()
    m(ids, attention_mask=attention_mask, trace=trace)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    weights = torch.stack([trace.get("attn_weights", la)[0] for la in range(2)])
    check_weights(payload(show(trace, ids=ids[0].tolist())), weights,
                  causal & attention_mask[0].bool())
    # a trace without masked_scores: the padding comes from attention_mask=
    light = Trace(names=["attn_weights"])
    m(ids, attention_mask=attention_mask, trace=light)
    data = payload(show(light, row=0, attention_mask=attention_mask))
    check_weights(data, weights, causal & attention_mask[0].bool())
    assert data["tokens"] == ["<pad>", "<pad>", "#2", "#3", "#4", "#5"] and data["steps"] is None
    # one decode step after a 5-token prefill: T = 1 query over S = 6 keys
    cache = m.new_cache(1)
    m(ids[1:, :5], kv_cache=cache)
    step = Trace()
    m(ids[1:, 5:], kv_cache=cache, trace=step)
    data = payload(show(step, ids=ids[1].tolist()))
    assert (data["T"], data["S"]) == (1, 6) and data["tokens"] == ["1", "2", "3", "4", "5", "6"]
    check_weights(data, torch.stack([step.get("attn_weights", la)[0] for la in range(2)]),
                  torch.ones(1, 6, dtype=torch.bool))


@pytest.mark.parametrize("steps", [True, False])
def test_a_sliding_window_is_masked_in_a_model_view(steps: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    if not steps:  # no raw scores wanted: the masks must still be computed and kept
        monkeypatch.setattr(sys.modules["attnlab.viewer.notebook"], "STEPS_CELLS", 0)
    torch.manual_seed(0)
    windowed = GPT(GPTConfig.from_name("nano", vocab_size=TOK.vocab_size, block_size=64,
                                       sliding_window=3, window_layers=[1])).eval()
    ids = TOK.encode("a window")
    data = payload(show(windowed, TOK, ids=ids))
    assert (data["steps"] is not None) == steps
    trace = Trace()
    windowed(torch.tensor([ids]), trace=trace)
    T = len(ids)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    window = causal & ~torch.ones(T, T, dtype=torch.bool).tril(-3)  # keys i-2..i
    check_weights(data, torch.stack([trace.get("attn_weights", la)[0] for la in range(2)]),
                  torch.stack([causal, window]))


def test_a_sliding_window_is_masked_in_a_trace_without_masked_scores() -> None:
    """show(trace) of a windowed model drew the keys outside the window as weight 0 (an
    allowed key) unless the trace kept masked_scores: it now reads the trace's windows."""
    torch.manual_seed(0)
    windowed = GPT(GPTConfig.from_name("nano", vocab_size=TOK.vocab_size, block_size=64,
                                       sliding_window=3, window_layers=[1])).eval()
    ids = torch.tensor([[0, 0, *TOK.encode("a window")]])  # (1, 10): two left pads
    attention_mask = torch.tensor([[0, 0] + [1] * 8])  # (1, 10)
    T = ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril() & attention_mask[0].bool()  # (T, T)
    window = causal & ~torch.ones(T, T, dtype=torch.bool).tril(-3)  # keys i-2..i
    light = Trace(names=["attn_weights"]).run(windowed, ids, attention_mask)
    data = payload(show(light, attention_mask=attention_mask))
    check_weights(data, torch.stack([light.get("attn_weights", la)[0] for la in range(2)]),
                  torch.stack([causal, window]))
    assert light.windows == {0: None, 1: 3}
    full = Trace().run(windowed, ids, attention_mask)  # masks from masked_scores: the same
    assert decoded(payload(show(full)))[1].tolist() == decoded(data)[1].tolist()
    # a decode step: one query over the cached keys, the window counted from its slot
    cache = windowed.new_cache(1)
    windowed(ids[:, :-1], attention_mask=attention_mask[:, :-1], kv_cache=cache)
    step = Trace(names=["attn_weights"])
    windowed(ids[:, -1:], attention_mask=attention_mask, kv_cache=cache, trace=step)
    masks = decoded(payload(show(step, attention_mask=attention_mask)))[1]  # (layers, 1, T)
    assert masks[:, 0].tolist() == [causal[-1].tolist(), window[-1].tolist()]


def test_budget_keeps_the_layer_on_show_and_every_layer_in_the_overview() -> None:
    m = model()
    ids = TOK.encode("budgets")
    data = payload(show(m, TOK, ids=ids, layer=1, head="all", max_cells=10))
    assert data["full"] == [1] and data["layer"] == 1 and data["head"] == "all"
    thumbs = unz(data["thumb"]["codes"]).reshape(2, 2, 7, 7)  # (layers, nh, t, s)
    assert (thumbs[:, :, 0, 1:] == 255).all() and (thumbs[:, :, :, 0] < 255).all()
    assert payload(show(m, TOK, ids=ids, layer=1, layers=[0]))["full"] == [0, 1]


def test_fragment_is_self_contained_and_views_do_not_clash() -> None:
    m = model()
    a, b = show(m, TOK, "one view"), show(m, TOK, "one view")
    for view in (a, b):
        html = view._repr_html_()
        assert not re.search(r"\b(src|href)\s*=|https?://|require\(|import\s*\(|<link", html)
        assert not re.search(r"^(export|import) ", html, re.M)  # inlined as a classic script
        assert html.count("<script>") == 1 and "window.attnlabView" in html
    ids = {re.search(r'id="(attnlab-view-\w+)"', v.html).group(1) for v in (a, b)}  # type: ignore[union-attr]
    assert len(ids) == 2
    assert a.page().startswith("<!doctype html>") and a.html in a.page()


def test_ids_may_be_the_batch_the_model_ran_on() -> None:
    """show(trace, tok, ids=ids) with the (B, T) ids fed to the model labels row `row`'s."""
    m = model()
    batch = torch.tensor([TOK.encode("the cat"), TOK.encode("a dog..")])  # (2, 7)
    trace = Trace()
    m(batch, trace=trace)
    for row in (0, 1):
        data = payload(show(trace, TOK, ids=batch, row=row))
        assert data["tokens"] == list(TOK.decode(batch[row].tolist()))
        assert data == payload(show(trace, TOK, ids=batch[row], row=row))
    one = payload(show(m, TOK, ids=batch, row=1))  # the model runs on that row alone
    assert one["tokens"] == list("a dog..") and one == payload(show(m, TOK, ids=batch[1]))
    with pytest.raises(ValueError, match="row=2 out of range for ids of 2 rows"):
        show(trace, TOK, ids=batch, row=2)
    with pytest.raises(ValueError, match=r"ids of shape \(1, 2, 7\): pass one sequence"):
        show(trace, TOK, ids=batch[None])


def test_labels_and_bad_arguments() -> None:
    m = model()
    trace = Trace()
    m(torch.tensor([[3, 4, 5]]), trace=trace)
    assert payload(show(trace, ids=[3, 4, 5]))["tokens"] == ["3", "4", "5"]
    assert payload(show(trace, tokens=["x", "y", "z"], query=-1))["query"] == 2
    some_heads = Trace(heads=[1])
    m(torch.tensor([[3, 4, 5]]), trace=some_heads)
    data = payload(show(some_heads))
    assert data["heads"] == [1] and data["head"] == 0 and data["steps"]["head"] == 1
    with pytest.raises(ValueError, match="3 key positions"):
        show(trace, ids=[1, 2])
    with pytest.raises(ValueError, match="view='heads'"):
        show(trace, view="heads")
    with pytest.raises(ValueError, match="head=7"):
        show(trace, head=7)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        show(m, text="abc")
    with pytest.raises(ValueError, match="was given empty text; pass some text"):
        show(m, CharTokenizer(list("abc")), text="")
    bigger = CharTokenizer([chr(40 + i) for i in range(TOK.vocab_size + 1)])
    with pytest.raises(ValueError, match=f"has {TOK.vocab_size + 1} ids but the model's "
                                         f"vocab_size is {TOK.vocab_size}"):
        show(m, bigger, text="abc")
    with pytest.raises(ValueError, match="no attn_weights"):
        show(Trace(names=["q"]))
    no_weights = Trace(names=["resid_pre"])
    m(torch.tensor([[3, 4, 5]]), trace=no_weights)
    with pytest.raises(ValueError, match="no attn_weights"):  # not "3 token labels for 0"
        show(no_weights, ids=[3, 4, 5])
    with pytest.raises(TypeError, match="Trace or a GPT"):
        show("text")
    one_row = Trace(rows=-1).run(m, torch.tensor([[3, 4, 5]]))
    with pytest.raises(ValueError, match=r"kept query rows \[-1\] alone"):
        show(one_row, ids=[3, 4, 5])


def test_text_in_the_tokenizer_slot_or_a_batch_of_texts_is_named() -> None:
    m = model()
    # the README's show(model, tokenizer, text) with the tokenizer left out: it was
    # AttributeError "'str' object has no attribute 'vocab_size'"
    with pytest.raises(ValueError, match=r"second argument is the tokenizer.*'abc'"):
        show(m, "abc")
    # a list of texts: it was "char tokenizer cannot encode character 'ab'"
    with pytest.raises(ValueError, match="text must be one str \\(got list\\)"):
        show(m, TOK, ["ab", "cd"])


def test_inspect_format_html_writes_one_page(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = save_checkpoint(tmp_path / "ckpt", model(), TOK)
    out = tmp_path / "out"
    assert main(["inspect", str(ckpt), "the cat sat", "--out", str(out), "--format", "html",
                 "--layer", "1", "--head", "1"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["attention.html", "attention.json"]
    page = (out / "attention.html").read_text()
    assert page.startswith("<!doctype html>") and "attention.html" in capsys.readouterr().out
    data = json.loads(re.search(r"\]\(root, (\{.*\})\);\n\}\)\(\);", page, re.S).group(1))  # type: ignore[union-attr]
    assert data["layers"] == [1] and data["heads"] == [1] and data["steps"]["layer"] == 1
    # no token pinned unless --query asks: a pinned one held the page still under the pointer
    assert data["query"] is None
    assert main(["inspect", str(ckpt), "the cat sat", "--out", str(out), "--format", "html",
                 "--query", "-2"]) == 0
    page = (out / "attention.html").read_text()
    data = json.loads(re.search(r"\]\(root, (\{.*\})\);\n\}\)\(\);", page, re.S).group(1))  # type: ignore[union-attr]
    assert data["query"] == 9
    assert main(["inspect", str(ckpt), "the cat", "--out", str(out), "--format", "jpg"]) == 1
    assert "--format jpg: choose from png, svg, pdf, html" in capsys.readouterr().err


def test_a_model_shown_a_padded_row_runs_it_with_its_padding() -> None:
    """show(model, ids=batch, row=1, attention_mask=mask) ran the row's pads as tokens: the
    pads were keys with weights and the real tokens' weights were not the batch's."""
    m = model()
    batch, mask = TOK.encode_batch(["the cat sat", "a dog"])  # row 1: 6 pads, 5 tokens
    data = payload(show(m, TOK, ids=batch, row=1, attention_mask=mask))
    trace = Trace(names=["attn_weights"]).run(m, batch, mask)
    weights = torch.stack([trace.get("attn_weights", la)[1] for la in range(2)])
    T = batch.shape[1]
    check_weights(data, weights, torch.ones(T, T, dtype=torch.bool).tril() & mask[1].bool())
    alone = Trace(names=["attn_weights"]).run(m, batch[1:, 6:])  # the row without its pads
    torch.testing.assert_close(weights[:, :, 6:, 6:], torch.stack(
        [alone.get("attn_weights", la)[0] for la in range(2)]))  # (layers, nh, 5, 5)
    with pytest.raises(ValueError, match=r"attention_mask of shape \(2, 5\) for 11 ids"):
        show(m, TOK, ids=batch, row=1, attention_mask=mask[:, 6:])


def test_pad_positions_are_labelled_as_padding() -> None:
    """A left-padded row's pads were labelled with the pad id's text (a token the row seemed
    to hold, often <|endoftext|>): they are PAD_LABEL, wherever the view learns the padding,
    and a trace's own padding masks them as the model did."""
    m = model()
    batch, mask = TOK.encode_batch(["the cat sat", "a dog"])  # row 1: 6 pads, 5 tokens
    want = ["<pad>"] * 6 + list("a dog")
    assert payload(show(m, TOK, ids=batch, row=1, attention_mask=mask))["tokens"] == want
    full = Trace().run(m, batch, mask)  # masked_scores and the trace's padding
    light = Trace(names=["attn_weights"]).run(m, batch, mask)  # the trace's padding alone
    T = batch.shape[1]
    may = torch.ones(T, T, dtype=torch.bool).tril() & mask[1].bool()  # (T, T)
    for trace in (full, light):
        for kwargs in ({}, {"attention_mask": mask}):
            data = payload(show(trace, TOK, ids=batch, row=1, **kwargs))
            assert data["tokens"] == want
            check_weights(data, torch.stack([light.get("attn_weights", la)[1]
                                             for la in range(2)]), may)
    assert payload(show(light, ids=batch, row=1))["tokens"] == ["<pad>"] * 6 + [
        str(i) for i in batch[1, 6:].tolist()]
    assert payload(show(light, row=0))["tokens"] == [f"#{j}" for j in range(T)]  # no pads
    # tokens= are the caller's own labels, kept as given
    assert payload(show(light, tokens=list("x" * T), row=1))["tokens"] == list("x" * T)


def test_a_title_given_heads_the_view_escaped_and_one_token_is_one_token() -> None:
    tok = CharTokenizer(sorted(set("abc <>&'\"")))
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tok.vocab_size)).eval()
    view = show(model, tok, "abc", title="<b>copy</b> & 'layer 0'")
    assert "<h3" in view.html and "&lt;b&gt;copy&lt;/b&gt; &amp; &#x27;layer 0&#x27;" in view.html
    assert "<b>copy</b>" not in view.html
    assert "<h3" not in show(model, tok, "abc").html  # no title given: no heading
    one = show(model, tok, "a")
    assert one.title == "attnlab · attention of 1 token" and "1 tokens" not in one.html
