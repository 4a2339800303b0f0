"""Readers of the committed files the docs cite, for tests/test_claims.py: each returns a value of a run, a log or a
record, or the words a sentence must use where the file bears it out (issue 46)."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from functools import cache

import yaml

from rlkit.models import shape as model_shape
from rlkit.report import limits as report_limits
from rlkit.core.env import REPO_ROOT
from rlkit.core.results import pct

ARMS = "outputs/05_grpo_qwen3_4b"
PROFILES = "outputs/update_profile"
GIB = 2**30


@cache
def _json(path: str) -> dict:
    return json.loads((REPO_ROOT / path).read_text())


def _yaml(path: str) -> dict:
    return yaml.safe_load((REPO_ROOT / path).read_text())


def _arm(name: str) -> dict:
    return _json(f"{ARMS}/{name}/metrics.json")


def _profile(name: str) -> dict:
    return _json(f"{PROFILES}/{name}/metrics.json")


def _verl_steps(run_dir: str) -> list[dict]:
    """A verl run's per-step records (its verl_metrics.jsonl), each its ``data`` with the step number under ``step``."""
    lines = _source_text(f"{run_dir}/verl_metrics.jsonl").splitlines()
    return [{**row["data"], "step": row["step"]} for row in map(json.loads, lines)]


def _passed(log: str) -> int:
    """How many tests a committed pytest log says passed, with none failed."""
    text = (REPO_ROOT / log).read_text(errors="replace")
    closing = re.findall(r"=*\s*(\d+) passed(?:, \d+ \w+)*(?: in [\d.]+s)?", text)
    assert closing and "failed" not in text.splitlines()[-1], f"{log}: no passing closing line"
    return int(closing[-1])


def _outcome(log: str) -> str:
    """What a committed pytest log's closing line says: 'passed' (tests passed, none failed) or 'failed'."""
    last = (REPO_ROOT / log).read_text(errors="replace").strip().splitlines()[-1]
    return "failed" if re.search(r"\d+ (failed|error)", last) or not re.search(r"\d+ passed", last) else "passed"


def _log_passes(log: str, test: str) -> bool:
    """A committed pytest log lists ``test`` (every parametrization of it) as PASSED and none of it as FAILED."""
    text = (REPO_ROOT / log).read_text(errors="replace")
    return f"PASSED {test}" in text and f"FAILED {test}" not in text and f"{test}" in text


def _says(status: str, holds):
    """A status check: ``status`` (the words the sentence must use) where ``holds()`` is true of the cited file, else
    what the file says instead, which no sentence of the claim's words contains. A sentence edited to another status
    ("failed" for "passed", "measured" for "not measured") then disagrees with the file."""
    return lambda: (status,) if holds() else (f"<the cited file does not bear out {status!r}>",)


def _node_setup() -> str:
    """The GPU and torch of the single-notebook h200 runs (01-04), as results.md's opening says them: one GPU model
    and one torch across the runs, the torch's full build tag from notebook 04's setup record."""
    notebooks = ("01_offload_bug", "02_host_adamw", "03_cast_once", "04_skip_old_logprob")
    envs = [_json(f"outputs/{nb}/h200/env.json") for nb in notebooks]
    gpus = {g["name"] for e in envs for g in e["gpus"]}
    torch = _json("outputs/04_skip_old_logprob/h200/metrics.json")["setup"]["torch"]
    assert len(gpus) == 1 and all(torch.startswith(e["versions"]["torch"]) for e in envs), (gpus, torch)
    return f"one {gpus.pop()} (offline node, torch {torch})"


def _tested(path: str, test: str) -> bool:
    """The CPU test a sentence leans on is still in the suite (which runs it)."""
    return f"def {test}(" in (REPO_ROOT / path).read_text()


def _by_test(status: str, test: str):
    """A status that a CPU test of the suite shows (``path::name``): the test is still in the suite."""
    path, name = test.split("::")
    return _says(status, lambda: _tested(path, name))


