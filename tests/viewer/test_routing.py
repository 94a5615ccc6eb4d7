"""A mixture of experts' routing in the viewer (`payloads.routing_payload`): show()'s payload
and POST /api/routing carry each layer's expert_weights of the row shown, to 4 significant
digits, and each expert's share of the tokens; a dense model's carry none. What the browser
draws from them is test_routing_browser.py's."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_notebook import payload

from attnlab import GPT, GPTConfig, Trace, show
from attnlab.tokenizers import CharTokenizer
from attnlab.viewer.payloads import attention_payload, routing_payload

TOK = CharTokenizer(sorted(set("abcdefghijklmnopqrstuvwxyz .")))
TEXT = "the cat sat on the mat"


def mixture(**overrides: Any) -> GPT:
    """Two layers of four experts, each token through two, random and the same each call."""
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**dict(vocab_size=TOK.vocab_size, block_size=32, n_layer=2,
                                   n_head=2, n_embd=16, n_experts=4, experts_per_token=2),
                            **overrides})).eval()


def dense() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=TOK.vocab_size, block_size=32, n_layer=2, n_head=2,
                         n_embd=16)).eval()


def assert_routing(got: dict[str, Any], weights: list[torch.Tensor], k: int,
                   real: torch.Tensor | None = None) -> None:
    """`got` (a routing payload) holds `weights` ((T, E) per layer) to 4 significant digits,
    the same experts chosen (nonzero), and each expert's share of the `real` tokens (T,)."""
    want = torch.stack(weights).double()  # (L, T, E)
    sent = torch.tensor(got["weights"], dtype=torch.float64)  # (L, T, E)
    assert sent.shape == want.shape
    assert torch.equal(sent != 0, want != 0)  # the chosen experts, even a tiny weight
    assert bool(((sent - want).abs() <= 5e-4 * want.abs()).all())  # 4 significant digits
    real = torch.ones(want.shape[1], dtype=torch.bool) if real is None else real
    shares = torch.tensor(got["shares"], dtype=torch.float64)  # (L, E)
    torch.testing.assert_close(shares, (want[:, real] != 0).double().mean(dim=1),
                               atol=5e-5, rtol=0)
    # each token chooses k experts: a layer's shares of the tokens add up to k
    torch.testing.assert_close(shares.sum(dim=1), torch.full((len(weights),), float(k),
                                                             dtype=torch.float64),
                               atol=want.shape[2] * 5e-5, rtol=0)
    assert got["top_k"] == k and got["experts"] == want.shape[2]


def test_shows_payload_is_the_traces_expert_weights_of_the_row_shown() -> None:
    """A trace of a batch (a mixture records expert_weights without a names filter): row 1's
    routing, every layer, labelled with the row's tokens."""
    m = mixture()
    ids = torch.tensor([TOK.encode("the cat sat"), TOK.encode("a dog ran a")])  # (2, 11)
    trace = Trace().run(m, ids)
    assert (0, "expert_weights") in trace
    data = payload(show(trace, TOK, ids=ids, row=1))
    routing = data["routing"]
    assert routing["layers"] == [0, 1] and routing["first"] == 0
    assert routing["tokens"] == data["tokens"] == TOK.pieces(ids[1].tolist())
    assert_routing(routing, [trace.get("expert_weights", la)[1] for la in range(2)], k=2)
    other = payload(show(trace, TOK, ids=ids, row=0))["routing"]
    assert other["weights"] != routing["weights"]  # the row asked about, not row 0


def test_a_model_shown_traces_its_routing_and_opens_the_routing_tab() -> None:
    m = mixture()
    data = payload(show(m, TOK, TEXT, view="routing"))
    assert data["view"] == "routing"
    trace = Trace(names="expert_weights").run(m, torch.tensor([TOK.encode(TEXT)]))
    assert_routing(data["routing"], [trace.get("expert_weights", la)[0] for la in range(2)],
                   k=2)
    assert data["routing"]["note"].startswith(f"shares of the {len(TEXT)} tokens that chose")


