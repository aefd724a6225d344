#!/usr/bin/env python3
"""Sequence-parallel attention, forward + backward, against one GPU running its share alone (#32).

Every GPU holds --tokens-per-gpu rows of one long sequence (B = --batch, H = --heads, each
--head-dims), so the whole sequence has W times as many. For ring_attention and
all_to_all_attention (attention_steps.sequence_parallel) it times a forward and backward in
--windows windows of --calls calls between CUDA events (the slowest GPU's median window), and
the same on each GPU alone: the plain call (the operator, autograd) over --tokens-per-gpu rows,
the same work per GPU as the split call would have with no communication and no merging. Per-GPU
TFLOP/s: the whole sequence's FLOPs (a forward's 4 B H N^2 D, the backward 2.5 times that; half
of the pairs under --causal) divided by W and by the time; the row's efficiency is that over the
one-GPU call's TFLOP/s (#32 asks for at least 0.9).

    torchrun --nproc-per-node 2 scripts/bench_sequence_parallel.py --csv sp2.csv
    torchrun --nproc-per-node 4 scripts/bench_sequence_parallel.py --causal --csv sp4_causal.csv

Chapter 19 has its results on 2 and 4 H200s. Exit status: 0 done, 3 no CUDA device or operator.
"""
import argparse
import csv
import statistics
import sys

import measuring

FIELDS = ["gpus", "gpu_name", "nccl_streams", "dtype", "causal", "batch", "heads", "tokens", "tokens_per_gpu",
          "head_dim", "method", "median_ms", "low_ms", "high_ms", "tflops_per_gpu", "efficiency"]


def parse_arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens-per-gpu", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dims", default="64,80", type=lambda t: [int(d) for d in t.split(",")])
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="bf16")
    parser.add_argument("--causal", action="store_true", help="is_causal; a balanced layout")
    parser.add_argument("--methods", default="ring,all-to-all", type=lambda t: t.split(","))
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3, help="forward + backward calls a window")
    parser.add_argument("--nccl-streams", choices=("high", "default"), default="high",
                        help="the priority of NCCL's streams (ProcessGroupNCCL's "
                             "is_high_priority_stream): high lets the ring's transfers start "
                             "while the attention kernels still have blocks waiting")
    parser.add_argument("--profile", metavar="PATH",
                        help="after the timings, one more call of each row under torch.profiler; "
                             "rank 0 writes its kernel table (by self CUDA time) to PATH and its "
                             "trace beside it (PATH.D<head dim>.<method>.json)")
    parser.add_argument("--csv", required=True, help="written by rank 0")
    return parser.parse_args(argv)


def windows_ms(torch, run, windows, calls):
    run()  # warm: the library's choice, the operator's first call
    torch.cuda.synchronize()
    return [measuring.window_ms(torch, run, calls) for _ in range(windows)]


def slowest(torch, dist, values, device):
    """Each statistic of `values` (median, low, high) as the slowest GPU has it."""
    stats = torch.tensor([statistics.median(values), min(values), max(values)], device=device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    return stats.tolist()


def main(argv=None):
    args = parse_arguments(argv)
    import torch
    import torch.distributed as dist

    from attention_steps import choice, torch_op
    from attention_steps.sequence_parallel import (SequenceLayout, all_to_all_attention,
                                                   ring_attention)
    why_not = measuring.cannot_run(torch, torch_op, "measured")
    if why_not:
        print(why_not, file=sys.stderr)
        return 3
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = args.nccl_streams == "high"
    dist.init_process_group("nccl", pg_options=options)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    methods = {"ring": ring_attention, "all-to-all": all_to_all_attention}
    tokens = args.tokens_per_gpu * world
    layout = SequenceLayout(tokens, world, balanced=args.causal)
    writer = None
    if rank == 0:
        out = open(args.csv, "w", newline="")
        writer = csv.DictWriter(out, fieldnames=FIELDS)
        writer.writeheader()
    for head_dim in args.head_dims:
        shape = (args.batch, args.heads, args.tokens_per_gpu, head_dim)
        generator = torch.Generator(device=device).manual_seed(rank)
        q, k, v, d_o = (torch.randn(shape, device=device, dtype=dtype, generator=generator)
                        for _ in range(4))
        leaves = [t.requires_grad_() for t in (q, k, v)]
        alignment = "top-left" if args.causal else None
        step, why = choice.serving(device.index, dtype, head_dim, causal=alignment)
        if step is None:
            print(f"D = {head_dim}: no step serves the one-GPU call here ({why})", file=sys.stderr)
            continue

        def alone():
            o = torch.ops.attention_steps.attention(*leaves, step, None, None, True, alignment)[0]
            torch.autograd.grad(o, leaves, d_o)

        def split(method):
            def run():
                o = methods[method](*leaves, layout, causal=args.causal)
                torch.autograd.grad(o, leaves, d_o)
            return run

        pairs = 0.5 if args.causal else 1.0
        flops_per_gpu = 3.5 * 4.0 * args.batch * args.heads * pairs * head_dim * tokens ** 2 / world
        flops_alone = 3.5 * 4.0 * args.batch * args.heads * pairs * head_dim * args.tokens_per_gpu ** 2
        rows = [("one GPU", alone, flops_alone)] + [(m, split(m), flops_per_gpu) for m in args.methods]
        baseline = None
        for method, run, flops in rows:
            median, low, high = slowest(torch, dist, windows_ms(torch, run, args.windows, args.calls), device)
            tflops = flops / median / 1e9
            baseline = baseline or tflops
            if writer:
                row = {"gpus": world, "gpu_name": torch.cuda.get_device_name(device),
                       "nccl_streams": args.nccl_streams,
                       "dtype": args.dtype, "causal": int(args.causal), "batch": args.batch,
                       "heads": args.heads, "tokens": args.tokens_per_gpu if method == "one GPU" else tokens,
                       "tokens_per_gpu": args.tokens_per_gpu, "head_dim": head_dim, "method": method,
                       "median_ms": f"{median:.3f}", "low_ms": f"{low:.3f}", "high_ms": f"{high:.3f}",
                       "tflops_per_gpu": f"{tflops:.1f}", "efficiency": f"{tflops / baseline:.3f}"}
                writer.writerow(row)
                out.flush()
                print(", ".join(f"{key}={value}" for key, value in row.items()), flush=True)
        if args.profile:
            profile_rows(torch, rows, head_dim, args.profile if rank == 0 else None)
    dist.destroy_process_group()
    return 0


def profile_rows(torch, rows, head_dim, path):
    """Where each row's time goes: its kernels, the steps', NCCL's and the merges', per GPU."""
    from torch.profiler import ProfilerActivity, profile
    for method, run, _ in rows:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as recorded:
            run()
            torch.cuda.synchronize()
        if path:
            with open(path, "a") as table:
                table.write(f"\n## D = {head_dim}, {method}\n")
                table.write(recorded.key_averages().table(sort_by="self_cuda_time_total", row_limit=25))
            recorded.export_chrome_trace(f"{path}.D{head_dim}.{method.replace(' ', '_')}.json")


if __name__ == "__main__":
    sys.exit(main())
