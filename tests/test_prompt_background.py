"""Tests for driver/prompt_background.py: prompts written for the device the task runs on (pure: facts in, text
out)."""
from __future__ import annotations

import pytest

from driver import prompt_background

GPU_INFO = {"device_name": "NVIDIA H200", "capability": [9, 0], "sms": 132, "total_mem": 150_000_000_000,
            "l2_bytes": 60 * 2**20, "mem_bw_bytes_per_s": 4.3e12}
CPU = {"kind": "cpu", "cpu": "AMD EPYC 9654", "machine": "x86_64", "cores": 2, "threads": 1,
       "isa": ["sse4_2", "avx", "avx2", "fma"], "compiler": "c++ (Debian 12.2.0-14) 12.2.0",
       "cflags": "-fPIC -std=c++20"}
GPU_WORDS = ("GPU", "CUDA", "L2", "stream", "cuDNN", "SM")


def test_cpu_background_states_threads_isa_compiler_and_flags_and_no_gpu_wording():
    for text in (prompt_background.kernel_background(CPU, "conv + GroupNorm, fp32"),
                 prompt_background.kernel_brief(CPU, "x")):
        for word in GPU_WORDS:
            assert word not in text, word
    text = prompt_background.kernel_background(CPU, "conv + GroupNorm, fp32")
    for needle in ("AMD EPYC 9654", "1 thread used for timing", "2 cores", "avx2, fma", "c++ (Debian 12.2.0-14)",
                   "`-fPIC -std=c++20`", "no optimisation flag", "-O3", "single-threaded", "conv + GroupNorm",
                   "ModelNew", "load_inline", "same order", "float32", "on the CPU", "try/except", "caching",
                   "subclassing", "tensor subclasses", "re-seeded weights", "perturbed after construction",
                   "CPU time over batches"):
        assert needle in text, needle
    four = prompt_background.kernel_background({**CPU, "threads": 4, "cflags": "-O2 -fPIC"}, "x")
    assert "4 threads used for timing" in four and "no optimisation flag" not in four


def test_gpu_background_states_the_measured_device_facts():
    facts = prompt_background.gpu_facts(GPU_INFO)
    text = prompt_background.kernel_background(facts, "softmax")
    for needle in ("NVIDIA H200", "compute capability 9.0", "132 SMs", "140 GiB memory", "4,300 GB/s",
                   "60 MiB L2", "back-to-back calls", "until the GPU is idle", "already on the GPU", "streams",
                   "softmax", "speedup over the reference"):
        assert needle in text, needle
    no_bandwidth = prompt_background.gpu_facts({**GPU_INFO, "mem_bw_bytes_per_s": None})
    assert "GB/s" not in prompt_background.describe_device(no_bandwidth)


def test_device_facts_prefers_the_evaluator_device_info():
    class Old:
        devices = [type("D", (), {"info": GPU_INFO})()]

    class New(Old):
        def device_info(self, gpu=None):
            return {**GPU_INFO, "device_name": "NVIDIA H100"}

    assert prompt_background.device_facts(Old(), "cuda")["name"] == "NVIDIA H200"
    assert prompt_background.device_facts(New(), "cuda")["name"] == "NVIDIA H100"


def test_cpu_facts_read_this_machine():
    facts = prompt_background.cpu_facts(threads=1)
    assert facts["kind"] == "cpu" and facts["threads"] == 1 and facts["cores"] >= 1
    assert facts["isa"] is None or all(f in prompt_background.CPU_FEATURES for f in facts["isa"])
    flags = prompt_background.load_inline_cflags()
    assert flags is None or ("-std=" in flags and "-isystem" not in flags and "TORCH_EXTENSION_NAME" not in flags)


@pytest.mark.gpu
def test_gpu_background_from_this_gpu():
    import torch

    import evaluate_kernel
    import tasks
    with evaluate_kernel.Evaluator(tasks.get("softmax@v0").reference_src, device="cuda", gpus=[0]) as ev:
        info = ev.device_info()                                    # measured by the reference worker
    assert info.get("mem_bw_bytes_per_s", 0) > 1e11
    text = prompt_background.kernel_background(prompt_background.gpu_facts(info), "x")
    assert "GB/s" in text
    props = torch.cuda.get_device_properties(0)
    assert props.name in text and f"{props.multi_processor_count} SMs" in text
    assert f"compute capability {props.major}.{props.minor}" in text and "MiB L2 cache" in text
