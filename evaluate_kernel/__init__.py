"""evaluate_kernel: compile, verify and time a candidate kernel against a KernelBench reference.

The package's front; evaluator.py holds the Evaluator and its docstring the trust boundary.
"""
from .common import STATUSES, EvalResult, Options, compare_outputs, scrubbed_env, source_hash
from .build import FULL_HEADER_RETRY, arch_list_for, trim_compiler_output
from .device import gpu_lock_path, physical_gpu
from .evaluator import Evaluator, default_cache_dir, evaluate
from .screen import RULES, ScreenVerdict, rules_markdown, screen

__all__ = ["Evaluator", "EvalResult", "Options", "STATUSES", "RULES", "ScreenVerdict", "evaluate", "screen",
           "rules_markdown", "compare_outputs", "scrubbed_env", "source_hash", "arch_list_for",
           "trim_compiler_output", "physical_gpu", "gpu_lock_path", "FULL_HEADER_RETRY", "default_cache_dir"]
