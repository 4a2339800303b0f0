import subprocess
import sys

from rlkit.tools import doctor

GOOD_GPU = {"torch": "2.11.0+cu130", "vllm": "0.24.0", "verl": "0.9.1", "ray": "2.60.0",
            "transformers": "5.10.4", "tokenizers": "0.22.2", "nvidia-ml-py": "13.0"}


def levels(checks, what):
    return {c.level for c in checks if c.what == what}


def test_consistent_gpu_stack_has_no_errors():
    checks = doctor.check_stack(GOOD_GPU, "3.12.3", "13.0", n_gpus=2)
    assert not [c for c in checks if c.level == "error"]
    assert "ok" in levels(checks, "gpu path")


def test_vllm_torch_mismatch_is_an_error_naming_the_fix():
    checks = doctor.check_stack({**GOOD_GPU, "torch": "2.13.0"}, "3.12.3", "13.0", n_gpus=1)
    err = [c for c in checks if c.what == "vllm" and c.level == "error"]
    assert err and "torch 2.11.0" in err[0].detail


def test_transformers_too_new_for_verl():
    checks = doctor.check_stack({**GOOD_GPU, "transformers": "5.17.0", "tokenizers": "0.23.2"}, "3.12.3", "13.0", 1)
    assert "error" in levels(checks, "transformers")


def test_old_transformers_with_new_tokenizers():
    checks = doctor.check_stack({**GOOD_GPU, "tokenizers": "0.23.2"}, "3.12.3", "13.0", 1)
    assert "error" in levels(checks, "tokenizers")


def test_python_313_rejected_for_verl():
    assert "error" in levels(doctor.check_stack(GOOD_GPU, "3.13.1", "13.0", 1), "python")


def test_gpu_path_missing_pieces_are_listed():
    versions = {**GOOD_GPU, "vllm": None, "nvidia-ml-py": None}
    warn = [c for c in doctor.check_stack(versions, "3.12.3", "13.0", 1) if c.what == "gpu path"]
    assert warn[0].level == "warn" and "vllm" in warn[0].detail and "nvidia-ml-py" in warn[0].detail


def test_cpu_torch_with_gpus_is_an_error():
    assert "error" in levels(doctor.check_stack({"torch": "2.13.0+cpu"}, "3.11.7", None, 1), "torch")


def test_cli_runs_here():
    proc = subprocess.run([sys.executable, "-m", "rlkit.tools.cli", "doctor", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '"checks"' in proc.stdout