def _dirty(folder: str) -> bool:
    return (_json(f"{folder}/env.json").get("git_sha") or "").endswith("-dirty")


def _wall(profile: str) -> float:
    return _profile(profile)["timing"]["timed"][0]["seconds"]


def _session26_mean(value, *tags: str) -> float:
    """The mean of ``value(profile)`` over session 26's profiles of ``tags`` (each folder is the tag + .session26)."""
    return sum(value(f"{tag}.session26") for tag in tags) / len(tags)


def _pass_seconds(name: str):
    return lambda profile: _profile(profile)["summary"]["passes"][name]["ms"] / 1000


def _idle_in_optimizer(profile: str) -> float:
    return _profile(profile)["summary"]["idle_gaps"]["by_region"]["optimizer_step"]["ms"] / 1000


def _copies(profile: str) -> dict:
    """The profile's device-host copies by direction, with their seconds."""
    return {k: {**c, "seconds": c["ms"] / 1000} for k, c in _profile(profile)["summary"]["host_syncs"]["copies"].items()}


def _kind_share(profile: str, kind: str) -> float:
    return _profile(profile)["summary"]["categories"][kind]["share"]


def _same_commit(*profiles: str) -> bool:
    from rlkit.report.notebooks import run_commit

    return len({run_commit(REPO_ROOT / PROFILES / p) for p in profiles}) == 1


def _host_gap_range() -> str:
    """The node's host peak above idle on the committed 2 x H200 HostAdamW arms, less what the host check counts."""
    import math

    from rlkit.planning.host_memory import host_adamw_bytes

    shape, gaps = model_shape.resolve_model("qwen3-4b"), []
    for arm in ("1-fixes-hostadamw", "4-rank0-owner", "5-master-on-host-cast-once"):
        m = _arm(arm)
        r, host = m["recipe"], m["launch"]["host_memory"]
        need = host_adamw_bytes(shape, ranks=r["n_gpus"], rank0_owner=r["host_rank0_owner"],
                                master_on_host="master_on_host" in r["patches"], param_offload=r["param_offload"])
        gaps.append(host["peak_above_baseline_gib"] - sum(need.values()) / GIB)
    return f"{math.floor(min(gaps))}-{math.ceil(max(gaps))} GiB"


def _failed_runs_say(*needles: str) -> bool:
    """Each committed failed notebook 05 run's FAILED.txt; the words each names, in the order of the folders."""
    texts = [(p / "FAILED.txt").read_text() for p in sorted((REPO_ROOT / ARMS).glob("*.failed"))]
    return all(any(n in t for t in texts) for n in needles) and not any("died" in t and "Ray worker" in t for t in texts)


def _limits() -> dict[str, dict]:
    from rlkit.report.limits import _limits_rows

    return {name: row for name, _, row in _limits_rows(REPO_ROOT / "outputs")}


def _seed_gen_fractions() -> list[float]:
    """The rollout's share of the standalone vLLM's tokens/s, for every seed-workload run that has a ceiling."""
    return [r["gen_fraction"] for n, r in _limits().items() if n.startswith("h200-seed-") and r.get("gen_fraction")]


def _range(values: list[float]) -> str:
    return f"{pct(min(values)).rstrip('%')}-{pct(max(values))}"


def _fastest(shape: str) -> dict:
    from rlkit.report.limits import fastest_pairs

    return next(p for p in fastest_pairs(REPO_ROOT / "outputs") if p["shape"] == shape)


def _sweep_card(case: str) -> float:
    """The card every committed point of a sweep case emulated (one value, or the check fails)."""
    cards = {json.loads((p / "metrics.json").read_text())["emulation"]["emulated_total_gib"]
             for p in (REPO_ROOT / "outputs/06_util_sweep").glob(f"{case}-u*") if (p / "metrics.json").exists()}
    assert len(cards) == 1, f"{case}: the points emulated {cards}"
    return cards.pop()


