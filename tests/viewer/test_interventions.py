"""viewer/routes/interventions.py and web/heads.js: the viewer's heads panel and logit lens answer
with the library's own numbers, reject bad requests, and the page shows them (headless
Chromium)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from fastapi.testclient import TestClient

from attnlab import GPT, GPTConfig, create_app
from attnlab.interp.edits import ablate
from attnlab.interp.heads import SUMMARY_MEANS, detect_heads, head_summaries
from attnlab.interp.lens import logit_lens
from attnlab.tokenizers import Tokenizer, get_tokenizer

CORPUS = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,;:!?'\n0123456789"
TEXT = "the cat sat. the cat"


@pytest.fixture(scope="module")
def setup() -> tuple[GPT, Any, TestClient]:
    tok = get_tokenizer("char", CORPUS)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tok.vocab_size, init_std=0.3)).eval()
    return model, tok, TestClient(create_app(model, tok))


def test_heads_api_equals_the_library(setup: tuple) -> None:
    model, tok, client = setup
    res = client.post("/api/heads", json={"text": TEXT, "ablate": [[1, 0], [0, 1]]})
    assert res.status_code == 200, res.text
    body = res.json()
    idx = torch.tensor([tok.encode(TEXT)])
    scores = detect_heads(model, idx)
    for kind, values in body["scores"].items():
        torch.testing.assert_close(torch.tensor(values), scores[kind], atol=1e-4, rtol=0)
    with torch.no_grad():
        edited = model(idx, edits=ablate([(1, 0), (0, 1)])).logits[0, -1]
        intact = model(idx).logits[0, -1]
    assert body["prediction"]["ablated"][0]["id"] == int(edited.argmax())
    assert body["prediction"]["intact"][0]["id"] == int(intact.argmax())
    assert body["prediction"]["intact"] != body["prediction"]["ablated"]
    assert sorted(map(tuple, body["induction_ranking"])) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # the heads overview: each summary's mean per layer and head, as head_summaries gives it
    means = head_summaries(model, idx)
    # every summary the model computes (no learned sinks here)
    assert body["summary_labels"] == {k: v for k, v in SUMMARY_MEANS.items()
                                      if k != "attn_learned_sink"}
    assert body["summary_shares"] == ["attn_sink", "attn_max"]  # coloured on 0..1
    for name, values in body["summaries"].items():
        torch.testing.assert_close(torch.tensor(values), means[name], atol=1e-4, rtol=0)
    assert body["summary_layers"] == [0, 1] and body["summary_heads"] == [0, 1]
    sink = body["summary_extremes"][0]
    assert sink["what"] == "most weight on the first token"
    layer, head, value = sink["heads"][0]
    assert value == pytest.approx(float(means["attn_sink"].max()), abs=1e-4)
    assert value == pytest.approx(float(means["attn_sink"][layer, head]), abs=1e-4)
    assert body["summary_note"].startswith(f"means over the {len(TEXT)} query rows, computed")


def test_lens_api_equals_the_library(setup: tuple) -> None:
    model, tok, client = setup
    body = client.post("/api/lens", json={"text": TEXT}).json()
    lens = logit_lens(model, torch.tensor([tok.encode(TEXT)]))[:, 0]  # (L + 1, T, V)
    assert body["layers"] == ["emb", "layer 0", "layer 1"]
    assert len(body["top"]) == 3 and len(body["top"][0]) == len(TEXT)
    for layer in range(3):
        for pos in (0, len(TEXT) - 1):
            best = tok.decode([int(lens[layer, pos].argmax())])
            assert body["top"][layer][pos][0]["text"] == best


def test_bad_requests_say_what_is_wrong(setup: tuple) -> None:
    _, _, client = setup
    res = client.post("/api/heads", json={"text": "ab", "ablate": [[5, 0]]})
    assert res.status_code == 422 and "do not exist" in res.json()["error"]
    res = client.post("/api/heads", json={"text": "a"})
    assert res.status_code == 422 and res.json()["error"] == (
        "the text is 1 token; head detectors need at least 2 tokens (a query and a key before "
        "it): give a longer text")
    res = client.post("/api/lens", json={"text": "x" * 40})
    assert res.status_code == 422 and "block_size" in res.json()["error"]
    for body in ({"text": "ab", "ids": [1, 2]}, {}):  # exactly one of them
        res = client.post("/api/heads", json=body)
        assert res.status_code == 422 and "exactly one of 'text' or 'ids'" in res.json()["error"]
    # true or 1.0 read as an index would hide a typo
    for path, body in (("/api/heads", {"text": "ab", "ablate": [[1.0, 0]]}),
                       ("/api/heads", {"ids": [1, True]}), ("/api/lens", {"ids": [2.0]}),
                       ("/api/attention", {"text": "ab", "layers": [True]})):
        assert client.post(path, json=body).status_code == 422, body


def test_heads_and_lens_of_ids_equal_those_of_their_text(setup: tuple) -> None:
    """The page scores the tokens it shows (a generation's too) by their ids."""
    _, tok, client = setup
    ids = tok.encode(TEXT)
    for path, extra in (("/api/heads", {"ablate": [[1, 0]]}), ("/api/lens", {})):
        by_text = client.post(path, json={"text": TEXT, **extra}).json()
        assert client.post(path, json={"ids": ids, **extra}).json() == by_text


@pytest.mark.browser
def _score_heads_and_read_the_overview(page: Any, model: GPT, tok: Any) -> None:
    """Show TEXT, score the heads, and read the heads overview beside them: a layer x head
    grid of the chosen summary, as head_summaries gives it."""
    from test_app_browser import show, wait_until

    show(page, TEXT)
    page.click("#heads-run")
    wait_until(page, "document.querySelectorAll('#heads-table tbody tr').length === 4")
    assert page.eval_on_selector_all("#overview .alo-table tr", "rows => rows.length") == 3
    means = head_summaries(model, torch.tensor([tok.encode(TEXT)]))
    cell = "document.querySelector('#overview .alo-table td[data-cell=\"1.0\"]').textContent"
    assert page.evaluate(cell) == f"{float(means['attn_entropy'][1, 0]):.2f}"
    page.select_option("#overview .alo-which", "attn_distance")
    assert page.evaluate(cell) == f"{float(means['attn_distance'][1, 0]):.2f}"


# the lens's line while the scores are for another text than the one on show
STALE = "document.querySelector('#lens').textContent.startsWith('score the heads')"


@pytest.mark.browser
def test_the_page_scores_heads_ablates_on_click_and_shows_the_lens(tmp_path: Path) -> None:
    from test_app_browser import CHROMIUM, playwright_api

    from helpers import serving

    if not CHROMIUM.exists():
        pytest.skip("browser tests skipped: /usr/bin/chromium is missing")
    tok = get_tokenizer("char", CORPUS)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tok.vocab_size, init_std=0.3,
                                    block_size=64)).eval()  # the page's default text fits
    with serving(create_app(model, tok), log_level="error") as port, \
            playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        problems: list[str] = []
        page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector("body[data-ready='1']", timeout=15_000)
        _score_heads_and_read_the_overview(page, model, tok)
        _ablate_two_heads(page, model, tok, tmp_path)
        _a_generation_leaves_the_scores_stale(page, model, tok)
        _other_texts_and_failures(page)
        browser.close()
    # the one console error: the browser's own line for the refused 1-token text (422)
    assert [p for p in problems if "status of 422" not in p] == [], problems


