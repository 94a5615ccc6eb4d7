"""hf/files.py and the registry's weight checks: sharded and .bin weights, heads that are
missing or stored while tied, stray weights, tokenizer BOS/EOS, and the CLI on a Llama dir."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import load_hf, save_hf
from attnlab.cli import main
from attnlab.generate import generate, generate_text
from attnlab.hf import load_hf_tokenizer
from attnlab.load import load_checkpoint
from attnlab.model.gpt import GPT, GPTConfig
from attnlab.tokenizers import Tokenizer, load_tokenizer

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = ["<s>", "</s>", "<pad>", "the", "quick", "brown", "fox", "jumps", "over", "lazy",
         "dog", "a", "cat"]


def llama(tie: bool, vocab: int = 64, **fields: object) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=tie, initializer_range=0.2, bos_token_id=0, eos_token_id=1,
        pad_token_id=2, **fields,
    )
    return transformers.LlamaForCausalLM(config).eval()


def write_tokenizer(directory: Path, add_bos: bool = True) -> None:
    """A word-level tokenizer.json (13 ids, fewer than the model's 64: padded vocab, as
    Pythia's), with <s> / </s> named in tokenizer_config.json."""
    tk = tokenizers
    backend = tk.Tokenizer(tk.models.WordLevel({w: i for i, w in enumerate(WORDS)},
                                               unk_token="<pad>"))
    backend.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
    backend.decoder = tk.decoders.WordPiece(prefix="##")  # joins words with spaces
    backend.add_special_tokens(WORDS[:3])
    backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": add_bos}))


def logits_equal(hf: torch.nn.Module, ours: torch.nn.Module) -> None:
    ids = torch.randint(3, 13, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)


def test_sharded_safetensors_and_pytorch_bin_load_the_same(tmp_path: Path) -> None:
    hf = llama(tie=False)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    logits_equal(hf, load_hf(tmp_path / "sharded"))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text((tmp_path / "sharded" / "config.json")
                                                  .read_text())
    torch.save(hf.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    logits_equal(hf, load_hf(tmp_path / "bin"))


def _rewrite_weights(directory: Path, change: object) -> None:
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    weights = load_file(str(path))
    change(weights)  # type: ignore[operator]
    save_file(weights, str(path), {"format": "pt"})


def test_untied_without_lm_head_is_an_error_not_a_random_head(tmp_path: Path) -> None:
    llama(tie=False).save_pretrained(tmp_path)
    _rewrite_weights(tmp_path, lambda w: w.pop("lm_head.weight"))
    with pytest.raises(ValueError, match=r"^llama config.json has tie_word_embeddings=false but "
                       r"the checkpoint has no lm_head.weight; refusing to run with a random "
                       r"output head$"):
        load_hf(tmp_path)


def test_tied_with_a_stored_lm_head_does_what_transformers_does(tmp_path: Path) -> None:
    """A tied config whose file also holds lm_head.weight: the same tensor stays tied; a
    different one is used as an untied head (transformers 5 unties it, with a warning)."""
    hf = llama(tie=True)
    hf.save_pretrained(tmp_path)
    _rewrite_weights(tmp_path, lambda w: w.update(
        {"lm_head.weight": w["model.embed_tokens.weight"].clone()}))
    ours = load_hf(tmp_path)
    assert ours.lm_head.weight is ours.wte.weight
    logits_equal(hf, ours)
    _rewrite_weights(tmp_path, lambda w: w.update(
        {"lm_head.weight": torch.randn_like(w["model.embed_tokens.weight"])}))
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()  # logs why
    ours = load_hf(tmp_path)
    assert ours.lm_head.weight is not ours.wte.weight and not ours.config.tie_weights
    logits_equal(reloaded, ours)


def test_a_weight_the_config_does_not_account_for_is_an_error(tmp_path: Path) -> None:
    llama(tie=True).save_pretrained(tmp_path)
    _rewrite_weights(tmp_path, lambda w: w.update(
        {"model.layers.0.self_attn.o_proj.bias": torch.zeros(32)}))
    with pytest.raises(ValueError, match=r"weights the config does not account for: "
                       r"\['model.layers.0.self_attn.o_proj.bias'\]"):
        load_hf(tmp_path)


def test_tokenizer_takes_bos_and_eos_from_the_directory(tmp_path: Path) -> None:
    write_tokenizer(tmp_path)
    tokenizer = load_hf_tokenizer(tmp_path)
    assert tokenizer.encode("the quick fox") == [0, 3, 4, 6]  # <s> prepended
    assert tokenizer.eot_id == 1  # </s>: generation stops there
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [10, 1]}))
    tokenizer = load_hf_tokenizer(tmp_path)
    assert tokenizer.eot_id == 10  # generation_config.json wins; it pads an ended row
    assert tokenizer.stop_ids == (10, 1)  # each of its EOS ids ends a generation
    write_tokenizer(tmp_path, add_bos=False)
    assert load_hf_tokenizer(tmp_path).encode("the quick fox") == [3, 4, 6]


