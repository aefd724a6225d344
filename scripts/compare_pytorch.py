#!/usr/bin/env python3
"""PyTorch on the bench's problem, timed and checked the way the bench treats the steps.

Times PyTorch eager attention (scale, matmul, softmax, matmul in fp16, as a ViT block without
fused attention runs it) and torch.nn.functional.scaled_dot_product_attention with each
backend forced through torch.nn.attention.sdpa_kernel (flash, efficient, cuDNN, math), on
fp16 [B, H, N, D] inputs; and, through the repository's library (libattention_steps.so and
python/attention_steps), any of its steps (--steps v6,v7,v8,...), in the same process on the
same inputs. Writes one row per (implementation, N) in the bench's CSV schema
(harness/report.cpp, csv_header()), with the ids torch_eager, sdpa_flash, sdpa_efficient,
sdpa_cudnn, sdpa_math and the steps' own; an implementation that cannot run says why in its
status.

Method, as in harness/, after --warm-s seconds (default 2) of every implementation in turn, so
the GPU runs at its top clock (measuring.warm_up): CUDA events around each run, 10 warm-ups,
then one timed probe sets the count (up to 50 runs within about 2 s, at least 5). When one set
of Q, K, V, O fits in L2, several sets rotate so no run finds its inputs in cache. One such timing is a window; every
implementation is timed in --windows windows (default 5), interleaved: window w times each
implementation once, in an order rotated by w, so a slow spell of the GPU lands on all of them
instead of one. The row's median is the median of its windows' medians; min and max are
over all timed runs; the last columns keep the windows (count, smallest and largest window
median), so a wide spread shows instead of hiding. The first and last (b, h) slices are
checked against an fp64 reference with the rule of harness/check.hpp: relative Frobenius error
<= 4 * 2^-11 and max abs error <= 4 * 2^-11 * max|V|. The GPU's ceilings (copy bandwidth,
fp16 tensor GEMM rate) are measured the same way the harness does.

  scripts/compare_pytorch.py [--tokens 197,577,1025] [--batch 32] [--heads 12] [--head-dim 64]
                             [--steps all|ID,ID,...] [--windows 5] [--csv FILE] [--info FILE]
                             [--seed S] [--device K] [--dtype fp16|bf16] [--causal]
                             [--warm-s SECONDS]

--dtype bf16 runs every implementation on bf16 tensors (checked with bf16's unit roundoff, 2^-8,
in the same rule). --causal runs causal attention: SDPA with is_causal=True, the steps with
causal="top-left" (the same mask: query i sees keys j <= i), eager attention with the mask
added; FLOPs then count the pairs on or below the diagonal, N (N + 1) / 2 per slice, as
FlashAttention counts them (contract/problem.hpp, Shape::visible_pairs). The CSV has no dtype or
mask column: name the file for them; --info records the command.

--steps all means the PyTorch implementations; step ids need the library (the environment
variable ATTENTION_STEPS_LIBRARY, or <checkout>/build/libattention_steps.so).

Without --csv the rows go to stdout. --info writes the versions (torch, CUDA, cuDNN), the GPU
and the date to FILE. Needs the Python standard library and torch with CUDA.
Exit status: 0 every run checked passed, 1 a check failed, 2 usage error, 3 no torch, no CUDA
device or a runtime error.
"""
import argparse
import contextlib
import csv
import datetime
import functools
import math
import os
import platform
import re
import statistics
import sys
import warnings

import measuring

# harness/report.cpp, csv_header(): the rows must be interchangeable with the bench's (ctest's
# cpu.csv_schema_shared compares this with `bench --csv-header`). The tolerances and counts below
# are copies of the C++ constants named beside each (this script runs without the bench; the same test checks
# each copy against its source).
CSV_COLUMNS = (
    "step,batch,heads,tokens,head_dim,median_us,min_us,max_us,iters,warmup,buffer_sets,"
    "tflops,gbps,fraction_tensor_peak,fraction_bandwidth,tensor_peak_tflops,copy_gbps,"
    "status,relative_error,max_abs_error,checked_slices,gpu,date"
).split(",")
# Appended after the bench's columns: the timing windows behind the median.
WINDOW_COLUMNS = ["windows", "window_median_min_us", "window_median_max_us"]

