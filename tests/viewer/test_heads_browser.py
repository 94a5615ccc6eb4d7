"""The served page's heads panel in headless Chromium (web/heads.js, web/overview.js): how it
writes the predicted tokens and the logit lens, and the heads overview of a model with many
heads. (test_interventions.py checks their numbers against the library's; the same
overview.js in show(..., summary=True) is test_notebook_browser.py's.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from test_app_browser import CORPUS, opened, show, wait_until

from attnlab import GPT, GPTConfig, create_app
from attnlab.tokenizers import get_tokenizer
from helpers import serving
from offline_page import chromium, needs_chromium

pytestmark = [pytest.mark.browser, needs_chromium]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


TOK = get_tokenizer("char", CORPUS)


def nano_model() -> GPT:
    """nano (2 layers x 2 heads) on the test pages' characters, the same each call."""
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("nano", vocab_size=TOK.vocab_size, block_size=64)).eval()


@pytest.fixture(scope="module")
def nano() -> Iterator[str]:
    """The URL of a page over nano_model()."""
    with serving(create_app(nano_model(), TOK), log_level="error") as port:
        yield f"http://127.0.0.1:{port}/"


def test_a_space_reads_as_in_the_tokens_row(browser: Any, nano: str) -> None:
    """A predicted space showed as nothing in Next token and in the lens, where the Tokens
    row writes it ␣: every token text goes through the chips' one function."""
    def space_first(route: Any) -> None:  # the answers, their first token made a space
        answer = route.fetch()
        body = answer.json()
        tops = body["prediction"]["intact"] if "prediction" in body else body["top"][0][2]
        tops[0]["text"] = " "
        route.fulfill(response=answer, json=body)

    with opened(browser, nano) as (page, _):
        page.route("**/api/heads", space_first)
        page.route("**/api/lens", space_first)
        show(page, "a cat")
        page.click("#heads-run")
        wait_until(page, "document.querySelector('#heads-intact').textContent")
        assert page.inner_text("#tokens .tok[data-i='1']") == "␣"
        assert page.inner_text("#heads-intact").startswith("␣ ")
        page.hover("#tokens .tok[data-i='2']")
        wait_until(page, "document.querySelector('#lens-table td')")
        assert page.inner_text("#lens-table td").startswith("␣ ")  # after the embeddings


def scored(page: Any, n: int) -> None:
    """Press Score heads and wait for the scores of the n tokens on show."""
    page.click("#heads-run")
    wait_until(page, "document.querySelector('#heads-status').textContent"
                     f".startsWith('scored on {n} tokens')")


def test_scoring_again_redraws_the_lens(browser: Any, nano: str) -> None:
    """Score, show another text, score again: the lens kept asking to score the heads. It
    shows the pinned token's lens, or how to see one; so does going back to a scored text."""
    lens = "document.querySelector('#lens').textContent"
    hint = "hover a token to see its logit lens"
    with opened(browser, nano) as (page, _):
        show(page, "a cat")
        scored(page, 5)
        show(page, "the dog")
        wait_until(page, f"{lens}.startsWith('score the heads')")
        scored(page, 7)
        assert page.inner_text("#lens") == hint
        show(page, "a cat")
        page.click("#tokens .tok[data-i='2']")  # pinned: the lens of token 2, when scored
        page.mouse.move(1, 1)
        wait_until(page, f"{lens}.startsWith('score the heads')")
        scored(page, 5)
        assert page.inner_text("#lens").startswith("logit lens at token 2")
        show(page, "the dog")  # another text, then back on the scored one
        show(page, "a cat")
        wait_until(page, "document.querySelector('#heads-status').textContent"
                         ".startsWith('scored on 5 tokens')")
        assert page.inner_text("#lens") == hint


@pytest.fixture(scope="module")
def many_heads() -> Iterator[str]:
    """The URL of a page over 12 layers x 16 heads (untrained; the shape is what counts)."""
    tok = get_tokenizer("char", CORPUS)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=12, n_head=16,
                          n_embd=32)).eval()
    with serving(create_app(model, tok), log_level="error") as port:
        yield f"http://127.0.0.1:{port}/"


BOX = "#overview .alo-wrap"
GRID = "#overview .alo-table"
CAPTION = "document.querySelector('#overview .alo-cell').textContent"


def test_a_12_x_16_overview_keeps_its_labels_in_sight(browser: Any, many_heads: str) -> None:
    """The grid scrolls in its box under a header row and a column of layers that stay put
    (scrolled, it showed values without labels), under a one-line corner label (it wrapped to
    three lines)."""
    with opened(browser, many_heads) as (page, _):
        show(page, "the cat sat")
        scored(page, 11)
        assert page.locator(f"{GRID} tbody tr").count() == 12
        height = "e => e.getBoundingClientRect().height"
        corner = page.eval_on_selector(f"{GRID} thead th", height)
        assert corner == page.eval_on_selector(f"{GRID} thead th:last-child", height)
        page.eval_on_selector(BOX, "w => { w.style.maxHeight = '8rem'; }")  # a short screen
        page.eval_on_selector(BOX, "w => { w.scrollTop = 1e4; w.scrollLeft = 1e4; }")
        at = page.evaluate("""() => {
            const box = document.querySelector('#overview .alo-wrap');
            const r = (sel) => document.querySelector(sel).getBoundingClientRect();
            return {scrolled: box.scrollTop > 0 && box.scrollLeft > 0,
                    box: box.getBoundingClientRect().toJSON(),
                    head15: r('#overview .alo-table thead th:last-child').toJSON(),
                    layer11: r('#overview .alo-table tbody tr:last-child th').toJSON()};
        }""")
        assert at["scrolled"]
        assert abs(at["head15"]["top"] - at["box"]["top"]) <= 2  # the header row, on top
        assert abs(at["layer11"]["left"] - at["box"]["left"]) <= 2  # the layers, at the left


