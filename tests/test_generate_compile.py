"""generate(..., compile=True): the compiled fixed-shape decode step (model/compiled_decode.py)
gives the eager path's ids, is compiled once per shape, and leaves edits on the eager path.

Compiling is slow on a 2-core CPU (Inductor builds C++ kernels), so the CPU tests share four
graphs: a GPT-2-shaped and a Llama-shaped model, each at batch 1 and at a left-padded batch
of 3. Every other test reuses one of them (same config, batch size and cache length).
"""

from __future__ import annotations

import functools

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.generate import generate, stream
from attnlab.interp.edits import ablate
from attnlab.model.compiled_decode import cache_length, compiled_decode, compiled_decodes
from attnlab.model.decode import half_weights
from helpers import assert_fixed_steps_match, left_padded

V = 97


def _gpt2() -> GPT:
    """GPT-2's wiring (learned positions, LayerNorm, GELU, biases, tied head); block 32."""
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=V, block_size=32, n_layer=2, n_head=4, n_embd=32,
                         init_std=0.3)).eval()


def _llama() -> GPT:
    """Llama's wiring with grouped-query attention (4 query heads, 2 key/value heads), RoPE,
    RMSNorm, SwiGLU, no biases, an untied head; layer 0 with a sliding window of 6; Gemma 2's
    soft caps of the scores and the logits (small enough to bend them)."""
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=V, block_size=64, n_layer=2, n_head=4, n_kv_head=2,
                         n_embd=32, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False,
                         tie_weights=False, sliding_window=6, window_layers=[0],
                         attn_logit_softcapping=2.0, final_logit_softcapping=5.0,
                         init_std=0.3)).eval()


MODELS = {"gpt2": _gpt2, "llama": _llama}
# one model of each kind shared by the tests that only read it: its kept compiled steps
# (compiled_decode keeps them with the model) then serve them all, compiled once
SHARED = {kind: functools.cache(build) for kind, build in MODELS.items()}
BATCHES = {"batch1": [5], "left_padded": [5, 2, 4]}
# the two cases whose graphs no other test reuses: each costs a compilation of its own
# (10-50 s cold on a 2-core CPU), and the other two cover both models and both batch kinds
CASES = [
    ("gpt2", "batch1"),
    pytest.param("gpt2", "left_padded", marks=pytest.mark.slow),
    pytest.param("llama", "batch1", marks=pytest.mark.slow),
    ("llama", "left_padded"),
]


