"""`attnlab train` and `attnlab info` end to end, in-process (`--resume`:
test_cli_train_resume.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from attnlab import __version__
from attnlab.cli import main
from attnlab.load import load_checkpoint
from helpers import cli_train, read_metrics


def test_default_task_learns_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_train(tmp_path, "--max_iters", "250") == 0
    out = capsys.readouterr().out
    before, after = (float(line.split("accuracy ")[1].split("%")[0])
                     for line in out.splitlines() if "answer accuracy" in line)
    assert before < 10 and after > 90, out
    assert "copy (char tokenizer" in out and "saved" in out
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["step"] == 250

    assert main(["info", str(tmp_path / "run" / "ckpt")]) == 0
    info = capsys.readouterr().out
    assert "2 layers, 4 heads, 64 dims" in info and "trained     250 steps on copy" in info

    # a second run does not silently overwrite the first; --resume continues it
    assert cli_train(tmp_path, "--max_iters", "250") == 1
    assert "--resume" in capsys.readouterr().err
    assert cli_train(tmp_path, "--max_iters", "260", "--resume") == 0
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["step"] == 260

    # --overwrite deletes the old checkpoint first: a new run that fails does not leave the
    # old weights beside its own metrics, nor point to them as its last good checkpoint
    capsys.readouterr()
    assert cli_train(tmp_path, "--overwrite", "--lr", "1e30", "--grad_clip", "0") == 1
    out, err = capsys.readouterr()
    assert f"removed  the checkpoint {tmp_path / 'run' / 'ckpt'} held (--overwrite)" in out
    assert "Last good checkpoint: none written by this run" in err
    assert not (tmp_path / "run" / "ckpt").exists()


def test_flags_map_onto_the_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    code = cli_train(tmp_path, "--data", str(text), "--n_layer", "1", "--n_head", "2",
                  "--n_embd", "16", "--block_size", "32", "--max_iters", "12", "--lr", "2e-3",
                  "--eval_interval", "6", "--eval_iters", "2", "--bias", "false")
    assert code == 0, capsys.readouterr().err
    ckpt = load_checkpoint(tmp_path / "run" / "ckpt")
    c = ckpt.model.config
    assert (c.n_layer, c.n_head, c.n_embd, c.block_size, c.bias) == (1, 2, 16, 32, False)
    assert c.vocab_size == ckpt.tokenizer.vocab_size
    assert ckpt.meta["train_config"]["lr"] == 2e-3
    # the recipe's 50-step warmup, fitted to 12 steps: a tenth of them, then the cosine
    assert ckpt.meta["train_config"]["warmup_iters"] == 1
    out = capsys.readouterr().out
    assert "sample" in out
    # bits per byte beside each loss (ASCII text, char tokenizer: one byte per token)
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    evals = [json.loads(line) for line in metrics if "val_loss" in line]
    assert [r["step"] for r in evals] == [6, 12]
    for row in evals:
        for split in ("train", "val"):
            assert row[f"{split}_bpb"] == pytest.approx(row[f"{split}_loss"] / math.log(2))
    assert ckpt.meta["val_bpb"] == evals[-1]["val_bpb"]
    assert f"val {evals[-1]['val_loss']:.4f}  ({evals[-1]['val_bpb']:.3f} bits/byte)" in out
    assert f"val loss {evals[-1]['val_loss']:.4f}, {evals[-1]['val_bpb']:.3f} bits/byte" in out
    assert main(["info", str(tmp_path / "run")]) == 0
    assert f"({evals[-1]['val_bpb']:.3f} bits/byte)" in capsys.readouterr().out
    lrs = [json.loads(line)["lr"] for line in metrics if '"lr"' in line]
    assert max(lrs) == pytest.approx(2e-3) and lrs[-1] < 2e-3 / 2  # at lr, then decayed
    # a warmup given is the one used
    code = cli_train(tmp_path / "again", "--data", str(text), "--n_layer", "1", "--n_head", "2",
                  "--n_embd", "16", "--block_size", "32", "--max_iters", "12",
                  "--warmup_iters", "8", "--eval_interval", "12", "--eval_iters", "1")
    assert code == 0, capsys.readouterr().err
    meta = load_checkpoint(tmp_path / "again" / "run" / "ckpt").meta
    assert meta["train_config"]["warmup_iters"] == 8


def test_a_first_tokenization_shows_its_progress_on_stderr_a_cached_one_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long text's first run trained a BPE and encoded the text for seconds before its first
    step, silently; now it says so on stderr (here at any length and every call, as a log
    would get it every 10 s), stdout as before. A second run reads the cache: nothing."""
    from attnlab.cli import progress

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    # raising=False: the test fails on its assertions where these do not exist
    monkeypatch.setattr(progress, "TOKENIZE_INTERVAL_S", 0.0, raising=False)
    monkeypatch.setattr(progress, "TRAINING_LINE_CHARS", 1, raising=False)
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 15000)  # 10 pieces
    n = len(text.read_text())
    flags = ["train", "--data", str(text), "--tokenizer", "bpe:300", "--n_layer", "1",
             "--n_head", "2", "--n_embd", "16", "--block_size", "32", "--max_iters", "1",
             "--eval_iters", "1"]
    assert main([*flags, "--out", str(tmp_path / "first")]) == 0
    out, err = capsys.readouterr()
    shown = [line for line in err.splitlines() if not line.startswith("step")]
    assert shown[0] == (f"tokenizer  training bpe:300 on {n:,} characters (once: later runs "
                        "on this text read the token cache)")
    assert [line.split()[0] for line in shown[1:]] == ["tokenized", "tokenized"]  # 8 + 2
    assert shown[-1].startswith(f"tokenized {n}/{n} characters")
    assert "tokenizer  " not in out and "tokenized" not in out
    assert "data     text.txt (bpe tokenizer" in out
    assert main([*flags, "--out", str(tmp_path / "second")]) == 0
    out, err = capsys.readouterr()
    assert "tokenize" not in err and "tokenizer  " not in out and "tokenized" not in out
    assert "step      1/1" in err  # the steps' progress is still shown
    # under torchrun only rank 0 shows it (the others are quiet): a first run again
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache-rank-1"))
    monkeypatch.setenv("RANK", "1")
    assert main([*flags, "--out", str(tmp_path / "rank-1")]) == 0
    assert "tokenize" not in capsys.readouterr().err


