"""The gpu_memory_utilization sweep source document 003 never ran: planner vs measured (notebook 06).

One call of :func:`run` is one point of the sweep: the GRPO recipe of :mod:`rlkit.recipes.grpo` for one case
and one ``gpu_memory_utilization`` value, launched as ``python -m verl.trainer.main_ppo`` with a
:class:`rlkit.measure.samplers.MemorySampler` (NVML / nvidia-smi, 1 Hz) running beside it. From verl's console
and vLLM's log it reads the KV pool and concurrency vLLM reported, the size of its weights and CUDA
graphs, verl's per-step timings and memory metrics, vLLM's throughput statistics and any OOM; it
cuts the sampled device memory into verl's phases, and puts the derived planner's estimate
(:func:`rlkit.planning.verdict.plan`, same settings, the emulated card) next to every measured number with
their ratio. The document's cost metric is computed per run at a stated price per GPU-hour.

The sweep is a grid over ``gpu_memory_utilization``, one fresh verl job per value::

    rlkit run nbs/06_util_sweep.ipynb --profile h200 --grid gpu_memory_utilization=[0.4,0.5,0.6,0.7]
    # on a node without papermill, one folder per point:
    python -m rlkit.experiments.util_sweep --profile h200 -p case=doc_small -p gpu_memory_utilization=0.4 \
        --tag doc_small-u0.4

Emulating a smaller card: :mod:`rlkit.patches.instruments.emulate_card` (``GRPORecipe.emulate_gpu_gib``). In every verl and
vLLM process ``torch.cuda.mem_get_info`` reports the emulated card (total ``E``; free = ``E`` minus what
all processes hold on the real device) and the allocator is capped at ``E``. vLLM 0.24 reserves
``ceil(total x gpu_memory_utilization)`` of that total (``request_memory`` in vllm/v1/worker/utils.py), so
``u`` keeps the document's meaning (a fraction of the small card) and is launched unchanged; weights,
profiling peak, CUDA graphs and the KV pool are sized as on the small card, its start-up check reads the
small card's free memory, and an actor that needs more than ``E`` raises a real OOM. The cap is per
process; the 1 Hz device-wide samples show what all processes held together, and the "exceeds the
emulated card" verdict is also read from them.

Without a CUDA GPU everything before the launch runs for real (inputs, overrides, verl's own config
validation, the planner); the measured side says why it was not launched. Nothing is invented.

The package: :mod:`.config` (cases, parameters, the point's recipe and planner inputs), :mod:`.timeline`
(phases on the sampler's clock), :mod:`.comparison` (planner vs measured), :mod:`.point` (the launch, the
measurement, re-analysis, the command line), :mod:`.tables` (rows and the answer in words), :mod:`.figures`.
"""
from rlkit.experiments.util_sweep.comparison import (
                                                     MIN_PHASE_SAMPLES,
                                                     PHASE_MAP,
                                                     TOLERANCE,
                                                     comparison_rows,
                                                     cost_summary,
                                                     emulated_verdict,
                                                     gap_rows,
                                                     old_log_prob_rows,
                                                     old_log_prob_split,
                                                     process_phase_peak,
                                                     update_breakdown,
                                                     vllm_outside_pool_by_step,
)
from rlkit.experiments.util_sweep.config import (
                                                     CASES,
                                                     NOTEBOOK,
                                                     PATCH_PLANNER_OPTION,
                                                     VERL_ROLLOUT_POLL_S,
                                                     Case,
                                                     Config,
                                                     build_recipe,
                                                     emulation_info,
                                                     extra_overrides,
                                                     planner_spec,
                                                     planner_sweep,
)
from rlkit.experiments.util_sweep.figures import throughput_figure, timeline_figure
from rlkit.experiments.util_sweep.point import (
                                                     METRICS_KEYS,
                                                     launch_measured,
                                                     main,
                                                     measure_from_logs,
                                                     point_metrics,
                                                     reanalyze,
                                                     run,
                                                     saved_samples_and_marks,
)
from rlkit.experiments.util_sweep.tables import (
                                                     answer_lines,
                                                     comparison_table,
                                                     describe,
                                                     first_update_oom,
                                                     point_folders,
                                                     process_rows,
                                                     read_results,
                                                     runs_of,
                                                     sweep_rows,
)
from rlkit.experiments.util_sweep.timeline import label_samples, phase_intervals, phase_peaks, process_peaks

__all__ = ["CASES", "METRICS_KEYS", "MIN_PHASE_SAMPLES", "NOTEBOOK", "PATCH_PLANNER_OPTION", "PHASE_MAP", "TOLERANCE",
           "VERL_ROLLOUT_POLL_S", "Case", "Config", "answer_lines", "build_recipe", "comparison_rows", "comparison_table",
           "cost_summary", "describe", "emulated_verdict", "emulation_info", "extra_overrides", "first_update_oom",
           "gap_rows", "label_samples", "launch_measured", "main", "measure_from_logs", "old_log_prob_rows",
           "old_log_prob_split", "phase_intervals", "phase_peaks",
           "planner_spec", "planner_sweep", "point_folders", "point_metrics", "process_peaks", "process_phase_peak", "process_rows",
           "read_results", "reanalyze", "run", "runs_of", "saved_samples_and_marks", "sweep_rows", "throughput_figure",
           "timeline_figure", "update_breakdown", "vllm_outside_pool_by_step"]
