"""The fit check's boundaries and message, and where free memory is read from
(mutation testing, round 3). All fake the free memory; nothing is allocated."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnlab.model.memory as memory
from attnlab.model.memory import DoesNotFitError, Use, check_memory, fit_report

GB = 10**9


def _free(monkeypatch: pytest.MonkeyPatch, nbytes: int | None) -> None:
    monkeypatch.setattr(memory, "available_bytes", lambda device: nbytes)


def test_exactly_the_free_bytes_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """needed == free loads (and `info` says it fits); one byte more is refused."""
    _free(monkeypatch, 4 * 1000 + 100)
    check_memory(1000, torch.float32, "cpu", extra=100)
    assert fit_report(1000, "cpu", extra=100)["float32"]["fits"] is True
    with pytest.raises(DoesNotFitError):
        check_memory(1000, torch.float32, "cpu", extra=101)
    assert fit_report(1000, "cpu", extra=101)["float32"]["fits"] is False


def test_bfloat16_is_suggested_when_it_exactly_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    _free(monkeypatch, 8 * GB + 5)
    with pytest.raises(DoesNotFitError, match=r"in bfloat16 it needs 8\.0 GB, which fits"):
        check_memory(4 * GB, torch.float32, "cpu", extra=5)


def test_the_suggestion_names_the_smaller_need_and_leaves_room_for_the_largest_tensor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _free(monkeypatch, 5 * GB)
    with pytest.raises(DoesNotFitError) as err:
        check_memory(4 * GB, torch.float32, "cpu")  # 16 GB, 8 GB in bfloat16
    assert "even bfloat16 needs 8.0 GB" in str(err.value)
    assert "use a device with 8.0 GB free" in str(err.value)  # the bfloat16 need, not 16 GB
    _free(monkeypatch, 10 * GB)
    with pytest.raises(DoesNotFitError) as err:
        check_memory(8 * GB, torch.bfloat16, "cpu", extra=2 * GB)
    assert "about 4.00B parameters fit here" in str(err.value)  # (10 - 2) GB / 2 bytes


def test_a_bfloat16_load_is_not_told_that_even_bfloat16_needs_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _free(monkeypatch, 1 * GB)
    for dtype in (torch.bfloat16, torch.float16):
        with pytest.raises(DoesNotFitError) as err:
            check_memory(2 * GB, dtype, "cpu")
        assert "even bfloat16" not in str(err.value) and "which fits" not in str(err.value)


@pytest.fixture
def fake_proc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """/proc/meminfo and /sys/fs/cgroup under tmp_path."""
    monkeypatch.setattr(memory, "Path", lambda p: tmp_path / str(p).lstrip("/"))
    (tmp_path / "proc").mkdir()
    (tmp_path / "sys/fs/cgroup").mkdir(parents=True)

    def write(meminfo_kb: int, limit: str | None = None, current: int = 0) -> None:
        (tmp_path / "proc/meminfo").write_text(
            f"MemTotal:       99999999 kB\nMemFree:  1 kB\nMemAvailable:   {meminfo_kb} kB\n")
        cgroup = tmp_path / "sys/fs/cgroup"
        if limit is not None:
            (cgroup / "memory.max").write_text(limit + "\n")
            (cgroup / "memory.current").write_text(f"{current}\n")
    return write


def test_cpu_free_memory_is_memavailable_in_kib(fake_proc) -> None:
    fake_proc(2_000_000)  # no cgroup limit
    assert memory.available_bytes("cpu") == 2_000_000 * 1024
    fake_proc(2_000_000, "max", 123)  # cgroup v2 without a limit
    assert memory.available_bytes("cpu") == 2_000_000 * 1024


def test_cpu_free_memory_is_capped_by_what_the_cgroup_limit_leaves(fake_proc) -> None:
    fake_proc(2_000_000, str(1_000_000_000), current=300_000_000)
    assert memory.available_bytes("cpu") == 700_000_000  # limit - current < MemAvailable
    fake_proc(100, str(1_000_000_000), current=300_000_000)
    assert memory.available_bytes("cpu") == 100 * 1024  # MemAvailable < what the limit leaves
    fake_proc(2_000_000, str(1_000), current=5_000)
    assert memory.available_bytes("cpu") == 0  # over the limit already: nothing, not < 0


def test_cuda_free_memory_is_read_from_the_device_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []

    def mem_get_info(device=None):
        asked.append(device)
        return (7 * GB, 80 * GB)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    assert memory.available_bytes("cuda:1") == 7 * GB
    assert len(asked) == 1 and torch.device(asked[0]) == torch.device("cuda:1")


def test_free_memory_of_a_device_type_neither_cpu_nor_cuda_is_unknown() -> None:
    """Not the host's memory: a load on such a device is never refused by the CPU's figure."""
    for device in ("meta", "mps", "xpu"):
        assert memory.available_bytes(device) is None
        assert fit_report(10, device)["float32"]["fits"] is None


def test_cpu_free_memory_is_capped_by_a_cgroup_v1_limit(fake_proc, tmp_path: Path) -> None:
    v1 = tmp_path / "sys/fs/cgroup/memory"
    v1.mkdir()
    fake_proc(2_000_000)
    (v1 / "memory.limit_in_bytes").write_text("1000000000\n")
    (v1 / "memory.usage_in_bytes").write_text("400000000\n")
    assert memory.available_bytes("cpu") == 600_000_000
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert memory.available_bytes("cpu") == 2_000_000 * 1024


def test_cpu_free_memory_is_capped_by_the_address_space_limit(
        fake_proc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prlimit --as / ulimit -v: past it every allocation fails whatever MemAvailable says."""
    import resource

    fake_proc(8_000_000)
    (tmp_path / "proc/self").mkdir()
    (tmp_path / "proc/self/status").write_text("Name: python\nVmSize:  1000000 kB\n")
    monkeypatch.setattr(resource, "getrlimit", lambda which: (
        (4 * GB, resource.RLIM_INFINITY) if which == resource.RLIMIT_AS else (-1, -1)))
    assert memory.available_bytes("cpu") == 4 * GB - 1_000_000 * 1024
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY,) * 2)
    assert memory.available_bytes("cpu") == 8_000_000 * 1024


