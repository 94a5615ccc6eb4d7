"""The viewer page in headless Chromium: what it shows equals what the API returns.

Needs Debian's chromium at /usr/bin/chromium (Playwright's own browser download is not
used); without it every test here is skipped, with that reason. The page runs under its
real Content-Security-Policy, so the test waits by polling `page.evaluate` rather than
`wait_for_function` (which needs eval).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

from attnlab import GPT, GPTConfig, create_app  # noqa: E402
from attnlab.tokenizers import get_tokenizer  # noqa: E402
from helpers import serving  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="browser tests skipped: /usr/bin/chromium is missing (apt-get install chromium)",
    ),
]
CORPUS = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,;:!?'\n0123456789"
TEXT_256 = ("The quick brown fox jumps over the lazy dog. " * 6)[:256]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:

    tok = get_tokenizer("char", CORPUS)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tok.vocab_size, block_size=256))
    app = create_app(model, tok, meta={"step": 0})
    with serving(app, log_level="error") as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 950})
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
    page.goto(server + "/")
    page.wait_for_selector("body[data-ready='1']", timeout=15_000)
    yield page
    context.close()
    assert problems == [], problems  # no script error, no CSP violation, no failed load


STATUSES = """() => Object.fromEntries([...document.querySelectorAll('[role=status]')]
    .map(s => [s.id, s.textContent]))"""


def wait_until(page: Any, script: str, timeout: float = 15.0) -> Any:
    """`script`'s value once truthy; on a timeout the page's status lines say what it was
    doing (a failed request, or one still running)."""
    deadline = time.monotonic() + timeout
    while not (value := page.evaluate(script)):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {script}; statuses: {page.evaluate(STATUSES)}")
        time.sleep(0.05)
    return value


def show(page: Any, text: str) -> None:
    page.fill("#text", text)
    page.click("#run")
    n = len(get_tokenizer("char", CORPUS).encode(text))
    wait_until(page, f"window.attnlab.tokens.length === {n} && !document.querySelector("
                     "'#status').textContent")


def shown_weights(page: Any) -> dict[str, Any]:
    """What the page shows for the query token: chip weights and the table's numbers."""
    return page.evaluate("""() => ({
        chips: [...document.querySelectorAll('#tokens .tok')].map(c => c.dataset.weight),
        future: [...document.querySelectorAll('#tokens .tok.future')].map(c => +c.dataset.i),
        table: [...document.querySelectorAll('#weights td.w')].map(td => td.textContent),
        tableWeights: [...document.querySelectorAll('#weights td.w')].map(td => td.dataset.weight),
    })""")


def _row(head: str, query: int) -> list[float]:
    """Query `query`'s weights from a head of /api/attention's float32 encoding."""
    import base64

    import numpy as np

    flat = np.frombuffer(base64.b64decode(head), dtype="<f4")  # rows 0, 1, ... of the triangle
    start = query * (query + 1) // 2
    return [float(w) for w in flat[start:start + query + 1]]


def test_hovered_token_shows_the_apis_weights(page: Any, server: str) -> None:
    """The page asks for the float32 encoding and shows those exact weights; the default
    number lists hold the same weights rounded to 5 decimals."""
    text = "The cat sat on the mat."
    show(page, text)
    api = httpx.post(server + "/api/attention", json={"text": text, "encoding": "float32"}).json()
    lists = httpx.post(server + "/api/attention", json={"text": text}).json()
    for layer, head, query in [(0, 1, 9), (1, 0, 22), (1, 1, 0)]:
        page.select_option("#layer", str(layer))
        page.select_option("#head", str(head))
        wait_until(page, f"window.attnlab.layer === {layer}")
        page.hover(f"#tokens .tok[data-i='{query}']")
        page.wait_for_selector(f"#tokens .tok.query[data-i='{query}']")
        seen = shown_weights(page)
        row = _row(api["layers"][layer]["heads"][head], query)  # keys 0..query
        assert row == pytest.approx(lists["layers"][layer]["heads"][head][query], abs=5e-6)
        assert [float(w) for w in seen["chips"][: query + 1]] == row
        # every later token is shown masked, with weight exactly 0
        assert seen["future"] == list(range(query + 1, len(text)))
        assert all(w == "0" for w in seen["chips"][query + 1:])
        assert [float(w) for w in seen["tableWeights"]] == row
        assert seen["table"] == [f"{w:.5f}" for w in row]
    title = page.inner_text("#detail-title")
    assert title.startswith("Token #0") and "layer 1, head 1" in title
    # the keyboard: Tab reaches the tokens, focus shows one, Enter pins it (chips had no
    # tab stop: the viewer was mouse-only)
    page.mouse.move(5, 5)  # leave the tokens
    page.focus("#tokens .tok[data-i='4']")
    page.wait_for_selector("#tokens .tok.query[data-i='4']")
    page.keyboard.press("Enter")
    wait_until(page, "window.attnlab.pinned === 4")
    page.keyboard.press("Tab")
    page.wait_for_selector("#tokens .tok.query[data-i='4']")  # pinned: stays on show


