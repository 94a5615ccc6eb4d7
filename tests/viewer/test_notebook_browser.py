"""attnlab.show()'s HTML in headless Chromium with the network cut: an `inspect --format
html` file shows the weights its attention.json holds, and two views on one page work
independently (hover, pin, tabs, the model view's click-to-open); show(..., summary=True)
draws its grids, legends and extreme heads with the page's overview.js, and picks a head
by pointer and keyboard, view by view.
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


# ----------------------------------------------------------------------------- heads overview


def peaked(n_head: int = 4) -> GPT:
    """A nano model whose heads differ (a larger init spreads their summaries apart)."""
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("nano", vocab_size=TOK.vocab_size, block_size=64,
                                   n_head=n_head, init_std=1.0)).eval()


GRIDS = """root => [...document.querySelectorAll(root + ' .alo-figure')].map(fig => ({
    name: fig.dataset.summary, title: fig.querySelector('.alo-title').innerText,
    legend: fig.querySelector('.alo-legend').innerText.split(/\\s+/).join(' '),
    cells: [...fig.querySelectorAll('td')].map(td => [td.dataset.cell, td.textContent,
        getComputedStyle(td).backgroundColor, td.title]),
    stops: fig.querySelectorAll("td[tabindex='0']").length}))"""


def test_the_heads_overview_draws_every_summary_offline(browser: Any, tmp_path: Path) -> None:
    """show(..., summary=True) saved as a page: the page's overview.js draws a grid per
    summary side by side, each cell labelled with its value and coloured on its summary's
    scale (a share on 0..1, the others on 0..the grid's largest, which is the top colour),
    a legend saying which; then the most extreme heads and what the means are over."""
    from test_notebook import payload

    text = "the cat sat on the mat. the cat sat"
    view = show(peaked(), TOK, text, summary=True)
    data = payload(view)
    with offline(browser, view.save(tmp_path / "summary.html")) as seen:
        page = seen.page
        assert page.inner_text("h3") == "attnlab · heads overview of 35 tokens"
        grids = page.evaluate(GRIDS, ".attnlab-view")
        assert [g["name"] for g in grids] == list(data["summaries"])
        for grid in grids:
            name = grid["name"]
            values = [v for row in data["summaries"][name] for v in row]
            assert grid["title"] == data["summary_labels"][name] and grid["stops"] == 1
            keys = [f"{la}.{h}" for la in range(2) for h in range(4)]
            assert [c[0] for c in grid["cells"]] == keys
            assert [c[1] for c in grid["cells"]] == [f"{v:.2f}" for v in values]
            assert grid["cells"][5][3] == f"layer 1, head 1: {grid['title']} {values[5]}"
            assert len({c[2] for c in grid["cells"]}) > 2  # coloured by value
            if name in data["summary_shares"]:
                assert grid["legend"] == "0 1 a share of each row's weight"
            else:
                assert grid["legend"] == f"0 {max(values):.2f} the largest here"
                top = values.index(max(values))
                assert grid["cells"][top][2] == "rgb(253, 231, 37)"  # viridis's top
        rows = page.eval_on_selector_all(".alo-extremes tr", "trs => trs.map(tr => tr.innerText)")
        assert rows[0] == "most extreme heads (layer.head mean)"
        for row, extreme in zip(rows[1:], data["summary_extremes"], strict=True):
            heads = [f"{la}.{h} {v:.3f}" for la, h, v in extreme["heads"]]
            assert row.split("\t") == [extreme["what"], *heads], row
        assert page.inner_text(".alo-note") == data["summary_note"]
        assert page.inner_text(".alo-cell").startswith("point at a cell")
        assert seen.requests == [] and seen.problems == []


def test_overview_cells_are_picked_by_pointer_and_keyboard_per_view(
    browser: Any, tmp_path: Path
) -> None:
    """Two overviews and an attention view on one page: a click on a cell, or Enter or Space
    on it, or on an extreme head, picks that head in every grid of its own view (marked, and
    the line under the grids gives its value in each summary); the arrow keys move within a
    grid, one tab stop each; the other views take nothing of it."""
    from test_notebook import payload

    a = show(peaked(), TOK, "the cat sat on the mat", summary=True)
    b = show(peaked(), TOK, "a dog ran", summary=True)
    c = show(peaked(), TOK, "a dog ran", head=1)
    path = tmp_path / "three.html"
    path.write_text("<!doctype html><meta charset='utf-8'><body>" + a.html + c.html + b.html
                    + "</body>")
    means = payload(a)["summaries"]
    labels = payload(a)["summary_labels"]
    with offline(browser, path) as seen:
        page = seen.page
        va, vc, vb = (f"#{page.locator('.attnlab-view').nth(k).get_attribute('id')}"
                      for k in (0, 1, 2))
        line = f"{va} .alo-cell"
        on = ("(root) => [...document.querySelectorAll(root + ' td.alo-on')]"
              ".map(td => td.dataset.cell)")

        def values(layer: int, head: int) -> str:
            return " · ".join(f"{labels[n]} {means[n][layer][head]}" for n in means)

        page.click(f"{va} figure[data-summary='attn_entropy'] td[data-cell='1.2']")
        assert page.evaluate(on, va) == ["1.2"] * 4 and page.evaluate(on, vb) == []
        page.mouse.move(1, 1)
        assert page.inner_text(line) == f"layer 1, head 2: {values(1, 2)} · picked"
        page.hover(f"{va} figure[data-summary='attn_max'] td[data-cell='0.3']")
        assert page.inner_text(line) == f"layer 0, head 3: {values(0, 3)}"
        # the keyboard: arrows within the grid, Enter and Space pick
        distance = f"{va} figure[data-summary='attn_distance']"
        page.mouse.move(1, 1)
        page.focus(f"{distance} td[data-cell='0.0']")
        for key, cell in (("ArrowRight", "0.1"), ("ArrowDown", "1.1"), ("ArrowDown", "1.1")):
            page.keyboard.press(key)
            assert page.evaluate("document.activeElement.dataset.cell") == cell
            assert page.evaluate("document.activeElement.closest('figure').dataset.summary") \
                == "attn_distance"
        assert page.inner_text(line).startswith("layer 1, head 1: ")
        page.keyboard.press("Enter")
        assert page.evaluate(on, va) == ["1.1"] * 4
        page.keyboard.press("ArrowLeft")
        page.keyboard.press(" ")
        assert page.evaluate(on, va) == ["1.0"] * 4
        stops = page.eval_on_selector_all(
            f"{va} .alo-table td[tabindex='0']",
            "tds => tds.map(td => td.closest('figure').dataset.summary + td.dataset.cell)")
        assert sorted(stops) == sorted(f"{n}1.0" for n in means)  # one per grid: the pick
        # an extreme head picks its cell; the other overview and the attention view are as
        # they were
        first = page.get_attribute(f"{va} .alo-extremes td[data-cell]", "data-cell")
        page.click(f"{va} .alo-extremes td[data-cell='{first}']")
        assert page.evaluate(on, va) == [first] * 4 and page.evaluate(on, vb) == []
        assert page.inner_text(f"{vb} .alo-cell").startswith("point at a cell")
        page.hover(f"{vc} .alv-tok[data-i='4']")
        page.wait_for_selector(f"{vc} .alv-tok.alv-query[data-i='4']")
        assert page.evaluate("Object.keys(window).filter(k => k.startsWith('attnlab'))") == [
            "attnlabView"]
        assert page.evaluate("Object.keys(window.attnlabView).length") == 2  # two bundles
        assert seen.requests == [] and seen.problems == []


def test_the_steps_of_a_capped_model_name_its_cap(browser: Any, tmp_path: Path) -> None:
    """A Gemma-2-style model's weights are softmax(cap * tanh(masked * s / cap)): the steps
    view said softmax(masked * s) for it. Its payload now carries the cap and the third
    panel's caption names it; an uncapped model's caption is as before, and a model with
    learned sinks (gpt-oss's) names its sink beside the keys."""
    captions = []
    for cap, sinks in ((2.0, False), (None, False), (None, True)):
        torch.manual_seed(0)
        capped = GPT(GPTConfig.from_name("nano", vocab_size=TOK.vocab_size, block_size=64,
                                         attn_logit_softcapping=cap, attn_sinks=sinks)).eval()
        view = show(capped, TOK, text="the cat sat", view="steps")
        page_path = tmp_path / f"steps{cap}{sinks}.html"
        page_path.write_text("<!doctype html><meta charset='utf-8'><body>" + view.html
                             + "</body>")
        with offline(browser, page_path) as seen:
            page = seen.page
            page.wait_for_selector(".alv-steps canvas")
            captions.append(page.locator(".alv-steps figure").nth(2).inner_text())
            assert seen.problems == []
    assert "softmax(2·tanh(masked × 0.3536 / 2))" in captions[0], captions
    assert "softmax(masked × 0.3536)" in captions[1], captions
    assert "softmax([masked × 0.3536, sink])" in captions[2], captions