def test_load_tokenizer_reads_a_hugging_face_directory(tmp_path: Path) -> None:
    """`load_tokenizer("smollm")`, the tokenizer beside `load_hf("smollm")`: it read
    transformers' tokenizer_config.json as attnlab's and called the directory corrupted."""
    llama(tie=True).save_pretrained(tmp_path)
    write_tokenizer(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.encode("the quick fox") == [0, 3, 4, 6]  # <s> prepended, as load_hf's
    assert tokenizer.eot_id == load_checkpoint(tmp_path).tokenizer.eot_id


def test_an_empty_prompt_starts_from_the_bos_as_in_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen's tokenizer adds no BOS; with nothing to continue, transformers' generate()
    starts from bos_token_id (<|endoftext|>), not from the first EOS (<|im_end|>)."""
    import attnlab.generate as generate_module

    write_tokenizer(tmp_path, add_bos=False)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [10, 1]}))
    tokenizer = load_hf_tokenizer(tmp_path)
    started: list[list[int]] = []
    real_stream = generate_module.stream

    def stream(model: Any, ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        started.append(ids[:, -1].tolist())
        return real_stream(model, ids, *args, **kwargs)

    monkeypatch.setattr(generate_module, "stream", stream)
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=1, n_embd=8)).eval()
    generate_text(model, tokenizer, ["", "the"], max_new_tokens=1)
    assert started == [[0, 3]]  # <s> (the BOS), where eot_id is 10


def test_cli_reads_a_llama_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = llama(tie=True)
    hf.save_pretrained(tmp_path / "hf")
    write_tokenizer(tmp_path / "hf")
    ckpt = load_checkpoint(tmp_path / "hf")  # what info / inspect / serve / generate call
    assert ckpt.meta["family"] == "llama" and ckpt.model.config.vocab_size == 64
    assert main(["info", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert "vocab 64" in out
    # what generation will do with the directory's special tokens, before it is tried
    assert "(13 ids); generation stops at '</s>' (1); '<s>' (0) prepended" in out
    ids = torch.tensor([ckpt.tokenizer.encode("the quick")])  # (1, 3), <s> first
    expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                           min_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=2)
    assert torch.equal(generate(ckpt.model, ids, max_new_tokens=6, temperature=0), expected)
    args = ["generate", str(tmp_path / "hf"), "the quick", "--max-new-tokens", "6",
            "--temperature", "0"]
    assert main(args) == 0
    completion = generate_text(ckpt.model, ckpt.tokenizer, ["the quick"], max_new_tokens=6,
                               temperature=0)[0]
    assert capsys.readouterr().out == "the quick" + completion + "\n"
    args = ["inspect", str(tmp_path / "hf"), "the quick fox", "--out", str(tmp_path / "figs"),
            "--layer", "0", "--head", "0", "--what", "weights"]
    assert main(args) == 0
    # tokens as they read in the text (this decoder joins words with spaces)
    assert "4 tokens: '<s>' ' the' ' quick' ' fox'" in capsys.readouterr().out


def test_save_hf_copies_the_tokenizer_files(tmp_path: Path) -> None:
    hf = llama(tie=False)
    hf.save_pretrained(tmp_path / "src")
    write_tokenizer(tmp_path / "src")
    ckpt = load_checkpoint(tmp_path / "src")
    save_hf(tmp_path / "out", ckpt.model, ckpt.tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "src" / name).read_bytes()
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (0, 1)
    logits_equal(hf, load_hf(tmp_path / "out"))


def test_an_attnlab_checkpoint_of_a_hf_model_keeps_its_special_tokens(tmp_path: Path) -> None:
    """load a Hugging Face directory, save it as an attnlab checkpoint, load that: the same
    BOS is prepended, generation stops at the same EOS, pads with the same id."""
    from attnlab.checkpoint import save_checkpoint

    llama(tie=True).save_pretrained(tmp_path / "src")
    write_tokenizer(tmp_path / "src")
    (tmp_path / "src" / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [10, 12]}))
    ckpt = load_checkpoint(tmp_path / "src")
    save_checkpoint(tmp_path / "ckpt", ckpt.model, ckpt.tokenizer)
    again = load_checkpoint(tmp_path / "ckpt").tokenizer
    before = ckpt.tokenizer
    assert again.encode("the quick fox") == before.encode("the quick fox") == [0, 3, 4, 6]
    assert (again.eot_id, again.pad_id) == (before.eot_id, before.pad_id) == (10, 2)
    assert again.stop_ids == before.stop_ids == (10, 12)
    assert again.identity() == before.identity()
    save_hf(tmp_path / "out", ckpt.model, again)  # exported: transformers stops at both
    assert json.loads((tmp_path / "out" / "config.json").read_text())["eos_token_id"] == [10, 12]

    config = tmp_path / "ckpt" / "tokenizer_config.json"
    broken = json.loads(config.read_text())
    broken["special"]["add_bos"] = "yes"
    config.write_text(json.dumps(broken))
    with pytest.raises(ValueError, match=r"not a valid tokenizer config.*add_bos"):
        load_checkpoint(tmp_path / "ckpt")


def test_patch_answers_are_read_without_the_bos(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory whose tokenizer prepends <s> made every --answer two tokens ("is 2
    tokens; give exactly one token"); the answer continues the prompt, so no BOS."""
    llama(tie=True).save_pretrained(tmp_path)
    write_tokenizer(tmp_path)
    tokenizer = load_hf_tokenizer(tmp_path)
    assert tokenizer.encode("fox") == [0, 6] and tokenizer.encode_continuation("fox") == [6]
    assert main(["patch", str(tmp_path), "--clean", "the quick brown", "--corrupt",
                 "the lazy brown", "--answer", "fox", "--wrong", "dog",
                 "--out", str(tmp_path / "patch")]) == 0
    record = json.loads((tmp_path / "patch" / "patch.json").read_text())
    assert record["answer"] == {"text": "fox", "id": 6}  # what was patched, in the JSON too
    assert record["wrong"] == {"text": "dog", "id": 10}


def test_a_word_without_its_leading_space_is_named_with_the_fix() -> None:
    from attnlab.cli.common import CLIError
    from attnlab.cli.patch import _one_token
    from attnlab.tokenizers import WordTokenizer

    class Spaced(WordTokenizer):  # GPT-2-like: " jumps" is one token, "jumps" two
        def encode_continuation(self, text: str) -> list[int]:
            return [7] if text == " jumps" else [1, 2]

    tok = Spaced(["a", "b"])
    with pytest.raises(CLIError, match=r"'jumps' is 2 tokens; .*' jumps' \(with its leading "
                                       r"space\) is one token"):
        _one_token(tok, "jumps", "--answer")
    assert _one_token(tok, " jumps", "--answer") == 7


def sentencepiece_like(directory: Path) -> None:
    """Llama 2's / Mistral's tokenizer.json shape: words carry a "▁" for their space, and
    the decoder strips the space of a text's first word."""
    tk = tokenizers
    words = ["<unk>", "<s>", "</s>", "▁The", "▁capital", "▁of", "▁France", "▁is", "▁Paris"]
    backend = tk.Tokenizer(tk.models.WordLevel({w: i for i, w in enumerate(words)},
                                               unk_token="<unk>"))
    backend.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = tk.decoders.Sequence([tk.decoders.Replace("▁", " "), tk.decoders.Fuse(),
                                            tk.decoders.Strip(" ", 1, 0)])
    backend.add_special_tokens(words[:3])
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}))