def test_a_step_graph_off_a_gpu_is_one_line_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_train(tmp_path, "--cuda_graph", "true", "--device", "cpu") == 1
    captured = capsys.readouterr()
    assert captured.err.strip() == ("attnlab train: error: --cuda_graph records the training step "
                                    "on one CUDA GPU; this run has 1 process(es) on cpu: pass "
                                    "--cuda_graph false")
    assert "accuracy" not in captured.out and not (tmp_path / "run").exists()


def test_unknown_flags_list_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--n_layers", "4"]) == 2
    err = capsys.readouterr().err
    assert "unknown arguments ['--n_layers', '4']" in err and "--n_layer" in err


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.write_text(""), "is empty"),
        (lambda p: p.write_bytes(b"\xff\xfe\xfa"), "not UTF-8"),
    ],
)
def test_bad_data_gives_one_line_and_no_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, message: str
) -> None:
    data = tmp_path / "data.txt"
    make(data)  # type: ignore[operator]
    assert cli_train(tmp_path, "--data", str(data)) == 1
    err = capsys.readouterr().err
    assert err.startswith("attnlab train: error:") and message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_folder_names_the_file_that_is_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder is read with its subfolders; one bad file among many is named."""
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_text("hello world " * 50)
    (corpus / "sub" / "latin1.txt").write_bytes(b"\xff\xfe bad")
    assert cli_train(tmp_path, "--data", str(corpus)) == 1
    err = capsys.readouterr().err
    assert f"{corpus / 'sub' / 'latin1.txt'} is not UTF-8 text" in err
    assert len(err.strip().splitlines()) == 1


def test_characters_the_tokenizer_cannot_encode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "a.txt"
    first.write_text("abcabc " * 50)
    assert cli_train(tmp_path, "--data", str(first), "--max_iters", "1", "--n_layer", "1",
                  "--n_embd", "8", "--n_head", "1", "--block_size", "8") == 0
    second = tmp_path / "b.txt"
    second.write_text("abc xyz " * 50)
    code = main(["train", "--quiet", "--data", str(second), "--tokenizer",
                 str(tmp_path / "run" / "ckpt"), "--out", str(tmp_path / "run2")])
    assert code == 1
    assert "cannot encode character 'x'" in capsys.readouterr().err
    assert not (tmp_path / "run2").exists()


def test_block_size_larger_than_the_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "small.txt"
    data.write_text("only a little text here\n")
    assert cli_train(tmp_path, "--data", str(data), "--block_size", "64") == 1
    # "only a little text here\n": 24 characters, a validation split of 2
    assert "larger than the data allows (2 tokens in the smaller split); use --block_size 1 " \
        "or less" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    data.write_text("hello world\n")  # a split of 1 token: no --block_size can fix that
    assert cli_train(tmp_path, "--data", str(data), "--block_size", "1") == 1
    err = capsys.readouterr().err
    assert "is too short to train on: its smaller split has 1 token(s)" in err
    assert "--block_size" not in err


def test_a_task_longer_than_block_size_is_refused_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # it used to print the model and fail in the untrained model's report with a message
    # about a prompt the user never gave
    assert cli_train(tmp_path, "--block_size", "4") == 1
    out, err = capsys.readouterr()
    assert "dataset 'copy' needs block_size >= 16, the model has 4" in err
    assert "model" not in out and "prompt" not in err
    # a tokenizer for a built-in dataset, which brings its own, was silently ignored
    assert cli_train(tmp_path, "--tokenizer", "bpe") == 1
    assert "the built-in dataset 'copy' brings its own tokenizer" in capsys.readouterr().err


def test_a_tiny_model_is_described_in_whole_words_and_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # it said "1 layers, 1 heads, ...: 0.00M parameters"
    assert cli_train(tmp_path, "--n_layer", "1", "--n_head", "1", "--n_embd", "8",
                  "--max_iters", "1") == 0
    model_line = next(line for line in capsys.readouterr().out.splitlines()
                      if line.startswith("model"))
    assert "1 layer, 1 head, 8 dims" in model_line and "M parameters" not in model_line
    assert model_line.endswith(" parameters") and model_line.split()[-2].replace(",", "").isdigit()


def test_arch_llama_trains_a_modern_model_that_every_command_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--arch llama: RoPE + RMSNorm + SwiGLU without biases, at about the GPT-2-style
    recipe's parameter count; generate, inspect, info and --resume work on it."""
    pytest.importorskip("matplotlib")
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    small = ("--data", str(text), "--n_layer", "2", "--n_embd", "32", "--block_size", "24",
             "--max_iters", "6", "--eval_interval", "3", "--eval_iters", "1")
    assert cli_train(tmp_path, *small, "--arch", "llama") == 0, capsys.readouterr().err
    ckpt = load_checkpoint(tmp_path / "run" / "ckpt")
    c = ckpt.model.config
    assert (c.pos, c.norm, c.mlp, c.bias, c.n_layer) == ("rope", "rmsnorm", "swiglu", False, 2)
    assert ckpt.model.wpe is None and "blocks.0.mlp.gate.weight" in ckpt.model.state_dict()
    # (test_train checks that the recipe's d_ff matches the GPT-2-style parameter count;
    # here the flags shrink n_embd after the recipe chose it)
    assert c.d_ff is not None
    capsys.readouterr()

    assert cli_train(tmp_path, *small, "--arch", "llama", "--max_iters", "8", "--resume") == 0
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["step"] == 8
    ckpt_dir = str(tmp_path / "run" / "ckpt")
    assert main(["info", ckpt_dir]) == 0
    info = capsys.readouterr().out
    assert "pos=rope" in info and "norm=rmsnorm" in info and "mlp=swiglu" in info
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("to be\nor\n")  # a batch: "or" is left-padded
    assert main(["generate", ckpt_dir, "--prompt-file", str(prompts), "--max-new-tokens", "15",
                 "--temperature", "0"]) == 0, capsys.readouterr().err
    assert "to be" in capsys.readouterr().out
    assert main(["generate", ckpt_dir, "to be", "--max-new-tokens", "40", "--sliding-window",
                 "--temperature", "0"]) == 0, capsys.readouterr().err
    assert len(capsys.readouterr().out) >= 40  # past block_size 24: the window slides
    assert main(["inspect", ckpt_dir, "to be or not", "--out", str(tmp_path / "insp"),
                 "--what", "embeddings,qkv", "--layer", "1", "--head", "0"]) == 0
    assert (tmp_path / "insp" / "attention.json").is_file()
    assert (tmp_path / "insp" / "embeddings.png").is_file()
    # the recipe refuses --arch where it has no meaning, and --arch with --preset (in a new
    # run directory: the one above already holds a checkpoint, which is refused first)
    fresh = ("--out", str(tmp_path / "fresh"))
    assert cli_train(tmp_path, "--data", "hello", "--arch", "llama", *fresh) == 1
    assert "--arch applies to text files and tasks" in capsys.readouterr().err
    assert cli_train(tmp_path, *small, "--arch", "llama", "--preset", "nano", *fresh) == 1
    assert "choose one" in capsys.readouterr().err


