"""Every `attnlab` command on a CUDA GPU: what it prints and writes there equals the CPU's
(within float tolerance, or token for token where the answer is an argmax), and what it
learns there is learnt (100% on the copy task).

Marked `cuda`: skipped without a GPU (tests/conftest.py). `python -m pytest -m cuda` runs them
on a GPU machine; ATTNLAB_TEST_DEVICE=cpu runs them on the CPU as a dry run of their code.
The copy run they share is tests/conftest.py's `cuda_copy_run`.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.cli import main
from attnlab.load import load_checkpoint
from helpers import first_answer, free_port, read_metrics

pytestmark = pytest.mark.cuda


def _main(*argv: str) -> str:
    """Run `attnlab ARGV` in this process: what it printed (it must succeed)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(list(argv))
    assert code == 0, (argv, printed.getvalue())
    return printed.getvalue()


def _on(device: torch.device) -> str:
    """What `attnlab train` adds to its train line for `device` ("" on the CPU)."""
    return "" if device.type == "cpu" else f" on {device.type}:{device.index or 0}"


def _accuracy(printed: str) -> float:
    line = next(ln for ln in printed.splitlines() if ln.startswith("after    answer accuracy"))
    return float(line.split("accuracy ")[1].split("%")[0])


def test_train_learns_the_copy_task_to_full_accuracy(
    cuda_copy_run: tuple[Path, str], cuda_device: torch.device
) -> None:
    run, printed = cuda_copy_run
    assert f"train    600 steps x 32 sequences, adamw lr 0.003, float32{_on(cuda_device)}\n" \
        in printed, printed
    assert _accuracy(printed) == 100.0, printed
    assert load_checkpoint(run / "ckpt").meta["step"] == 600


def test_train_on_text_takes_the_gpu_recipe_and_learns(
    tmp_path: Path, cuda_device: torch.device
) -> None:
    text = tmp_path / "fox.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 3000)
    printed = _main("train", "--quiet", "--data", str(text), "--out", str(tmp_path / "run"),
                    "--max_iters", "60", "--eval_interval", "30", "--eval_iters", "4",
                    "--device", str(cuda_device))
    if cuda_device.type == "cuda":  # the CPU dry run takes the CPU recipe
        assert "model    6 layers, 6 heads, 384 dims, context 256" in printed, printed
        assert ", bfloat16 on cuda:" in printed and "stopping after 2 evaluations" in printed
        assert ", each step one CUDA graph," in printed  # the recipe's step graph
    val = [r["val_loss"] for r in read_metrics(tmp_path / "run") if "val_loss" in r]
    vocab = load_checkpoint(tmp_path / "run" / "ckpt").tokenizer.vocab_size
    assert len(val) == 2 and val[1] < val[0] < math.log(vocab), val  # it learns


def test_train_llama_blocks_learn_the_copy_task(tmp_path: Path, cuda_device: torch.device) -> None:
    printed = _main("train", "--quiet", "--arch", "llama", "--out", str(tmp_path / "run"),
                    "--device", str(cuda_device))
    assert _accuracy(printed) >= 98.0, printed
    config = load_checkpoint(tmp_path / "run" / "ckpt").model.config
    assert (config.pos, config.norm, config.mlp) == ("rope", "rmsnorm", "swiglu")


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")  # inductor's own imports
def test_compiled_training_follows_the_eager_curve(
    tmp_path: Path, cuda_device: torch.device
) -> None:
    flags = ("--quiet", "--max_iters", "100", "--eval_interval", "50", "--eval_iters", "4",
             "--device", str(cuda_device))
    printed = _main("train", "--out", str(tmp_path / "compiled"), "--compile", "true", *flags)
    assert "compile  torch.compile" in printed
    _main("train", "--out", str(tmp_path / "eager"), *flags)
    compiled = [r["val_loss"] for r in read_metrics(tmp_path / "compiled") if "val_loss" in r]
    eager = [r["val_loss"] for r in read_metrics(tmp_path / "eager") if "val_loss" in r]
    assert compiled[-1] < 0.5 * compiled[0]  # it learns
    for c, e in zip(compiled, eager, strict=True):  # the same math, other kernels
        assert c == pytest.approx(e, rel=0.1, abs=0.02), (compiled, eager)


def _val_losses(run: Path) -> list[float]:
    return [r["val_loss"] for r in read_metrics(run) if "val_loss" in r]


