"""``rlkit`` command line: each sub-command lives in the module that owns the feature."""
from __future__ import annotations

import importlib
import sys

# sub-command -> (module, function taking argv and returning an exit status, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("rlkit.tools.run", "main", "execute notebooks with papermill from parameter files"),
    "doctor": ("rlkit.tools.doctor", "main", "which torch/CUDA/vLLM/verl/Ray am I running, do they fit"),
    "budget": ("rlkit.experiments.phase_budget", "main", "phase-budget memory planner (GiB per phase)"),
    "preflight": ("rlkit.planning.preflight", "main", "lint a verl config for known traps before booking a GPU"),
    "grpo": ("rlkit.experiments.grpo", "main", "render / launch the Qwen3-4B GRPO recipe on verl"),
    "bundle": ("rlkit.tools.bundle", "main", "build a wheelhouse for an offline GPU node"),
    "figures": ("rlkit.viz.static", "main", "add static PNGs beside the plotly figures of executed notebooks"),
    "render": ("rlkit.tools.render", "main", "write an executed notebook's findings cells from its metrics.json"),
}


def usage() -> str:
    lines = ["usage: rlkit <command> [options]", "", "commands:"]
    lines += [f"  {name:10s} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"rlkit: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, func_name, _ = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name == module_name:
            print(f"rlkit {name}: not available in this version of rlkit", file=sys.stderr)
            return 2
        raise
    return int(getattr(module, func_name)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
