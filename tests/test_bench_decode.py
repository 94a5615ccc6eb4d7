"""benchmarks/decode.py in quick mode: it runs, both systems agree, the result has its shape."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `pytest` without `python -m`
from benchmarks import decode


def test_quick_run_measures_both_systems_on_the_same_ids(tmp_path: Path) -> None:
    result = decode.run(quick=True)
    assert result["suite"] == "decode"
    assert [(r["shape"], r["dtype"], r["batch"]) for r in result["records"]] == [
        ("toy", "float32", 1), ("toy", "float32", 2), ("toy", "bfloat16", 1)
    ]
    for record in result["records"]:
        if record["dtype"] == "float32":  # bfloat16 rounds differently in the two systems
            assert record["same_greedy_ids"] is True
        assert 0 <= record["greedy_agreement"] <= 1
        speeds = record["tokens_per_s"]
        assert set(speeds) == {"attnlab", "huggingface"}
        assert all(v > 0 for v in speeds.values())
        assert record["ratio"] > 0 and len(record["ratios_per_round"]) == record["rounds"]
    flat = result["flat"]
    assert flat["positions"] == [16, 64] and all(ms > 0 for ms in flat["ms_per_token"])
    table = result["tables"][0]
    assert len(table["rows"]) == 3 and all(len(r) == len(table["columns"]) for r in table["rows"])
    json.dumps(result)  # the CLI writes it as JSON


def test_main_prints_the_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    canned = {"suite": "decode", "tables": [{"title": "T", "columns": ["a"], "rows": [[1]]}],
              "notes": ["n"]}
    monkeypatch.setattr(decode, "run", lambda quick: {**canned, "quick": quick})
    assert decode.main(["--quick", "--out", str(tmp_path / "d.json")]) == 0
    assert "| a |" in capsys.readouterr().out
    assert json.loads((tmp_path / "d.json").read_text())["quick"] is True
