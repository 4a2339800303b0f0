"""HostAdamW against torch.optim.AdamW: bit-exactness, staging reuse, checkpoints, non-finite skip,
rank-0 owner on 2 gloo processes, and construction through verl's build_optimizer.

On a CPU machine every fp32 parameter is host-resident (its own master, stepped in place); bf16
parameters take the packed-copy path that device parameters take on a GPU."""
from __future__ import annotations

import io
import os
import tempfile
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
from conftest import fresh_paths, spawn_two_ranks
from torch.optim.lr_scheduler import LambdaLR

from rlkit.measure.samplers import PhaseTimer
from rlkit.optim import IMPLS, HostAdamW
from rlkit.optim.overlap import HostCopies

TORCH_FLAGS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "forloop": {"foreach": False}}
SHAPES = [(3000,), (40, 17), (7,), (1,)]  # flat FSDP-like, 2-D, tiny, scalar-like
HYPER = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
STEPS = 6


def make_params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]


def set_grads(params, step: int) -> None:
    gen = torch.Generator().manual_seed(1000 + step)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen) * 0.1).to(p.dtype)


def lr_lambda(step: int) -> float:
    return [1.0, 0.5, 0.5, 2.0, 0.25, 1.0, 1.0, 1.0, 1.0, 1.0][step]  # an lr change at most steps


def assert_same_state(host: torch.optim.Optimizer, ref: torch.optim.Optimizer, host_params, ref_params):
    for hp, rp in zip(host_params, ref_params, strict=True):
        assert torch.equal(hp, rp), (hp - rp).abs().max()
        hs, rs = host.state[hp], ref.state[rp]
        assert set(hs) == set(rs)  # max_exp_avg_sq with amsgrad, on exactly the parameters torch keeps it for
        for key in rs:
            assert torch.equal(hs[key], rs[key]), key
            assert hs[key].dtype == rs[key].dtype and hs[key].shape == rs[key].shape, key


GROUP_OPTIONS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")
# Every AdamW option HostAdamW claims (its docstring: torch.optim.AdamW's keywords), each against torch's kernel.
CASES = {
    "defaults": {},
    "amsgrad": {"amsgrad": True},
    "maximize": {"maximize": True},
    "amsgrad+maximize": {"amsgrad": True, "maximize": True},
}


def param_groups(params, case: str):
    """``params`` as one group (``CASES``), or three groups that override every option differently."""
    if case in CASES:
        return params
    return [{"params": params[:2]},
            {"params": params[2:3], "lr": 3e-2, "weight_decay": 0.0, "amsgrad": True},
            {"params": params[3:], "betas": (0.8, 0.99), "eps": 1e-6, "maximize": True}]


@pytest.mark.parametrize("case", [*CASES, "param_groups"])
@pytest.mark.parametrize("impl", IMPLS)
def test_bit_exact_vs_torch_adamw_with_scheduler(impl, case):
    host_params, ref_params = make_params(), make_params()
    options = {**HYPER, **CASES.get(case, {})}
    host = HostAdamW(param_groups(host_params, case), impl=impl, **options)
    ref = torch.optim.AdamW(param_groups(ref_params, case), **options, **TORCH_FLAGS[impl])
    assert [{k: g[k] for k in GROUP_OPTIONS} for g in host.param_groups] == \
        [{k: g[k] for k in GROUP_OPTIONS} for g in ref.param_groups]
    host_sched, ref_sched = LambdaLR(host, lr_lambda), LambdaLR(ref, lr_lambda)
    for step in range(STEPS):
        set_grads(host_params, step)
        set_grads(ref_params, step)
        host.step()
        ref.step()
        host_sched.step()
        ref_sched.step()
        assert [g["lr"] for g in host.param_groups] == [g["lr"] for g in ref.param_groups]
    assert_same_state(host, ref, host_params, ref_params)
    assert float(host.state[host_params[0]]["step"]) == STEPS
    # state_dict holds exactly torch's per-parameter state
    hsd, rsd = host.state_dict(), ref.state_dict()
    for idx in rsd["state"]:
        assert set(hsd["state"][idx]) == set(rsd["state"][idx])
        for key, value in rsd["state"][idx].items():
            assert torch.equal(hsd["state"][idx][key], value)