def test_pads_are_routed_but_left_out_of_the_shares() -> None:
    m = mixture()
    batch, mask = TOK.encode_batch(["the cat sat", "a dog"])  # row 1: 6 pads, 5 tokens
    routing = payload(show(m, TOK, ids=batch, row=1, attention_mask=mask))["routing"]
    trace = Trace(names="expert_weights").run(m, batch, mask)
    assert_routing(routing, [trace.get("expert_weights", la)[1] for la in range(2)], k=2,
                   real=mask[1].bool())
    assert routing["tokens"][:6] == ["<pad>"] * 6
    assert "shares of the 5 tokens (pads left out)" in routing["note"]


def test_the_routing_of_a_kv_cache_step_is_its_queries() -> None:
    """One decode step after a 6-token prefill routes 1 token: the 7th, #6."""
    m = mixture()
    ids = torch.tensor([TOK.encode("the cat")])  # (1, 7)
    cache = m.new_cache(1)
    m(ids[:, :6], kv_cache=cache)
    step = Trace()
    m(ids[:, 6:], kv_cache=cache, trace=step)
    routing = payload(show(step, TOK, ids=ids[0].tolist()))["routing"]
    assert routing["first"] == 6 and routing["tokens"] == ["t"]
    assert_routing(routing, [step.get("expert_weights", la)[0] for la in range(2)], k=2)


def test_max_cells_bounds_the_routing_too_and_keeps_a_layer() -> None:
    m = mixture()
    cells = len(TEXT) * 4  # one layer's routing: T x E
    assert payload(show(m, TOK, TEXT, max_cells=2 * cells))["routing"]["layers"] == [0, 1]
    assert payload(show(m, TOK, TEXT, max_cells=2 * cells - 1))["routing"]["layers"] == [0]
    assert payload(show(m, TOK, TEXT, max_cells=1))["routing"]["layers"] == [0]


def test_a_tiny_chosen_weight_stays_chosen() -> None:
    """Weights go out to 4 significant digits: 4 decimals would send a chosen expert's
    0.00001 as a skipped one's 0."""
    weights = torch.tensor([[0.99999, 0.00001, 0.0], [0.0, 0.25, 0.75]])  # (T, E)
    got = routing_payload([weights], [3], ["a", "b"])
    assert got["weights"] == [[[1.0, 1e-05, 0], [0, 0.25, 0.75]]]
    assert got["shares"] == [[0.5, 1.0, 0.5]] and got["top_k"] == 2
    with pytest.raises(ValueError, match="3 token labels for 2 routed tokens"):
        routing_payload([weights], [0], ["a", "b", "c"])


def test_a_dense_model_carries_no_routing() -> None:
    m = dense()
    data = payload(show(m, TOK, TEXT))
    assert "routing" not in data
    trace = Trace().run(m, torch.tensor([TOK.encode(TEXT)]))
    assert "routing" not in payload(show(trace, TOK, TEXT))
    with pytest.raises(ValueError, match=r"view='routing' .* \(n_experts unset\)"):
        show(m, TOK, TEXT, view="routing")
    # the page's attention answer is the same with or without experts: nothing about routing
    keys = set(attention_payload(m, TOK.encode(TEXT), TOK, layers=[0])["layers"][0])
    assert keys == set(attention_payload(mixture(), TOK.encode(TEXT), TOK,
                                         layers=[0])["layers"][0])
    assert not any("rout" in key or "expert" in key for key in keys)


# ----------------------------------------------------------------------------- /api/routing


@pytest.fixture(scope="module")
def clients() -> tuple[Any, Any]:
    """TestClients of a mixture and of a dense model."""
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
    from fastapi.testclient import TestClient

    from attnlab import ServeConfig, create_app

    config = ServeConfig(max_weights=200)
    return (TestClient(create_app(mixture(), TOK, config=config)),
            TestClient(create_app(dense(), TOK, config=config)))


