"""describe(metrics) of notebooks 00-04 and 06 states the numbers of the metrics it is given.

Each is run on every committed results folder of its notebook and on a tiny CPU run made here; the numbers it must
carry are formatted in the test from the metrics themselves, and a changed metric must change the prose."""
import copy
import json

import pytest

from rlkit.core import params as P
from rlkit.core.results import OUTPUTS_DIR, NotACheckout, committed_runs, load_profile
from rlkit.experiments import findings

GIB = 2**30
NOTEBOOKS = ["00_phase_budget", "01_offload_bug", "02_host_adamw", "03_cast_once", "04_skip_old_logprob", "06_util_sweep"]


def _committed():
    """Each notebook's committed run folders (rlkit.core.results.committed_runs: never a `make demo` tiny/ run); in a
    copy of the tree without .git, one parameter that skips, saying why."""
    try:
        runs = {nb: committed_runs(OUTPUTS_DIR / nb) for nb in NOTEBOOKS}
    except NotACheckout as err:
        yield pytest.param(None, None, marks=pytest.mark.skip(reason=str(err)), id="not-a-checkout")
        return
    for nb in NOTEBOOKS:
        for folder in runs[nb]:
            yield pytest.param(nb, folder, id=str(folder.relative_to(OUTPUTS_DIR)))
        if nb == "06_util_sweep":
            yield pytest.param(nb, OUTPUTS_DIR / nb, id=nb)  # the sweep: its point folders together


def _numbers_00(m):
    plans = list(m["plans"].values())
    changed = [r for r in m["seed_diff"] if r["differs"]]
    return ([f"{plans[0]['params']:,}", f"{len(changed)} of {len(m['seed_diff'])} rows"]
            + [f"{p['peak_gib']:.2f} GiB, headroom {p['headroom_gib']:+.2f} GiB" for p in plans]
            + [f"${c['run_cost']:,.2f}" for c in m["cost_examples"]])


def _numbers_01(m):
    g = m["grad_sync"]
    out = [f"{m['model_params']:,}", f"{m['model_gib']:.3f} GiB", f"= {g['max_abs_grad_diff_without_fix']:.3e}",
           f"{len(m['rows'])} rows"]
    bug = next(r for r in m["rows"] if not (r["use_orig_params"] or r["forward_first"] or r["fix"]))
    if m["memory_measured"]:
        out.append(f"{bug['after_reload_gib']:.3f} GiB after reload")
    else:
        out.append(f"{bug['views_stale_after_offload']} of {bug['views_before_offload']} parameter views")
    return out


def _numbers_02(m):
    s = m["summary"]
    out = [f"optimizer phase {t:.3f} s" for t in s["optimizer_seconds"].values()]
    out += [f"{b / GIB:.3f} GiB" for bs in s["adam_state_bytes_per_rank"].values() for b in bs]
    if s["host_step_vs_torch_fused"] is not None:
        out.append(f"{s['host_step_vs_torch_fused']:.2f} x torch's fused CPU AdamW")
    return out + [f"{a['parity']['device_reference']['max_abs_diff']:.3g}" for a in m["arms"] if a["status"] == "ok"]


def _numbers_03(m):
    rows = m["summary"]["per_arm"].values()
    return ([f"peak {r['peak_device_gib']:.2f} GiB, step {r['step_seconds']:.3f} s" for r in rows]
            + [f"{r['casts_per_step']} casts/step for {r['num_flat_params']} flat parameters" for r in rows]
            + [f"over {m['config']['steps']} steps"])


def _numbers_04(m):
    b, t, s = m["bit_exactness"], m["timing"], m["setup"]
    return [f"{s['total_tokens']:,} tokens", f"{b['grad_max_abs_diff']:.3e}", f"PPO loss {b['loss_skip']:.6g}",
            f"took {t['old_log_prob_seconds']:.3g} s", f"{t['skipped_over_unskipped']:.3%}",
            f"{sum(g['ok'] for g in m['guard'])} of {len(m['guard'])} configs"]