def _update_mfu(seed: bool) -> float:
    """The lowest update_actor MFU of the unpadded seed-workload runs, or the highest of the h200 profile's runs."""
    limits = _limits()
    if seed:
        return min(r["update_actor_fraction"] for n, r in limits.items()
                   if n.startswith("h200-seed-") and r["tokens_real"] == r["tokens_computed"])
    return max(r["update_actor_fraction"] for n, r in limits.items() if not n.startswith("h200-"))


def _seed_profile() -> dict:
    return _yaml("nbs/params/05_grpo_qwen3_4b.h200-seed.yaml")


def _session(folder: str) -> int:
    """The device session a committed run's COMMAND.txt names (its first 'session N')."""
    return int(re.search(r"session (\d+)", (REPO_ROOT / folder / "COMMAND.txt").read_text()).group(1))


def _sweep_waiting(util: float) -> tuple[int, int, float]:
    """At the lowest utilization of each sweep case: the most requests vLLM queued, a sequence's tokens (prompt +
    response), and the lowest utilization the sweep ran."""
    waiting, lengths, utils = [], set(), set()
    for p in (REPO_ROOT / "outputs/06_util_sweep").glob("*-u*"):
        if not (p / "metrics.json").exists():
            continue
        m = json.loads((p / "metrics.json").read_text())
        utils.add(m["emulation"]["gpu_memory_utilization"])
        if m["emulation"]["gpu_memory_utilization"] == util:
            waiting += [int(w) for w in re.findall(r'"waiting_reqs": (\d+)', json.dumps(m))]
            lengths.add(m["recipe"]["max_prompt_length"] + m["recipe"]["max_response_length"])
    assert len(lengths) == 1 and waiting, (lengths, waiting)
    return max(waiting), lengths.pop(), min(utils)


NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
GENERATED = "the generated blocks"  # a source: every generated block of the docs (tests/test_report.py holds them to outputs/)


def _source_text(source: str) -> str:
    if source == GENERATED:
        from rlkit.report import sections as report

        return "\n".join(report.block(name) for names in report.DOCS.values() for name in names)
    return (REPO_ROOT / source).read_text(errors="replace")


def _quote(doc: str, words: str, *sources: str) -> tuple:
    """A claim whose numbers are quoted from committed records (a session's README, a COMMAND.txt, a log) or from
    the generated blocks: every number of the words must be written in one of ``sources``."""
    def check():
        text = " ".join(_source_text(src) for src in sources)
        flat = text.replace(",", "")
        return tuple(n if n in text or n.replace(",", "") in flat else f"<{n}: in none of {sources}>"
                     for n in NUMBER.findall(words))
    return (doc, words, check)


def _node_time(record: str, run: str) -> str:
    """'M min S s' between the two node-clock times a record gives for ``run`` (``run ran HH:MM:SS-HH:MM:SS``)."""
    from datetime import datetime

    a, b = re.search(re.escape(run) + r"\s+(?:ran\s+)?(\d\d:\d\d:\d\d)-(\d\d:\d\d:\d\d)", _source_text(record)).groups()
    seconds = int((datetime.strptime(b, "%H:%M:%S") - datetime.strptime(a, "%H:%M:%S")).total_seconds())
    return f"{seconds // 60} min {seconds % 60} s"


def _node_minutes(record: str, job: str) -> str:
    """'M.m min' between the node-clock times a session record gives for a job (```job` HH:MM:SS to HH:MM:SS``)."""
    from datetime import datetime

    a, b = re.search(f"`{job}` (\\d\\d:\\d\\d:\\d\\d) to (\\d\\d:\\d\\d:\\d\\d)", _source_text(record)).groups()
    return f"{(datetime.strptime(b, '%H:%M:%S') - datetime.strptime(a, '%H:%M:%S')).total_seconds() / 60:.1f} min"


