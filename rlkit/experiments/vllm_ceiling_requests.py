"""The requests of the gen ceiling (:mod:`rlkit.experiments.vllm_ceiling`): verl's first batch of prompts, rendered
as verl's agent loop renders them, repeated ``rollout_n`` times and cut to one replica's share; the warm-up's prompts
beside them. Prepared in a child process, so that the measuring process holds nothing on the GPU when vLLM starts.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlkit.core import params as P
from rlkit.experiments.vllm_ceiling_config import Config


def first_batch(n_rows: int, batch: int, extra: int, seed: int) -> tuple[list[int], list[int]]:
    """Row indices of verl's first batch (``batch``) and the next ``extra`` (warm-up): torchdata's ``RandomSampler``
    with a generator seeded ``seed`` draws ``torch.randperm(n_rows, generator)`` for its first epoch."""
    import torch

    order = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed)).tolist()
    return order[:batch], order[batch:batch + extra]


def prepare_requests(cfg: Config) -> dict[str, Any]:
    """The recipe's inputs (written if missing) and the prompt token ids: the replica's requests and the warm-up's."""
    from transformers import AutoConfig, AutoTokenizer
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from rlkit.models import data
    from rlkit.recipes import grpo as R

    recipe = cfg.recipe()
    paths, data_info, model_info = R.prepare_inputs(recipe)
    tokenizer = AutoTokenizer.from_pretrained(paths.model)
    hf_config = AutoConfig.from_pretrained(paths.model)
    builder = create_continuous_token_builder(tokenizer, hf_model_type=getattr(hf_config, "model_type", None),
                                              chat_template_kwargs={})
    rows = data.read_parquet_rows(paths.train_file)
    rendered = [list(builder.build_initial_tokens(list(row["prompt"]))) for row in rows]
    kept = [ids for ids in rendered if len(ids) <= cfg.max_prompt_length]  # data.filter_overlong_prompts
    batch, warm = first_batch(len(kept), cfg.train_batch_size, cfg.warmup_sequences, recipe.model_seed)
    requests = [kept[i] for i in batch for _ in range(cfg.rollout_n)]  # repeat(interleave=True)
    return {"model_path": paths.model, "train_file": paths.train_file, "data": data_info, "model_info": model_info,
            "max_position_embeddings": hf_config.max_position_embeddings, "rows": len(rows),
            "rows_over_prompt_cap": len(rows) - len(kept), "batch_rows": batch,
            "requests": requests[:cfg.sequences_per_replica], "warmup": [kept[i] for i in warm]}


_PREPARE_CHILD = """
import json, sys
from rlkit.core import params
from rlkit.experiments.vllm_ceiling_config import Config
from rlkit.experiments.vllm_ceiling_requests import prepare_requests
cfg = params.build(Config, json.loads(sys.argv[1]))
with open(sys.argv[2], "w") as f:
    json.dump(prepare_requests(cfg), f, default=str)
"""


def prepare_isolated(cfg: Config, work_dir: Path) -> dict[str, Any]:
    """:func:`prepare_requests` in a child process: writing a random-init model uses the GPU, and this process must
    hold nothing on it (nor have imported verl) when vLLM starts."""
    out = work_dir / "requests.json"
    done = subprocess.run([sys.executable, "-c", _PREPARE_CHILD, json.dumps(P.as_dict(cfg)), str(out)], check=False,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"preparing the inputs failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    prepared = json.loads(out.read_text())
    out.unlink()
    return prepared