def test_the_api_answers_the_routing_of_a_text(clients: tuple[Any, Any]) -> None:
    client = clients[0]
    r = client.post("/api/routing", json={"text": "the cat"})
    assert r.status_code == 200, r.text
    got = r.json()
    ids = TOK.encode("the cat")
    assert got["ids"] == ids and got["tokens"] == TOK.pieces(ids) and got["layers"] == [0, 1]
    trace = Trace(names="expert_weights").run(mixture(), torch.tensor([ids]))
    assert_routing(got, [trace.get("expert_weights", la)[0] for la in range(2)], k=2)
    one = client.post("/api/routing", json={"ids": ids, "layers": [1, 1]}).json()
    assert one["layers"] == [1] and one["weights"] == got["weights"][1:]
    assert client.get("/api/model").json()["config"]["n_experts"] == 4  # the page asks it


@pytest.mark.parametrize(("body", "error"), [
    ({"text": "the cat", "layers": [2]}, "layers [2] must be a non-empty list of layer "
                                         "indices in [0, 2)"),
    ({"text": "the cat", "layers": []}, "layers [] must be a non-empty list"),
    ({"text": "the cat sat on the mat ab."}, "2 layers x 26 tokens x 4 experts are 208 "
     'weights, over the limit of 200; ask for fewer layers, e.g. "layers": [0]'),
    ({"text": "the cat", "ids": [1]}, "send exactly one of 'text' or 'ids'"),
])
def test_bad_requests_name_the_value_and_the_fix(clients: tuple[Any, Any], body: Any,
                                                 error: str) -> None:
    r = clients[0].post("/api/routing", json=body)  # apps of max_weights=200
    assert r.status_code == 422 and error in r.json()["error"], r.text


def test_a_dense_model_is_refused_by_name(clients: tuple[Any, Any]) -> None:
    r = clients[1].post("/api/routing", json={"text": "the cat"})
    assert r.status_code == 422
    assert r.json()["error"].startswith("this model routes no token: its MLP is one dense MLP")
    assert "n_experts set" in r.json()["error"]
    assert clients[1].get("/api/model").json()["config"]["n_experts"] is None


def test_a_dense_first_layer_is_left_out_of_the_routing_and_refused_by_name() -> None:
    """DeepSeek-V3's dense first layers (dense_layers) route nothing: the answer holds the
    mixtures' layers alone, weights times routed_scaling (above 1), and asking for a dense
    layer is refused by name."""
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
    from fastapi.testclient import TestClient

    from attnlab import create_app

    model = mixture(n_layer=3, dense_layers=1, router_scoring="sigmoid", routed_scaling=2.5)
    client = TestClient(create_app(model, TOK))
    got = client.post("/api/routing", json={"text": TEXT}).json()
    assert got["layers"] == [1, 2]
    trace = Trace(names=["expert_weights"]).run(model, torch.tensor([TOK.encode(TEXT)]))
    assert_routing(got, [trace.get("expert_weights", i)[0] for i in (1, 2)], k=2)
    assert max(w for layer in got["weights"] for row in layer for w in row) > 1
    r = client.post("/api/routing", json={"text": "the cat", "layers": [0, 1]})
    assert r.status_code == 422
    assert "layers [0] have one dense MLP (the first dense_layers=1 blocks)" in r.json()["error"]


def test_dense_layers_between_the_mixtures_are_left_out_and_refused_by_name() -> None:
    """ERNIE 4.5's mixture every few layers (mixture_layers): the answer holds those layers
    alone, and a dense one asked for is refused naming the mixtures' layers."""
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
    from fastapi.testclient import TestClient

    from attnlab import create_app

    model = mixture(n_layer=4, mixture_layers=[1, 3], router_scoring="softmax_corrected",
                    router_norm_min=0.9)
    client = TestClient(create_app(model, TOK))
    got = client.post("/api/routing", json={"text": TEXT}).json()
    assert got["layers"] == [1, 3]
    trace = Trace(names=["expert_weights"]).run(model, torch.tensor([TOK.encode(TEXT)]))
    assert_routing(got, [trace.get("expert_weights", i)[0] for i in (1, 3)], k=2)
    r = client.post("/api/routing", json={"text": "the cat", "layers": [1, 2]})
    assert r.status_code == 422
    assert "layers [2] have one dense MLP and route nothing; ask for layers among the " \
        "mixtures' [1, 3]" in r.json()["error"]