def test_staging_buffers_are_reused_and_sized_to_largest_param():
    packed = torch.nn.Parameter(torch.randn(5000, dtype=torch.bfloat16))  # the largest; not host fp32: packed
    params = make_params() + [packed]
    opt = HostAdamW(params, **HYPER)
    set_grads(params, 0)
    opt.step()
    after_first = opt.staging.allocations
    assert after_first == 2  # one buffer per tag: "grad" and "param"
    # every gradient comes through "grad" (fp32); only the non-host-fp32 parameter through "param"
    assert opt.staging.nbytes() == {"param": packed.numel() * 2, "grad": packed.numel() * 4}
    for step in range(1, 5):
        set_grads(params, step)
        opt.step()
    assert opt.staging.allocations == after_first
    assert opt.staging.pinned == torch.cuda.is_available()


def _expose(params, masters):
    """HostMasters.exposed() without FSDP: each parameter's .data becomes its host fp32 master."""
    placeholders = [p.data for p in params]
    for p, m in zip(params, masters):
        p.data = m
    return placeholders


@pytest.mark.parametrize("impl", IMPLS)
def test_host_resident_master_is_stepped_in_place_bit_exact(impl):
    masters = [p.detach().clone() for p in make_params()]
    pointers = [m.data_ptr() for m in masters]
    params = [torch.nn.Parameter(torch.zeros_like(m)) for m in masters]  # the parked flat params' placeholders
    ref_params = make_params()
    timer = PhaseTimer()
    host = HostAdamW(params, impl=impl, timer=timer, **HYPER)
    ref = torch.optim.AdamW(ref_params, **HYPER, **TORCH_FLAGS[impl])
    for step in range(STEPS):
        set_grads(params, step)
        set_grads(ref_params, step)
        if step == 2:  # a non-finite gradient: the masters and the state stay as they are
            params[-1].grad[0] = float("inf")
            before = [m.clone() for m in masters]
            placeholders = _expose(params, masters)
            host.step()
            _expose(params, placeholders)
            assert host.last_step_skipped and all(torch.equal(m, b) for m, b in zip(masters, before))
            assert float(host.state[params[0]]["step"]) == 2
            set_grads(params, step)
        placeholders = _expose(params, masters)
        host.step()
        _expose(params, placeholders)
        ref.step()
    for m, r, ptr, p in zip(masters, ref_params, pointers, params):
        assert torch.equal(m, r) and m.data_ptr() == ptr
        assert torch.equal(p, torch.zeros_like(p))  # the placeholder is never written
    for p, r in zip(params, ref_params):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(host.state[p][key], ref.state[r][key]), key
    assert host.master_bytes() == 0 and "param" not in host.staging.nbytes()  # no copy of the master
    assert {"param_pack", "param_h2d"} <= set(timer.seconds)  # entered (empty): same phase names as the device path
    # the checkpoint holds torch's state only; a restored optimizer over the same masters resumes exactly
    saved = host.state_dict()
    assert all(set(s) == {"step", "exp_avg", "exp_avg_sq"} for s in saved["state"].values())
    resumed = HostAdamW(params, impl=impl, **HYPER)
    resumed.load_state_dict(saved)
    set_grads(params, STEPS)
    set_grads(ref_params, STEPS)
    placeholders = _expose(params, masters)
    resumed.step()
    _expose(params, placeholders)
    ref.step()
    assert all(torch.equal(m, r) for m, r in zip(masters, ref_params))