WARMUP = 10                        # harness/options.hpp: default --warmup
WARM_S = 2.0                       # seconds of warm-up per shape before its windows (measuring.warm_up)
AUTO_ITERS, AUTO_SECONDS = 50, 2.0  # harness/options.hpp: kAutoIters, kAutoSeconds
MIN_ITERS = 5                      # harness/timing.cu
MAX_BUFFER_SETS = 8                # harness/runner.cu
UNIT_ROUNDOFF = 2.0 ** -11         # harness/check.hpp: fp16
RELATIVE_TOLERANCE = 4 * UNIT_ROUNDOFF
ABSOLUTE_FACTOR = 4 * UNIT_ROUNDOFF

# id -> SDPBackend member name (None: PyTorch eager, no SDPA)
IMPLEMENTATIONS = {
    "torch_eager": None,
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_math": "MATH",
}


class UsageError(Exception):
    pass


class RuntimeFailure(Exception):
    pass


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def number(value):
    """Numbers as the bench writes them (%.6g); unmeasured ones as empty cells."""
    return "" if value is None or not math.isfinite(value) else f"{value:.6g}"


def positive_list(flag, text):
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"{flag}: '{text}' is not a comma-separated list of integers")
    if any(value < 1 for value in values):
        raise UsageError(f"{flag}: '{text}': every value must be at least 1")
    return values


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="compare_pytorch.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="197,577,1025", help="token counts N (default 197,577,1025)")
    parser.add_argument("--batch", default="32", help="batch B (default 32)")
    parser.add_argument("--heads", default="12", help="heads H (default 12)")
    parser.add_argument("--head-dim", default="64", help="head dim D (default 64)")
    parser.add_argument("--steps", default="all",
                        help="all (the PyTorch ones), or ids among " + ",".join(IMPLEMENTATIONS)
                        + " and the library's steps (v6, v7, ...)")
    parser.add_argument("--windows", default="5", help="timing windows per implementation (default 5)")
    parser.add_argument("--csv", help="write the rows here (default: stdout)")
    parser.add_argument("--info", help="write torch, CUDA and cuDNN versions, GPU and date here")
    parser.add_argument("--seed", default="1234", help="seed of the random inputs (default 1234)")
    parser.add_argument("--device", default="0", help="CUDA device index (default 0)")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    parser.add_argument("--causal", action="store_true", help="causal attention (top left)")
    parser.add_argument("--warm-s", type=float, default=WARM_S,
                        help=f"seconds of warm-up, every implementation in turn, before a shape's "
                             f"windows (default {WARM_S})")
    args = parser.parse_args(argv)
    args.tokens = positive_list("--tokens", args.tokens)
    for flag in ("batch", "heads", "head_dim", "device", "seed", "windows"):
        text = getattr(args, flag)
        if not text.isdigit() or (flag not in ("device", "seed") and int(text) < 1):
            raise UsageError(f"--{flag.replace('_', '-')}: '{text}' is not a "
                             + ("non-negative" if flag in ("device", "seed") else "positive") + " integer")
        setattr(args, flag, int(text))
    if args.warm_s < 0:
        raise UsageError(f"--warm-s: {args.warm_s} is negative")
    # "all" stands for the PyTorch implementations, alone or in a list (all,v6,v7,v8).
    args.steps = [step for name in args.steps.split(",")
                  for step in (IMPLEMENTATIONS if name == "all" else [name])]
    unknown = [step for step in args.steps
               if step not in IMPLEMENTATIONS and not re.fullmatch(r"v[0-9]+", step)]
    if unknown:
        raise UsageError(f"--steps: no implementation '{unknown[0]}' (ids: "
                         f"{','.join(IMPLEMENTATIONS)}, or a step id such as v8)")
    return args


