import contextlib
import importlib.util
import os
import tempfile

import pytest


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_verl = pytest.mark.skip(reason="needs verl (pip install -e '.[verl]')")
    has_cuda = _has_cuda()
    has_verl = importlib.util.find_spec("verl") is not None
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "verl" in item.keywords and not has_verl:
            item.add_marker(skip_verl)


@contextlib.contextmanager
def gloo_world_of_one():
    """A one-rank gloo process group (FSDP1 needs a default group even on one CPU process)."""
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'rdzv')}", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


@pytest.fixture
def single_rank_group():
    with gloo_world_of_one():
        yield