@pytest.mark.parametrize("arch, blocks, architecture", [
    ("gemma3", {"norm": "gemma_rmsnorm", "mlp": "geglu", "sandwich_norm": True, "qk_norm": True,
                "scale_embeddings": True}, "Gemma3ForCausalLM"),
    ("olmo2", {"norm": "olmo_rmsnorm", "mlp": "swiglu", "sandwich_norm": True,
               "pre_norm": False, "qk_norm_whole": True, "rope_in_float32": True},
     "Olmo2ForCausalLM"),
    ("phi", {"norm": "layernorm", "mlp": "gelu", "parallel_residual": True, "shared_norm": True,
             "head_bias": True}, "PhiForCausalLM"),
])
def test_an_arch_trains_a_model_that_resumes_and_exports_as_its_family(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arch: str, blocks: dict[str, Any],
    architecture: str,
) -> None:
    """--arch gemma3: Gemma 3's blocks (sandwich norms, (1 + w) QK-norm, GeGLU, scaled
    embeddings); --arch olmo2: OLMo 2's (norms after each branch alone, QK-norm over whole q
    and k); --arch phi: Phi-2's (attention and MLP on one norm, a bias on the head). The run
    resumes under the same --arch, refuses another, and `attnlab export` writes that
    family's directory, which attnlab reads back with the same logits."""
    import torch

    from attnlab.hf import load_hf

    pytest.importorskip("matplotlib")
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    small = ("--data", str(text), "--n_layer", "2", "--n_embd", "32", "--block_size", "24",
             "--max_iters", "6", "--eval_interval", "3", "--eval_iters", "1")
    assert cli_train(tmp_path, *small, "--arch", arch) == 0, capsys.readouterr().err
    ckpt_dir = tmp_path / "run" / "ckpt"
    model = load_checkpoint(ckpt_dir).model
    assert {name: getattr(model.config, name) for name in blocks} == blocks
    assert cli_train(tmp_path, *small, "--arch", arch, "--max_iters", "8", "--resume") == 0
    assert cli_train(tmp_path, *small, "--arch", "llama", "--max_iters", "9", "--resume") == 1
    assert f"--arch {arch} -> llama" in capsys.readouterr().err
    out = tmp_path / "hf"
    assert main(["export", str(ckpt_dir), str(out)]) == 0, capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["architectures"] == [architecture]
    model = load_checkpoint(ckpt_dir).model
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        torch.testing.assert_close(load_hf(out)(ids).logits, model(ids).logits, atol=1e-5,
                                   rtol=0)