class Bench:
    """Timing, ceilings and checking on one CUDA device, after harness/timing.cu and check.cpp."""

    def __init__(self, torch, device):
        self.torch = torch
        self.device = torch.device("cuda", device)
        torch.cuda.set_device(self.device)
        properties = torch.cuda.get_device_properties(self.device)
        self.gpu = properties.name
        self.l2_bytes = getattr(properties, "L2_cache_size", 50 * 2 ** 20)  # older torch: H100's

    def _timed(self, launch, first, count):
        """Microseconds of launch(first), ..., launch(first + count - 1), queued behind a
        busy-wait of about 0.1 ms a run (at most 0.2 s) so that Python launch overhead is not
        timed."""
        runs = [functools.partial(launch, first + i) for i in range(count)]
        return [1000.0 * ms for ms in measuring.each_call_ms(self.torch, runs,
                                                             hold_ms=min(count * 0.1, 200.0))]

    def time(self, launch, warmup=WARMUP, iters=0):
        """launch(i) warmup times untimed, then timed; iters 0 picks the count like the bench."""
        run = 0
        for run in range(warmup):
            launch(run)
        run = warmup
        if iters == 0:
            probe_us = self._timed(launch, run, 1)[0]
            run += 1
            iters = int(min(max(math.floor(AUTO_SECONDS * 1e6 / max(probe_us, 1.0)), MIN_ITERS), AUTO_ITERS))
        durations = self._timed(launch, run, iters)
        return {"median_us": statistics.median(durations), "min_us": min(durations),
                "max_us": max(durations), "iters": iters, "warmup": warmup}

    def ceilings(self):
        """Copy bandwidth (GB/s, read + write) and fp16 tensor GEMM rate (TFLOP/s), measured as
        harness/ceilings.cu measures them: a 1 GiB device copy and an 8192^3 GEMM, fp32 accumulate."""
        torch = self.torch
        free_bytes, _ = torch.cuda.mem_get_info(self.device)
        size = min(2 ** 30, free_bytes // 4)
        source = torch.ones(size, dtype=torch.uint8, device=self.device)
        target = torch.empty_like(source)
        copy = self.time(lambda _: target.copy_(source), warmup=3, iters=20)
        copy_gbps = 2.0 * size / (copy["median_us"] * 1e-6) / 1e9
        del source, target

        n = 8192
        generator = torch.Generator(device=self.device).manual_seed(7)
        a = torch.rand(n, n, device=self.device, generator=generator, dtype=torch.float16) * 2 - 1
        b = torch.rand(n, n, device=self.device, generator=generator, dtype=torch.float16) * 2 - 1
        c = torch.empty_like(a)
        matmul = torch.backends.cuda.matmul
        reduced = matmul.allow_fp16_reduced_precision_reduction
        matmul.allow_fp16_reduced_precision_reduction = False  # fp32 accumulate throughout
        try:
            gemm = self.time(lambda _: torch.matmul(a, b, out=c), warmup=3, iters=10)
        finally:
            matmul.allow_fp16_reduced_precision_reduction = reduced
        del a, b, c
        torch.cuda.empty_cache()
        return 2.0 * n ** 3 / (gemm["median_us"] * 1e-6) / 1e12, copy_gbps

    def check(self, q, k, v, output, causal=False):
        """The first and last (b, h) slices against fp64, with harness/check.cpp's rule (u of the
        inputs' dtype); causal: query i sees keys j <= i."""
        torch = self.torch
        u = 2.0 ** -8 if q.dtype == torch.bfloat16 else UNIT_ROUNDOFF
        batch, heads, _, head_dim = q.shape
        error_sq = reference_sq = max_abs_error = max_abs_v = 0.0
        nonfinite = 0
        slices = sorted({(0, 0), (batch - 1, heads - 1)})
        for b, h in slices:
            q64, k64, v64 = q[b, h].double(), k[b, h].double(), v[b, h].double()
            scores = (q64 @ k64.T) / math.sqrt(head_dim)
            if causal:
                scores = scores.masked_fill(
                    torch.ones_like(scores, dtype=torch.bool).triu(diagonal=1), -math.inf)
            reference = torch.softmax(scores, dim=-1) @ v64
            got = output[b, h].double()
            finite = torch.isfinite(got)
            nonfinite += int((~finite).sum())
            # As the bench does, a non-finite output counts as a failure, not in the sums.
            error = torch.where(finite, (got - reference).abs(), torch.zeros_like(got))
            error_sq += float((error * error).sum())
            reference_sq += float((torch.where(finite, reference, torch.zeros_like(got)) ** 2).sum())
            max_abs_error = max(max_abs_error, float(error.max()))
            max_abs_v = max(max_abs_v, float(v64.abs().max()))
        relative_error = math.sqrt(error_sq / reference_sq) if reference_sq > 0 else math.sqrt(error_sq)
        passed = (nonfinite == 0 and relative_error <= RELATIVE_TOLERANCE / UNIT_ROUNDOFF * u
                  and max_abs_error <= ABSOLUTE_FACTOR / UNIT_ROUNDOFF * u * max_abs_v)
        return {"passed": passed, "relative_error": relative_error, "max_abs_error": max_abs_error,
                "checked_slices": len(slices), "nonfinite": nonfinite}


def sdpa_tools(torch):
    """(sdpa_kernel, SDPBackend), or a reason why this torch has none."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None, f"torch {torch.__version__} has no torch.nn.attention.sdpa_kernel (needs 2.3 or later)"
    return (sdpa_kernel, SDPBackend), None


def one_line(text, limit=240):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def step_library():
    """(the attention_steps module from python/ beside this script, None), or (None, why not)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(repo, "python"))
    try:
        import attention_steps
        attention_steps.load_library()
    except Exception as error:  # ImportError, LibraryNotFoundError, an old library: say which
        return None, one_line(error)
    return attention_steps, None