@pytest.mark.parametrize("impl", IMPLS)
def test_non_fp32_params_step_a_separate_host_master_bit_exact(impl):
    params = [torch.nn.Parameter(p.detach().to(torch.bfloat16)) for p in make_params()]
    ref_params = [torch.nn.Parameter(p.detach().float()) for p in params]
    host = HostAdamW(params, impl=impl, **HYPER)
    ref = torch.optim.AdamW(ref_params, **HYPER, **TORCH_FLAGS[impl])
    for step in range(STEPS):
        set_grads(params, step)
        for p, r in zip(params, ref_params):
            r.grad = p.grad.float()
        host.step()
        ref.step()
    for p, r in zip(params, ref_params):
        assert torch.equal(host.state[p]["master"], r) and torch.equal(p, r.to(torch.bfloat16))
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(host.state[p][key], ref.state[r][key]), key
    assert host.master_bytes() == sum(p.numel() * 4 for p in params)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_grad_on_host_master_and_switching_between_device_and_host_bit_exact():
    """Grads on the device, the master alternately on the device (copy path) and parked on the host (in place)."""
    params = [torch.nn.Parameter(p.detach().cuda()) for p in make_params()]
    ref_params = make_params()
    host = HostAdamW(params, **HYPER)
    ref = torch.optim.AdamW(ref_params, fused=True, **HYPER)
    for step in range(STEPS):
        set_grads(ref_params, step)
        for p, r in zip(params, ref_params):
            p.grad = r.grad.cuda()
        parked = step % 3 != 0  # steps 0 and 3 on the device; the others in place on the host
        if parked:
            placeholders = _expose(params, [p.detach().cpu().pin_memory() for p in params])
        host.step()
        ref.step()
        for p, r in zip(params, ref_params):
            assert torch.equal(p.detach().cpu(), r), step
        if parked:
            for p, placeholder in zip(params, placeholders):
                placeholder.copy_(p.data)  # unpark
                p.data = placeholder
        assert host.master_bytes() == (0 if parked else sum(p.numel() * 4 for p in params))


def test_overlap_copies_without_device_copies_is_the_serial_step():
    """On host gradients (a CPU model) there is nothing to overlap: the option leaves the serial step, same bits."""
    serial_params, overlap_params = make_params(), make_params()
    serial, overlap = HostAdamW(serial_params, **HYPER), HostAdamW(overlap_params, overlap_copies=True, **HYPER)
    for step in range(3):
        set_grads(serial_params, step)
        set_grads(overlap_params, step)
        serial.step()
        overlap.step()
        assert overlap.last_step_overlapped is False
    assert_same_state(overlap, serial, overlap_params, serial_params)


def _overlap_params() -> list[torch.nn.Parameter]:
    """bf16 parameters take the packed copy path (master -> param buffer -> upload), fp32 ones are stepped in place;
    the copy path comes twice in a row (both buffers in flight) and last (the last upload)."""
    gen = torch.Generator().manual_seed(3)
    shapes_dtypes = [((300,), torch.bfloat16), ((40, 17), torch.bfloat16), ((7,), torch.float32),
                     ((3000,), torch.bfloat16), ((1,), torch.float32), ((5, 11), torch.bfloat16)]
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(d)) for s, d in shapes_dtypes]


@pytest.mark.parametrize("deferred", [False, True], ids=["copies-at-issue", "copies-when-waited"])
def test_overlapped_schedule_is_bit_identical_to_the_serial_step_on_the_cpu(deferred):
    """The overlapped schedule itself (rlkit.optim.overlap.step_overlapped), on host tensors with a stand-in stream:
    with copies that complete as soon as they are issued (a buffer overwritten too early shows) and copies that
    complete only when waited for (a buffer read too early, or a copy never waited for, shows), after gradient
    clipping as verl does it, every parameter, master and moment equals the serial step's after every step."""
    runs = {}
    for overlap in (False, True):
        params = _overlap_params()
        streams = HostCopies(deferred=deferred)
        opt = HostAdamW(params, overlap_copies=overlap, copy_streams=streams, **HYPER)
        history = []
        for step in range(STEPS):
            gen = torch.Generator().manual_seed(1000 + step)
            for p in params:
                p.grad = (torch.randn(p.shape, generator=gen) * (1.0 + step)).to(p.dtype)
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)
            assert norm > 1.0  # the clipping scaled these gradients
            opt.step()
            assert opt.last_step_overlapped is overlap
            history.append([p.detach().clone() for p in params])
        runs[overlap] = (opt, params, history, streams.copies)
    (serial, serial_params, serial_history, _), (overlapped, params, history, copies) = runs[False], runs[True]
    for step, (got, want) in enumerate(zip(history, serial_history, strict=True)):
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert torch.equal(a, b), f"step {step}, parameter {i}: max diff {(a.float() - b.float()).abs().max()}"
    for i, (a, b) in enumerate(zip(params, serial_params, strict=True)):
        for key in ("step", "exp_avg", "exp_avg_sq", "master"):
            if key in serial.state[b]:
                assert torch.equal(overlapped.state[a][key], serial.state[b][key]), (i, key)
    # every gradient came down and every packed parameter went up through the stand-in, two buffers per direction
    packed = sum(p.dtype != torch.float32 for p in params)
    assert copies == STEPS * (len(params) + packed)
    assert {"grad0", "grad1", "param0", "param1"} == set(overlapped.staging.nbytes())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("parked", [False, True])