def _seed_levers_arithmetic() -> tuple[str, ...]:
    """The levers run at the seed's workload: its step 2's rollout and step, 30% of that step against the rest, and what
    update_actor (mean over steps 2..) would save at the 40% MFU target instead of its own."""
    name = "h200-seed-5-master-on-host-cast-once-levers.session12"
    step2 = next(s for s in _arm(name)["steps"] if s["step"] == 2)
    gen, step = step2["timing_s/gen"], step2["timing_s/step"]
    row = _limits()[name]
    update, mfu, target = row["update_actor_s"], row["update_actor_fraction"], report_limits.UPDATE_MFU_TARGET
    return (f"{-report_limits.STEP_CHANGE_TARGET:.0%} off that step would take "
            f"{-report_limits.STEP_CHANGE_TARGET * step:.1f} s out of the other {step - gen:.1f} s",
            f"at {target:.0%} MFU instead of its {pct(mfu)} would save about {update * (1 - mfu / target):.1f} "
            f"of its {update:.1f} s")


def _step1_pair_words() -> tuple[str, ...]:
    """Step 1 of the one-GPU pair: the same tokens, and its two gradient norms against arm 5's two sessions'."""
    from rlkit.verl.logs import training_steps

    pair = _fastest("h200-1gpu")
    first = {n: training_steps(_arm(n)["steps"])[0] for n in (pair["variant"], pair["base"], "5-master-on-host-cast-once",
                                                              "5-master-on-host-cast-once.session4")}
    fast, base = first[pair["variant"]], first[pair["base"]]
    assert fast["perf/total_num_tokens"] == base["perf/total_num_tokens"]
    g = {n: f["actor/grad_norm"] for n, f in first.items()}
    return (f"same {fast['perf/total_num_tokens']:,.0f} tokens", f"{g[pair['variant']]:.4f} and {g[pair['base']]:.4f}",
            f"({abs(g[pair['variant']] / g[pair['base']] - 1):.2%} apart)",
            f"`5-master-on-host-cast-once` {g['5-master-on-host-cast-once']:.4f}",
            f"`.session4` {g['5-master-on-host-cast-once.session4']:.4f}")


def _learning() -> dict:
    return _json("outputs/07_does_it_learn/h200/metrics.json")


def _learning_arm5_recipe() -> dict:
    m = _learning()
    return _yaml(f"{m['config']['runs_dir']}/{m['analysis']['compare']['run']}/params.yaml")


PADDED = "h200-seed-1-fixes-hostadamw-padded-tok12288"
LEVERS12 = "h200-seed-5-master-on-host-cast-once-levers.session12"
ARM5 = "5-master-on-host-cast-once"
ENTROPY_BACKPROP = ("2-skip-old-logprob-entropy-backprop", "3-pinned-entropy-backprop")
GPU12 = "outputs/_node/session12/gpu-tests-profile-compiled.log"
RESUME9 = "outputs/_node/session9/resume-test.console.log"
GQA12 = "outputs/_node/session12/gqa-test.console.log"
SESSION11_PROFILES = ("h200-base", "h200-overlap", "h200-compiled", "h200-levers")


def _compiled_profile(field: str) -> bool:
    """The compiled kernels' profile ran on the H200 with ``field`` compiled (its first call's check passed, or the
    profile would have stopped there) and their GPU tests passed in session 12."""
    m = _profile("h200-compiled")
    return (m["config"][field] == "compiled" and m["device"] == "NVIDIA H200" and bool(m["timing"]["timed"])
            and _log_passes(GPU12, "tests/test_compiled_patches.py"))


def _padded_plan(tokens: int):
    """The planner for the padded seed arm's own overrides at ``tokens`` per micro-batch."""
    from rlkit.experiments.estimates import planner_for_run
    from rlkit.planning import verdict

    card, spec, _ = planner_for_run(_arm(PADDED))
    return card, verdict.plan(replace(spec, micro_batch_tokens=tokens, log_prob_micro_batch_tokens=tokens))


