"""rlkit.patches.instruments.rank_identity: the after-step check finds 0.0 on identical ranks and the difference otherwise."""
import json
import tempfile

import torch
import torch.distributed as dist
from conftest import fresh_paths, spawn_two_ranks

from rlkit.patches.instruments import rank_identity


def _worker(rank: int, rdzv: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=2)
    torch.manual_seed(0)
    same = [torch.randn(1000), torch.randn(37, 5)]
    differ = [t.clone() for t in same]
    if rank == 1:
        differ[1][3, 2] += 0.25
        differ.append(torch.tensor([float("nan")]))
    else:
        differ.append(torch.tensor([float("nan")]))
    results = {
        "same": rank_identity.max_rank_difference(same, chunk_numel=64),
        "differ": rank_identity.max_rank_difference(differ, chunk_numel=64),
    }
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.barrier()  # no rank tears gloo down while its peer is still communicating
    dist.destroy_process_group()


def test_identical_ranks_give_zero_and_a_changed_element_is_found():
    with tempfile.TemporaryDirectory() as tmp:
        _, out = spawn_two_ranks(_worker, fresh_paths(tmp, "rdzv", "out.json"))
        with open(out) as f:
            results = json.load(f)
    assert results["same"] == [0.0, 0]
    worst, differing = results["differ"]
    # The changed element, plus the NaN that is never equal to itself (a NaN must fail the bar).
    assert worst == float("inf") and differing == 2


def test_records_are_read_in_step_order(tmp_path):
    rows = [{"optimizer_step": 2, "max_abs_diff": 0.0}, {"optimizer_step": 1, "max_abs_diff": 0.0}]
    (tmp_path / f"{rank_identity.RECORD_PREFIX}host-1.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert [r["optimizer_step"] for r in rank_identity.read_records(tmp_path)] == [1, 2]


def test_a_new_launch_starts_without_the_previous_launchs_records(tmp_path):
    from rlkit.recipes.job import clear_plugin_records

    record_dir = tmp_path / "plugin_records"
    record_dir.mkdir()
    (record_dir / "host-1.json").write_text("{}")
    (record_dir / f"{rank_identity.RECORD_PREFIX}host-1.jsonl").write_text("{}\n")
    (record_dir / "notes.txt").write_text("kept")
    clear_plugin_records(record_dir)
    assert sorted(p.name for p in record_dir.iterdir()) == ["notes.txt"]
    assert rank_identity.read_records(record_dir) == []


def test_record_names_the_host_step_threads():
    import types

    import torch

    from rlkit.optim import HostAdamW

    engine = types.SimpleNamespace(optimizer=HostAdamW([torch.nn.Parameter(torch.ones(3))], host_threads=3))
    assert rank_identity._host_threads(engine) == {"host_threads": 3, "torch_threads": torch.get_num_threads()}
    plain = types.SimpleNamespace(optimizer=torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))]))
    assert rank_identity._host_threads(plain)["host_threads"] is None
