"""attnlab.show()'s HTML in headless Chromium with the network cut: an `inspect --format
html` file shows the weights its attention.json holds, and two views on one page work
independently (hover, pin, tabs, the model view's click-to-open).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import GPT, GPTConfig, Trace, show
from attnlab.checkpoint import save_checkpoint
from attnlab.cli import main
from attnlab.tokenizers import CharTokenizer
from offline_page import chromium, needs_chromium, offline, weights_shown

pytestmark = [pytest.mark.browser, needs_chromium]
TOK = CharTokenizer(sorted(set("abcdefghijklmnopqrstuvwxyz .")))


@pytest.fixture(scope="module")
def browser() -> Any:
    with chromium() as b:
        yield b


def model(seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig.from_name("nano", vocab_size=TOK.vocab_size, block_size=64)).eval()


def close(got: list[Any], want: list[float]) -> bool:
    top = max(want)
    pairs = zip(got, want, strict=True)
    return all(g is not None and abs(g - w) <= top / 508 + 1e-5 for g, w in pairs)


def test_inspect_html_file_works_offline(browser: Any, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = save_checkpoint(tmp_path / "ckpt", model(0), TOK)
    text = "the cat sat on the mat."
    assert main(["inspect", str(ckpt), text, "--out", str(tmp_path), "--format", "html"]) == 0
    capsys.readouterr()
    record = json.loads((tmp_path / "attention.json").read_text())
    weights = {(a["layer"], a["head"]): a["weights"] for a in record["attention"]}
    with offline(browser, tmp_path / "attention.html") as seen:
        page, view = seen.page, ".attnlab-view"
        # nothing pinned without --query: hovering picks at once (the last token was pinned
        # by default, so the page stayed still under the pointer until it was clicked)
        assert weights_shown(page, view)["query"] == []
        for layer, head, q in [(0, 0, 9), (1, 1, 22), (1, 0, 0)]:
            page.select_option(f"{view} .alv-layer", str(layer))
            page.select_option(f"{view} .alv-head", str(head))
            page.hover(f"{view} .alv-tok[data-i='{q}']")
            page.wait_for_selector(f"{view} .alv-tok.alv-query[data-i='{q}']")
            shown = weights_shown(page, view)
            row = weights[(layer, head)][q]
            assert close(shown["weights"][: q + 1], row[: q + 1])
            assert shown["masked"] == list(range(q + 1, len(text)))  # masked, never "0"
            assert shown["weights"][q + 1:] == [None] * (len(text) - q - 1)
        page.mouse.move(1, 1)  # the keyboard: focus shows a token, Enter pins it
        page.focus(f"{view} .alv-tok[data-i='5']")
        page.wait_for_selector(f"{view} .alv-tok.alv-query[data-i='5']")
        page.keyboard.press("Enter")
        page.wait_for_selector(f"{view} .alv-tok.alv-pinned[data-i='5']")
        page.click(f"{view} .alv-tab[data-view='steps']")
        assert page.locator(f"{view} .alv-steps canvas").count() == 3
        assert not page.locator(f"{view} .alv-check").is_visible()  # rows to max: no effect
        assert seen.requests == [] and seen.problems == []


def test_two_views_on_one_page_are_independent(browser: Any, tmp_path: Path) -> None:
    texts = ["the dog ran", "a cat sat on a mat"]
    traces, views = [], []
    for seed, text in enumerate(texts):
        trace = Trace()
        ids = TOK.encode(text)
        model(seed)(torch.tensor([ids]), trace=trace)
        traces.append(trace)
        views.append(show(trace, TOK, ids=ids, head=1))
    page_path = tmp_path / "two.html"
    page_path.write_text("<!doctype html><meta charset='utf-8'><body>"
                         + views[0].html + views[1].html + "</body>")
    with offline(browser, page_path) as seen:
        page = seen.page
        a, b = (f"#{page.locator('.attnlab-view').nth(k).get_attribute('id')}" for k in (0, 1))
        page.hover(f"{a} .alv-tok[data-i='5']")
        page.wait_for_selector(f"{a} .alv-tok.alv-query[data-i='5']")
        assert close(weights_shown(page, a)["weights"][:6],
                     traces[0].get("attn_weights", 0)[0, 1, 5, :6].tolist())
        assert weights_shown(page, b)["query"] == []
        page.click(f"{b} .alv-tok[data-i='8']")  # pin in b; a's hover ends when the mouse leaves
        shown_b = weights_shown(page, b)
        assert shown_b["query"] == [8] and weights_shown(page, a)["query"] == []
        assert close(shown_b["weights"][:9], traces[1].get("attn_weights", 0)[0, 1, 8, :9].tolist())
        # a's model view opens layer 1, head 0 on click; b stays in its head view
        page.click(f"{a} .alv-tab[data-view='model']")
        assert page.locator(f"{a} .alv-mini").count() == 4
        page.click(f"{a} .alv-mini[data-layer='1'][data-head='0']")
        assert page.input_value(f"{a} .alv-layer") == "1"
        assert page.input_value(f"{a} .alv-head") == "0"
        # and on Enter or Space: each thumbnail is a button with a tab stop (it took clicks)
        for key, head in (("Enter", 1), (" ", 0)):
            page.click(f"{a} .alv-tab[data-view='model']")
            mini = f"{a} .alv-mini[data-layer='0'][data-head='{head}']"
            assert page.get_attribute(mini, "role") == "button"
            page.focus(mini)
            page.keyboard.press(key)
            assert page.get_attribute(f"{a} .alv-app", "data-view") == "head"
            assert page.input_value(f"{a} .alv-layer") == "0"
            assert page.input_value(f"{a} .alv-head") == str(head)
        assert page.get_attribute(f"{b} .alv-app", "data-view") == "head"
        assert page.input_value(f"{b} .alv-layer") == "0"
        assert page.input_value(f"{b} .alv-head") == "1"
        globals_added = page.evaluate("Object.keys(window).filter(k => k.startsWith('attnlab'))")
        assert globals_added == ["attnlabView"]
        assert seen.requests == [] and seen.problems == []


def test_the_heatmap_tooltip_writes_weights_as_the_table_and_stays_in_view(
    browser: Any, tmp_path: Path
) -> None:
    """Weights are stored as 8-bit steps of their row's largest: a stored 0 reads "< step/2"
    (the tooltip said 0.00000), and the tooltip flips to stay inside the scrolled map (at
    the bottom rows it sat below the box, out of sight)."""
    torch.manual_seed(0)
    peaked = GPT(GPTConfig.from_name("nano", vocab_size=TOK.vocab_size, block_size=64,
                                     init_std=1.0)).eval()
    ids = TOK.encode("the cat sat on the mat and the dog sat too")
    trace = Trace()
    peaked(torch.tensor([ids]), trace=trace)
    path = show(trace, TOK, ids=ids).save(tmp_path / "view.html")
    with offline(browser, path) as seen:
        page = seen.page
        texts, outside = [], []
        for fy in (0.3, 0.6, 0.97):
            for fx in [k / 24 for k in range(1, 24)] + [0.99]:
                # measured each time: hovering a row fills the detail above the map
                heat = page.locator(".alv-heatmap").bounding_box()
                assert heat is not None
                page.mouse.move(heat["x"] + fx * heat["width"], heat["y"] + fy * heat["height"])
                tip = page.locator(".alv-tip")
                if not tip.is_visible():
                    continue
                texts.append(tip.text_content() or "")
                r, box = tip.bounding_box(), page.locator(".alv-map").bounding_box()
                assert r is not None and box is not None
                if r["y"] + r["height"] > box["y"] + box["height"] + 1 or (
                        r["x"] + r["width"] > box["x"] + box["width"] + 1):
                    outside.append(texts[-1])
        assert texts and not any(t.endswith(": 0.00000") for t in texts), texts
        assert any(": < " in t for t in texts), texts  # a stored 0 on this peaked model
        assert outside == []
        assert seen.problems == []


def test_the_map_stays_under_the_pointer(browser: Any, tmp_path: Path) -> None:
    """The detail a hover fills sits above the map and keeps its space when the hover ends:
    the map did jump up each time the pointer left a token or the map itself."""
    ids = TOK.encode("the cat sat on the mat")
    trace = Trace()
    model(0)(torch.tensor([ids]), trace=trace)
    path = show(trace, TOK, ids=ids).save(tmp_path / "view.html")
    with offline(browser, path) as seen:
        page = seen.page
        page.hover(".alv-tok[data-i='4']")
        page.wait_for_selector(".alv-tok.alv-query[data-i='4']")
        where = page.locator(".alv-heatmap").bounding_box()
        assert page.locator(".alv-detail").is_visible()
        page.mouse.move(1, 1)
        page.wait_for_selector(".alv-tok.alv-query", state="detached")
        assert page.locator(".alv-heatmap").bounding_box() == where
        assert not page.locator(".alv-detail").is_visible()
        assert seen.requests == [] and seen.problems == []


def test_the_legend_names_the_scale_rows_to_max_draws(browser: Any, tmp_path: Path) -> None:
    """Above 64 tokens a view opens with "rows to max" ticked: the darkest colour is each
    row's largest weight, and the legend says so (it read 0 … 1), as the served page's does."""
    torch.manual_seed(0)
    long = GPT(GPTConfig.from_name("nano", vocab_size=TOK.vocab_size, block_size=128)).eval()
    path = show(long, TOK, "the cat sat on the mat. " * 3).save(tmp_path / "view.html")
    with offline(browser, path) as seen:
        page, legend = seen.page, ".alv-legend"
        assert page.is_checked(".alv-check input")
        assert page.inner_text(legend).split()[:3] == ["0", "row", "max"]
        page.click(".alv-check input")
        assert page.inner_text(legend).split()[:2] == ["0", "1"]
        page.click(".alv-tab[data-view='model']")  # the thumbnails follow the box too
        page.click(".alv-check input")
        assert page.inner_text(legend).split()[:3] == ["0", "row", "max"]
        assert seen.requests == [] and seen.problems == []
