"""show(..., summary=True): the heads overview as one self-contained fragment that carries the
page's own overview.js and the data /api/heads sends for it (`payloads.overview_payload`),
with the summaries of the row asked about. What the browser draws from it is
test_notebook_browser.py's.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from test_notebook import payload

from attnlab import GPT, GPTConfig, Trace, View, show
from attnlab.interp.heads import SUMMARY_MEANS, head_summaries, summary_means
from attnlab.tokenizers import CharTokenizer
from attnlab.viewer.payloads import heads_payload

TOK = CharTokenizer(sorted(set("abcdefghijklmnopqrstuvwxyz .")))
OVERVIEW_KEYS = {"summaries", "summary_labels", "summary_shares", "summary_layers",
                 "summary_heads", "summary_extremes", "summary_note"}


def model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("nano", n_head=4, vocab_size=TOK.vocab_size)).eval()


def test_the_overview_is_the_pages_script_and_the_pages_data() -> None:
    """One fragment with overview.js inlined (no cell written in Python, nothing fetched) and
    the same data, from the same function, as the page's heads panel gets in /api/heads."""
    m, text = model(), "the cat sat on the mat"
    view = show(m, TOK, text, summary=True)
    assert isinstance(view, View) and "heads overview of 22 tokens</h3>" in view.html
    assert not re.search(r"\b(src|href)\s*=|https?://|require\(|import\s*\(|<link", view.html)
    assert not re.search(r"^(export|import) ", view.html, re.M)  # inlined as a classic script
    assert view.html.count("<script>") == 1 and "window.attnlabView" in view.html
    assert "class Overview" in view.html and "return mountOverview;" in view.html
    assert "<td" not in view.html  # the cells are the script's
    data = payload(view)
    page = heads_payload(m, TOK, TOK.encode(text), [])
    assert set(data) == OVERVIEW_KEYS and set(page) >= OVERVIEW_KEYS
    assert {key: page[key] for key in OVERVIEW_KEYS} == data
    means = head_summaries(m, torch.tensor([TOK.encode(text)]))
    for name, values in data["summaries"].items():
        torch.testing.assert_close(torch.tensor(values, dtype=torch.float32), means[name],
                                   atol=1e-4, rtol=0)
    assert data["summary_labels"] == {k: v for k, v in SUMMARY_MEANS.items()
                                      if k != "attn_learned_sink"}  # no sinks here
    assert data["summary_shares"] == ["attn_sink", "attn_max"]
    assert data["summary_layers"] == [0, 1] and data["summary_heads"] == [0, 1, 2, 3]
    sink = data["summary_extremes"][0]
    assert sink["what"] == "most weight on the first token" and len(sink["heads"]) == 3
    layer, head, value = sink["heads"][0]
    assert value == pytest.approx(float(means["attn_sink"].max()), abs=1e-4)
    assert value == pytest.approx(float(means["attn_sink"][layer, head]), abs=1e-4)
    assert data["summary_note"] == ("means over the 22 query rows, computed in tiles without "
                                    "the T × T weights")


def test_a_padded_row_one_token_and_a_trace_without_summaries() -> None:
    """A left-padded row's pads are left out of the means and the note says so; a row of
    pads alone has no mean (null, drawn as none: NaN is not JSON); one token is one token;
    a trace without summaries is refused by name."""
    m = model()
    ids = torch.tensor([[0, 0, *TOK.encode("a cat")], TOK.encode("the mat")])  # (2, 7)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
    trace = Trace(names=list(SUMMARY_MEANS)).run(m, ids, mask)
    padded = payload(show(trace, summary=True, row=0))
    assert padded["summary_note"].startswith("means over the 5 query rows (pads left out), ")
    entropy = summary_means(trace, [0, 1], row=0)["attn_entropy"]
    torch.testing.assert_close(torch.tensor(padded["summaries"]["attn_entropy"]), entropy,
                               atol=1e-4, rtol=0)
    pads = Trace(names=list(SUMMARY_MEANS)).run(m, ids, torch.tensor([[0] * 7, [1] * 7]))
    empty = payload(show(pads, summary=True, row=0))
    assert {v for grid in empty["summaries"].values() for row in grid for v in row} == {None}
    assert all(row["heads"] == [] for row in empty["summary_extremes"])
    one = show(m, TOK, "a", summary=True)
    assert one.title == "attnlab · heads overview of 1 token"
    assert payload(one)["summary_note"].startswith("means over the 1 query row, ")
    with pytest.raises(ValueError, match="holds no summaries"):
        show(Trace(names="attn_weights").run(m, ids), summary=True)


def test_show_summary_takes_rows_and_masks_as_the_head_view_does() -> None:
    """The overview reads `row` and `attention_mask` as the head view does: a negative row
    counts from the end, a row's own (S,) mask serves, and a mask of another shape, a row
    out of range or empty text get errors that say so. A trace holding some of the
    summaries shows those."""
    m = model()
    ids = torch.tensor([TOK.encode("the mat"), [0, 0, *TOK.encode("a cat")]])  # (2, 7)
    mask = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])

    def means(view: View) -> dict[str, Any]:
        return payload(view)["summaries"]

    last = show(m, TOK, ids=ids, row=1, attention_mask=mask, summary=True)
    assert payload(last)["summary_note"].startswith("means over the 5 query rows (pads left")
    for again in (show(m, TOK, ids=ids, row=-1, attention_mask=mask, summary=True),
                  show(m, TOK, ids=ids, row=1, attention_mask=mask[1], summary=True)):
        assert means(again) == means(last)
    assert len(means(last)["attn_entropy"]) == 2
    trace = Trace(names=list(SUMMARY_MEANS)).run(m, ids, mask)
    assert means(show(trace, row=-1, summary=True)) == means(last)
    assert means(show(trace, row=1, attention_mask=mask[1], summary=True)) == means(last)
    with pytest.raises(ValueError, match=r"attention_mask of shape \(2, 5\) for a trace of 2 "):
        show(trace, attention_mask=mask[:, :5], summary=True)
    with pytest.raises(ValueError, match=r"row=2 out of range for a batch of 2 rows \(0 to 1"):
        show(trace, row=2, summary=True)
    with pytest.raises(ValueError, match="attention_mask of shape"):
        show(m, TOK, ids=ids, row=1, attention_mask=mask[:, :5], summary=True)
    with pytest.raises(ValueError, match="was given empty text"):
        show(m, TOK, "", summary=True)
    some = Trace(names=["attn_sink", "attn_max"]).run(m, ids, mask)
    assert set(means(show(some, row=1, summary=True))) == {"attn_sink", "attn_max"}


def test_a_trace_of_some_layers_and_heads_names_them() -> None:
    """The grids and the extreme heads name the model's layers and heads, not their places
    in the trace (`inspect --summary --layer 1 --head 2,3`)."""
    m = model()
    ids = torch.tensor([TOK.encode("the cat sat")])
    trace = Trace(layers=[1], heads=[2, 3], names=list(SUMMARY_MEANS)).run(m, ids)
    data = payload(show(trace, summary=True))
    assert data["summary_layers"] == [1] and data["summary_heads"] == [2, 3]
    assert len(data["summaries"]["attn_entropy"][0]) == 2
    named = {(layer, head) for row in data["summary_extremes"] for layer, head, _ in row["heads"]}
    assert named == {(1, 2), (1, 3)}