def test_a_completion_keeps_the_space_its_first_word_carries(tmp_path: Path) -> None:
    """Decoded alone, "▁Paris" is "Paris": the CLI printed "The capital of France isParis"
    and the viewer streamed the same. New ids are decoded as they continue the prompt."""
    import asyncio

    from attnlab.tokenizers.streaming import TextPieces
    from attnlab.viewer.payloads import stream_events

    sentencepiece_like(tmp_path)
    tok = load_hf_tokenizer(tmp_path)
    prompt = tok.encode("The capital of France is")  # [<s>, ▁The, ..., ▁is]
    paris, the = tok.encode_continuation("Paris") + tok.encode_continuation("The")
    assert tok.decode([paris]) == "Paris"  # the decoder strips a text's first space
    assert tok.decode_continuation([paris], prompt) == " Paris"
    steps = iter([torch.tensor([paris]), torch.tensor([the])])
    assert list(TextPieces(steps, tok, [prompt], [])) == [[" Paris"], [" The"]]

    async def events() -> list[str]:
        new = iter([paris, the, None])

        async def step() -> int | None:
            return next(new)

        async def gone() -> bool:
            return False

        return [e.decode() async for e in stream_events(step, tok, prompt, (2,),
                                                          "max_new_tokens", gone)]

    # labels on figures, the viewer and lens: each token as it reads in the text
    assert tok.pieces([*prompt, paris]) == ["<s>", " The", " capital", " of", " France", " is",
                                            " Paris"]
    streamed = asyncio.run(events())
    assert streamed[0].startswith("event: start")  # the prompt's ids, then the new tokens
    assert '"text": " Paris"' in streamed[1] and '"text": " The"' in streamed[2]
    assert '"text": " Paris The"' in streamed[-1]  # the done event's whole completion