def implementation(torch, step, tools, steps_module, causal=False):
    """(attention(q, k, v), a context manager factory to run it in), or a 'skipped: why'."""
    functional = torch.nn.functional
    if step not in IMPLEMENTATIONS:
        module, why_not = steps_module
        if module is None:
            return f"skipped: the repository's library did not load ({why_not})"
        align = "top-left" if causal else None
        return (lambda q, k, v: module.attention(q, k, v, step=step, causal=align)), contextlib.nullcontext
    backend_name = IMPLEMENTATIONS[step]
    if backend_name is None:
        def attention(q, k, v):  # a ViT block without fused attention (timm's Attention)
            scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)
            if causal:
                above = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
                scores = scores.masked_fill(above, -math.inf)
            return scores.softmax(dim=-1) @ v
        return attention, contextlib.nullcontext
    if tools is None:
        return "skipped: " + sdpa_tools(torch)[1]
    sdpa_kernel, sdpa_backend = tools
    backend = getattr(sdpa_backend, backend_name, None)
    if backend is None:
        return f"skipped: torch {torch.__version__} has no SDPBackend.{backend_name}"
    sdpa = functional.scaled_dot_product_attention
    if causal:
        return (lambda q, k, v: sdpa(q, k, v, is_causal=True)), (lambda: sdpa_kernel(backend))
    return sdpa, (lambda: sdpa_kernel(backend))


