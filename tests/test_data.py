"""DAPO-Math-17k loader (validation, dedupe) and the synthetic set share one schema."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from rlkit.models import data


def test_synthetic_rows_are_valid_distinct_and_deterministic():
    rows = data.synthetic_rows(300, seed=3)
    for i, row in enumerate(rows):
        data.validate_row(row, where=f"row {i}")
    assert len({r["prompt"][0]["content"] for r in rows}) == 300
    assert rows == data.synthetic_rows(300, seed=3)
    assert rows != data.synthetic_rows(300, seed=4)
    assert all(r["data_source"] == "math_dapo" and r["ability"] == "MATH" for r in rows)
    assert all(r["prompt"][0]["content"].startswith(data.PROMPT_PREFIX) for r in rows)


def test_synthetic_answers_are_the_integer_results():
    for row in data.synthetic_rows(50, seed=0):
        text = row["prompt"][0]["content"][len(data.PROMPT_PREFIX):-len(data.PROMPT_SUFFIX)]
        expr = (text.replace("What is ", "").replace("Compute ", "").replace("Find ", "")
                .replace("\\times", "*").replace("\\cdot", "*").rstrip("?."))
        assert int(row["reward_model"]["ground_truth"]) == eval(expr)


def _duplicated_dump(tmp_path, copies=3):
    """A file shaped like the public parquet: every prompt repeated, each copy with its own index."""
    unique = data.synthetic_rows(40, seed=1)
    rows = []
    for copy in range(copies):
        for row in unique:
            rows.append({**row, "extra_info": {"index": f"{row['extra_info']['index']}-copy{copy}"}})
    return unique, data.write_parquet(rows, tmp_path / "dump.parquet")


def test_load_dapo_dedupes_and_keeps_first_rows(tmp_path):
    unique, dump = _duplicated_dump(tmp_path)
    info = data.load_dapo(str(dump), tmp_path / "dedup.parquet")
    assert (info.rows_read, info.rows) == (120, 40)
    assert info.as_dict()["duplicates_removed"] == 80
    kept = data.read_parquet_rows(info.path)
    assert [r["prompt"] for r in kept] == [r["prompt"] for r in unique]
    assert all(r["extra_info"]["index"].endswith("-copy0") for r in kept)
    capped = data.load_dapo(str(dump), tmp_path / "capped.parquet", max_rows=7)
    assert capped.rows == 7


def test_real_loader_and_synthetic_set_share_the_parquet_schema(tmp_path):
    _, dump = _duplicated_dump(tmp_path, copies=2)
    real = data.load_dapo(str(dump), tmp_path / "dedup.parquet")
    synthetic = data.synthetic_dapo(16, seed=0, out_path=tmp_path / "synthetic.parquet")
    assert pq.read_schema(real.path).equals(pq.read_schema(synthetic.path))
    assert tuple(pq.read_schema(synthetic.path).names) == data.COLUMNS
    row = data.read_parquet_rows(synthetic.path)[0]
    data.validate_row(row)
    assert row["reward_model"]["style"] == "rule-lighteval/MATH_v2"


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.pop("ability"), "missing columns \\['ability'\\]"),
    (lambda r: r.update(prompt="just text"), "prompt must be a non-empty list"),
    (lambda r: r.update(reward_model={"ground_truth": 7}), "reward_model.ground_truth must be a string"),
    (lambda r: r.update(extra_info=None), "extra_info must be a mapping"),
])
def test_schema_errors_name_the_column(mutate, message):
    row = data.synthetic_rows(1)[0]
    mutate(row)
    with pytest.raises(data.DataSchemaError, match=message):
        data.validate_row(row)


def test_loader_rejects_a_file_without_the_columns(tmp_path):
    import pandas as pd

    path = tmp_path / "gsm8k.parquet"
    pd.DataFrame({"question": ["1+1"], "answer": ["2"]}).to_parquet(path)
    with pytest.raises(data.DataSchemaError, match="missing columns"):
        data.load_dapo(str(path), tmp_path / "out.parquet")


def test_missing_file_says_how_to_fetch():
    with pytest.raises(FileNotFoundError, match="data/README.md"):
        data.load_dapo("/nonexistent/dapo-math-17k.parquet")


def test_threads_writing_one_parquet_do_not_collide(tmp_path, monkeypatch):
    """Notebook 07's side-by-side runs prepare the same rows from threads of one process: each writes its own partial
    file (the barrier holds every thread between writing it and moving it into place), and the file ends whole."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import pandas as pd

    written = threading.Barrier(3, timeout=10)
    to_parquet = pd.DataFrame.to_parquet

    def held(self, *args, **kwargs):
        to_parquet(self, *args, **kwargs)
        written.wait()

    monkeypatch.setattr(pd.DataFrame, "to_parquet", held)
    rows = data.synthetic_rows(8, seed=0)
    with ThreadPoolExecutor(max_workers=3) as pool:
        paths = list(pool.map(lambda _: data.write_parquet(rows, tmp_path / "rows.parquet"), range(3)))
    assert set(paths) == {tmp_path / "rows.parquet"} and [p.name for p in tmp_path.iterdir()] == ["rows.parquet"]
    assert data.read_parquet_rows(paths[0]) == rows
