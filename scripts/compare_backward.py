#!/usr/bin/env python3
"""The backward of attention, steps v9 and v10 beside PyTorch's SDPA backward (FlashAttention-2 and
cuDNN), in one process, on the GPU, fp16 or bf16 [B, H, N, D]:

  v9        torch.ops.attention_steps.attention_backward (D = rowsum(dO o O), the kernel, dQ's
            conversion), after the forward (v6, with L) ran once outside the timing
  v10       the same call with step v10, the Hopper backward (on an H100 only), on the same O and L
  eager     the same call with the library's cuBLAS eager backward (eager_backward: P and dS
            materialised, N x N, five GEMMs), on the same O and L
  flash     torch.autograd.grad of F.scaled_dot_product_attention under SDPBackend.FLASH_ATTENTION
  cudnn     the same under SDPBackend.CUDNN_ATTENTION

All of them first run in turn for --warm-s seconds (the GPU reaches its top clock:
measuring.warm_up), then each is timed in windows of back-to-back calls between two CUDA
events; the implementations alternate window by window, each window in an order rotated by one,
and the row holds the median of the windows and their extremes.
FLOPs of a backward are counted as FlashAttention counts them: 2.5 times the forward's
4 B H N^2 D. The v9 and eager rows also check their dQ, dK, dV against SDPA's math backend in
fp32 on the same inputs (relative Frobenius error of each); v10's too.

    python3 scripts/compare_backward.py --csv docs/results/h100/backward.csv
    python3 scripts/compare_backward.py --dtype bf16 --csv backward_bf16.csv   # no eager row:
                                                               # eager_backward takes fp16 only
    python3 scripts/compare_backward.py --causal --csv causal.csv  # is_causal=True; v10 and the
                     # SDPA rows only (v9 and eager_backward take no causal mask), the forward of
                     # O and L by v8; FLOPs count the N (N + 1) / 2 pairs a causal mask leaves

--training measures the path training takes instead, every implementation through autograd:
  steps     attention_steps.attention(q, k, v, step=--forward-step) on inputs that require
            grad (the forward keeps O where it wrote it and L), then torch.autograd.grad, which
            runs the backward step the library chooses (v10 on an H100)
  flash, cudnn   F.scaled_dot_product_attention under that backend, then torch.autograd.grad
each as the backward alone (the forward ran once, outside the timing, its graph retained) and as
forward + backward, each timed two ways: in windows of back-to-back calls (as above) and call by
call with the L2 cache flushed before each (measuring.flushed_call_ms, as triton's do_bench),
both in the row. Its CSV has its own columns (TRAINING_FIELDS).

    python3 scripts/compare_backward.py --training --csv training.csv
"""
import argparse
import csv
import statistics
import sys

import measuring

SHAPES = [(32, 12, 197, 64), (32, 12, 577, 64), (32, 12, 1025, 64), (8, 12, 4097, 64),
          (8, 16, 4097, 128)]
FIELDS = ["batch", "heads", "tokens", "head_dim", "implementation", "median_us", "low_us",
          "high_us", "windows", "tflops", "vs_flash", "vs_cudnn", "note"]
TRAINING_FIELDS = ["batch", "heads", "tokens", "head_dim", "dtype", "path", "implementation",
                   "windows_median_us", "windows_low_us", "windows_high_us", "flushed_median_us",
                   "flushed_low_us", "flushed_high_us", "vs_cudnn_windows", "vs_cudnn_flushed",
                   "vs_flash_windows", "vs_flash_flushed", "note"]
