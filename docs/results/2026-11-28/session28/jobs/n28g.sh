#!/usr/bin/env bash
# Session 28, job g: price a byte read from L2 and from HBM on this H200 (incremental board power over
# idle, NVML), to size the energy levers of perf-notes' session-28 item 3.
set -u; source gpu_runs/env.sh
export PYTHONUNBUFFERED=1
run n28-bytes-energy 200 python3 -c "
import sys, time, statistics, torch
sys.path.insert(0, 'benchmarks')
from power_clocks import Nvml, Sampler
nv = Nvml()
def window(fn, nbytes, seconds=3.0):
    fn(); torch.cuda.synchronize()
    with Sampler(nv) as s:
        t0 = time.perf_counter(); n = 0
        while time.perf_counter() - t0 < seconds:
            for _ in range(50): fn()
            torch.cuda.synchronize(); n += 50
        t1 = time.perf_counter()
        keep = s.between(t0 + seconds / 3, t1)
    # launches in the kept part ~ proportional to time
    rate = n / (t1 - t0)
    return rate * nbytes, statistics.fmean(k[1] for k in keep), statistics.fmean(k[0] for k in keep)
with Sampler(nv) as s:
    t0 = time.perf_counter(); time.sleep(2.0); idle = statistics.fmean(k[1] for k in s.between(t0 + 0.5, time.perf_counter()))
print(f'idle board power {idle:.0f} W (limit {nv.power_limit_w:.0f} W)')
for label, mib in (('L2-resident', 8), ('L2-resident', 24), ('HBM', 4096)):
    x = torch.randn(mib * 2**20 // 2, dtype=torch.bfloat16, device='cuda').view(-1, 4096)
    out = torch.empty(x.shape[0], dtype=torch.float32, device='cuda')
    fn = lambda: torch.sum(x, dim=1, dtype=torch.float32, out=out)
    bw, watts, mhz = window(fn, x.numel() * 2)
    print(f'{label:12} {mib:5d} MiB sum: {bw / 1e12:6.2f} TB/s  {watts:5.0f} W  {mhz:5.0f} MHz  incremental {(watts - idle) / bw * 1e12:6.1f} pJ/B, total {watts / bw * 1e12:6.1f} pJ/B')
"
