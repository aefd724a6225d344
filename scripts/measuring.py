"""What the measurement scripts share: CUDA-event timing, the profiler's GPU time by kernel
category, and CSV writing. Each script imports it (python puts scripts/ on the path of a script
it runs), none loads another.

    import measuring
    per_call_ms = measuring.each_call_ms(torch, [forward] * 20)      # events around each call
    ms = measuring.window_ms(torch, lambda: step(q, k, v), calls=50)  # one window, ms per call
    measuring.warm_up(torch, [forward, baseline], seconds=2.0)         # to the GPU's top clock
"""
import csv
import re
from collections import Counter

PROFILER_ACTIVITIES = ("CPU", "CUDA")  # torch.profiler.ProfilerActivity names (a CPU test: CPU)

CATEGORIES = ["attention", "gemm", "layernorm", "gelu", "elementwise", "layout", "other"]

# Kernel name -> category, first match wins (names lowercased). Attention first: cuDNN's SDPA
# kernels mention wgmma and fprop too. The steps' kernels all hold "attention" in their names.
CATEGORY_PATTERNS = [
    ("attention", re.compile(r"attention|attn|flash|fmha|sdpa|softmax")),
    ("layernorm", re.compile(r"layer_?norm|rowwisemoments")),
    ("gelu", re.compile(r"gelu")),
    ("layout", re.compile(r"copy|transpose|permute|contiguous|transform_bias_rescale|catarray|"
                          r"nchwtonhwc|nhwctonchw|im2col")),
    ("gemm", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|s16816|h16816|wgmma|conv|fprop")),
    ("elementwise", re.compile(r"elementwise|functor|add|mul|fill")),
]


def category_of(name):
    lowered = name.lower()
    for category, pattern in CATEGORY_PATTERNS:
        if pattern.search(lowered):
            return category
    return "other"



def cannot_run(torch, torch_op, outcome):
    """Why a script that needs a CUDA device and the operator cannot run ("nothing {outcome}"),
    the line it prints before exiting 3; None when it can."""
    if not torch.cuda.is_available():
        return f"torch sees no CUDA device: nothing {outcome}"
    if not torch_op.available():
        return f"the operator is not built: {torch_op.BUILD_COMMAND}"
    return None


def each_call_ms(torch, runs, *, hold_ms=0.0, before=None):
    """Milliseconds of each call in `runs` (callables), CUDA events around each, queued back to
    back with no synchronisation between them. hold_ms > 0 first queues a busy-wait kernel of
    about that long (torch.cuda._sleep, where torch has it), so Python queues every call while
    the GPU is busy and each pair of events brackets GPU work, not Python's launch overhead (the
    bench does the same with hold_stream in harness/timing.cu). `before`: a callable queued
    before each call, outside its events (flushed_call_ms's flush)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in runs]
    ends = [torch.cuda.Event(enable_timing=True) for _ in runs]
    sleep = getattr(torch.cuda, "_sleep", None)
    if hold_ms > 0 and sleep is not None:
        sleep(int(hold_ms * 2_000_000))  # cycles at about 2 GHz
    for start, run, end in zip(starts, runs, ends):
        if before is not None:
            before()
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in zip(starts, ends)]


def warm_up(torch, runs, seconds):
    """Calls each of `runs` in turn, waiting for the GPU after every round, until `seconds` have
    passed; the rounds it ran. From idle an H100 takes most of a second of steady load to reach
    its top clock (docs/results/h100/v10/clock-ramp/: 1,710 MHz rising to 1,980 over 0.7 s, with
    nvidia-smi's reason "SW power cap"), so a few warm-up calls leave the first windows timed
    on a slower GPU than the last, and whichever implementation runs first pays most of it."""
    import time
    started, rounds = time.perf_counter(), 0
    while rounds == 0 or time.perf_counter() - started < seconds:
        for run in runs:
            run()
        torch.cuda.synchronize()
        rounds += 1
    return rounds


def window_ms(torch, run, calls):
    """One timing window: `calls` calls of run() back to back between two CUDA events, waited
    for; milliseconds per call."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def rotated_windows(torch, calls, windows, calls_per_window):
    """{key: [microseconds per call, one per window]} for a dict of callables: `windows` windows
    of each (window_ms), interleaved, the order rotated by one every window so that none always
    runs first."""
    keys = list(calls)
    times = {key: [] for key in keys}
    for window in range(windows):
        shift = window % len(keys)
        for key in keys[shift:] + keys[:shift]:
            times[key].append(1000 * window_ms(torch, calls[key], calls_per_window))
    return times


# Bytes written before each flushed call: more than an H100's 50 MB L2 (or an A100's 40 MB) by far.
FLUSH_BYTES = 256 << 20


def flushed_call_ms(torch, run, calls, flush=None):
    """Milliseconds of each of `calls` calls of run(), each after the L2 cache was flushed by
    zeroing FLUSH_BYTES (as triton.testing.do_bench times a kernel): CUDA events around run()
    alone, so each call starts with its inputs in device memory, as it would after the other
    layers of a model ran. `flush`: a reusable uint8 buffer of FLUSH_BYTES (one is made if None)."""
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda") if flush is None else flush
    return each_call_ms(torch, [run] * calls, before=flush.zero_)


def profile_forward(torch, forward, count, record_prefix):
    """GPU time per forward by category (ms), kernels per forward and the largest kernel of each
    category, and how attention was found. Kernels that ran inside the bridge's
    record_function ranges (attention_steps::<step>) are attention whatever their names (the
    eager baseline's cuBLAS GEMMs): found by the ranges' spans on the GPU timeline ('gpu
    range'), else by the profiler's links from the ranges to their kernels ('cpu range'); other
    kernels, and all of the stock model's, by name ('name')."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[getattr(ProfilerActivity, a) for a in PROFILER_ACTIVITIES]) as prof:
        for _ in range(count):
            forward()
        torch.cuda.synchronize()
    events = prof.events()

    def in_range(event):
        return event.name.startswith(record_prefix)

    # A record_function range shows up twice: as a CPU event (linked to the kernels launched in
    # it) and as a user annotation on the GPU spanning them. Neither is a kernel.
    spans = [(e.time_range.start, e.time_range.end) for e in events
             if e.device_type == DeviceType.CUDA and e.is_user_annotation and in_range(e)]
    linked = Counter((k.name, k.duration) for e in events
                     if e.device_type == DeviceType.CPU and in_range(e) for k in e.kernels)
    per_category = {category: 0.0 for category in CATEGORIES}
    kernels = {category: 0 for category in CATEGORIES}
    largest = {category: Counter() for category in CATEGORIES}  # name -> total us
    found_by = set()
    for event in events:
        if event.device_type != DeviceType.CUDA or event.is_user_annotation:
            continue  # kernels, memcpys and memsets only
        start, end = event.time_range.start, event.time_range.end
        duration = end - start
        if any(low <= start and end <= high for low, high in spans):
            category = "attention"
            found_by.add("gpu range")
        elif linked[(event.name, duration)] > 0:
            linked[(event.name, duration)] -= 1
            category = "attention"
            found_by.add("cpu range")
        else:
            category = category_of(event.name)
        per_category[category] += duration
        kernels[category] += 1
        largest[category][event.name] += duration
    result = {}
    for category in CATEGORIES:
        top = largest[category].most_common(1)[0] if largest[category] else ("", 0.0)
        result[category] = {"ms": per_category[category] / count / 1000.0,
                            "kernels": kernels[category] / count,
                            "top_kernel": top[0][:160], "top_kernel_ms": top[1] / count / 1000.0}
    return result, "+".join(sorted(found_by)) or "name"


def write_csv(path, columns, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({column: row.get(column, "") for column in columns})