def _padded_failure() -> tuple[str, str, int]:
    """The padded seed arm's failure: its kind, the phase and the step it ran out of the card in."""
    from ast import literal_eval

    from rlkit.verl.logs import training_steps

    m = _arm(PADDED)
    failure = m["launch"]["failure"]
    failure = literal_eval(failure) if isinstance(failure, str) else failure  # the launch record keeps it as a repr
    return failure["kind"], failure["phase"], len(training_steps(m["steps"])) + 1


def _same_sample_ratio(variant: str, base: str) -> float:
    from rlkit.report.seed_workload import _first_step

    return _first_step(_arm(base))[1] / _first_step(_arm(variant))[1]


def _standalone_bound() -> dict:
    """The HBM bound of the h200-1gpu standalone vLLM run (every weight once per decode step plus the KV cache)."""
    from rlkit.planning import roofline

    m = _json("outputs/_node/vllm_standalone/h200-1gpu/metrics.json")
    g, shape = m["generate"], model_shape.resolve_model(m["shape"]["model"])
    length = int(g["response_length"]["max"])
    assert g["response_length"]["min"] == length, "the sentence says every response had exactly one length"
    bound = roofline.decode_bound(shape, sequences=g["sequences"], prompt_tokens=g["prompt_length"]["mean"],
                                  response_pmf={length: 1.0}, hbm_bytes_per_s=roofline.hbm_bytes_per_s(m["gpu"])[0])
    return {"m": m, "shape": shape, "bound": bound, "kv_token": roofline.kv_bytes_per_token(shape, 2),
            "linear": roofline.linear_params(shape), "hbm": roofline.hbm_bytes_per_s(m["gpu"])[0]}


def _bandwidth_words() -> tuple[str, ...]:
    b = _standalone_bound()
    m, bound = b["m"], b["bound"]
    steps = round(bound["decode_steps"]) + 1  # the first token comes from prefill: r - 1 decode steps, said as r
    return (f"{steps} decode steps", f"{b['linear'] / 1e9:.2f} B bf16 weights ({b['linear'] * 2 / 1e9:.1f} GB)",
            f"{b['kv_token']:,} bytes a token", f"mean context of {m['generate']['prompt_length']['mean']:.0f} prompt tokens",
            f"{bound['kv_bytes'] / 1e12:.1f} TB over", f"{(bound['kv_bytes'] + bound['weight_bytes']) / 1e12:.1f} TB in all",
            f"{bound['limit_s']:.2f} s at the H200's {b['hbm'] / 1e12:.1f} TB/s",
            f"about {round(bound['limit_s'] / m['wall_s'] * 10) * 10:.0f}% of that bound")


def _host_overlap_extra_gib() -> float:
    from rlkit.planning.host_memory import host_adamw_bytes

    shape = model_shape.resolve_model("qwen3-4b")
    on, off = (host_adamw_bytes(shape, ranks=2, overlap_copies=o) for o in (True, False))
    return (sum(on.values()) - sum(off.values())) / GIB


def _selective_layer() -> tuple[int, float]:
    """Elements per layer and token the selective layer keeps (q, k, v, attention out, o_proj, down_proj, gate, up),
    and GiB a layer at 24,576 tokens, from Qwen3-4B's shape."""

    s = model_shape.resolve_model("qwen3-4b")
    q, kv = s.heads * s.head_dim, s.kv_dim
    elements = q + kv + kv + q + s.hidden + s.hidden + s.intermediate + s.intermediate
    return elements, elements * 2 * 24576 / GIB


def _verl_compat() -> dict:
    return _json("outputs/verl_compat/cpu/metrics.json")


def _verl_compat_words() -> tuple[str, ...]:
    """verl's own CPU tests with rlkit: how many passed in every mode (none failed, no regression), and the tree."""
    m = _verl_compat()
    same = len({c["passed"] for c in m["counts"].values()}) == 1
    clean = m["ok"] and not any(m["regressions"].values()) and not any(c["failed"] + c["error"] for c in m["counts"].values())
    if not (same and clean):
        return ("<not every test passed in every mode>",)
    sha = _json("outputs/verl_compat/cpu/env.json").get("git_sha") or ""
    selected = _yaml("outputs/verl_compat/cpu/params.yaml")["modes"]["selected"]["RLKIT_PATCHES"].split(",")
    return (f"{m['counts']['stock']['passed']} tests", "(dirty tree)" if _dirty("outputs/verl_compat/cpu") else f"({sha[:7]},",
            *(f"`{name}`" for name in ("selective_checkpoint", "grad_prefetch") if name in selected))