def _prompt(lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
    ids, mask = left_padded(lengths, vocab=V, seed=seed)
    return ids, (mask if len(lengths) > 1 else None)


def _unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@pytest.mark.parametrize(("kind", "batch"), CASES)
def test_compiled_greedy_ids_equal_eager(kind: str, batch: str) -> None:
    model = SHARED[kind]()
    ids, mask = _prompt(BATCHES[batch])
    eager = generate(model, ids, mask, max_new_tokens=12, temperature=0)
    compiled = generate(model, ids, mask, max_new_tokens=12, temperature=0, compile=True)
    assert torch.equal(compiled, eager)
    assert len(set(eager[0, -12:].tolist())) > 3  # a varied continuation, not one id repeated
    step = compiled_decode(model, len(BATCHES[batch]), 17)  # the kept one: 17 -> 32 slots
    assert step in compiled_decodes(model) and step.max_len == 32
    assert step.compile_seconds is not None and step.compile_seconds > 0
    assert step.cuda_graph is False  # a CPU compiles without graphs


@pytest.mark.parametrize(("kind", "batch"), [("gpt2", "batch1"), ("llama", "left_padded")])
def test_a_repetition_penalty_leaves_the_compiled_graph_alone(kind: str, batch: str) -> None:
    """The seen ids live outside the compiled step (a fixed (B, V + 1) buffer the loop writes
    in place), and so does the n-gram ban (read from the loop's history of ids), so a
    penalized or banned generation replays the graph compiled without one and gives the
    eager ids."""
    model = SHARED[kind]()
    ids, mask = _prompt(BATCHES[batch])
    plain = generate(model, ids, mask, max_new_tokens=12, temperature=0, compile=True)
    graphs = _unique_graphs()
    for how in ({"repetition_penalty": 3.0}, {"no_repeat_ngram_size": 1}):
        eager = generate(model, ids, mask, max_new_tokens=12, temperature=0, **how)
        compiled = generate(model, ids, mask, max_new_tokens=12, temperature=0, compile=True,
                            **how)
        assert torch.equal(compiled, eager) and not torch.equal(compiled, plain), how
    assert _unique_graphs() == graphs  # replayed, not compiled again


def test_each_compiled_step_has_a_compilation_budget_of_its_own() -> None:
    """Dynamo fails (fullgraph=True) once one code object holds recompile_limit compilations;
    every kept step compiles its own copy, so two shapes fit a limit of one. (Set through
    config.patch: pytest 9.2's monkeypatch undoes a setattr on torch's config modules by
    deleting the option, which failed every later compiled test.)"""
    model = _gpt2()
    for lengths in BATCHES.values():
        ids, mask = _prompt(lengths)
        with torch._dynamo.config.patch(recompile_limit=1):
            out = generate(model, ids, mask, max_new_tokens=12, temperature=0, compile=True)
        assert torch.equal(out, generate(model, ids, mask, max_new_tokens=12, temperature=0))
    assert len(compiled_decodes(model)) == 2


def test_compiled_step_logits_equal_the_decode_step() -> None:
    """Step by step over a left-padded batch: the compiled step's logits equal
    `DecodeStep`'s within float32 rounding (it attends over the whole masked buffer)."""
    model = SHARED["llama"]()
    ids, mask = _prompt([5, 2, 4])
    assert mask is not None
    compiled = compiled_decode(model, 3, 17)
    eager_cache = assert_fixed_steps_match(model, compiled, ids, mask)
    assert compiled.cache.seq_len == eager_cache.seq_len == 11


def test_compiled_sliding_window_past_block_size() -> None:
    """Past block_size generation re-encodes the last window into the same static cache."""
    model = SHARED["gpt2"]()
    ids, _ = _prompt([5])
    eager = generate(model, ids, max_new_tokens=40, temperature=0, sliding_window=True)
    compiled = generate(model, ids, max_new_tokens=40, temperature=0, sliding_window=True,
                        compile=True)
    assert torch.equal(compiled, eager)


def test_two_live_compiled_streams_of_one_shape_give_the_eager_ids() -> None:
    """One static cache per shape: a second stream started while the first still runs
    decodes eagerly (with a warning) instead of overwriting the first one's cache; once
    both end, the compiled step serves the next generation again."""
    model = SHARED["gpt2"]()
    a, _ = _prompt([5], seed=3)
    b, _ = _prompt([5], seed=4)
    want = [generate(model, p, max_new_tokens=12, temperature=0)[0, 5:] for p in (a, b)]
    first = stream(model, a, max_new_tokens=12, temperature=0, compile=True)
    got_a = [next(first)]
    with pytest.warns(UserWarning, match="serves a generation still running"):
        second = stream(model, b, max_new_tokens=12, temperature=0, compile=True)
        got_b = [next(second)]
    got_a += list(first)
    got_b += list(second)
    assert torch.equal(torch.cat(got_a), want[0]) and torch.equal(torch.cat(got_b), want[1])
    (step,) = [s for s in compiled_decodes(model) if (s.batch_size, s.max_len) == (1, 32)]
    assert not step.in_use  # both streams ended
    again = generate(model, b, max_new_tokens=12, temperature=0, compile=True)  # no warning
    assert torch.equal(again[0, 5:], want[1])


def test_edits_take_the_eager_path_with_compile() -> None:
    model = SHARED["gpt2"]()
    ids, _ = _prompt([5])
    edits = ablate([(0, 1), (1, 2)])
    edited = generate(model, ids, max_new_tokens=12, temperature=0, edits=edits, compile=True)
    assert torch.equal(edited, generate(model, ids, max_new_tokens=12, temperature=0,
                                        edits=edits))
    plain = generate(model, ids, max_new_tokens=12, temperature=0, compile=True)
    assert not torch.equal(edited, plain)  # the edit changed the output


def test_compile_refuses_float16_weights_before_the_first_step() -> None:
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        pytest.skip("float16 weights need fbgemm (x86 CPUs)")
    model = half_weights(_gpt2())
    ids, _ = _prompt([5])
    with pytest.raises(ValueError, match="decode_weights = 'float32'"):
        stream(model, ids, max_new_tokens=4, compile=True)


def test_cache_length_rounds_up_to_a_power_of_two_within_block_size() -> None:
    assert [cache_length(n, 64) for n in (1, 2, 3, 17, 32, 33, 64, 100)] == \
        [1, 2, 4, 32, 32, 64, 64, 64]


def test_a_second_generation_reuses_the_compiled_step() -> None:
    # last of the CPU tests: reset clears every kept step's compilation, and so that this
    # test's first call compiles, whatever ran before
    torch._dynamo.reset()
    model = _gpt2()
    ids, _ = _prompt([5])
    before = _unique_graphs()
    generate(model, ids, max_new_tokens=12, temperature=0, compile=True)
    assert _unique_graphs() == before + 1  # the counter sees a compilation
    (step,) = compiled_decodes(model)
    first = step.compile_seconds
    other, _ = _prompt([7], seed=2)  # another prompt, the same cache length (7 + 12 -> 32)
    out = generate(model, other, max_new_tokens=12, temperature=0, compile=True)
    assert _unique_graphs() == before + 1  # nothing compiled again
    assert compiled_decodes(model) == [step] and step.compile_seconds == first
    assert torch.equal(out, generate(model, other, max_new_tokens=12, temperature=0))


# ----------------------------------------------------------------------------- CUDA graphs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# Inductor warns that float32 products could use TF32 tensor cores; these tests want float32
tf32_note = pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores:UserWarning")


@pytest.mark.cuda
@cuda
@tf32_note
@pytest.mark.parametrize("batch", BATCHES)
def test_cuda_graph_ids_equal_eager_in_float32(batch: str) -> None:
    model = _llama().cuda()
    ids, mask = _prompt(BATCHES[batch])
    ids, mask = ids.cuda(), None if mask is None else mask.cuda()
    eager = generate(model, ids, mask, max_new_tokens=16, temperature=0)
    compiled = generate(model, ids, mask, max_new_tokens=16, temperature=0, compile=True)
    assert torch.equal(compiled, eager)
    (step,) = compiled_decodes(model)
    assert step.cuda_graph  # recorded as a CUDA graph: Inductor skipped nothing
    for penalized in ({"temperature": 0, "repetition_penalty": 3.0},
                      {"temperature": 0, "no_repeat_ngram_size": 2}):
        eager = generate(model, ids, mask, max_new_tokens=16, **penalized)  # type: ignore[arg-type]
        assert torch.equal(generate(model, ids, mask, max_new_tokens=16, compile=True,
                                    **penalized), eager)  # type: ignore[arg-type]
    assert compiled_decodes(model) == [step]  # the same graph replayed


@pytest.mark.cuda
@cuda
@tf32_note
def test_cuda_graph_bfloat16_runs_and_is_not_compiled_again() -> None:
    torch._dynamo.reset()
    model = _gpt2().cuda().to(torch.bfloat16)
    ids, _ = _prompt([5])
    ids = ids.cuda()
    before = _unique_graphs()
    out = generate(model, ids, max_new_tokens=20, temperature=0, compile=True)
    assert out.shape == (1, 25) and int(out.max()) < V
    assert _unique_graphs() == before + 1
    (step,) = compiled_decodes(model)
    assert step.cuda_graph
    again = generate(model, ids, max_new_tokens=20, temperature=0, compile=True)
    assert _unique_graphs() == before + 1  # replayed, not compiled again
    assert torch.equal(again, out)  # a replay computes what the first run did
