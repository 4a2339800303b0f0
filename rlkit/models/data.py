"""DAPO-Math-17k: the real loader (deduplicated, schema-checked) and a synthetic set in the same schema.

The public ``BytedTsinghua-SIA/DAPO-Math-17k`` parquet repeats each of its ~17k prompts about 100
times (verl issue #3065), so :func:`load_dapo` deduplicates on (prompt text, ground truth) and says
how many rows remain. The schema is verl-native, one row per prompt:

- ``data_source``: ``"math_dapo"`` (routes verl's ``default_compute_score`` to ``math_dapo``)
- ``prompt``: ``[{"role": "user", "content": <DAPO instruction + problem>}]``
- ``ability``: ``"MATH"``
- ``reward_model``: ``{"ground_truth": <answer string>, "style": "rule-lighteval/MATH_v2"}``
- ``extra_info``: ``{"index": <unique id string>}``

:func:`synthetic_dapo` writes integer-answer arithmetic problems in exactly that schema, so offline
runs and tests exercise the same reading path as the real data.

:func:`target_rows` turns any of these rows (synthetic or real) into a row of the target-character task
(:func:`rlkit.models.reward.target_chars`): the target set is derived from the prompt (:func:`rlkit.models.reward.target_set_of`),
a line naming it opens the prompt, and ``extra_info["target_chars"]`` carries it to the reward. Nothing else
changes (same columns, the math answer kept as ground truth), so ``targets=True`` in :func:`prepare` gives the
task on the synthetic set and on DAPO-Math-17k alike.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.core.env import REPO_ROOT
from rlkit.core.jsonio import partial_suffix

DAPO_HUB_ID = "BytedTsinghua-SIA/DAPO-Math-17k"
DAPO_URL = f"https://huggingface.co/datasets/{DAPO_HUB_ID}/resolve/main/data/dapo-math-17k.parquet"
GENERATED_DIR = REPO_ROOT / "data" / "generated"
COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")

# The DAPO-Math-17k instruction around each problem (the published rows carry it in the prompt).
PROMPT_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
PROMPT_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


class DataSchemaError(ValueError):
    """A row does not follow the DAPO/verl schema; the message names the column and the fix."""


@dataclass(frozen=True)
class DatasetInfo:
    path: str          # the parquet file verl reads
    source: str        # where the rows came from (a file, a hub id, or "synthetic")
    rows_read: int     # rows before deduplication
    rows: int          # rows after deduplication (what training sees)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "source": self.source, "rows_read": self.rows_read, "rows": self.rows,
                "duplicates_removed": self.rows_read - self.rows}


def _as_plain(value):
    """numpy arrays / pyarrow structs read back from parquet -> plain lists and dicts."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _as_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_plain(v) for v in value]
    return value


ROW_FIX = ("Fix: repair or drop that row (pandas: frame.drop(index=[...])), or re-download the published parquet "
           f"({DAPO_URL}; data/README.md). Nothing has been written")