def test_help_says_what_each_flag_does_and_misspelt_flags_get_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # --help showed "TrainConfig.lr" for every flag; a misspelt flag only listed all flags
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--lr FLOAT peak learning rate (TrainConfig default: 0.001)" in help_text
    assert "--n_layer INT transformer blocks (GPTConfig default: 4)" in help_text
    # a comment above the field documents it too
    assert "--attention STR fused (SDPA) | explicit | auto" in help_text
    assert "TrainConfig.lr" not in help_text
    assert main(["train", "--n_layers", "4"]) == 2
    err = capsys.readouterr().err
    # the closest first (GPTConfig's --window_layers is a second, farther match)
    assert "--n_layers (did you mean --n_layer or --nope_layers?)" in err
    # a misspelt command or choice names the closest one
    for args, hint in ((["trian"], "did you mean 'train'?"),
                       (["generate", "ckpt", "--dtype", "bf16"], "did you mean 'bfloat16'?")):
        with pytest.raises(SystemExit):
            main(args)
        assert hint in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a value that starts with '-' reads as a flag
        main(["train", "--time_budget", "-5m"])
    assert "(a value that starts with '-' is written --time_budget=VALUE)" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith(f"attnlab {__version__} (torch ")


def test_every_command_takes_any_checkpoint_load_checkpoint_reads() -> None:
    """CHECKPOINT means the same in every command, and its help says all it may be."""
    from attnlab.cli import build_parser

    _, parsers = build_parser()
    helps = {name: action.help for name, parser in parsers.items()
             for action in parser._actions if action.dest == "checkpoint"}
    assert set(helps) >= {"generate", "inspect", "serve", "info", "export", "heads", "patch"}
    for help_text in helps.values():
        assert help_text is not None
        assert "run directory holding ckpt/" in help_text and "Hugging Face" in help_text