def _numbers_06(m):
    runs = m.get("runs", [m])
    out = [f"{len(runs)} point(s)", f"{sum(bool(r['measured']) for r in runs)} measured on a GPU"]
    for r in runs:
        out.append(f"planner KV pool {r['planner']['kv_pool_gib']:.2f} GiB")
        if r["measured"]:
            out.append(f"step {r['measured']['step_s']:.1f} s")
    return out


NUMBERS = {"00_phase_budget": _numbers_00, "01_offload_bug": _numbers_01, "02_host_adamw": _numbers_02,
           "03_cast_once": _numbers_03, "04_skip_old_logprob": _numbers_04, "06_util_sweep": _numbers_06}


def _change(nb, m):
    """A deliberately changed metric, and the text its new value must show."""
    m = copy.deepcopy(m)
    if nb == "00_phase_budget":
        p = next(iter(m["plans"].values()))
        p["peak_gib"] += 1.234
        return m, f"{p['peak_gib']:.2f} GiB"
    if nb == "01_offload_bug":
        m["grad_sync"]["max_abs_grad_diff_without_fix"] = 0.0123
        return m, "1.230e-02"
    if nb == "02_host_adamw":
        arm = next(iter(m["summary"]["optimizer_seconds"]))
        next(a for a in m["arms"] if a["arm"] == arm)["optimizer_seconds"] = 98.765
        return m, "optimizer phase 98.765 s"
    if nb == "03_cast_once":
        next(iter(m["summary"]["per_arm"].values()))["peak_device_gib"] = 77.77
        return m, "peak 77.77 GiB"
    if nb == "04_skip_old_logprob":
        m["bit_exactness"]["grad_max_abs_diff"] = 0.0321
        return m, "3.210e-02"
    run = m["runs"][0] if "runs" in m else m
    run["planner"]["kv_pool_gib"] = 12.345
    return m, "planner KV pool 12.35 GiB"


def _check(nb, metrics):
    text = findings.describe(nb, metrics)
    missing = [n for n in NUMBERS[nb](metrics) if n not in text]
    assert not missing, f"{nb}: the prose lacks {missing}:\n{text}"
    changed, shown = _change(nb, metrics)
    other = findings.describe(nb, changed)
    assert other != text and shown in other and shown not in text
    return text


@pytest.mark.parametrize("nb, folder", list(_committed()))
def test_describe_states_the_numbers_of_each_committed_run(nb, folder):
    text = _check(nb, findings.read_folder(nb, folder))
    if nb != "00_phase_budget":  # 00 measures nothing: it says so instead
        assert text.startswith("GPU run") or "measured on a GPU" in text.splitlines()[0]


def _tiny(nb, tmp_path, **overrides):
    import importlib

    module = importlib.import_module(findings.MODULES[nb])
    values = {**load_profile(nb, "tiny"), **overrides}
    for key in ("results_dir", "noise_dir"):
        values.pop(key, None)
    cfg = P.build(module.Config, values, where=f"tiny {nb}")
    metrics = module.run(cfg, out_dir=tmp_path) if nb == "06_util_sweep" else module.run(cfg)
    return json.loads(json.dumps(metrics, default=str))  # as metrics.json holds them


TINY = {"00_phase_budget": {}, "01_offload_bug": {"use_orig_params": [False]},
        "02_host_adamw": {"arms": ["host_pinned", "host_pinned_rank0@2"], "bench_adam_numel": 200_000},
        "03_cast_once": {}, "04_skip_old_logprob": {}, "06_util_sweep": {}}


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_describe_states_the_numbers_of_a_tiny_cpu_run(nb, tmp_path):
    text = _check(nb, _tiny(nb, tmp_path, **TINY[nb]))
    if nb == "06_util_sweep":
        assert "0 measured on a GPU" in text and "planner only" in text
    elif nb != "00_phase_budget":
        assert text.startswith("Tiny CPU profile")
    else:
        assert "no GPU was used" in text


def test_every_notebook_has_a_describe():
    import importlib

    for nb, module in findings.MODULES.items():
        assert callable(importlib.import_module(module).describe), nb