def measure(bench, torch, steps, tools, steps_module, shape, seed, windows, dtype="fp16",
            causal=False, warm_s=WARM_S):
    """Every implementation on one shape: {step: result dict for its row}. Each is checked once,
    then timed in `windows` windows, interleaved with the others (rotated order per window)."""
    batch, heads, tokens, head_dim = shape
    elements = batch * heads * tokens * head_dim
    set_bytes = 4 * elements * 2  # Q, K, V, O in fp16
    sets = min(max(2 * bench.l2_bytes // set_bytes + 1, 1), MAX_BUFFER_SETS)
    generator = torch.Generator(device=bench.device).manual_seed(seed)
    results, timed = {}, []
    inputs = []
    try:
        first = [torch.randn(batch, heads, tokens, head_dim, device=bench.device,
                             generator=generator,
                             dtype=torch.bfloat16 if dtype == "bf16" else torch.float16)
                 for _ in range(3)]
        inputs.append(first)
        for _ in range(1, sets):
            try:
                inputs.append([tensor.clone() for tensor in first])
            except torch.cuda.OutOfMemoryError:
                break  # fewer sets, as the bench does when memory is short
        sets = len(inputs)
        for step in steps:
            found = implementation(torch, step, tools, steps_module, causal)
            if isinstance(found, str):
                results[step] = {"status": found}
                continue
            attention, context = found
            with context(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    output = attention(*inputs[0])
                    torch.cuda.synchronize()
                except torch.cuda.OutOfMemoryError:
                    raise
                except Exception as error:  # a backend or step that declines this shape
                    # SDPA says why a backend declined in warnings ("... not used because ...").
                    why = one_line("; ".join(str(w.message) for w in caught) or error)
                    results[step] = {"status": f"skipped: {step} cannot run this shape: {why}"}
                    continue
            check = bench.check(*inputs[0], output, causal)
            del output
            results[step] = {"check": check, "buffer_sets": sets, "windows": [],
                             "status": "passed" if check["passed"] else "failed"}
            timed.append((step, attention, context))
        # Keep one output per set alive, so outputs rotate through memory like the bench's O.
        outputs = [None] * sets
        # Every implementation in turn until the GPU runs at its top clock (measuring.warm_up).
        def warm_call(attention, context):
            def call():
                with context():
                    outputs[0] = attention(*inputs[0])
            return call
        measuring.warm_up(torch, [warm_call(a, c) for _, a, c in timed], warm_s)
        for window in range(windows):
            shift = window % max(len(timed), 1)
            for step, attention, context in timed[shift:] + timed[:shift]:
                def launch(run, attention=attention):
                    which = run % sets
                    outputs[which] = attention(*inputs[which])
                with context():
                    results[step]["windows"].append(bench.time(launch))
        del outputs
    except torch.cuda.OutOfMemoryError:
        for step in steps:
            if not results.get(step, {}).get("windows"):
                results[step] = {"status": f"skipped: out of GPU memory for this shape ({step})"}
    inputs.clear()
    torch.cuda.empty_cache()
    for result in results.values():
        if result.get("windows"):
            medians = [timing["median_us"] for timing in result["windows"]]
            result["timing"] = {
                "median_us": statistics.median(medians),
                "min_us": min(timing["min_us"] for timing in result["windows"]),
                "max_us": max(timing["max_us"] for timing in result["windows"]),
                "iters": sum(timing["iters"] for timing in result["windows"]),
                "warmup": result["windows"][0]["warmup"],
                "window_median_min_us": min(medians), "window_median_max_us": max(medians),
            }
    return results


def row_for(step, shape, result, ceilings, gpu, causal=False):
    batch, heads, tokens, head_dim = shape
    tensor_tflops, copy_gbps = ceilings
    # contract/problem.hpp's Shape::flops() and min_bytes(): two N x N x D GEMMs over the pairs a
    # query sees (N (N + 1) / 2 under the causal mask), Q, K, V and O once.
    pairs = tokens * (tokens + 1) / 2.0 if causal else float(tokens) * tokens
    flops = 4.0 * batch * heads * pairs * head_dim
    min_bytes = 4.0 * batch * heads * tokens * head_dim * 2
    row = dict.fromkeys(CSV_COLUMNS + WINDOW_COLUMNS, "")
    row.update(step=step, batch=batch, heads=heads, tokens=tokens, head_dim=head_dim, iters=0,
               warmup=0, buffer_sets=1, tensor_peak_tflops=number(tensor_tflops),
               copy_gbps=number(copy_gbps), status=result["status"], checked_slices=0, gpu=gpu,
               date=utc_now())
    if "timing" in result:
        timing, check = result["timing"], result["check"]
        median = timing["median_us"]
        tflops = flops / (median * 1e-6) / 1e12
        gbps = min_bytes / (median * 1e-6) / 1e9
        row.update(median_us=number(median), min_us=number(timing["min_us"]),
                   max_us=number(timing["max_us"]), iters=timing["iters"], warmup=timing["warmup"],
                   buffer_sets=result["buffer_sets"], tflops=number(tflops), gbps=number(gbps),
                   fraction_tensor_peak=number(tflops / tensor_tflops if tensor_tflops else None),
                   fraction_bandwidth=number(gbps / copy_gbps if copy_gbps else None),
                   relative_error=number(check["relative_error"]),
                   max_abs_error=number(check["max_abs_error"]),
                   checked_slices=check["checked_slices"], windows=len(result["windows"]),
                   window_median_min_us=number(timing["window_median_min_us"]),
                   window_median_max_us=number(timing["window_median_max_us"]))
    return row


def write_info(path, torch, bench, ceilings, argv):
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    capability = torch.cuda.get_device_capability(bench.device)
    lines = [
        f"date_utc: {utc_now()}",
        f"command: {' '.join(['scripts/compare_pytorch.py'] + argv)}",
        f"python: {platform.python_version()}",
        f"torch: {torch.__version__}",
        f"torch_cuda: {torch.version.cuda}",
        f"cudnn: {cudnn}",
        f"gpu: {bench.gpu} (compute capability {capability[0]}.{capability[1]})",
        f"measured tensor_peak_tflops: {ceilings[0]:.1f}",
        f"measured copy_gbps: {ceilings[1]:.0f}",
        "sdpa_flash is the FlashAttention-2 kernel built into PyTorch; sdpa_cudnn is cuDNN's fused attention.",
    ]
    with open(path, "w", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")


def run(argv):
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        raise RuntimeFailure("torch is not installed for this Python (pip install torch)")
    if not torch.cuda.is_available():
        raise RuntimeFailure(f"torch {torch.__version__} sees no CUDA device; run this on a machine with an NVIDIA GPU")
    if args.device >= torch.cuda.device_count():
        raise RuntimeFailure(f"--device {args.device}: there are only {torch.cuda.device_count()} CUDA device(s)")

    bench = Bench(torch, args.device)
    ceilings = bench.ceilings()
    print(f"# {bench.gpu}: measured {ceilings[0]:.0f} TFLOP/s fp16 tensor (torch.matmul), "
          f"{ceilings[1]:.0f} GB/s copy bandwidth; torch {torch.__version__}", flush=True)
    if args.info:
        write_info(args.info, torch, bench, ceilings, argv)
    tools, _ = sdpa_tools(torch)
    needs_library = any(step not in IMPLEMENTATIONS for step in args.steps)
    steps_module = step_library() if needs_library else (None, "no step asked for")

    out = open(args.csv, "w", newline="", encoding="utf-8") if args.csv else sys.stdout
    table = sys.stdout if args.csv else sys.stderr  # keep stdout pure CSV when it carries the rows
    any_failed = False
    try:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_COLUMNS + WINDOW_COLUMNS)
        print(f"{'step':<15} {'N':>6} {'D':>4} {'median_us':>11} {'windows (min-max)':>21} "
              f"{'TFLOP/s':>9} {'rel_err':>10}  status", file=table)
        for tokens in args.tokens:
            shape = (args.batch, args.heads, tokens, args.head_dim)
            results = measure(bench, torch, args.steps, tools, steps_module, shape, args.seed,
                              args.windows, args.dtype, args.causal, args.warm_s)
            for step in args.steps:
                result = results[step]
                row = row_for(step, shape, result, ceilings, bench.gpu, args.causal)
                writer.writerow([row[column] for column in CSV_COLUMNS + WINDOW_COLUMNS])
                out.flush()
                any_failed = any_failed or result["status"] == "failed"
                spread = (f"{row['window_median_min_us']}-{row['window_median_max_us']}"
                          if row["windows"] else "-")
                print(f"{step:<15} {tokens:>6} {args.head_dim:>4} {row['median_us'] or '-':>11} "
                      f"{spread:>21} {row['tflops'] or '-':>9} {row['relative_error'] or '-':>10}  "
                      f"{row['status']}", file=table, flush=True)
    finally:
        if out is not sys.stdout:
            out.close()
    return 1 if any_failed else 0


def main():
    try:
        return run(sys.argv[1:])
    except UsageError as error:
        print(f"compare_pytorch.py: {error}", file=sys.stderr)
        return 2
    except RuntimeFailure as error:
        print(f"compare_pytorch.py: {error}", file=sys.stderr)
        return 3
    except OSError as error:
        print(f"compare_pytorch.py: {error}", file=sys.stderr)
        return 3
    except RuntimeError as error:  # CUDA errors surface as RuntimeError
        print(f"compare_pytorch.py: {one_line(error)}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