def test_an_overview_cell_opens_its_layer_and_head(browser: Any, many_heads: str) -> None:
    """A click on a cell, or Enter or Space on it, picks its layer and head in the page's
    menus (it did nothing); the arrow keys move between cells; a line under the grid names
    the cell pointed at or focused, and its value."""
    picked = "window.attnlab.layer === {} && window.attnlab.head === {}"
    with opened(browser, many_heads) as (page, _):
        show(page, "the cat sat")
        scored(page, 11)
        page.click(f"{GRID} td[data-cell='3.5']")
        wait_until(page, picked.format(3, 5))
        assert (page.input_value("#layer"), page.input_value("#head")) == ("3", "5")
        page.hover(f"{GRID} td[data-cell='2.9']")
        value = page.inner_text(f"{GRID} td[data-cell='2.9']")
        assert page.evaluate(CAPTION).startswith(f"layer 2, head 9: entropy (nats) {value}")
        page.mouse.move(1, 1)  # the pointer gone: the line names the cell on show
        assert page.evaluate(CAPTION).startswith("layer 3, head 5")
        page.focus(f"{GRID} td[data-cell='7.12']")
        page.keyboard.press("ArrowLeft")
        assert page.evaluate("document.activeElement.dataset.cell") == "7.11"
        assert page.evaluate(CAPTION).startswith("layer 7, head 11")
        page.keyboard.press("Enter")
        wait_until(page, picked.format(7, 11))
        page.keyboard.press("ArrowUp")
        page.keyboard.press(" ")
        wait_until(page, picked.format(6, 11))
        assert page.evaluate("document.activeElement.dataset.cell") == "6.11"


def test_a_narrow_window_scrolls_the_grids_not_the_page(browser: Any, many_heads: str) -> None:
    """At 600 px the overview and the heads table scroll in their boxes: the whole page
    scrolled sideways."""
    with opened(browser, many_heads, width=600) as (page, _):
        show(page, "the cat sat")
        scored(page, 11)
        sizes = page.evaluate("""() => ({
            page: document.documentElement.scrollWidth, window: innerWidth,
            box: document.querySelector('#overview .alo-wrap').clientWidth,
            grid: document.querySelector('#overview .alo-wrap').scrollWidth})""")
        assert sizes["page"] <= sizes["window"], sizes
        assert sizes["grid"] > sizes["box"], sizes


def test_the_overview_says_its_scale_and_opens_the_extreme_heads(browser: Any,
                                                                  nano: str) -> None:
    """Each summary's legend says its scale: 0 to 1 for the shares of a row's weight (first
    token, largest), 0 to the grid's largest for the others, whose largest cell is the top
    colour (the page had no legend and shaded every summary relative to its grid's largest).
    The most extreme heads are listed under the grid, and one opens its layer and head as a
    cell does."""
    text = "the cat sat on the mat"
    picked = "window.attnlab.layer === {} && window.attnlab.head === {}"
    with opened(browser, nano) as (page, _):
        show(page, text)
        scored(page, len(text))
        names = page.eval_on_selector_all("#overview .alo-which option",
                                          "os => os.map(o => o.value)")
        assert names == ["attn_entropy", "attn_sink", "attn_distance", "attn_max"]
        for name in names:
            page.focus("#overview .alo-which")
            page.select_option("#overview .alo-which", name)
            # the menu keeps the focus: its grid is redrawn, not the menu with it
            assert page.evaluate("document.activeElement.className") == "alo-which"
            legend = " ".join(page.inner_text("#overview .alo-legend").split())
            cells = page.eval_on_selector_all(f"{GRID} td", """tds => tds.map(td =>
                [+td.textContent, getComputedStyle(td).backgroundColor])""")
            assert len(cells) == 4
            if name in ("attn_sink", "attn_max"):
                assert legend == "0 1 a share of each row's weight", legend
            else:
                top = max(value for value, _ in cells)
                assert legend == f"0 {top:.2f} the largest here", legend
                assert ("rgb(253, 231, 37)" in [c for v, c in cells if v == top]), cells
        rows = page.eval_on_selector_all("#overview .alo-extremes tr",
                                         "trs => trs.map(tr => tr.innerText)")
        assert rows[0].startswith("most extreme heads") and len(rows) == 5, rows
        assert rows[1].startswith("most weight on the first token"), rows
        listed = page.eval_on_selector_all("#overview .alo-extremes td[data-cell]",
                                           "tds => tds.map(td => td.dataset.cell)")
        first = listed[0]
        other = next(cell for cell in listed if cell != first)
        page.click(f"#overview .alo-extremes td[data-cell='{first}']")
        wait_until(page, picked.format(*first.split(".")))
        page.focus(f"#overview .alo-extremes td[data-cell='{other}']")
        page.keyboard.press("Enter")
        wait_until(page, picked.format(*other.split(".")))
        layer, head = other.split(".")
        assert page.evaluate(CAPTION).startswith(f"layer {layer}, head {head}: ")
        assert page.evaluate(CAPTION).endswith(" · on show above")