def test_text_of_one_distinct_token_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a file of NUL bytes trained silently on a 1-id vocabulary
    data = tmp_path / "zeros.bin"
    data.write_bytes(b"\0" * 4096)
    assert cli_train(tmp_path, "--data", str(data)) == 1
    err = capsys.readouterr().err
    assert "4,096 tokens of only 1 distinct one ('\\x00')" in err and "Is it a text file?" in err
    assert err.count("\n") == 1 and not (tmp_path / "run").exists()


def test_init_from_fine_tunes_a_hugging_face_directory_and_keeps_its_family(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--init_from: the run starts from the directory's weights, config and tokenizer (not
    the recipe's fresh model), its checkpoint remembers the family (a Mistral exports as a
    Mistral), and flags that would change the model are refused."""
    import torch

    from attnlab import GPT, GPTConfig, save_hf
    from attnlab.tokenizers import CharTokenizer

    text = "the quick brown fox jumps over the lazy dog\n" * 80
    (tmp_path / "text.txt").write_text(text)
    config = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=4, n_kv_head=2,
                       n_embd=32, bias=False, mlp="swiglu", norm="rmsnorm", pos="rope",
                       sliding_window=6, init_std=None)
    torch.manual_seed(0)
    source = GPT(config)
    save_hf(tmp_path / "hf", source, CharTokenizer.from_text(text), family="mistral")
    flags = ["--data", str(tmp_path / "text.txt"), "--init_from", str(tmp_path / "hf"),
             "--max_iters", "2", "--eval_interval", "2", "--eval_iters", "1",
             "--batch_size", "2", "--lr", "1e-5", "--warmup_iters", "0"]
    assert cli_train(tmp_path, *flags) == 0
    assert "init     the weights of" in capsys.readouterr().out
    tuned = load_checkpoint(tmp_path / "run")
    assert tuned.model.config == load_checkpoint(tmp_path / "hf").model.config
    assert tuned.model.config.sliding_window == 6
    assert tuned.meta["family"] == "mistral"
    moved = max((a - b).abs().max().item() for a, b in zip(
        tuned.model.state_dict().values(), source.state_dict().values(), strict=True))
    assert 0 < moved < 1e-3  # two steps of lr 1e-5 from the source, not a fresh model
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    assert '"MistralForCausalLM"' in (tmp_path / "out" / "config.json").read_text()
    # a resumed fine-tune still knows where it came from (its checkpoints lost the family)
    assert main(["train", "--quiet", "--resume", "--out", str(tmp_path / "run"),
                 "--max_iters", "3"]) == 0
    resumed = load_checkpoint(tmp_path / "run").meta
    assert resumed["step"] == 3 and resumed["family"] == "mistral"
    assert resumed["init_from"] == str(tmp_path / "hf")
    capsys.readouterr()
    assert main(["info", str(tmp_path / "run")]) == 0  # it raised KeyError: 'architecture'
    assert f"fine-tuned  from {tmp_path / 'hf'} (Hugging Face mistral)" in (
        capsys.readouterr().out)

    for extra, refused in ((["--n_layer", "3"], "--n_layer would change them"),
                           (["--resume"], "choose one")):
        capsys.readouterr()
        assert main(["train", "--quiet", "--out", str(tmp_path / "other"), *flags,
                     *extra]) == 1
        assert refused in capsys.readouterr().err


def test_a_mixture_fine_tunes_with_its_balance_term(tmp_path: Path) -> None:
    """--init_from a Mixtral directory with --router_aux_loss_coef: a training field, which a
    fine-tune takes (as --dropout); the first step's training loss then holds the balance
    term (2.0 or more times the coefficient; the evaluations, which do not train, leave it
    out), and the checkpoint keeps the model's config otherwise."""
    import torch

    from attnlab import GPT, GPTConfig, save_hf
    from attnlab.tokenizers import CharTokenizer

    text = "the quick brown fox jumps over the lazy dog\n" * 80
    (tmp_path / "text.txt").write_text(text)
    config = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=4, n_kv_head=2,
                       n_embd=32, bias=False, mlp="swiglu", norm="rmsnorm", pos="rope",
                       n_experts=4, experts_per_token=2, init_std=None)
    torch.manual_seed(0)
    save_hf(tmp_path / "hf", GPT(config), CharTokenizer.from_text(text))
    flags = ["--data", str(tmp_path / "text.txt"), "--init_from", str(tmp_path / "hf"),
             "--max_iters", "2", "--eval_interval", "2", "--eval_iters", "1",
             "--batch_size", "2", "--lr", "1e-5", "--warmup_iters", "0"]
    losses = {}
    for coef in ("0", "10"):
        out = tmp_path / f"run{coef}"
        assert main(["train", "--quiet", "--out", str(out), *flags,
                     "--router_aux_loss_coef", coef]) == 0
        losses[coef] = read_metrics(out)[0]["loss"]  # step 1's training loss
        tuned = load_checkpoint(out).model.config
        assert tuned.computed() == config.computed()
        assert tuned.router_aux_loss_coef == float(coef)
    assert losses["10"] - losses["0"] > 10 * 2.0 * 0.9  # the term is at least k = 2 each