def test_overlapped_copies_are_bit_identical_to_the_serial_step_on_the_gpu(parked):
    """Device gradients, the copies on a side stream: the same parameters, masters and moments as the serial step,
    for fp32 and bf16 device parameters (the copy path) and parameters parked on the host (stepped in place), with
    the next step's forward reading the uploaded parameters on the compute stream right after."""
    def build():
        params = [torch.nn.Parameter(p.detach().cuda()) for p in make_params()]
        params.append(torch.nn.Parameter(torch.randn(5000, generator=torch.Generator().manual_seed(7)).to(
            "cuda", torch.bfloat16)))
        return params

    runs = {}
    for overlap in (False, True):
        params = build()
        opt = HostAdamW(params, overlap_copies=overlap, **HYPER)
        for step in range(STEPS):
            gen = torch.Generator().manual_seed(1000 + step)
            for p in params:
                p.grad = (torch.randn(p.shape, generator=gen) * 0.1).to("cuda", p.dtype)
            placeholders = _expose(params[:-1], [p.detach().cpu().pin_memory() for p in params[:-1]]) if parked else None
            opt.step()
            assert opt.last_step_overlapped is overlap
            sums = [float(p.detach().double().sum()) for p in params]  # read on the compute stream at once
            if parked:
                for p, placeholder in zip(params[:-1], placeholders):
                    placeholder.copy_(p.data)
                    p.data = placeholder
        runs[overlap] = (opt, params, sums)
    (serial, serial_params, serial_sums), (overlapped, overlap_params, overlap_sums) = runs[False], runs[True]
    assert overlap_sums == serial_sums
    for a, b in zip(overlap_params, serial_params, strict=True):
        assert torch.equal(a.detach().cpu(), b.detach().cpu())
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(overlapped.state[a][key], serial.state[b][key]), key
    assert {"grad0", "grad1"} <= set(overlapped.staging.nbytes())  # two buffers per direction


def test_pin_memory_true_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA present: pinning works")
    with pytest.raises(ValueError, match="pin_memory"):
        HostAdamW(make_params(), pin_memory=True)


@pytest.mark.parametrize("kwargs, key", [({"impl": "cuda"}, "impl"), ({"lr": -1.0}, "lr"),
                                         ({"betas": (0.9, 1.5)}, "betas"), ({"weight_decay": -0.1}, "weight_decay"),
                                         ({"rank0_owner": True}, "rank0_owner"), ({"host_threads": -1}, "host_threads"),
                                         ({"host_threads": True}, "host_threads"), ({"host_threads": 2.0}, "host_threads"),
                                         ({"owners": "rack"}, "owners"), ({"owners": "node"}, "owners")])
def test_bad_arguments_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        HostAdamW(make_params(), **kwargs)


class ThreadProbe:
    """A timer that records torch's intra-op thread count inside each HostAdamW phase."""

    def __init__(self) -> None:
        self.threads: dict[str, set[int]] = {}

    @contextmanager
    def phase(self, name: str):
        self.threads.setdefault(name, set()).add(torch.get_num_threads())
        yield