def test_the_last_layer_picked_is_drawn_when_an_earlier_answer_comes_late(page: Any) -> None:
    """Layer 1 asked for, then layer 0 (on hand) before layer 1's answer: the late answer
    is dropped, and the map, the title and the state all read layer 0."""
    show(page, "the lazy dog")
    late: list[Any] = []

    def hold_layer_1(route: Any) -> None:
        if json.loads(route.request.post_data or "{}").get("layers") == [1]:
            late.append(route)  # answered below, once layer 0 is drawn
        else:
            route.continue_()

    page.route("**/api/attention", hold_layer_1)
    page.select_option("#layer", "1")
    wait_until(page, "document.querySelector('#status').textContent === 'running…'")
    page.select_option("#layer", "0")
    wait_until(page, "!document.querySelector('#status').textContent")
    assert len(late) == 1
    late[0].continue_()
    page.wait_for_timeout(500)  # the late answer arrives and is dropped
    assert page.evaluate("window.attnlab.layer") == 0
    assert "layer 0" in page.eval_on_selector("#map-title", "e => e.textContent")
    assert not page.evaluate("document.querySelector('#status').textContent")


def test_all_heads_grid_and_click_to_open(page: Any) -> None:
    page.select_option("#head", "all")
    page.wait_for_selector("#grid figure.mini")
    assert page.locator("#grid figure.mini").count() == 2
    assert page.is_hidden("#heatmap-wrap")
    page.click("#grid figure.mini[data-head='1']")
    assert page.input_value("#head") == "1"
    assert page.is_visible("#heatmap") and page.is_hidden("#grid")
    # the keyboard opens one too: each thumbnail is a button with a tab stop (they took
    # only clicks), Enter or Space opens it
    for key, head in (("Enter", 0), (" ", 1)):
        page.select_option("#head", "all")
        mini = f"#grid figure.mini[data-head='{head}']"
        assert page.get_attribute(mini, "role") == "button"
        page.focus(mini)
        assert page.evaluate("document.activeElement.dataset.head") == str(head)
        page.keyboard.press(key)
        assert page.input_value("#head") == str(head) and page.is_visible("#heatmap")


def test_keys_outside_a_sliding_window_are_shown_masked(browser: Any) -> None:
    """A Mistral-style window of 4: query 7 sees keys 4..7; keys 0..3 get weight 0 because
    they are masked, and the page says so, as for later keys (not "0.00000", not white)."""
    tok = get_tokenizer("char", CORPUS)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tok.vocab_size, sliding_window=4))
    with serving(create_app(model, tok), log_level="error") as port:
        page = browser.new_page(viewport={"width": 1400, "height": 950})
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector("body[data-ready='1']", timeout=15_000)
        show(page, "abcdefghij")
        page.hover("#tokens .tok[data-i='7']")
        wait_until(page, "document.querySelectorAll('#weights td.w').length === 8")
        shown = shown_weights(page)
        assert shown["future"] == [0, 1, 2, 3, 8, 9]
        assert shown["table"][:4] == ["masked"] * 4
        assert "masked" not in shown["table"][4:]
        assert "4 earlier tokens fall outside this layer's sliding window of 4" in (
            page.inner_text("#detail-note"))
        assert "sliding window of 4" in page.inner_text("#masked-label")
        page.close()


def test_leaving_the_tokens_moves_nothing_below_them(page: Any) -> None:
    """The weights panel that a hover opens keeps its space when the pointer leaves the
    tokens: a control below (Generate) stays under a pointer on its way there. (It did not:
    the panel closed between a click's mousedown and mouseup, and the click was lost.)"""
    show(page, "The cat sat on the mat.")
    assert page.is_hidden("#detail")  # a new text: nothing hovered yet
    box = "JSON.stringify(document.querySelector('#gen').getBoundingClientRect())"
    page.hover("#tokens .tok[data-i='3']")
    wait_until(page, "document.querySelectorAll('#weights td.w').length === 4")
    where = page.evaluate(box)
    page.mouse.move(5, 5)  # off the tokens
    wait_until(page, "!document.querySelector('#tokens .tok.query')")  # the hover has ended
    assert page.evaluate(box) == where
    assert not page.is_visible("#weights")  # nothing on show describes the left token
    show(page, "The dog.")
    assert page.is_hidden("#detail")