def test_seq_len_fine_tunes_a_long_context_model_on_shorter_windows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fine-tune trained on windows of the model's whole context, so a text shorter than
    that (a 512-token model here; 32k for Qwen) could not be used; --seq_len sets the
    windows and leaves the model's context as it was."""
    import torch

    from attnlab import GPT, GPTConfig, save_hf
    from attnlab.tokenizers import CharTokenizer

    text = "the quick brown fox jumps over the lazy dog\n" * 80  # ~350 validation tokens
    (tmp_path / "text.txt").write_text(text)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=32, block_size=512, n_layer=1, n_head=2, n_embd=16,
                       bias=False, mlp="swiglu", norm="rmsnorm", pos="rope", init_std=None)
    save_hf(tmp_path / "hf", GPT(config), CharTokenizer.from_text(text), family="llama")
    flags = ["--data", str(tmp_path / "text.txt"), "--init_from", str(tmp_path / "hf"),
             "--max_iters", "2", "--eval_interval", "2", "--eval_iters", "1",
             "--batch_size", "2", "--lr", "1e-5", "--warmup_iters", "0"]
    assert cli_train(tmp_path, *flags) == 1
    assert "block_size=512 is larger than the data allows" in capsys.readouterr().err
    assert cli_train(tmp_path, *flags, "--seq_len", "32") == 0
    tuned = load_checkpoint(tmp_path / "run")
    assert tuned.model.config.block_size == 512 and tuned.meta["train_config"]["seq_len"] == 32
    assert cli_train(tmp_path, *flags, "--seq_len", "600", "--overwrite") == 1
    assert "seq_len=600 is longer than the model's context (block_size=512)" in (
        capsys.readouterr().err)
