"""Step 10 at (8, 16, 4097, 128), fp16, on contiguous tensors and on views (Q, K, V cut from one
[B, N, 3, H, D] projection and O, dO [B, N, H, D], as compare_backward.py's v10_views row builds
them; and each half alone): once per layout (for ncu), or with --time in windows of 10 calls that
alternate the four layouts, 12 windows, nvidia-smi's SM clock, power and temperature after each.
Run from the repository root with the operator built (PYTHONPATH holding attention_steps):

    python3 docs/results/h100/training-path/views-ab/views_windows.py --time > windows.txt
    ncu --kernel-name regex:"hopper_backward|row_vectors|dq_convert" --metrics gpu__time_duration.sum,\
dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex.sum,\
sm__throughput.avg.pct_of_peak_sustained_elapsed --csv \
        python3 docs/results/h100/training-path/views-ab/views_windows.py > ncu.csv
"""
import statistics
import subprocess
import sys

import torch
sys.path.insert(0, "scripts")
from compare_backward import packed_views, token_major_view
from attention_steps import torch_op
attention = torch_op.load()
backward = torch.ops.attention_steps.attention_backward
B, H, N, D = 8, 16, 4097, 128
torch.manual_seed(0)
q, k, v, d_o = (torch.randn((B, H, N, D), device="cuda", dtype=torch.half) for _ in range(4))
o, lse = attention(q, k, v, "v6", None, None, True, None)
qv, kv, vv = packed_views(torch, q, k, v)
ov, dov = token_major_view(o), token_major_view(d_o)
modes = {"contiguous": (d_o, q, k, v, o), "views": (dov, qv, kv, vv, ov),
         "qkv_views": (d_o, qv, kv, vv, o), "o_do_views": (dov, q, k, v, ov)}
def call(m):
    a = modes[m]
    return backward(a[0], a[1], a[2], a[3], a[4], lse, "v10", None, False, None)
if "--time" not in sys.argv:
    for m in modes:
        torch.cuda.nvtx.range_push(m); call(m); torch.cuda.synchronize(); torch.cuda.nvtx.range_pop()
    sys.exit(0)
for _ in range(20): call("contiguous"); call("views")
res = {m: [] for m in modes}
for w in range(12):
    order = list(modes)[w % 4:] + list(modes)[:w % 4]
    for m in order:
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        for _ in range(10): call(m)
        e.record(); e.synchronize()
        clk = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
        res[m].append(s.elapsed_time(e) * 100)
        print(w, m, f"{res[m][-1]:.1f} us", clk, flush=True)
for m, v in res.items():
    print(m, f"median {statistics.median(v):.1f} low {min(v):.1f} high {max(v):.1f}")