def test_a_server_gone_mid_session_is_named_in_every_panel(browser: Any, server: str) -> None:
    """With the server stopped (every request fails, as when `attnlab serve` restarts), each
    panel says the server cannot be reached, not the browser's bare "Failed to fetch"."""
    page = browser.new_page(viewport={"width": 1400, "height": 950})  # its failed loads log
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(server + "/")
    page.wait_for_selector("body[data-ready='1']", timeout=15_000)
    page.route("**/api/**", lambda route: route.abort())
    page.click("#run")
    page.click("#gen")
    page.click("#heads-run")
    wait_until(page, "document.querySelector('#heads-status').textContent.includes('server')")
    for status in ("#status", "#gen-status", "#heads-status"):
        wait_until(page, f"document.querySelector('{status}').textContent.includes('server')")
        assert "cannot reach the server" in page.inner_text(status)
        assert "attnlab serve" in page.inner_text(status)
    page.unroute("**/api/**")
    show(page, "The cat sat")  # back: the page works again without a reload
    page.close()
    assert errors == []


def test_generation_streams_then_shows_its_attention(page: Any, server: str) -> None:
    body = {"text": "The cat", "max_new_tokens": 12, "temperature": 0}
    expected = httpx.post(server + "/api/generate", json=body).text
    done_line = next(line for line in expected.splitlines() if line.startswith("data: {\"ids\""))
    page.fill("#prompt", body["text"])
    page.fill("#max_new_tokens", "12")
    page.fill("#temperature", "0")
    page.click("#gen")
    wait_until(page, "window.attnlab.generatedFrom === 7")
    done = json.loads(done_line.removeprefix("data: "))
    assert page.inner_text("#output .new-text") == done["text"]
    assert page.evaluate("window.attnlab.ids") == done["ids"]
    assert page.locator("#tokens .tok.generated").count() == 12
    assert "12 tokens" in page.inner_text("#gen-status")
    page.fill("#max_new_tokens", "1")
    page.click("#gen")
    wait_until(page, "document.querySelector('#gen-status').textContent.startsWith('1 token (')")
    page.fill("#prompt", TEXT_256)  # a full context: the one new token is never read or shown
    page.click("#gen")
    wait_until(page, "document.querySelector('#count').textContent.endsWith("
                     "'256 / 256 tokens · the generated token is past the context')")


def test_a_stopped_generation_shows_the_ids_it_got(page: Any) -> None:
    """Stop ends the stream before `done`: the page shows the ids streamed so far, the new
    ones underlined (re-encoding their text would not give them back: a byte token that is
    half a character decodes to U+FFFD, which encodes as three other bytes)."""
    tok = get_tokenizer("char", CORPUS)
    prompt, new = tok.encode("The cat"), tok.encode(" sat on")
    events = [("start", {"prompt_ids": prompt})] + [
        ("token", {"id": i, "text": tok.decode([i])}) for i in new]
    body = "".join(f"event: {kind}\ndata: {json.dumps(data)}\n\n" for kind, data in events)
    page.route("**/api/generate", lambda route: route.fulfill(
        status=200, content_type="text/event-stream", body=body))  # no `done`: stopped
    page.fill("#prompt", "The cat")
    page.click("#gen")
    wait_until(page, "window.attnlab.generatedFrom === 7")
    assert page.evaluate("window.attnlab.ids") == prompt + new
    assert page.locator("#tokens .tok.generated").count() == len(new)