def validate_row(row: dict[str, Any], where: str = "row") -> None:
    """Raise :class:`DataSchemaError` unless ``row`` has the DAPO/verl schema; the message names ``where`` (the
    file and row), the key, what was found, and the fix."""
    def bad(key: str, expected: str, found: Any) -> DataSchemaError:
        missing = found is None or (isinstance(found, float) and math.isnan(found))  # parquet's null: None or NaN
        got = "null (the value is missing)" if missing else repr(found)
        return DataSchemaError(f"{where}: {key} must be {expected}, found {got}. {ROW_FIX}")

    missing = [c for c in COLUMNS if c not in row]
    if missing:
        raise DataSchemaError(f"{where}: missing columns {missing}; a DAPO row needs {list(COLUMNS)}. {ROW_FIX}")
    if not isinstance(row["data_source"], str) or not row["data_source"]:
        raise bad("data_source", "a non-empty string (e.g. 'math_dapo')", row["data_source"])
    prompt = row["prompt"]
    if not isinstance(prompt, list) or not prompt:
        raise bad("prompt", "a non-empty list of {'role', 'content'} chat messages", prompt)
    for j, message in enumerate(prompt):
        if not isinstance(message, dict) or not {"role", "content"} <= set(message):
            raise bad(f"prompt[{j}]", "a chat message with 'role' and 'content'", message)
        for field in ("role", "content"):
            if not isinstance(message[field], str) or not message[field]:
                raise bad(f"prompt[{j}].{field}", "a non-empty string", message[field])
    if not isinstance(row["ability"], str):
        raise bad("ability", "a string (e.g. 'MATH')", row["ability"])
    reward_model = row["reward_model"]
    if not isinstance(reward_model, dict):
        raise bad("reward_model", "a mapping with a 'ground_truth' string", reward_model)
    if not isinstance(reward_model.get("ground_truth"), str) or not reward_model["ground_truth"].strip():
        raise bad("reward_model.ground_truth", "a string (the reference answer, not empty)",
                  reward_model.get("ground_truth"))
    if not isinstance(row["extra_info"], dict):
        raise bad("extra_info", "a mapping (e.g. {'index': '<id>'})", row["extra_info"])


def _row_name(source: str, i: int, row: dict[str, Any]) -> str:
    """How a message names row ``i`` of ``source``: its position, and its DAPO index where it has one."""
    index = row.get("extra_info", {}).get("index") if isinstance(row.get("extra_info"), dict) else None
    return f"data {source!r} row {i}" + (f" (extra_info.index={index!r})" if index is not None else "")


def _read_rows(source: str) -> list[dict[str, Any]]:
    path = Path(source).expanduser()
    if path.exists():
        import pandas as pd

        frame = pd.read_parquet(path)
    elif "/" in source and not source.endswith(".parquet"):
        import datasets  # a hub id: needs network or a populated HF cache

        frame = datasets.load_dataset(source, split="train").to_pandas()
    else:
        raise FileNotFoundError(
            f"data {source!r}: no such file. Fix: download {DAPO_URL} (see data/README.md) and pass its "
            f"path, or pass the hub id {DAPO_HUB_ID!r} with network access"
        )
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise DataSchemaError(f"data {source!r}: missing columns {missing}; found {list(frame.columns)}")
    return [{c: _as_plain(rec[c]) for c in COLUMNS} for rec in frame.to_dict("records")]


def dedupe(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """First occurrence of each (prompt text, ground truth), order kept."""
    seen, out = set(), []
    for row in rows:
        key = (json.dumps(row["prompt"], sort_keys=True), row["reward_model"]["ground_truth"])
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> Path:
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".parquet.{partial_suffix()}")  # concurrent writers of one file do not collide
    pd.DataFrame(rows, columns=list(COLUMNS)).to_parquet(tmp, index=False)
    tmp.replace(path)
    return path