# A bf16 run's CSV has one more column, dtype, last: the fp16 file keeps its columns.


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", required=True)
    parser.add_argument("--windows", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10, help="calls per window")
    parser.add_argument("--warm-s", type=float, default=2.0,
                        help="seconds of warm-up, every implementation in turn, before the windows")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    parser.add_argument("--causal", action="store_true", help="causal attention (top left)")
    parser.add_argument("--shapes", default="",
                        help="B,H,N,D;... (default: the five of chapter 15)")
    parser.add_argument("--training", action="store_true",
                        help="every implementation through autograd, backward alone and forward + "
                             "backward, by windows and with the L2 flushed")
    parser.add_argument("--forward-step", default="v8", help="the steps' forward with --training")
    parser.add_argument("--flushed-calls", type=int, default=50,
                        help="calls timed one by one with the L2 flushed (--training)")
    args = parser.parse_args(argv)
    if args.warm_s < 0:
        parser.error(f"--warm-s: {args.warm_s} is negative")
    shapes = [tuple(int(x) for x in part.split(",")) for part in args.shapes.split(";") if part] \
        or SHAPES

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attention_steps import torch_op
    if not torch.cuda.is_available():
        print("torch sees no CUDA device: nothing measured", file=sys.stderr)
        return 77
    attention = torch_op.load()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.half
    backward = torch.ops.attention_steps.attention_backward
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}", flush=True)
    out = open(args.csv, "w", newline="")
    if args.training:
        return training(torch, F, sdpa_kernel, SDPBackend, args, shapes, dtype, out)
    writer = csv.DictWriter(out, fieldnames=FIELDS + (["dtype"] if args.dtype == "bf16" else []))
    writer.writeheader()
    for shape in shapes:
        batch, heads, tokens, head_dim = shape
        torch.manual_seed(0)
        q, k, v, d_o = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))
        causal = "top-left" if args.causal else None
        o, lse = attention(q, k, v, "v8" if args.causal else "v6", None, None, True, causal)

        def v9():
            return backward(d_o, q, k, v, o, lse, "v9")

        def v10():
            return backward(d_o, q, k, v, o, lse, "v10", None, False, causal)

        def eager():
            return backward(d_o, q, k, v, o, lse, "eager_backward")

        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

        def sdpa_backward(backend):
            with sdpa_kernel(backend):
                result = F.scaled_dot_product_attention(*leaves, is_causal=args.causal)

            def run():
                return torch.autograd.grad(result, leaves, d_o, retain_graph=True)
            return run

        hopper = torch.cuda.get_device_capability() == (9, 0)  # v10 runs there alone
        calls = {**({"v9": v9} if not args.causal else {}), **({"v10": v10} if hopper else {}),
                 **({"eager": eager} if args.dtype == "fp16" and not args.causal else {}),
                 "flash": sdpa_backward(SDPBackend.FLASH_ATTENTION),
                 "cudnn": sdpa_backward(SDPBackend.CUDNN_ATTENTION)}
        # The check: the library's two against SDPA's math backend in fp32.
        want = math_gradients(torch, F, sdpa_kernel, SDPBackend, q, k, v, d_o, args.causal)
        errors = {name: relative_errors(calls[name](), want)
                  for name in ("v9", "v10", "eager") if name in calls}
        measuring.warm_up(torch, list(calls.values()), args.warm_s)
        windows = measuring.rotated_windows(torch, calls, args.windows, args.calls)
        medians = {name: statistics.median(values) for name, values in windows.items()}
        pairs = tokens * (tokens + 1) / 2.0 if args.causal else float(tokens) * tokens
        flops = 2.5 * 4.0 * batch * heads * pairs * head_dim
        for name, values in windows.items():
            row = {"batch": batch, "heads": heads, "tokens": tokens, "head_dim": head_dim,
                   "implementation": name, "median_us": f"{medians[name]:.1f}",
                   "low_us": f"{min(values):.1f}", "high_us": f"{max(values):.1f}",
                   "windows": len(values), "tflops": f"{flops / medians[name] / 1e6:.1f}",
                   "vs_flash": f"{medians[name] / medians['flash']:.3f}",
                   "vs_cudnn": f"{medians[name] / medians['cudnn']:.3f}",
                   "note": ("dQ, dK, dV relative error vs fp32 math: " +
                            ", ".join(f"{e:.2e}" for e in errors[name])) if name in errors else ""}
            if args.dtype == "bf16":
                row["dtype"] = "bf16"
            writer.writerow(row)
            out.flush()
            print(", ".join(f"{key}={value}" for key, value in row.items() if value != ""),
                  flush=True)
        del calls, leaves
        torch.cuda.empty_cache()
    return 0