def _ablate_two_heads(page: Any, model: GPT, tok: Tokenizer, tmp_path: Path) -> None:
    """Two clicks ablate two heads: the edited prediction is the model's with both
    ablated, the intact one stays; a hovered token shows its lens."""
    from test_app_browser import wait_until

    before = page.text_content("#heads-intact")
    assert page.text_content("#heads-edited") == "(no head ablated)"
    page.click("#heads-table tbody tr[data-head='1.0']")
    page.click("#heads-table tbody tr[data-head='0.1']")
    wait_until(page, "document.querySelector('#heads-which').textContent === '1.0, 0.1'")
    wait_until(page, "document.querySelector('#heads-edited').textContent !== "
                     "'(no head ablated)'")
    with torch.no_grad():
        edited = model(torch.tensor([tok.encode(TEXT)]),
                       edits=ablate([(1, 0), (0, 1)])).logits[0, -1].argmax()
    assert page.text_content("#heads-intact") == before
    assert page.text_content("#heads-edited").startswith(tok.decode([int(edited)]))
    page.hover("#tokens .tok[data-i='4']")
    wait_until(page, "document.querySelectorAll('#lens-table tr').length === 3")
    shots = Path(os.environ.get("ATTNLAB_SCREENSHOTS", tmp_path))
    page.screenshot(path=str(shots / "viewer-heads.png"), full_page=True)


def _a_generation_leaves_the_scores_stale(page: Any, model: GPT, tok: Tokenizer) -> None:
    """A generation replaces the Tokens row and leaves the Text box: the lens and the
    ablations described the scored text, not the one on show, until it is scored."""
    from test_app_browser import wait_until

    page.fill("#prompt", "the")
    page.fill("#max_new_tokens", "4")
    page.fill("#temperature", "0")
    page.click("#gen")
    wait_until(page, "window.attnlab.generatedFrom === 3")
    wait_until(page, STALE)  # at once, not at the next hover
    wait_until(page, "document.querySelector('#heads-status').textContent"
                     ".includes('for another text')")
    page.hover("#tokens .tok[data-i='2']")
    wait_until(page, STALE)
    page.click("#heads-table tbody tr[data-head='0.0']")
    wait_until(page, "document.querySelector('#heads-status').textContent"
                     ".includes('not the ones scored')")
    assert page.text_content("#heads-which") == "1.0, 0.1"  # nothing was sent
    # Score heads scores the generation on show (the Text box still holds TEXT), and
    # a click then ablates on it
    generated = page.evaluate("window.attnlab.ids")
    page.click("#heads-run")
    wait_until(page, "document.querySelector('#heads-status').textContent"
                     f".startsWith('scored on {len(generated)} tokens')")
    page.click("#heads-table tbody tr[data-head='0.0']")
    wait_until(page, "document.querySelector('#heads-which').textContent === "
                     "'1.0, 0.1, 0.0'")
    with torch.no_grad():
        edited = model(torch.tensor([generated]),
                       edits=ablate([(1, 0), (0, 1), (0, 0)])).logits[0, -1].argmax()
    wait_until(page, "document.querySelector('#heads-edited').textContent.startsWith("
                     f"{json.dumps(tok.decode([int(edited)]))})")
    page.hover("#tokens .tok[data-i='2']")
    wait_until(page, "document.querySelectorAll('#lens-table tr').length === 3")