@pytest.mark.parametrize("impl", IMPLS)
def test_host_threads_do_not_change_the_step(impl):
    """1 against 2 intra-op threads: params, master copies (bf16 params) and Adam state bit-identical."""
    big = [(1 << 20) + 3, (700, 513)]  # large enough that torch's CPU kernels split the work across threads
    runs = []
    for threads in (1, 2):
        gen = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype))
                  for s in big for dtype in (torch.float32, torch.bfloat16)]
        probe = ThreadProbe()
        opt = HostAdamW(params, impl=impl, host_threads=threads, timer=probe, **HYPER)
        for step in range(3):
            set_grads(params, step)
            opt.step()
        assert probe.threads["host_step"] == {threads} and opt.memory_report()["host_threads"] == threads
        runs.append((params, opt))
    (p1, o1), (p2, o2) = runs
    for a, b in zip(p1, p2):
        assert (a.float() - b.float()).abs().max().item() == 0.0
        for key in ("step", "exp_avg", "exp_avg_sq", "master"):
            if key in o1.state[a]:
                assert torch.equal(o1.state[a][key], o2.state[b][key]), key


def test_host_threads_are_restored_after_the_step_and_zero_keeps_torchs():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        params = make_params()
        probe = ThreadProbe()
        opt = HostAdamW(params, host_threads=2, timer=probe, **HYPER)
        set_grads(params, 0)
        opt.step()
        assert probe.threads["host_step"] == {2} and torch.get_num_threads() == 1
        keep_probe = ThreadProbe()
        HostAdamW(params, host_threads=0, timer=keep_probe, **HYPER).step()
        assert keep_probe.threads["host_step"] == {1} and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_default_host_threads_share_this_hosts_cpus(monkeypatch):
    """Ray starts verl's workers with one torch thread; the default uses the process's CPUs per stepping rank."""
    cpus = len(os.sched_getaffinity(0))
    for var in ("LOCAL_WORLD_SIZE", "RAY_LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert HostAdamW(make_params()).host_threads == cpus
    monkeypatch.setenv("RAY_LOCAL_WORLD_SIZE", "2")  # verl's Ray workers
    assert HostAdamW(make_params()).host_threads == max(1, cpus // 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # a stray 1 does not hide the Ray count: the larger one counts
    assert HostAdamW(make_params()).host_threads == max(1, cpus // 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun
    assert HostAdamW(make_params()).host_threads == max(1, cpus // 4)
    assert HostAdamW(make_params(), rank0_owner=False, host_threads=3).host_threads == 3
    monkeypatch.setenv("RLKIT_HOST_THREADS", "5")  # jobs sharing a host: each rank's share, set from outside
    assert HostAdamW(make_params()).host_threads == 5
    assert HostAdamW(make_params(), host_threads=2).host_threads == 2
    monkeypatch.setenv("RLKIT_HOST_THREADS", "half")
    with pytest.raises(ValueError, match="RLKIT_HOST_THREADS='half'.*Fix"):
        HostAdamW(make_params())


def _host_count_worker(rank: int, store_path: str, out_dir: str) -> None:
    for name in ("LOCAL_WORLD_SIZE", "RAY_LOCAL_WORLD_SIZE"):
        os.environ.pop(name, None)  # what a launcher may leave unset: the count comes from the process group
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    try:
        torch.save(HostAdamW(make_params()).host_threads, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_default_host_threads_count_the_ranks_on_this_host_over_the_process_group():
    with tempfile.TemporaryDirectory() as tmp:
        _, out_dir = spawn_two_ranks(_host_count_worker, fresh_paths(tmp, "store", ""))
        threads = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in (0, 1)]
    assert threads == [max(1, len(os.sched_getaffinity(0)) // 2)] * 2


@pytest.mark.parametrize("impl", ["fused", "forloop"])
def test_state_dict_round_trip_resumes_exactly(impl):
    params, ref_params = make_params(), make_params()
    opt = HostAdamW(params, impl=impl, **HYPER)
    ref = torch.optim.AdamW(ref_params, **HYPER, **TORCH_FLAGS[impl])
    for step in range(3):
        set_grads(params, step)
        set_grads(ref_params, step)
        opt.step()
        ref.step()
    buffer = io.BytesIO()
    torch.save({"optim": opt.state_dict(), "params": [p.detach().clone() for p in params]}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    resumed_params = [torch.nn.Parameter(t) for t in saved["params"]]
    resumed = HostAdamW(resumed_params, impl=impl, lr=123.0)  # hyper-parameters come from the checkpoint
    resumed.load_state_dict(saved["optim"])
    assert resumed.param_groups[0]["lr"] == HYPER["lr"]
    for state in resumed.state.values():
        assert all(t.device.type == "cpu" for t in state.values())
    for step in range(3, STEPS):
        set_grads(resumed_params, step)
        set_grads(ref_params, step)
        resumed.step()
        ref.step()
    assert_same_state(resumed, ref, resumed_params, ref_params)


def test_load_state_dict_mismatch_is_a_clear_error():
    opt = HostAdamW(make_params(), **HYPER)
    other = HostAdamW(make_params()[:2], **HYPER)
    with pytest.raises(ValueError, match="same model"):
        other.load_state_dict(opt.state_dict())


def test_state_dict_records_the_rank_role_and_torch_adamw_ignores_it():
    params, ref_params = make_params(), make_params()
    opt = HostAdamW(params, host_threads=1, **HYPER)
    set_grads(params, 0)
    opt.step()
    saved = opt.state_dict()
    assert saved["host_adamw"] == {"rank0_owner": False, "is_owner": True}
    assert opt.options() == {"impl": "fused", "rank0_owner": False, "skip_nonfinite": True,
                             "check_identical_grads": False, "pin_memory": torch.cuda.is_available(),
                             "broadcast_device": "host", "host_threads": 1, "overlap_copies": False, "prefetch_grads": False,
                             "group_size": 1, "owners": "group", "nodes": None}
    ref = torch.optim.AdamW(ref_params, fused=True, **HYPER)
    ref.load_state_dict(saved)  # the extra entry is not torch's business
    assert torch.equal(ref.state[ref_params[0]]["exp_avg"], opt.state[params[0]]["exp_avg"])
    # a state dict of a rank without Adam state (rank0_owner on rank 1) is refused by a rank that steps
    empty = {**saved, "state": {}, "host_adamw": {"rank0_owner": True, "is_owner": False}}
    with pytest.raises(ValueError, match=r"saved by a rank that holds no Adam state \(rank0_owner=True\), and this "
                                         r"rank holds Adam state \(rank0_owner=False\)"):
        HostAdamW(make_params(), **HYPER).load_state_dict(empty)


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_gradient_leaves_everything_untouched(bad):
    params = make_params()
    opt = HostAdamW(params, **HYPER)
    set_grads(params, 0)
    opt.step()
    before_params = [p.detach().clone() for p in params]
    before_state = {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()}
    set_grads(params, 1)
    params[-1].grad[0] = bad  # the last parameter: the walk would already have updated the others
    opt.step()
    assert opt.last_step_skipped
    for p, b in zip(params, before_params):
        assert torch.equal(p, b)
    for i, s in opt.state_dict()["state"].items():
        for k, v in s.items():
            assert torch.equal(v, before_state[i][k]), k
    set_grads(params, 1)
    opt.step()
    assert not opt.last_step_skipped and float(opt.state[params[0]]["step"]) == 2


def test_skip_nonfinite_false_steps_like_torch():
    params, ref_params = make_params(), make_params()
    opt = HostAdamW(params, skip_nonfinite=False, **HYPER)
    ref = torch.optim.AdamW(ref_params, fused=True, **HYPER)
    for ps in (params, ref_params):
        set_grads(ps, 0)
        ps[1].grad[0, 0] = float("nan")
    opt.step()
    ref.step()
    for p, r in zip(params, ref_params):
        assert torch.equal(p.isnan(), r.isnan()) and torch.equal(p.nan_to_num(), r.nan_to_num())


@pytest.mark.verl
def test_lr_scheduler_drives_param_groups_with_verl_schedule():
    from verl.utils import torch_functional as verl_tf

    params, ref_params = make_params(), make_params()
    opt = HostAdamW(params, **HYPER)
    ref = torch.optim.AdamW(ref_params, fused=True, **HYPER)
    scheds = [verl_tf.get_constant_schedule_with_warmup(o, num_warmup_steps=3) for o in (opt, ref)]
    lrs = []
    for step in range(STEPS):
        set_grads(params, step)
        set_grads(ref_params, step)
        opt.step()
        ref.step()
        for s in scheds:
            s.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs[:3] == pytest.approx([HYPER["lr"] / 3, 2 * HYPER["lr"] / 3, HYPER["lr"]])
    assert_same_state(opt, ref, params, ref_params)


@pytest.mark.verl
def test_build_through_verl_build_optimizer():
    from verl.workers.config.optimizer import FSDPOptimizerConfig, build_optimizer

    config = FSDPOptimizerConfig(optimizer_impl="rlkit.optim", optimizer="HostAdamW", lr=1e-2, weight_decay=0.1,
                                 betas=(0.9, 0.95), override_optimizer_config={"impl": "foreach"})
    params, ref_params = make_params(), make_params()
    opt = build_optimizer(params, config)
    assert isinstance(opt, HostAdamW) and opt.impl == "foreach"
    group = opt.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["betas"]) == (1e-2, 0.1, (0.9, 0.95))
    ref = torch.optim.AdamW(ref_params, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), foreach=True)
    for step in range(3):
        set_grads(params, step)
        set_grads(ref_params, step)
        opt.step()
        ref.step()
    assert_same_state(opt, ref, params, ref_params)


# ------------------------------------------------------------------------------ rank-0 owner, 2 gloo ranks
def _rank0_worker(rank: int, world: int, broadcast: str, store_path: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        params, ref_params = make_params(), make_params()
        opt = HostAdamW(params, rank0_owner=True, check_identical_grads=True, broadcast_device=broadcast, **HYPER)
        ref = torch.optim.AdamW(ref_params, fused=True, **HYPER)
        scheds = [LambdaLR(o, lr_lambda) for o in (opt, ref)]

        def step(step_idx, optimizer, ps):
            set_grads(ps, step_idx)
            optimizer.step()

        for i in range(2):
            step(i, opt, params)
            step(i, ref, ref_params)
            for s in scheds:
                s.step()
        # checkpoint: every rank saves its own (rank 1's holds no state), then a fresh optimizer resumes
        saved = {"optim": opt.state_dict(), "sched": scheds[0].state_dict(),
                 "params": [p.detach().clone() for p in params]}
        params = [torch.nn.Parameter(t.clone()) for t in saved["params"]]
        opt = HostAdamW(params, rank0_owner=True, check_identical_grads=True, broadcast_device=broadcast, **HYPER)
        sched = LambdaLR(opt, lr_lambda)  # built before loading, as verl does
        opt.load_state_dict(saved["optim"])
        sched.load_state_dict(saved["sched"])
        for i in range(2, STEPS):
            step(i, opt, params)
            step(i, ref, ref_params)
            sched.step()
            scheds[1].step()
        # a non-finite gradient on the owner skips the step on every rank
        set_grads(params, 99)
        if rank == 0:
            params[0].grad[5] = float("inf")
        snapshot = [p.detach().clone() for p in params]
        opt.check_identical_grads = False  # the grads now differ on purpose; test the skip alone
        opt.step()
        skipped = opt.last_step_skipped and all(torch.equal(p, s) for p, s in zip(params, snapshot))
        # the debug assertion catches ranks whose gradients differ
        opt.check_identical_grads = True
        set_grads(params, 100)
        if rank == 1:
            params[1].grad[0, 0] += 1.0
        try:
            opt.step()
            caught = ""
        except RuntimeError as err:
            caught = str(err)
        # the packed-copy path (not host fp32, like device params): the owner's master goes out packed
        packed = [torch.nn.Parameter(p.detach().to(torch.bfloat16)) for p in make_params()]
        packed_opt = HostAdamW(packed, rank0_owner=True, broadcast_device=broadcast, **HYPER)
        for i in range(2):
            set_grads(packed, i)
            packed_opt.step()
        result = {
            "max_diff_vs_ref": max(float((p - r).detach().abs().max()) for p, r in zip(params, ref_params)),
            "params": [p.detach().clone() for p in params],
            "adam_state_bytes": opt.adam_state_bytes(),
            "adam_state_params": opt.adam_state_params(),
            "master_bytes": opt.master_bytes(),
            "skipped_consistently": skipped,
            "caught": caught,
            "packed": [p.detach().clone() for p in packed],
            "packed_report": packed_opt.memory_report(),
            "state_equal_ref": all(
                torch.equal(opt.state[p][k], ref.state[r][k])
                for p, r in zip(params, ref_params) for k in ("step", "exp_avg", "exp_avg_sq")
            ) if rank == 0 else None,
        }
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears gloo down while its peer is still communicating
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("broadcast", ["host", "cpu"])  # "cpu": the device path (buffer, in-place) over gloo
def test_rank0_owner_two_gloo_ranks_exact_with_checkpoint_restore(broadcast):
    with tempfile.TemporaryDirectory() as tmp:
        make = fresh_paths(tmp, "store", "")
        _, _, store, out_dir = spawn_two_ranks(_rank0_worker, lambda: (2, broadcast, *make()))
        r0, r1 = (torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in (0, 1))
    assert r0["max_diff_vs_ref"] == 0.0 and r1["max_diff_vs_ref"] == 0.0
    assert r0["state_equal_ref"]
    assert all(torch.equal(a, b) for a, b in zip(r0["params"], r1["params"]))
    expected_bytes = sum(2 * 4 * torch.Size(s).numel() + 4 for s in SHAPES)  # exp_avg, exp_avg_sq, step
    assert r0["adam_state_bytes"] == expected_bytes and r0["adam_state_params"] == len(SHAPES)
    assert r1["adam_state_bytes"] == 0 and r1["adam_state_params"] == 0 and r1["master_bytes"] == 0
    assert r0["skipped_consistently"] and r1["skipped_consistently"]
    assert "differ across ranks" in r0["caught"] and "differ across ranks" in r1["caught"]
    assert all(torch.equal(a, b) for a, b in zip(r0["packed"], r1["packed"]))
    assert r0["packed_report"]["master_bytes"] == sum(4 * torch.Size(s).numel() for s in SHAPES)
    assert r1["packed_report"]["master_bytes"] == 0 and r1["packed_report"]["adam_state_params"] == 0


# ------------------------------------------------------------------------------ rank-0 owner over NCCL, 2 GPUs
def _rank0_nccl_worker(rank: int, store_path: str, out_dir: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"file://{store_path}", rank=rank, world_size=2)
    try:
        # Device params: written on the owner, broadcast in place. Parked params: device placeholders whose
        # .data is the host fp32 master during the step (HostMasters.exposed()), crossing through the buffer.
        device_params = [torch.nn.Parameter(p.detach().cuda()) for p in make_params()]
        masters = [p.detach().clone().pin_memory() for p in make_params(seed=1)]
        parked = [torch.nn.Parameter(torch.zeros_like(m, device="cuda")) for m in masters]
        ref_params = make_params() + make_params(seed=1)
        opt = HostAdamW(device_params + parked, rank0_owner=True, **HYPER)
        ref = torch.optim.AdamW(ref_params, fused=True, **HYPER)
        for step in range(3):
            set_grads(ref_params, step)
            for p, r in zip(device_params + parked, ref_params):
                p.grad = r.grad.cuda()  # gradients stay on the device, as FSDP leaves them
            placeholders = _expose(parked, masters)
            opt.step()
            _expose(parked, placeholders)
            ref.step()
        result = {"device": str(opt._broadcast_device), "buffer_after_step": opt._device_staging.nbytes() == {},
                  "shared_threads": HostAdamW(make_params()).host_threads,  # counted over NCCL, both ranks here
                  "max_diff_vs_ref": max(float((p.detach().cpu() - r).abs().max())
                                         for p, r in zip(device_params + masters, ref_params))}
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_rank0_owner_broadcasts_over_nccl_by_default_bit_exact():
    with tempfile.TemporaryDirectory() as tmp:
        _, out_dir = spawn_two_ranks(_rank0_nccl_worker, fresh_paths(tmp, "store", ""))
        results = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in (0, 1)]
    for rank, r in enumerate(results):
        assert r["device"] == f"cuda:{rank}" and r["buffer_after_step"] and r["max_diff_vs_ref"] == 0.0
        assert r["shared_threads"] == max(1, len(os.sched_getaffinity(0)) // 2)