def read_parquet_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a parquet file written by this module (plain Python values)."""
    return _read_rows(str(path))


def load_dapo(source: str, out_path: str | Path | None = None, *, max_rows: int | None = None,
              targets: bool = False) -> DatasetInfo:
    """Read DAPO-Math-17k from a local parquet or a hub id, validate, deduplicate, write a parquet.

    ``max_rows`` keeps the first rows after deduplication (a smaller epoch for short runs); ``targets``
    writes them as rows of the target-character task (:func:`target_rows`).
    """
    rows = _read_rows(source)
    for i, row in enumerate(rows):
        validate_row(row, where=_row_name(source, i, row))
    unique = dedupe(rows)
    if max_rows is not None:
        unique = unique[:max_rows]
    if targets:
        unique = target_rows(unique)
    out = Path(out_path) if out_path else default_path(source, 0, targets=targets)
    write_parquet(unique, out)
    info = DatasetInfo(str(out), source, len(rows), len(unique))
    print(f"DAPO data {source}: {info.rows_read} rows read, {info.rows} unique prompts kept -> {out}")
    return info


def synthetic_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct integer-answer arithmetic problems in the DAPO schema (deterministic per seed)."""
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n:
        a, b, c = rng.randint(2, 999), rng.randint(2, 999), rng.randint(2, 99)
        kind = rng.choice(("sum_times", "difference", "product_minus"))
        if kind == "sum_times":
            problem, answer = f"What is ({a} + {b}) \\times {c}?", (a + b) * c
        elif kind == "difference":
            problem, answer = f"Compute {a * c} - {b}.", a * c - b
        else:
            problem, answer = f"Find {a} \\cdot {c} - {b} \\cdot {c}.", (a - b) * c
        if problem in seen:
            continue
        seen.add(problem)
        rows.append({
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": PROMPT_PREFIX + problem + PROMPT_SUFFIX}],
            "ability": "MATH",
            "reward_model": {"ground_truth": str(answer), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"synthetic-{seed}-{len(rows)}"},
        })
    return rows


def target_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` as rows of the target-character task: each prompt's set (:func:`rlkit.models.reward.target_set_of` of its
    text) named in a line before it and kept in ``extra_info``; rows that already carry a set are kept as they are."""
    from rlkit.models import reward

    out = []
    for row in rows:
        if reward.TARGET_KEY in row["extra_info"]:
            out.append(row)
            continue
        targets = reward.target_set_of("\n".join(m["content"] for m in row["prompt"]))
        first, *rest = row["prompt"]
        prompt = [{**first, "content": reward.target_instruction(targets) + first["content"]}, *rest]
        out.append({**row, "prompt": prompt, "extra_info": {**row["extra_info"], reward.TARGET_KEY: targets}})
    return out


def synthetic_dapo(n: int = 2048, seed: int = 0, out_path: str | Path | None = None, *,
                   targets: bool = False) -> DatasetInfo:
    """Write ``n`` synthetic DAPO-schema rows to a parquet file (default under data/generated/); ``targets``:
    as rows of the target-character task (:func:`target_rows`)."""
    rows = synthetic_rows(n, seed)
    if targets:
        rows = target_rows(rows)
    for i, row in enumerate(rows):
        validate_row(row, where=f"synthetic row {i}")
    out = Path(out_path) if out_path else default_path("synthetic", n, seed, targets=targets)
    write_parquet(rows, out)
    return DatasetInfo(str(out), "synthetic", len(rows), len(rows))


def default_path(data: str, rows: int, seed: int = 0, out_dir: str | Path | None = None, *,
                 targets: bool = False) -> Path:
    """Where :func:`prepare` writes the parquet verl reads (nothing is touched)."""
    out_dir = Path(out_dir) if out_dir else GENERATED_DIR
    task = "-targets" if targets else ""
    if data == "synthetic":
        return out_dir / f"synthetic-dapo-{rows}-seed{seed}{task}.parquet"
    return out_dir / f"dapo-math-17k.dedup{task}.parquet"


def prepare(data: str, *, rows: int, seed: int = 0, out_dir: str | Path | None = None,
            targets: bool = False) -> DatasetInfo:
    """The recipe's data step: ``data="synthetic"`` -> generated set, else the real DAPO loader; ``targets``:
    rows of the target-character task (:func:`target_rows`)."""
    out = default_path(data, rows, seed, out_dir, targets=targets)
    if data == "synthetic":
        return synthetic_dapo(rows, seed, out, targets=targets)
    return load_dapo(data, out, max_rows=rows or None, targets=targets)


def corpus(rows: list[dict[str, Any]]) -> list[str]:
    """The texts a tokenizer should cover: prompts and ``Answer: <truth>`` lines."""
    out = []
    for row in rows:
        out.extend(m["content"] for m in row["prompt"])
        out.append(f"Let me compute step by step.\nAnswer: {row['reward_model']['ground_truth']}")
    return out
