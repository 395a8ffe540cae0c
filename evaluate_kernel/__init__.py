"""evaluate_kernel: build a candidate kernel, check it against a KernelBench reference, time it honestly.

    from evaluate_kernel import Evaluator, evaluate, EvalResult
    with Evaluator(reference_src, device="cuda") as ev:      # one per task; thread-safe
        result = ev.evaluate(candidate_src)                  # EvalResult: status, speedup, message, details

PACEvolve (paper section 4) scores a candidate by its speedup over the task's PyTorch reference; the search
optimises whatever this package returns, so its job is to make that number true. The candidate's code runs
in two processes of its own (the builder, without a GPU, and the runner) and can do anything there; nothing
those processes compute or report is believed.

Protected (each by a mechanism; DESIGN.md gives the reasoning for the timing and the checks, ISOLATION.md
for the processes that run candidate code):
- Correctness: the reference worker (never runs candidate code) computes every reference output and makes
  every comparison; trials on seeds drawn at evaluation time, five input distributions, re-seeded and
  perturbed weights (mapped to ModelNew's parameters by name, else by shape and values, else by shape and
  order), NaN-poisoned memory.
- The runtime is this process's own clock: batches of back-to-back calls on fresh inputs drawn from a seed
  chosen when the batch starts (each set through one of the trials' distributions), alternating with
  batches of the reference on some of the same sets, the checked calls' among them (same harness code,
  same core, same minutes; each side's batch about batch_ms of its own calls), both sides on the
  perturbed trial's weights, drawn for this evaluation. The speedup is the median of paired ratios with a 95% interval
  (details["speedup_ci"], details["noise"]).
- On the CPU both sides are timed in runners (the reference in one of its own) that run nothing but the
  calls: the reference worker writes a batch's inputs into a shared-memory file the runner holds mapped,
  while it is stopped; the batch's time is the runner's CPU time from being let go to being stopped
  again; the outputs of calls chosen after that are read from its stopped memory (/proc/PID/mem), into
  a directory hidden from candidates, and checked by the reference worker, with the inputs it wrote
  (host_batches.py, readout.py).
- On a GPU, the same, through device memory the reference worker makes and shares with the runner by
  file descriptor (vmm.py): it writes the inputs there and reads the chosen outputs there, the runners
  stopped and the device drained (a trivial kernel of a third context runs at once three times in a
  row); the batch's time is this process's clock from letting the runner go to stopping it, plus what
  the device still had to do, less a batch's fixed cost (waking the runner, the GPU switching back to
  its context, the last synchronise: about 0.8 ms on an H100), measured on the reference's runner from
  batches of one call and of many, and taken off both sides alike. Where such memory cannot be shared, the runner draws and digests itself:
  every step is clocked and a step that does another's work is charged for it; every timed output is
  bound to its inputs by a digest (a hash tree) sent before the evaluator chooses which to check.
- The reference cannot be slowed: the candidate's process is stopped (SIGSTOP) whenever the reference
  runs (one whose thread holds off the stop for a second, inside a system call, is rejected), and on a
  GPU the device must be idle (the wait is charged to the candidate) first.
- The runner stays on the cores it was given at its priority, without io_uring or AIO (a seccomp filter installed
  before any candidate code: confine.py); on the CPU it may not start processes, on a GPU those it starts
  are killed and reject it. On the CPU its clock is read with the process stopped (a running thread's
  time lags by up to a scheduler tick). It may hold no timers and at most 64 threads, and it has no
  network (a timer, or a paced socket's, fires on the reference's core while the runner is stopped). In
  the namespace every file system but its own home and /dev/shm is read-only to it; of the cache it sees
  only the finished builds (read-only) and its home, and no worker sees another's (a builder builds in
  its home; the parent moves the build once the builder is dead), nor the workers' logs; it cannot make
  a FIFO, /dev holds only null,
  zero, full, random, urandom and the GPU's nodes, and it holds no capability (no remount, no file
  handles), no keyring and no further namespace; its IPC namespace and session are its own. A builder
  stays on the cores it was given too (its moves and priority changes do nothing). No worker may change
  a file's mode, owner or ACL, and the cache's own directories are made the evaluator's again at each
  evaluation, so no candidate keeps a later one out of the cache.
- The evaluator's code runs from a private, hash-checked copy; builder and runner start in a PID + mount
  + network namespace where one can be made (code, Python installation read-only; the build-marker key
  hidden; /dev/shm its own), fresh for each candidate, forked from a server that has imported torch;
  cached builds are trusted only by digest (and, across Evaluators, a signed marker).
- Every verdict is finite: a non-finite or missing figure is a rejection that says which.
- No failure is stored that may be the machine's: one returned while the cache's disk has under 1 GiB
  free, or during which the kernel killed a process for want of memory, or a worker that could not be
  started, raises EvaluatorError (the run stops and says why). Workers are the kernel's first choice when
  memory runs out (oom_score_adj 1000).

Not protected: in the GPU's fallback protocol (no shared memory) the runner draws its own inputs and
digests its own outputs, by code it can replace, and a step is charged only beyond the reference worker's
time for it: a leaner harness that fills the difference with the calls' work gains it (fourth red team:
about 1.08x over the twin on a 10 us softmax, once 1.25x; nothing on conv_groupnorm). The harness's batch
step runs in the candidate's process too, with shared memory as without, and can be replaced: a C++ loop of
launches in place of the calls read 1.32x its twin on softmax@v0, and every set of a batch is in the
runner's memory when its first call starts, so one launch over all of them read about 10x its twin there
(seventeenth red team; the sixth measured no profit from computing several calls at once); on the CPU, a
step that runs the sets 16 at a time read 1.30x against its twin's 0.97x on a 15 us softmax (forty-fourth).
On a GPU, work
left running at "done" overlaps what an honest batch spends after its work (the answer, the stop, the
switch to the prober's context): one candidate leaving its last call's work running read 1.013-1.015x
its twin on conv_groupnorm, only its last kernel 1.002-1.005x (1.048x and 1.02x before the drain started
on the runner's answer and looked again after a pause); those kept in tests/cheats lose (0.85-0.96x).
A batch's outputs are held until the next batch's step, so memory recycled by the candidate's own
allocator after that (torch's allocation and free saved) counts as its speed: a ring
of output buffers kept across batches read 1.02-1.07x against its twin's 0.77-0.89x on softmax@v0
(thirty-sixth red team; DESIGN.md says why this stays).
Outputs of calls not chosen for checking are bound only by their digests or the stopped memory, so a
candidate that skips a fraction f of its calls is caught with probability 1-(1-f)^k over k checks; without
a namespace, a process that clears its environment and leaves its worker's tree escapes the sweep, and the
runner can signal the reference worker (its death then rejects the candidate); candidates alive at once
share the machine's counters (/proc/meminfo, file-system free space, load), a channel of bytes a second
(thirty-third red team: 16 bytes/s through Shmem; no profit from it measured); the cache directory stays
writable to candidates (and, without a namespace, /dev/shm). In the namespace a worker is still root
(without capabilities): it reads files only root may read, which its messages may quote to the LLM.
Not supported: inputs that hold tensors
inside a list, tuple or dict (refused with that reason when the reference is measured); torch.compile and
Triton, which compile at the first call in a process that may not start a compiler (load_inline builds at
import or in the constructor); parameters folded into constants at construction (the perturbed-weights
trial), or kept in another layout (permuted) or fused with another (a parameter of the reference's that is
1-D or the same under every seed is perturbed element by element, and its counterpart must hold the same
elements in the same order); an output buffer reused across calls (every timed call's output is kept and
may be checked).
Not measured: energy, memory footprint as a score, clock locking (the
GPU runs at its own clocks; pairs cancel drift). On a shared CPU the interval is one evaluation's noise:
evaluations of one candidate spread more (sd about 3% on a 2-core VM; DESIGN.md, "Costs and limits").

Files, by role. Parent side: evaluator.py (Evaluator, evaluate), builds.py (builders, the build cache's
trust, torch's header), evaluation.py (one evaluation: the conversation with a runner), timing.py (its timing, batch by batch), steps.py (one batch: the runner let go for a step and stopped again), drains.py (the GPU drained before and after each batch, and what that charges), verdict.py (what was measured, as
an EvalResult), clock.py (pure: the speedup from the phases), device.py (a device slot: reference worker,
spares, regions, locks), sandbox.py (private code copy and roots, process sweep, build seal),
namespace.py (the namespace's policy), forkserver.py (workers forked from a process with torch
imported), readout.py (a runner's claim of where its outputs lie, checked; a CPU runner's outputs, read
from its memory), stopped.py (a process stopped, its CPU time). Protocol: protocol.py (message table,
the parent's handle on a worker). Worker side: worker.py (the roles), host_batches.py (a batch with its
bookkeeping outside the runner, CPU and GPU, both sides), vmm.py (device memory shared by descriptor,
the runner's pool over it), batches.py (the GPU's fallback batch, both sides), inputs.py (inputs,
models, output checks), build.py (load_inline wrapped), light_headers.py, binding_header.py (main.cpp's
precompiled header, made by the parent), fast_nvcc.py (and prefixes.py, the store of its final step's
precompiled prefixes, kept by the parent), confine.py.
Leaf: common.py (results, options, comparison, digests), tensorfile.py (tensors in a file a runner
writes, read without a pickle), screen.py (the static first filter). Copying this folder is enough to
vendor it
(standard library + torch; ninja and a compiler for C++/CUDA candidates).
"""
from .build import FULL_HEADER_RETRY, arch_list_for, trim_compiler_output
from .common import STATUSES, EvalResult, EvaluatorError, Options, compare_outputs, scrubbed_env, source_hash
from .device import gpu_lock_path, physical_gpu
from .evaluator import Evaluator, default_cache_dir, evaluate
from .screen import RULES, ScreenVerdict, rules_markdown, screen

__all__ = ["Evaluator", "EvalResult", "EvaluatorError", "Options", "STATUSES", "RULES", "ScreenVerdict", "evaluate",
           "screen", "rules_markdown", "compare_outputs", "scrubbed_env", "source_hash", "arch_list_for",
           "trim_compiler_output", "physical_gpu", "gpu_lock_path", "FULL_HEADER_RETRY", "default_cache_dir"]