def _no_run_varies(field: str, off) -> bool:
    """No committed notebook 05 run or update profile sets ``field`` away from ``off`` alone: where it is on, so are
    the other levers (chunked log-probs and the compiled RMSNorm), so its own effect is not measured."""
    runs = [p / "metrics.json" for p in (REPO_ROOT / ARMS).iterdir() if (p / "metrics.json").exists()]
    recipes = [json.loads(f.read_text())["recipe"] for f in runs]
    on = [r for r in recipes if r.get(field, off) != off]
    return all(r.get("logits") == "chunked" and r.get("rmsnorm") == "compiled" for r in on)


def _no_seed_run_with(field: str, off) -> bool:
    """No committed notebook 05 run ran with ``field`` away from ``off``."""
    runs = [p / "metrics.json" for p in (REPO_ROOT / ARMS).iterdir() if (p / "metrics.json").exists()]
    return all(json.loads(f.read_text())["recipe"].get(field, off) == off for f in runs)


def _never_on_a_gpu(field: str, off) -> bool:
    """No committed notebook 05 run and no update profile ran with ``field`` away from ``off``."""
    runs = [p / "metrics.json" for p in (REPO_ROOT / ARMS).iterdir() if (p / "metrics.json").exists()]
    profiles = [p / "metrics.json" for p in (REPO_ROOT / PROFILES).iterdir() if (p / "metrics.json").exists()]
    return (all(json.loads(f.read_text())["recipe"].get(field, off) == off for f in runs)
            and all(json.loads(f.read_text())["config"].get(field, off) == off for f in profiles))


def _learning_words() -> tuple[str, ...]:
    m, r = _learning(), _learning_arm5_recipe()
    a, c = m["analysis"], m["analysis"]["compare"]["per_step"]
    assert r["n_gpus"] == 1 and r["logits"] == "full" and r["rmsnorm"] == r["pointwise"] == "eager"
    assert not r["host_overlap_copies"] and r["replay_poll_s"] == 2.0
    fast = _arm(_fastest("h200-1gpu")["variant"])["recipe"]  # the fastest variant has every lever the sentence names
    assert fast["logits"] == "chunked" and fast["rmsnorm"] == fast["pointwise"] == "compiled" and fast["host_overlap_copies"]
    collapsed = max(run["entropy_collapsed_at"] for run in a["per_run"].values())
    assert a["noise"]["curve_distance"] < a["criteria"]["noise_floor"], "the sentence says the floor is above the noise"
    return (f"max({a['criteria']['noise_factor']:g} x the range of arm 1 run twice, {a['criteria']['noise_floor']:g})",
            f"at {c['within_band']} of {c['steps']} steps", f"inside that range at {c['in_range']}",
            f"measured noise ({a['noise']['curve_distance']:.4f})", f"collapsed by step {collapsed}",
            "one GPU" if r["n_gpus"] == 1 else "(not one GPU)",
            f"verl's {r['replay_poll_s']:g}-s poll")


C5 = "outputs/05_grpo_qwen3_4b/COMMAND.txt"
GPU5 = "outputs/05_grpo_qwen3_4b/gpu-tests-session5.console.log"


def _session_readme(n: int) -> str:
    return f"outputs/_node/session{n}/README.md"


def _outcome_of(arm: str) -> str:
    from rlkit.experiments.grpo_runs import outcome

    return outcome(_arm(arm))


def _steps_trained(arm: str) -> int:
    from rlkit.verl.logs import training_steps

    return len(training_steps(_arm(arm)["steps"]))