def test_uses_beside_the_model_are_counted_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A generation's KV cache scales with the dtype (`elements`); packed float16 copies do
    not (`nbytes`)."""
    cache = Use("the KV cache for 1 row of 8 positions", elements=250)
    packed = Use("the packed float16 copies of the matrices", nbytes=60)
    _free(monkeypatch, 1000 * 4 + 100 + 250 * 4 + 60)
    check_memory(1000, torch.float32, "cpu", extra=100, uses=[cache, packed])
    assert fit_report(1000, "cpu", 100, [cache, packed])["float32"]["fits"] is True
    assert fit_report(1000, "cpu", 100, [cache, packed])["bfloat16"]["bytes"] == 2660
    with pytest.raises(DoesNotFitError) as err:
        check_memory(1000, torch.float32, "cpu", extra=101, uses=[cache, packed])
    assert str(err.value).startswith(
        "the model needs 4.1 kB in float32 (1,000 parameters), the KV cache for 1 row of 8 "
        "positions 1.0 kB more, the packed float16 copies of the matrices 60 bytes more: "
        "5.2 kB in all, but this machine has 5.2 kB free; in bfloat16 it needs 2.7 kB")


def test_the_advice_names_only_the_ways_out_a_caller_has(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _free(monkeypatch, 3 * GB)
    with pytest.raises(DoesNotFitError) as err:
        check_memory(1 * GB, torch.float32, "cpu")  # 4 GB; 2 GB in bfloat16 would fit
    assert str(err.value).endswith("which fits: dtype=torch.bfloat16; force=True tries anyway")
    flags = err.value.advice(dtype="--dtype bfloat16", force="--force")
    assert flags.endswith("which fits: --dtype bfloat16; --force tries anyway")
    # a command that cannot load in bfloat16 (train --init_from) is not told to
    neither = err.value.advice()
    assert "bfloat16" not in neither and "tries anyway" not in neither
    assert neither.endswith("use a device with 4.0 GB free or a smaller model (about 750.0M "
                            "parameters fit here in float32)")


def test_the_refusal_is_public_api_beside_the_loaders_that_raise_it() -> None:
    """load_checkpoint / load_hf raise it; callers catch it without reaching into
    attnlab.model.memory (as attnlab.tokenizers exports NoTokenizerError)."""
    import attnlab
    import attnlab.model

    assert attnlab.DoesNotFitError is attnlab.model.DoesNotFitError is DoesNotFitError
    assert "DoesNotFitError" in attnlab.__all__ and "DoesNotFitError" in attnlab.model.__all__


def test_a_use_held_a_piece_at_a_time_counts_at_most_its_piece(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An export's shard: the whole model's elements where it is smaller, `most` where not,
    in any dtype."""
    shard = Use("the shard being written", elements=1000, most=3000)
    assert shard.bytes_in(torch.float32) == 3000 and shard.bytes_in(torch.bfloat16) == 2000
    _free(monkeypatch, 1000 * 4 + 3000)
    check_memory(1000, torch.float32, "cpu", uses=[shard])
    with pytest.raises(DoesNotFitError, match=r"the shard being written 3\.0 kB more"):
        check_memory(1000, torch.float32, "cpu", extra=1, uses=[shard])


