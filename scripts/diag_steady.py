"""Diagnostic (not committed): where does the runner's steady-state (c) differ from an in-process timer?"""
import os, sys, time, statistics, subprocess
sys.path.insert(0, "scripts"); sys.path.insert(0, ".")
import torch, tasks, bench_agreement as ba

def pin_all(cpus):
    for t in os.listdir("/proc/self/task"):
        try: os.sched_setaffinity(int(t), cpus)
        except OSError: pass

def pin_main(cpus):
    os.sched_setaffinity(0, cpus)

def hot_gpu_ms(fn, sets, n=200):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); torch.cuda._sleep(3_000_000); s.record()
    for i in range(n): fn(*sets[i % len(sets)])
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n

def host_queue_ms(fn, sets, n=200):
    torch.cuda.synchronize(); torch.cuda._sleep(20_000_000)
    t0 = time.perf_counter()
    for i in range(n): fn(*sets[i % len(sets)])
    t1 = time.perf_counter(); torch.cuda.synchronize()
    return (t1 - t0) * 1e3 / n

print(subprocess.run("lscpu | egrep 'Thread|Core|Socket|NUMA|Model name|^CPU\\(s\\)'; lscpu -e | head -20; grep -i nvidia /proc/interrupts | head -5; nproc", shell=True, capture_output=True, text=True).stdout)
allc = sorted(os.sched_getaffinity(0)); last = allc[-1]
src = open("tests/kernels/softmax_v0.py").read()
notes = []
ref, cand, sets = ba.build(tasks.get(sys.argv[1] if len(sys.argv) > 1 else "softmax@v0"), src, "cuda", "/tmp/diag_cache", notes)
print(notes, "threads", len(os.listdir("/proc/self/task")))
conds = {"unpinned": lambda: pin_all(allc), "all->last": lambda: pin_all([last]), "all->0": lambda: pin_all([allc[0]]),
         "all->mid": lambda: pin_all([allc[len(allc)//2]]), "main->last": lambda: (pin_all(allc), pin_main([last])),
         "all->last2": lambda: pin_all(allc[-2:])}
with torch.no_grad():
    for name, fn in (("cand", cand), ("ref", ref)):
        ba.warm_up(fn, sets, "cuda")
        print(name, "hot gpu ms", [round(hot_gpu_ms(fn, sets), 4) for _ in range(3)])
        res = {k: [] for k in conds}
        q = {k: [] for k in conds}
        for rep in range(3):
            for k, setup in conds.items():
                setup(); time.sleep(0.05)
                ba.warm_up(fn, sets, "cuda")
                res[k].append(ba.steady_ms(fn, sets, "cuda", passes=3)[0])
                q[k].append(host_queue_ms(fn, sets))
        for k in conds:
            print(f"{name} {k:12s} steady {[round(v,4) for v in res[k]]}  host-queue {[round(v,4) for v in q[k]]}")
        pin_all(allc)
