"""A mixture of experts' routing in headless Chromium (web/routing.js): the served page's
routing panel (web/routing_panel.js) and show()'s routing tab draw a token x expert grid of
the traced weights, the chosen experts marked, with each expert's share of the tokens; a
dense model's page shows no panel and asks for none. (The numbers sent are
test_routing.py's.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from test_app_browser import CORPUS, show, wait_until

from attnlab import GPT, GPTConfig, Trace, create_app
from attnlab import show as show_view
from attnlab.tokenizers import get_tokenizer
from helpers import serving
from offline_page import chromium, needs_chromium, offline

pytestmark = [pytest.mark.browser, needs_chromium]
TOK = get_tokenizer("char", CORPUS)
TEXT = "the cat sat"
GRID = "#routing-view .alr-table"
SHOWN = """(sel) => ({
    rows: document.querySelectorAll(`${sel} tbody tr`).length,
    cells: [...document.querySelectorAll(`${sel} tbody tr`)].map(tr =>
        [...tr.querySelectorAll('td')].map(td => td.dataset.weight === undefined ? 0
                                                  : +td.dataset.weight)),
    chosen: document.querySelectorAll(`${sel} td.alr-chosen`).length,
    shares: [...document.querySelectorAll(`${sel} tfoot td.alr-share`)].map(
        td => +td.dataset.share),
})"""


def model(n_experts: int | None) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=TOK.vocab_size, block_size=64, n_layer=2, n_head=2,
                         n_embd=16, n_experts=n_experts, experts_per_token=2)).eval()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def opened_page(browser: Any, url: str) -> tuple[Any, Any, list[str], list[str]]:
    """(context, page at `url` once ready, its script and console errors, its requests)."""
    context = browser.new_context(viewport={"width": 1400, "height": 950})
    page = context.new_page()
    problems: list[str] = []
    requests: list[str] = []
    page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
    page.on("request", lambda r: requests.append(r.url))
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=15_000)
    return context, page, problems, requests


def routed(layer: int) -> list[list[float]]:
    """Layer `layer`'s expert_weights (T, E) of TEXT, as the library traces them."""
    trace = Trace(names="expert_weights").run(model(4), torch.tensor([TOK.encode(TEXT)]))
    return trace.get("expert_weights", layer)[0].tolist()


def assert_drawn(got: dict[str, Any], want: list[list[float]]) -> None:
    """A grid of `want`'s T x E cells, the 2 chosen a token labelled with their weights."""
    assert got["rows"] == len(want) and got["chosen"] == 2 * len(want)
    assert [len(row) for row in got["cells"]] == [4] * len(want)
    for drawn, row in zip(got["cells"], want, strict=True):
        assert all(abs(d - w) <= 5e-4 * w if w else d == 0
                   for d, w in zip(drawn, row, strict=True)), (drawn, row)
    assert len(got["shares"]) == 4 and abs(sum(got["shares"]) - 2) < 1e-3


def test_the_page_draws_a_mixtures_routing_and_follows_the_layer(browser: Any) -> None:
    with serving(create_app(model(4), TOK), log_level="error") as port:
        context, page, problems, _ = opened_page(browser, f"http://127.0.0.1:{port}/")
        try:
            show(page, TEXT)
            wait_until(page, f"document.querySelectorAll('{GRID} tbody tr').length === "
                             f"{len(TEXT)} && !document.querySelector('#routing-status')"
                             ".textContent")
            assert page.is_visible("#routing")
            assert "4 experts, top 2" in page.inner_text("#model-info")
            assert_drawn(page.evaluate(SHOWN, GRID), routed(0))
            page.select_option("#layer", "1")  # the page's Layer menu opens layer 1's routing
            wait_until(page, "document.querySelector('#routing-view').dataset.layer === '1'")
            assert_drawn(page.evaluate(SHOWN, GRID), routed(1))
            assert page.locator("#routing-view .alr-loads tr[data-li]").count() == 2
            page.click("#routing-view .alr-loads tr[data-li='0']")  # a layer's loads open it
            assert page.evaluate("document.querySelector('#routing-view').dataset.layer") == "0"
            assert page.input_value("#routing-view .alr-layer") == "0"
        finally:
            context.close()
    assert problems == [], problems  # no script error, no CSP violation, no failed load


def test_a_dense_models_page_has_no_routing_panel(browser: Any) -> None:
    with serving(create_app(model(None), TOK), log_level="error") as port:
        context, page, problems, requests = opened_page(browser, f"http://127.0.0.1:{port}/")
        try:
            show(page, TEXT)
            assert not page.is_visible("#routing")
            assert page.locator("#routing-view td").count() == 0
        finally:
            context.close()
    assert problems == [] and not [r for r in requests if "/api/routing" in r], requests


def test_shows_routing_tab_draws_offline(browser: Any, tmp_path: Path) -> None:
    path = show_view(model(4), TOK, TEXT).save(tmp_path / "routing.html")
    with offline(browser, path) as seen:
        page, view = seen.page, ".attnlab-view"
        assert not page.is_visible(f"{view} .alv-routing")
        page.click(f"{view} .alv-tab[data-view='routing']")
        assert page.is_visible(f"{view} .alv-routing")
        assert not page.is_visible(f"{view} .alv-layer")  # the routing has its own menu
        assert_drawn(page.evaluate(SHOWN, f"{view} .alr-table"), routed(0))
        page.select_option(f"{view} .alr-layer", "1")
        assert_drawn(page.evaluate(SHOWN, f"{view} .alr-table"), routed(1))
        assert seen.requests == [] and seen.problems == []


def test_scaled_weights_end_the_ramp_at_the_largest(browser: Any, tmp_path: Path) -> None:
    """A router that scales its weights past 1 (DeepSeek-V3's routed_scaling): the ramp ends
    at the largest weight shown, and its legend says so."""
    torch.manual_seed(0)
    scaled = GPT(GPTConfig(vocab_size=TOK.vocab_size, block_size=64, n_layer=2, n_head=2,
                           n_embd=16, n_experts=4, experts_per_token=2,
                           router_scoring="sigmoid", routed_scaling=2.5)).eval()
    top = max(max(max(row) for row in Trace(names="expert_weights").run(
        scaled, torch.tensor([TOK.encode(TEXT)])).get("expert_weights", layer)[0].tolist())
        for layer in (0, 1))
    assert top > 1
    path = show_view(scaled, TOK, TEXT).save(tmp_path / "scaled.html")
    with offline(browser, path) as seen:
        page, view = seen.page, ".attnlab-view"
        page.click(f"{view} .alv-tab[data-view='routing']")
        legend = page.inner_text(f"{view} .alr-legend")
        assert f"{top:.2f}: the expert's weight" in legend, legend
        assert seen.requests == [] and seen.problems == []
