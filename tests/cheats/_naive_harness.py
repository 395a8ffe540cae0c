"""A deliberately naive, KernelBench-v0.1-style harness: proof that each cheat in this folder really cheats.

Not a candidate (the leading underscore keeps it out of the parametrised tests). Run as a script with cheat
file paths; prints one JSON line per file. Like KernelBench v0.1: reference
and candidate exec'd into one namespace, seed 42 for both models, the reference run first on the same
input tensors, torch.allclose(atol=rtol=1e-2), a baseline timed once before the candidate is loaded,
and the candidate timed on the same tensors every call with time.perf_counter. Each cheat runs in a forked child so its patches cannot leak into the next one.
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_cheats import REFERENCES, load_spec  # noqa: E402
from pathlib import Path  # noqa: E402


def _min_ms(fn, inputs, calls=15):
    for _ in range(3):
        fn(*inputs)
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(*inputs)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def naive_check(path: str) -> dict:
    spec = load_spec(Path(path))
    ctx: dict = {}
    exec(compile(REFERENCES[spec.reference], "<reference>", "exec"), ctx)
    torch.manual_seed(42)
    init = ctx["get_init_inputs"]()
    torch.manual_seed(42)
    model = ctx["Model"](*init)
    torch.manual_seed(42)
    timing_inputs = ctx["get_inputs"]()
    with torch.no_grad():
        ref_ms = _min_ms(model, timing_inputs)  # the baseline is timed once, before any candidate (cached)
    exec(compile(spec.source, path, "exec"), ctx)
    torch.manual_seed(42)
    new = ctx["ModelNew"](*init)
    correct = True
    with torch.no_grad():
        for trial in range(3):
            torch.manual_seed(1000 + trial)
            inputs = ctx["get_inputs"]()
            out = model(*inputs)
            out_new = new(*inputs)
            correct = correct and out.shape == out_new.shape and bool(torch.allclose(out, out_new, atol=1e-2, rtol=1e-2))
        new_ms = _min_ms(new, timing_inputs)
    return {"file": Path(path).name, "correct": correct, "ref_ms": ref_ms, "new_ms": new_ms}


def main(paths: list[str]) -> None:
    torch.set_num_threads(1)
    for path in paths:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                line = json.dumps(naive_check(path))
            except BaseException as e:  # noqa: BLE001 - any failure is a result here
                line = json.dumps({"file": Path(path).name, "error": f"{type(e).__name__}: {e}"})
            os.write(w, (line + "\n").encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as fh:
            data = fh.read()
        os.waitpid(pid, 0)
        sys.stdout.write(data.splitlines()[0] + "\n" if data.strip() else
                         json.dumps({"file": Path(path).name, "error": "no output"}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
