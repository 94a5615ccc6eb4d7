"""The served page's heads panel in headless Chromium (web/heads.js): how it writes the
predicted tokens and the logit lens. (test_interventions.py checks its numbers against the
library's.)"""

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


@pytest.fixture(scope="module")
def nano() -> Iterator[str]:
    """The URL of a page over nano (2 layers x 2 heads) on the test pages' characters."""
    tok = get_tokenizer("char", CORPUS)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tok.vocab_size, block_size=64)).eval()
    with serving(create_app(model, tok), log_level="error") as port:
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