def test_a_use_that_alone_does_not_fit_is_named_with_its_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the model alone fits, the refusal says so and how the caller holds less beside
    it (each fix once), and does not send the user to a smaller model."""
    trace = Use("the traced weights", elements=2000, fix="a shorter text")
    json_text = Use("attention.json", nbytes=9000, fix="a shorter text")
    _free(monkeypatch, 1000 * 4 + 100)
    with pytest.raises(DoesNotFitError) as err:
        check_memory(1000, torch.float32, "cpu", uses=[trace, json_text])
    said = err.value.advice(dtype="--dtype bfloat16", force="--force")
    assert "; the model alone fits (4.0 kB); to hold less beside it: a shorter text; " in said
    assert said.count("a shorter text") == 1
    assert "smaller model" not in said and said.endswith("--force tries anyway")
    _free(monkeypatch, 1000 * 4 - 1)  # the model alone does not fit: the usual advice
    with pytest.raises(DoesNotFitError) as err:
        check_memory(1000, torch.float32, "cpu", uses=[trace, json_text])
    assert "alone fits" not in str(err.value) and "a shorter text" not in str(err.value)


@pytest.mark.parametrize("names, heads, rows", [
    (["attn_weights"], [0, 1, 2, 3], None),
    (["attn_scores", "masked_scores", "attn_weights"], [1, 3], None),
    (["attn_weights"], [2], [-1]),
    (["q", "k", "v", "context", "tok_emb", "pos_emb", "emb"], [0, 1, 2, 3], None),
    (["resid_pre", "mlp_pre", "mlp_hidden", "block_out", "logits"], [0], None),
    (["attn_entropy", "attn_sink", "attn_distance", "attn_max", "attn_received"], [0, 2], None),
])
def test_a_traces_use_is_what_the_trace_keeps(names: list[str], heads: list[int],
                                              rows: list[int] | None) -> None:
    """trace_use reads each name's shape from names.NAMES: the bytes it counts are the
    bytes a real trace keeps, plus a layer's three (T, S) working copies where the trace
    needs attention's explicit path."""
    from attnlab import GPT, GPTConfig
    from attnlab.model.memory import trace_use
    from attnlab.model.trace import Trace

    config = GPTConfig(vocab_size=37, block_size=32, n_layer=3, n_head=4, n_embd=16)
    model = GPT(config).eval()
    T, layers = 20, [0, 2]
    trace = Trace(layers=layers, heads=heads, names=names, rows=rows).run(
        model, torch.randint(0, 37, (1, T)))
    use = trace_use(config, T, names, layers=len(layers), heads=len(heads),
                    rows=None if rows is None else len(rows))
    R = T if rows is None else len(rows)
    working = 3 * len(heads) * R * T if {"attn_scores", "attn_weights"} & set(names) else 0
    assert use.bytes_in(torch.float32) == trace.nbytes() + 4 * working
    assert use.bytes_in(torch.bfloat16) == (trace.nbytes() + 4 * working) // 2
    assert f"of 2 layers x {len(heads)} head" in use.what and "over 20 tokens" in use.what


def test_a_traces_use_counts_nothing_for_names_the_model_never_computes() -> None:
    from attnlab import GPTConfig
    from attnlab.model.memory import trace_use

    rope = GPTConfig(vocab_size=37, block_size=32, n_layer=2, n_head=2, n_embd=16, pos="rope")
    assert trace_use(rope, 10, ["pos_emb"], layers=2, heads=2).elements == 0
    assert trace_use(rope, 10, ["tok_emb"], layers=2, heads=2).elements == 10 * 16
