import importlib.util

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