@pytest.mark.parametrize("kind", ["char", "byte", "word"])
def test_save_hf_writes_a_tokenizer_json_for_attnlab_tokenizers(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A char, byte or word model exported to Hugging Face keeps its tokenizer: attnlab and
    transformers' AutoTokenizer read the same ids back, and `attnlab generate` runs on the
    directory."""
    from attnlab import GPT, GPTConfig
    from attnlab.tokenizers import get_tokenizer

    text = "Hello World! hello  there.\r\n New line, ünïcode € "
    ours = get_tokenizer(kind, text)
    model = GPT(GPTConfig(vocab_size=ours.vocab_size, block_size=32, n_layer=1, n_head=2,
                          n_embd=16)).eval()
    save_hf(tmp_path / "hf", model, ours)
    # AutoTokenizer, as users load it: GPT2Tokenizer for a gpt2 model without the class named
    fast = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    read = load_checkpoint(tmp_path / "hf").tokenizer
    want = ours.encode(text)
    assert fast(text)["input_ids"] == want and read.encode(text) == want
    assert fast.decode(want) == text and read.decode(want) == text
    if kind != "byte":  # a character the vocabulary lacks is named, as attnlab's own does
        with pytest.raises(ValueError, match="cannot encode '§'"):
            read.encode("§")
    assert main(["generate", str(tmp_path / "hf"), "Hello", "--max-new-tokens", "3",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("Hello")


class Opaque(Tokenizer):
    """A tokenizer with no tokenizer.json form."""

    name, vocab_size = "custom", 8

    def encode(self, text: str) -> list[int]:
        return [0] * len(text)

    def decode(self, ids: Sequence[int]) -> str:
        return "x" * len(ids)

    def _config(self) -> dict[str, Any]:
        return {}


def test_info_reports_special_ids_outside_the_tokenizer_and_finishes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """generation_config.json may name ids the tokenizer lacks (generate runs: it never
    samples them); info said "cannot decode id 999999" and stopped mid-report."""
    llama(tie=True).save_pretrained(tmp_path)
    write_tokenizer(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [999999, 1], "bos_token_id": 50}))
    assert main(["info", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("generation stops at eos id 999999 (not in the tokenizer) or '</s>' (1); "
            "bos id 50 (not in the tokenizer) prepended") in out
    assert "generation  bos_token_id=50, eos_token_id=[999999, 1]" in out  # the last line


def test_info_reads_a_directory_without_a_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnlab import GPT, GPTConfig
    model = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=2, n_embd=16))
    with pytest.warns(UserWarning, match="has no tokenizer.json form"):
        save_hf(tmp_path / "hf", model, Opaque())
    assert not (tmp_path / "hf/tokenizer.json").exists()
    assert main(["info", str(tmp_path / "hf")]) == 0
    out, err = capsys.readouterr()
    assert "has no tokenizer" in err and "tokenizer   none" in out
    assert f"{model.num_params(non_embedding=False):,} parameters" in out
    # the JSON holds the note and the largest tensor every memory estimate adds
    assert main(["info", str(tmp_path / "hf"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert any("has no tokenizer" in note for note in info["notes"])
    assert info["largest_tensor"] == 16 * 64 * 4  # the MLP's (C, 4C) float32 matrices
    assert info["memory"]["cpu"]["float32"]["bytes"] == (
        model.num_params(non_embedding=False) * 4 + info["largest_tensor"])


def test_export_writes_a_directory_transformers_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnlab import GPT, GPTConfig
    from attnlab.checkpoint import save_checkpoint
    from attnlab.cli import export
    from attnlab.hf import FAMILIES
    from attnlab.tokenizers import get_tokenizer

    assert tuple(f.name for f in FAMILIES if f.exports) == export.FAMILY_NAMES
    tok = get_tokenizer("char", "to be or not to be")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=2, n_head=2,
                          n_embd=16, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False))
    ckpt = save_checkpoint(tmp_path / "ckpt", model.eval(), tok)
    out = tmp_path / "hf"
    assert main(["export", str(ckpt), str(out)]) == 0
    assert f"wrote    {out}/ as LlamaForCausalLM (llama)" in capsys.readouterr().out
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([tok.encode("to be or not")])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, atol=1e-5, rtol=0)
    assert main(["export", str(ckpt), str(out)]) == 1  # a model there: --overwrite
    assert "already holds a model" in capsys.readouterr().err
    assert main(["export", str(ckpt), str(out), "--overwrite", "--family", "gpt2"]) == 1
    assert "GPT2LMHeadModel cannot express this model" in capsys.readouterr().err
    assert main(["export", str(ckpt), str(out), "--overwrite", "--family", "mistral"]) == 0
    assert load_checkpoint(out).meta["family"] == "mistral"
    # the exported directory remembers it: exported again, it stays a Mistral (a Mistral
    # without a window was written as the first family that fits, Llama)
    capsys.readouterr()
    assert main(["export", str(out), str(tmp_path / "again")]) == 0
    assert "as MistralForCausalLM (mistral)" in capsys.readouterr().out
    # a run directory: an export there would shadow its ckpt/ for every command given it
    run = tmp_path / "run"
    save_checkpoint(run / "ckpt", model.eval(), tok)
    assert main(["export", str(run / "ckpt"), str(run)]) == 1
    assert "is an attnlab run (it holds ckpt/)" in capsys.readouterr().err
    assert not (run / "config.json").exists()
    assert main(["export", str(run / "ckpt"), str(run / "ckpt"), "--overwrite"]) == 1
    assert "holds an attnlab checkpoint" in capsys.readouterr().err
    # the files listed are the export's, not what OUT held before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert main(["export", str(ckpt), str(mine)]) == 0
    listed = capsys.readouterr().out.split("\n")[0].split(": ", 1)[1]
    assert listed == "config.json, model.safetensors, tokenizer.json, tokenizer_config.json"


def test_export_writes_bfloat16_and_its_refusal_names_its_own_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """export had no --dtype or --force, yet its refusal told users to pass them; and it
    holds a shard of the weights beside the model (save_hf), which the check counts: here
    the whole model, smaller than one shard."""
    from safetensors import safe_open

    import attnlab.model.memory as memory

    hf = llama(tie=False)
    hf.save_pretrained(tmp_path / "hf")
    write_tokenizer(tmp_path / "hf")
    params = sum(p.numel() for p in hf.parameters())
    largest = max(p.numel() for p in hf.parameters()) * 4
    # float32: model + largest tensor + the copy; bfloat16: half of the model and the copy
    monkeypatch.setattr(memory, "available_bytes", lambda device: params * 4 + largest)
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"the model needs {memory.gb(params * 4 + largest)} in float32" in err
    assert f"the shard being written (--max_shard_size) {memory.gb(params * 4)} more" in err
    assert "the model alone fits" in err and "a smaller --max_shard_size" in err
    assert err.rstrip().endswith("which fits: --dtype bfloat16; --force tries anyway"), err
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "out"), "--dtype",
                 "bfloat16"]) == 0
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # noqa: SIM118
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"


def test_save_hf_with_its_arguments_swapped_says_which_comes_first(tmp_path: Path) -> None:
    from attnlab import GPT, GPTConfig
    model = GPT(GPTConfig.from_name("nano"))
    with pytest.raises(TypeError, match=r"model is a \w*Path, not an attnlab GPT \(the "
                                        r"directory comes first\)"):
        save_hf(model, tmp_path / "out")  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


def test_a_sentencepiece_model_alone_is_named_with_its_conversion(tmp_path: Path) -> None:
    """Llama 2's own repository has tokenizer.model and no tokenizer.json: "has no tokenizer"
    read as if the directory held none."""
    (tmp_path / "tokenizer.model").write_bytes(b"\n\x0e\n\x05<unk>")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    with pytest.raises(FileNotFoundError) as caught:
        load_hf_tokenizer(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path} has only tokenizer.model, a sentencepiece file attnlab does not read: "
        "write its tokenizer.json with transformers (pip install sentencepiece protobuf): "
        f"AutoTokenizer.from_pretrained('{tmp_path}').save_pretrained('{tmp_path}')")


def test_a_stale_single_file_beside_an_index_is_read_and_named(tmp_path: Path) -> None:
    """transformers reads model.safetensors before model.safetensors.index.json; so does
    attnlab, and an error about the weights says which file it read."""
    llama(tie=False).save_pretrained(tmp_path, max_shard_size="40KB")
    from safetensors.torch import save_file

    save_file({"lm_head.weight": torch.zeros(64, 32)}, str(tmp_path / "model.safetensors"),
              {"format": "pt"})
    with pytest.raises(ValueError, match=r"; read from model\.safetensors, not "
                       r"model\.safetensors\.index\.json beside it \(transformers reads the "
                       r"same one\); remove the stale file$"):
        load_hf(tmp_path)


def test_a_legacy_pytorch_bin_loads_after_the_fit_check_counts_it_whole(
        tmp_path: Path) -> None:
    """torch.save's pre-1.6 format cannot be memory-mapped (torch's mmap refused it): opening
    reads its names and shapes alone, the load reads it whole, and the fit check counts
    that (every tensor beside the model, not the largest one)."""
    from attnlab.load import inspect_dir

    hf = llama(tie=False)
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    state = hf.state_dict()
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin",
               _use_new_zipfile_serialization=False)
    info = inspect_dir(tmp_path / "bin")
    assert info.largest_tensor == sum(t.nbytes for t in state.values())
    logits_equal(hf, load_hf(tmp_path / "bin"))


class _Payload:
    """Unpickling this calls os.mkdir(marker): code from the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return os.mkdir, (str(self.marker),)