def test_256_tokens_stay_responsive(page: Any, tmp_path: Path) -> None:
    shots = Path(os.environ.get("ATTNLAB_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    show(page, TEXT_256)
    timings = page.evaluate("window.attnlab.timings")
    assert timings["render"] < 500, timings
    canvas = page.locator("#heatmap").bounding_box()
    assert canvas["width"] > 256  # at least one pixel per token
    start = time.monotonic()
    for i in range(0, 256, 16):
        page.hover(f"#tokens .tok[data-i='{i}']")
        page.wait_for_selector(f"#tokens .tok.query[data-i='{i}']")
        assert page.evaluate("window.attnlab.timings.highlight") < 100
    hover_s = time.monotonic() - start
    assert hover_s < 10, f"16 hovers took {hover_s:.1f} s"
    # hovering the heatmap itself picks the query row under the pointer
    g = page.evaluate("window.attnlab.geometry")
    corner = g["margin"] + 255.5 * g["cell"]  # the centre of cell (255, 255)
    page.mouse.move(canvas["x"] + corner, canvas["y"] + corner)
    page.wait_for_selector("#tokens .tok.query[data-i='255']", state="attached")
    assert page.is_visible("#tooltip")
    page.screenshot(path=str(shots / "viewer-256.png"), full_page=True)
    page.select_option("#head", "all")
    page.wait_for_selector("#grid figure.mini")
    for i in (40, 200):
        page.hover(f"#tokens .tok[data-i='{i}']")
        page.wait_for_selector(f"#tokens .tok.query[data-i='{i}']")
        assert page.evaluate("window.attnlab.timings.highlight") < 100
    png = page.screenshot(path=str(shots / "viewer-256-all-heads.png"), full_page=True)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


# ----------------------------------------------------------------------------- first run


@contextlib.contextmanager
def opened(browser: Any, url: str, *, offline: bool = False,
           width: int = 1400) -> Iterator[tuple[Any, list[str]]]:
    """A page at `url` in a window `width` px wide; offline: every request to a host other
    than 127.0.0.1 is aborted (and listed), as on a machine without network."""
    context = browser.new_context(viewport={"width": width, "height": 950})
    blocked: list[str] = []
    if offline:
        def route(r: Any) -> None:
            if urlsplit(r.request.url).hostname in ("127.0.0.1", "localhost"):
                r.continue_()
            else:
                blocked.append(r.request.url)
                r.abort()

        context.route("**/*", route)
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=15_000)
    try:
        yield page, blocked
    finally:
        context.close()
    assert problems == [], problems


def test_api_docs_render_with_the_network_blocked(browser: Any, server: str) -> None:
    # /docs was FastAPI's Swagger UI page, whose script and CSS come from a CDN: blank offline
    with opened(browser, server + "/docs", offline=True) as (page, blocked):
        paths = page.eval_on_selector_all(".endpoint", "els => els.map(e => e.dataset.path)")
        schema = httpx.get(server + "/openapi.json").json()
        assert sorted(paths) == sorted(schema["paths"])  # every endpoint, as the schema has it
        assert {"/api/attention", "/api/generate", "/api/model"} <= set(paths)
        generate = page.inner_text(".endpoint[data-path='/api/generate']")
        assert "max_new_tokens" in generate and "≤ 1024" in generate and "temperature" in generate
        assert "attnlab attention viewer" in page.inner_text("#api-info")
        assert blocked == []


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A server over the checkpoint `attnlab train` makes by default: the copy task's
    38-character vocabulary and a 16-token context (weights untrained: shapes are what count)."""
    from attnlab.checkpoint import save_checkpoint
    from attnlab.train.data import TaskDataset

    tok = TaskDataset("copy").tokenizer
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=2, n_head=4,
                          n_embd=64)).eval()
    meta = {"step": 600, "dataset": "copy", "val_loss": 0.0014}
    path = save_checkpoint(tmp_path_factory.mktemp("copy") / "ckpt", model, tok, meta=meta)
    with serving(create_app(model, tok, meta=meta), log_level="error") as port:
        yield f"http://127.0.0.1:{port}", path


def test_the_default_checkpoint_opens_without_an_error_and_generates_as_the_cli(
    browser: Any, copy_run: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # the page opened with an error (its English sample is outside the copy task's
    # vocabulary and longer than 16 tokens), and generated one token fewer than the CLI
    from attnlab.cli import main

    url, ckpt = copy_run
    assert main(["generate", str(ckpt), "abcdefgh|", "--temperature", "0"]) == 0
    cli_new = len(capsys.readouterr().out.rstrip("\n")) - len("abcdefgh|")
    assert cli_new == 8
    with opened(browser, url + "/") as (page, _):
        assert page.inner_text("#status") == ""
        text = page.input_value("#text")
        assert len(text) == 16 and "|" in text
        assert page.evaluate("window.attnlab.tokens.length") == 16
        # the panels stack without a gap between Text and Generate
        gap = page.evaluate("document.getElementById('generate').getBoundingClientRect().top"
                            " - document.getElementById('explore').getBoundingClientRect().bottom")
        assert gap < 24, gap

        page.fill("#text", "typedbyme|")
        page.click("#run")
        wait_until(page, "window.attnlab.tokens.length === 10")
        page.fill("#prompt", "abcdefgh|")
        page.fill("#max_new_tokens", "40")
        page.fill("#temperature", "0")
        page.click("#gen")
        wait_until(page, "window.attnlab.generatedFrom === 9 && window.attnlab.ids.length === 16")
        status = page.inner_text("#gen-status")
        assert status.startswith(f"{cli_new} tokens (context full)"), status
        assert page.input_value("#text") == "typedbyme|"  # what the user typed stays

        # text the model cannot read: the error, and no stale tokens, count or heatmap
        page.fill("#text", "Hello, World")
        page.click("#run")
        wait_until(page, "document.querySelector('#status').classList.contains('error')")
        assert "cannot encode" in page.inner_text("#status")
        assert page.evaluate("window.attnlab.tokens.length") == 0
        assert page.locator("#tokens .tok").count() == 0 and page.inner_text("#count") == ""