def _other_texts_and_failures(page: Any) -> None:
    """Another text leaves the scores stale; a failed scoring clears them; a refused text
    draws no layer's title over an empty map."""
    from test_app_browser import show, wait_until

    # back to TEXT: the scores are the generation's
    show(page, TEXT)
    wait_until(page, "document.querySelector('#heads-status').textContent"
                     ".includes('for another text')")
    # another text in the Text box: the same refusal
    show(page, "the dog")
    page.hover("#tokens .tok[data-i='1']")
    wait_until(page, STALE)
    # a scoring that fails clears the old table, predictions and lens
    show(page, "a")
    page.click("#heads-run")
    wait_until(page, "document.querySelector('#heads-status').textContent"
                     ".includes('at least 2 tokens')")
    assert page.locator("#heads-table tbody tr").count() == 0
    assert page.text_content("#heads-intact") == "" and page.text_content("#lens") == ""
    # a text the tokenizer refuses: no layer's title over an empty map
    page.fill("#text", "the €")
    page.click("#run")
    wait_until(page, "document.querySelector('#status').textContent.includes('€')")
    assert page.text_content("#map-title") == "Attention weights"
    assert not page.locator("#heatmap-wrap").is_visible()


@pytest.mark.browser
def test_the_keyboard_ablates_a_head() -> None:
    """Tab reaches each head's row, Enter or Space ablates it (as a click), as the token
    chips take Enter and Space."""
    from test_app_browser import CHROMIUM, playwright_api, wait_until

    from helpers import serving

    if not CHROMIUM.exists():
        pytest.skip("browser tests skipped: /usr/bin/chromium is missing")
    tok = get_tokenizer("char", CORPUS)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tok.vocab_size, block_size=64)).eval()
    with serving(create_app(model, tok), log_level="error") as port, \
            playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector("body[data-ready='1']", timeout=15_000)
        _score_heads_and_read_the_overview(page, model, tok)
        page.focus("#heads-table tbody tr[data-head='1.0']")
        page.keyboard.press("Enter")
        wait_until(page, "document.querySelector('#heads-which').textContent === '1.0'")
        page.keyboard.press("Tab")
        page.keyboard.press(" ")
        wait_until(page, "document.querySelector('#heads-which').textContent.includes(', ')")
        browser.close()


@pytest.mark.filterwarnings("ignore:Glyph:UserWarning")  # control bytes in the lens figure
def test_predicted_byte_tokens_read_as_their_bytes(tmp_path: Path) -> None:
    """The lens and heads panels (and `attnlab lens`) named a predicted token by decoding it
    alone: every byte token of a multi-byte character (byte-fallback <0xE6>, byte-level BPE
    "æ") read "\ufffd"."""
    from attnlab.checkpoint import save_checkpoint
    from attnlab.cli import main
    from attnlab.viewer.payloads import heads_payload, lens_payload

    tok = get_tokenizer("byte")
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=256, init_std=0.3)).eval()
    ids = tok.encode("日本")
    lens = [cell["text"] for layer in lens_payload(model, tok, ids)["top"] for row in layer
            for cell in row]
    heads = heads_payload(model, tok, ids, [])["prediction"]
    texts = [*lens, *(cell["text"] for cell in heads["intact"] + heads["ablated"])]
    assert all("\ufffd" not in t for t in texts)
    assert sum(t.startswith("<") and t.endswith(">") for t in texts) >= 10  # bytes >= 0x80
    save_checkpoint(tmp_path / "ckpt", model, tok)
    assert main(["lens", str(tmp_path / "ckpt"), "日本", "--out", str(tmp_path / "l")]) == 0
    words = (tmp_path / "l" / "lens.json").read_text(encoding="utf-8")
    assert "\\ufffd" not in words and "\ufffd" not in words and '"<' in words


def test_predicted_tokens_are_written_as_the_tokens_row_writes_them() -> None:
    """The prediction and the lens write a token as /api/attention's tokens do, control
    characters visible ("\\n", "<01>"): the page printed them raw, or as JSON escapes."""
    from attnlab.viewer.payloads import heads_payload, lens_payload

    tok = get_tokenizer("byte")
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=256)).eval()
    ids = tok.encode("ab")
    pieces = set(tok.pieces(list(range(256))))  # the Tokens row's "\\n", "<01>", " ", "<e6>"
    intact = heads_payload(model, tok, ids, [], k=256)["prediction"]["intact"]
    assert {t["text"] for t in intact} == pieces
    top = lens_payload(model, tok, ids, k=256)["top"]
    assert {t["text"] for t in top[1][0]} == pieces
