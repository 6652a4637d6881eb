"""Where a reduce-overhead training step of a zoo model spends its host and GPU time, against eager,
ember and Inductor's reduce-overhead (GPU diagnosis, not a test; the harness in .bench).

    PYTHONPATH=. python benchmarks/gpu_ro_step_phases.py mlp4 eager,ember,ember-ro,inductor-ro

Per variant: the step's median (CUDA events around each step, as run.py), host time of each phase
(cudagraph_mark_step_begin, zero_grad, forward, loss, backward), and for ember-ro the CUDA-graph
counters and torch.profiler's host and device tables over 10 steps.
"""
import sys, time, torch
sys.path.insert(0, ".bench"); sys.path.insert(0, "benchmarks")
from zoo_train_setup import zoo_training
import ember
from ember.runtime import cudagraphs
from torch.profiler import profile, ProfilerActivity

def run(label, name):
    model, bench, args, kwargs = zoo_training(name)
    if label == "eager":
        fn, mark = model, (lambda: None)
    elif label == "ember":
        fn, mark = ember.compile(model), (lambda: None)
    elif label == "ember-ro":
        fn, mark = ember.compile(model, mode="reduce-overhead"), ember.cudagraph_mark_step_begin
    else:
        fn, mark = torch.compile(model, mode="reduce-overhead"), torch.compiler.cudagraph_mark_step_begin
    phases = [0.0] * 5
    def step(timed=False):
        t0 = time.perf_counter(); mark(); t1 = time.perf_counter()
        model.zero_grad(set_to_none=True); t2 = time.perf_counter()
        out = fn(*args, **kwargs); t3 = time.perf_counter()
        loss = bench.loss_fn(out); t4 = time.perf_counter()
        loss.backward(); t5 = time.perf_counter()
        if timed:
            for i, (a, b) in enumerate(zip((t0, t1, t2, t3, t4), (t1, t2, t3, t4, t5))):
                phases[i] += b - a
    for _ in range(30): step()
    torch.cuda.synchronize()
    evs = []
    for _ in range(300):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); step(True); e.record(); evs.append((s, e))
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in evs)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10): step()
        torch.cuda.synchronize()
    avg = prof.key_averages()
    gpu = sum(e.self_device_time_total for e in avg) / 10 / 1e3
    print(f"== {name} {label}: step median {times[150]:.3f} ms p10 {times[30]:.3f}; GPU {gpu:.3f} ms/step; host per phase us "
          f"(mark, zero_grad, forward, loss, backward) {[round(p / 300 * 1e6) for p in phases]}", flush=True)
    if label == "ember-ro":
        print("   cudagraph counters", dict(cudagraphs.counters), flush=True)
        print(avg.table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60), flush=True)
        print(avg.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60), flush=True)

for name in sys.argv[1].split(","):
    for label in sys.argv[2].split(","):
        try:
            run(label, name)
        except Exception as exc:
            print("FAILED", name, label, type(exc).__name__, exc, flush=True)