@pytest.mark.parametrize("legacy", [False, True])
def test_a_pytorch_bin_with_code_is_refused_for_safety_without_torchs_advice(
        tmp_path: Path, legacy: bool) -> None:
    llama(tie=False).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    torch.save({"lm_head.weight": _Payload(marker)}, tmp_path / "pytorch_model.bin",
               _use_new_zipfile_serialization=not legacy)
    with pytest.raises(ValueError) as refused:
        load_hf(tmp_path)
    message = str(refused.value)
    assert not marker.exists() and "\n" not in message
    assert message.startswith(f"refusing {tmp_path / 'pytorch_model.bin'} for safety: ")
    assert "convert it to model.safetensors" in message
    assert "weights_only` set to `False`" not in message and "will likely succeed" not in message


def test_a_tied_pytorch_bin_with_a_stored_head_is_compared_as_safetensors_are(
        tmp_path: Path) -> None:
    hf = llama(tie=True)
    hf.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    state = {k: v.clone() for k, v in hf.state_dict().items()}  # lm_head.weight included
    torch.save(state, tmp_path / "pytorch_model.bin")
    ours = load_hf(tmp_path)
    assert ours.lm_head.weight is ours.wte.weight
    state["lm_head.weight"] = torch.randn_like(state["lm_head.weight"])
    torch.save(state, tmp_path / "pytorch_model.bin")
    ours = load_hf(tmp_path)
    assert not ours.config.tie_weights
    assert torch.equal(ours.lm_head.weight, state["lm_head.weight"])