def test_the_step_as_one_cuda_graph_trains_as_the_eager_step(
    tmp_path: Path, cuda_device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--cuda_graph (train/graph_step.py): three eager steps, the recording, then replays of
    the same kernels: in float32 without dropout the eager run's losses, up to the GPU's
    run-to-run noise (attention's backward sums in any order) and the learning rate, a
    float32 scalar 1e-8 off the schedule's. Gradients summed across replays, a frozen learning
    rate or a step left out would be off by far more. On the CPU (the dry run) it is
    rehearsed."""
    from attnlab.train import graph_step

    monkeypatch.setattr(graph_step, "DEVICES", ("cuda", "cpu"))
    flags = ("--quiet", "--max_iters", "100", "--eval_interval", "50", "--eval_iters", "4",
             "--dropout", "0.0", "--grad_accum", "2", "--device", str(cuda_device))
    _main("train", "--out", str(tmp_path / "graph"), "--cuda_graph", "true", *flags)
    _main("train", "--out", str(tmp_path / "eager"), *flags)
    graphed, eager = _val_losses(tmp_path / "graph"), _val_losses(tmp_path / "eager")
    assert graphed[-1] < 0.5 * graphed[0]  # it learns
    assert graphed == pytest.approx(eager, rel=2e-3), (graphed, eager)


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")  # inductor's own imports
def test_compiled_blocks_inside_the_step_graph_follow_the_eager_curve(
    tmp_path: Path, cuda_device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--compile with --cuda_graph: Inductor's kernels (the blocks compiled without graphs of
    their own) recorded in the step's graph, with dropout and bfloat16 as the GPU recipe.
    On the CPU (the dry run) it is rehearsed."""
    from attnlab.train import graph_step

    monkeypatch.setattr(graph_step, "DEVICES", ("cuda", "cpu"))
    flags = ("--quiet", "--max_iters", "100", "--eval_interval", "50", "--eval_iters", "4",
             "--dtype", "bfloat16", "--device", str(cuda_device))
    _main("train", "--out", str(tmp_path / "both"), "--compile", "true", "--cuda_graph", "true",
          *flags)
    _main("train", "--out", str(tmp_path / "eager"), *flags)
    both, eager = _val_losses(tmp_path / "both"), _val_losses(tmp_path / "eager")
    assert both[-1] < 0.5 * both[0]  # it learns
    for b, e in zip(both, eager, strict=True):  # the same math, other kernels and draws
        assert b == pytest.approx(e, rel=0.1, abs=0.02), (both, eager)


def test_an_interrupted_run_resumes_where_it_stopped(
    tmp_path: Path, cuda_device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C at step 100 of 150, then --resume: the curve of the run never stopped."""
    import attnlab.cli.train as train_cli

    class CtrlCAt100(train_cli.Progress):
        def __call__(self, row: dict[str, Any]) -> None:
            super().__call__(row)
            if row["step"] == 100 and "loss" in row:
                os.kill(os.getpid(), signal.SIGINT)

    flags = ("--quiet", "--max_iters", "150", "--eval_interval", "50", "--eval_iters", "4",
             "--device", str(cuda_device))
    _main("train", "--out", str(tmp_path / "whole"), *flags)
    monkeypatch.setattr(train_cli, "Progress", CtrlCAt100)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["train", "--out", str(tmp_path / "parts"), *flags]) == 130
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "parts" / "ckpt").meta["step"] == 100
    printed_again = _main("train", "--out", str(tmp_path / "parts"), "--resume", *flags)
    assert "resumed  from step 100 of 150" in printed_again
    whole, parts = read_metrics(tmp_path / "whole"), read_metrics(tmp_path / "parts")
    assert [r["step"] for r in parts] == [r["step"] for r in whole]
    # CUDA's backward of the embedding adds in any order: equal to rounding, not bit for bit
    for a, b in zip(whole, parts, strict=True):
        for key in ("loss", "val_loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-4), (a, b)
    assert load_checkpoint(tmp_path / "parts" / "ckpt").meta["step"] == 150


def test_torchrun_one_process_trains(tmp_path: Path, cuda_device: torch.device) -> None:
    """`torchrun --nproc_per_node 1 -m attnlab train` (a world of one: no process group is
    needed; tests/cuda/test_cuda_library.py runs NCCL itself)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
         "-m", "attnlab", "train", "--quiet", "--max_iters", "100", "--out",
         str(tmp_path / "run"), "--device", "auto" if cuda_device.type == "cuda" else "cpu"],
        capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"float32{_on(cuda_device)}" in done.stdout, done.stdout
    meta = load_checkpoint(tmp_path / "run" / "ckpt").meta
    assert (meta["step"], meta["world_size"]) == (100, 1)


def test_generate_a_left_padded_batch_as_the_cpu_does(
    cuda_copy_run: tuple[Path, str], tmp_path: Path, cuda_device: torch.device
) -> None:
    ckpt = str(cuda_copy_run[0] / "ckpt")
    prompts = tmp_path / "prompts.txt"
    # three lengths (a prompt may hold part of its answer): left-padded to the longest
    prompts.write_text("qwertyui|qwerty\nasdfghjk|asdfg\nzxcvbnml|zxcv\n")
    flags = ("--prompt-file", str(prompts), "--temperature", "0", "--max-new-tokens", "2")
    on_device = _main("generate", ckpt, *flags, "--device", str(cuda_device))
    assert on_device == _main("generate", ckpt, *flags, "--device", "cpu")
    for copied in ("qwertyui|qwertyui", "asdfghjk|asdfghj", "zxcvbnml|zxcvbn"):
        assert copied in on_device, on_device


def _chat_model(directory: Path) -> None:
    """A random Llama with a word-level tokenizer and a ChatML template (transformers)."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    words = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "<pad>", "system", "user",
             "assistant", "what", "is", "a", "cat", "?", "\n"]
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(words), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=3, pad_token_id=4, initializer_range=0.2)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(directory)
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex(r"\s+|\n"),
                                                            "removed")
    backend.add_special_tokens(words[:5])
    backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "add_bos_token": False,
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": (
            "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
            "'<|im_end|>' + '\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")}))


def test_generate_chat_as_the_cpu_does(tmp_path: Path, cuda_device: torch.device) -> None:
    _chat_model(tmp_path / "hf")
    flags = ("what is a cat ?", "--chat", "--system", "what is a cat", "--temperature", "0",
             "--max-new-tokens", "6")
    on_device = _main("generate", str(tmp_path / "hf"), *flags, "--device", str(cuda_device))
    assert on_device == _main("generate", str(tmp_path / "hf"), *flags, "--device", "cpu")
    assert on_device.startswith("what is a cat ?\n")


def test_inspect_writes_the_cpu_weights(
    cuda_copy_run: tuple[Path, str], tmp_path: Path, cuda_device: torch.device
) -> None:
    ckpt = str(cuda_copy_run[0] / "ckpt")
    records = []
    for device in (cuda_device, torch.device("cpu")):
        out = tmp_path / device.type
        _main("inspect", ckpt, "qwertyui|qwerty", "--what", "grid", "--format", "png,html",
              "--out", str(out), "--device", str(device))
        records.append(json.loads((out / "attention.json").read_text()))
        assert (out / "attention.html").stat().st_size > 1000
    got, expected = records
    assert len(got["attention"]) == 8  # 2 layers x 4 heads
    for a, b in zip(got["attention"], expected["attention"], strict=True):
        torch.testing.assert_close(torch.tensor(a["weights"]), torch.tensor(b["weights"]),
                                   atol=2e-5, rtol=0)



def test_serve_answers_over_http_as_the_cpu_does(
    cuda_copy_run: tuple[Path, str], cuda_device: torch.device
) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    from attnlab.generate import generate_text
    from attnlab.viewer.payloads import attention_payload

    ckpt, port = cuda_copy_run[0] / "ckpt", free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "attnlab", "serve", str(ckpt), "--port",
                             str(port), "--device", str(cuda_device)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        info = first_answer(proc, f"{url}/api/model", 60)
        assert info.status_code == 200 and info.json()["meta"]["step"] == 600
        cpu = load_checkpoint(ckpt)
        text = "qwertyui|qwer"
        r = httpx.post(f"{url}/api/attention", json={"text": text}, timeout=30)
        assert r.status_code == 200, r.text
        expected = attention_payload(cpu.model, cpu.tokenizer.encode(text), cpu.tokenizer)
        for got, want in zip(r.json()["layers"], expected["layers"], strict=True):
            for head, want_head in zip(got["heads"], want["heads"], strict=True):
                for row, want_row in zip(head, want_head, strict=True):
                    torch.testing.assert_close(torch.tensor(row), torch.tensor(want_row),
                                               atol=2e-5, rtol=0)
        r = httpx.post(f"{url}/api/generate", json={"text": "asdfghjk|", "temperature": 0,
                                                    "max_new_tokens": 8}, timeout=30)
        done = json.loads(r.text.strip().split("\n\n")[-1].split("data: ", 1)[1])
        greedy = generate_text(cpu.model, cpu.tokenizer, ["asdfghjk|"], max_new_tokens=8,
                               temperature=0)[0]
        assert done["text"] == greedy == "asdfghjk"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert f"weights on {cuda_device}" in err, err


def test_heads_score_as_the_cpu_and_ablation_breaks_copying(
    cuda_copy_run: tuple[Path, str], tmp_path: Path, cuda_device: torch.device
) -> None:
    ckpt = str(cuda_copy_run[0] / "ckpt")
    reports = []
    for device in (cuda_device, torch.device("cpu")):
        _main("heads", ckpt, "--out", str(tmp_path / device.type), "--device", str(device))
        reports.append(json.loads((tmp_path / device.type / "heads.json").read_text()))
    got, expected = reports
    for kind, scores in got["scores"].items():
        torch.testing.assert_close(torch.tensor(scores), torch.tensor(expected["scores"][kind]),
                                   atol=1e-4, rtol=0)
    ablation = got["ablation"]
    assert ablation["intact"] >= 0.98 and ablation["top_ablated"] <= 0.05, ablation


def test_patch_effects_as_the_cpu(
    cuda_copy_run: tuple[Path, str], tmp_path: Path, cuda_device: torch.device
) -> None:
    ckpt = str(cuda_copy_run[0] / "ckpt")
    for method in ("activation", "attribution"):
        records = []
        for device in (cuda_device, torch.device("cpu")):
            out = tmp_path / f"{method}-{device.type}"
            _main("patch", ckpt, "--clean", "abcdefgh|a", "--corrupt", "aycdefgh|a", "--answer",
                  "b", "--wrong", "y", "--method", method, "--out", str(out), "--device",
                  str(device))
            records.append(json.loads((out / "patch.json").read_text()))
        got, expected = records
        assert got["clean_metric"] == pytest.approx(expected["clean_metric"], abs=1e-3)
        for key in ("heads", "resid"):
            torch.testing.assert_close(torch.tensor(got[key]), torch.tensor(expected[key]),
                                       atol=1e-3, rtol=0)


def test_lens_reads_as_the_cpu(
    cuda_copy_run: tuple[Path, str], tmp_path: Path, cuda_device: torch.device
) -> None:
    ckpt = str(cuda_copy_run[0] / "ckpt")
    tables = []
    for device in (cuda_device, torch.device("cpu")):
        _main("lens", ckpt, "qwertyui|qwer", "--out", str(tmp_path / device.type), "--device",
              str(device))
        tables.append(json.loads((tmp_path / device.type / "lens.json").read_text()))
    got, expected = tables
    assert [row[-1][0] for row in got["top_tokens"]][-1] == "t"  # the copy: qwer -> t
    assert [[cell[0] for cell in row] for row in got["top_tokens"]] == [
        [cell[0] for cell in row] for row in expected["top_tokens"]]
    torch.testing.assert_close(torch.tensor(got["top_probs"]), torch.tensor(expected["top_probs"]),
                               atol=1e-4, rtol=0)


def test_export_then_load_hf_onto_the_device(
    cuda_copy_run: tuple[Path, str], tmp_path: Path, cuda_device: torch.device
) -> None:
    from attnlab import load_hf

    ckpt = cuda_copy_run[0] / "ckpt"
    _main("export", str(ckpt), str(tmp_path / "hf"))
    ours = load_checkpoint(ckpt, map_location=cuda_device).model
    ids = torch.tensor([[3, 4, 5, 6, 1, 3]], device=cuda_device)  # (1, T)
    for dtype, atol, rtol in ((torch.float32, 1e-5, 0.0), (torch.bfloat16, 0.1, 0.05)):
        model = load_hf(tmp_path / "hf", map_location=cuda_device, dtype=dtype)
        assert model.wte.weight.device.type == cuda_device.type
        assert model.wte.weight.dtype == dtype
        with torch.no_grad():
            got, expected = model(ids).logits.float(), ours(ids).logits
        torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)
        assert torch.equal(got[0, -1].argmax(), expected[0, -1].argmax())


def test_the_demos_on_the_device(tmp_path: Path, cuda_device: torch.device) -> None:
    printed = _main("demo", "hello", "--no-figures", "--out", str(tmp_path / "hello"),
                    "--device", str(cuda_device))
    assert "check    'Hello' -> ' World'" in printed, printed
    printed = _main("demo", "averaging", "--out", str(tmp_path / "avg"), "--device",
                    str(cuda_device))
    assert "found    the three forms agree" in printed and (
        tmp_path / "avg" / "averaging_weights.png").exists()