def math_gradients(torch, F, sdpa_kernel, SDPBackend, q, k, v, d_o, causal):
    """dQ, dK, dV by SDPA's math backend in fp32, what the library's gradients are checked against."""
    exact = [t.detach().float().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH):
        return torch.autograd.grad(F.scaled_dot_product_attention(*exact, is_causal=causal),
                                   exact, d_o.float())


def relative_errors(got, want):
    """The relative Frobenius error of each gradient."""
    return [((g.float() - w).norm() / w.norm()).item() for g, w in zip(got, want)]


def training(torch, F, sdpa_kernel, SDPBackend, args, shapes, dtype, out):
    """--training: the rows of TRAINING_FIELDS, two paths x three implementations a shape."""
    import attention_steps
    writer = csv.DictWriter(out, fieldnames=TRAINING_FIELDS)
    writer.writeheader()
    flush = torch.empty(measuring.FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    causal = "top-left" if args.causal else None
    for shape in shapes:
        batch, heads, tokens, head_dim = shape
        torch.manual_seed(0)
        q, k, v, d_o = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))

        def steps_forward(*inputs):
            return attention_steps.attention(*inputs, step=args.forward_step, causal=causal)

        def sdpa_forward(backend):
            def forward(*inputs):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(*inputs, is_causal=args.causal)
            return forward

        forwards = {"steps": steps_forward, "flash": sdpa_forward(SDPBackend.FLASH_ATTENTION),
                    "cudnn": sdpa_forward(SDPBackend.CUDNN_ATTENTION)}
        calls, steps_output, skipped = {}, None, ""
        for name, forward in list(forwards.items()):
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            try:
                result = forward(*leaves)
                torch.autograd.grad(result, leaves, d_o, retain_graph=True)
            except (ValueError, NotImplementedError, RuntimeError) as refusal:  # a shape not served
                skipped = f"{name} skipped: {str(refusal).splitlines()[0]}"
                print(skipped, flush=True)
                del forwards[name]
                continue
            if name == "steps":
                steps_output = result
            calls[("backward", name)] = (
                lambda leaves=leaves, result=result: torch.autograd.grad(result, leaves, d_o, retain_graph=True))
            calls[("forward+backward", name)] = (
                lambda leaves=leaves, forward=forward: torch.autograd.grad(forward(*leaves), leaves, d_o))
        errors, o_strides = [], ()
        if "steps" in forwards:
            want = math_gradients(torch, F, sdpa_kernel, SDPBackend, q, k, v, d_o, args.causal)
            errors = relative_errors(calls[("backward", "steps")](), want)
            o_strides = tuple(steps_output.stride())

        measuring.warm_up(torch, list(calls.values()), args.warm_s)
        windows = measuring.rotated_windows(torch, calls, args.windows, args.calls)
        flushed = {key: [1000 * ms for ms in measuring.flushed_call_ms(torch, run, args.flushed_calls, flush)]
                   for key, run in calls.items()}
        for path in ("backward", "forward+backward"):
            median = {name: (statistics.median(windows[(path, name)]), statistics.median(flushed[(path, name)]))
                      for name in forwards}
            for name in forwards:
                w, f = windows[(path, name)], flushed[(path, name)]
                row = {"batch": batch, "heads": heads, "tokens": tokens, "head_dim": head_dim,
                       "dtype": args.dtype, "path": path, "implementation": name,
                       "windows_median_us": f"{median[name][0]:.1f}", "windows_low_us": f"{min(w):.1f}",
                       "windows_high_us": f"{max(w):.1f}", "flushed_median_us": f"{median[name][1]:.1f}",
                       "flushed_low_us": f"{min(f):.1f}", "flushed_high_us": f"{max(f):.1f}",
                       **{f"vs_{base}_{method}": (f"{median[name][i] / median[base][i]:.3f}"
                                                   if base in median else "")
                          for base in ("cudnn", "flash") for i, method in enumerate(("windows", "flushed"))},
                       "note": (f"forward {args.forward_step} (O strides {o_strides}), backward the "
                                "library's choice; dQ, dK, dV relative error vs fp32 math: " +
                                ", ".join(f"{e:.2e}" for e in errors)) if name == "steps" else skipped}
                writer.writerow(row)
                out.flush()
                print(", ".join(f"{key}={value}" for key, value in row.items() if value != ""), flush=True)
        del calls, steps_output
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
