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


def spawn_two_ranks(worker, make_args):
    """``torch.multiprocessing.spawn(worker, make_args(), nprocs=2)``, once more if a rank dies of a signal.

    On a loaded 2-core machine a gloo rank occasionally aborts (SIGABRT, "terminate called without an active
    exception") while the process group is torn down. The workers compute deterministic values, so a second
    run cannot change what a test checks; a worker that raises still fails the test. ``make_args()`` is
    called for each attempt (fresh rendezvous and output paths) and the arguments used are returned.
    """
    import torch.multiprocessing as mp

    for attempt in range(2):
        args = make_args()
        try:
            mp.spawn(worker, args=args, nprocs=2, join=True)
            return args
        except mp.ProcessExitedException as err:
            if attempt or err.exit_code is None or err.exit_code >= 0:
                raise
    raise AssertionError("unreachable")


def fresh_paths(root: str, *names: str):
    """A ``make_args`` for :func:`spawn_two_ranks`: each call returns new paths ``names`` in a new folder."""
    counter = iter(range(1_000_000))

    def make():
        folder = os.path.join(root, f"attempt{next(counter)}")
        os.makedirs(folder)
        return tuple(os.path.join(folder, n) for n in names)

    return make


def committed_runs(folder):
    """The run folders under ``folder`` whose metrics.json git tracks (rlkit.core.results.committed_runs): the
    committed results a test may read, never a local run such as the tiny/ folders ``make demo`` writes. Skips,
    saying why, where git cannot tell them apart (a copy of the tree without .git)."""
    from rlkit.core.results import NotACheckout
    from rlkit.core.results import committed_runs as runs

    try:
        return runs(folder)
    except NotACheckout as err:
        pytest.skip(str(err))


def committed_run(folder):
    """``folder`` if git tracks its metrics.json, else skip the test saying so."""
    from pathlib import Path

    folder = Path(folder).resolve()
    if folder not in committed_runs(folder.parent):
        pytest.skip(f"{folder} is not a committed run (git tracks no metrics.json there)")
    return folder


def committed_params(folder, name, ids_from):
    """Parameters for a test over every file called ``name`` under ``folder`` that git tracks, each with the id
    ``ids_from(path)``: the committed results, never a local run (the tiny/ folders ``make demo`` writes). In a
    copy of the tree without .git, one parameter that skips, saying why, so collection still succeeds."""
    from rlkit.core.results import NotACheckout, tracked_files

    try:
        files = [p for p in tracked_files(folder) if p.name == name]
    except NotACheckout as err:
        return [pytest.param(None, marks=pytest.mark.skip(reason=str(err)), id="not-a-checkout")]
    return [pytest.param(p, id=ids_from(p)) for p in files]
