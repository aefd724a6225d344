#!/usr/bin/env python3
"""Profiles every step with Nsight Compute at one ViT shape and writes the evidence table the
chapters cite: one CSV row per step with kernel duration, DRAM bytes read and written, DRAM and
SM throughput, achieved and theoretical occupancy with the limiter, registers per thread,
shared memory per block, and the launch shape.

  scripts/ncu_profile.py --out OUTDIR [--build-dir build] [--tokens 577] [--steps all|ID,ID,...]
                     [--batch 32] [--heads 12] [--head-dim 64] [--kv-tokens N_k] [--key-padding]
                     [--ncu PATH] [--kernel-regex attention] [--timeout SECONDS]
                     [--sections NAME,NAME,...]

Each step runs once under `ncu --clock-control none` (the GPU at its own clocks, as the bench
times it): `stepN --tokens N --iters 1 --warmup 0 --check none` at B=32, H=12, D=64 unless
--batch, --heads, --head-dim say otherwise (--kv-tokens and --key-padding go to the step too), with a
kernel filter so only the step's kernels (names containing "attention") are profiled, not the
cuBLAS GEMM and the copy the harness runs to measure the GPU's ceilings. The eager baseline
runs through `bench --steps eager` with no filter (its kernels are cuBLAS's and a softmax);
its row sums the kernels of one invocation.

A step is launched twice in that command (the checked run, then the timed one), on the
runner's own stream: the row describes the last launch, all the kernels it issued on that
stream (the harness's own kernels, hold_stream and fill_hashed, left out). Durations and bytes are summed over those kernels, throughputs are weighted by
duration, and the per-launch facts (occupancy, limiter, registers, shared memory, grid and
block) are the longest kernel's, named in main_kernel.

Writes OUTDIR/profile.csv and, per step, OUTDIR/profile/<id>.ncu-rep (open it in Nsight
Compute), <id>.log (ncu's and the program's output) and <id>_raw.csv (ncu --page raw).
--sections adds ncu's sections by name (ComputeWorkloadAnalysis, SchedulerStats,
WarpStateStats, ...: what limits a kernel beyond the table's columns) and writes each step's
details page, every section's metrics with their units, to OUTDIR/profile/<id>_details.csv.
A metric this ncu does not know leaves its cell empty. A step this GPU cannot run at the shape
(its compute capability, or the shared memory the shape needs) refuses with exit 2 before any
kernel runs; its row's status is "skipped: <the refusal>". Standard library only.
Exit status: 0 every step profiled or skipped with its reason, 1 one failed (its row says why),
2 usage error, 3 ncu not found.
"""
import argparse
import csv
import datetime
import os
import re
import shutil
import subprocess
import sys

METRICS = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",  # achieved occupancy
    "sm__maximum_warps_per_active_cycle_pct",             # theoretical occupancy
    "launch__occupancy_limit_registers",                  # blocks per SM each resource allows
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__occupancy_limit_blocks",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_static",
    "launch__shared_mem_per_block_dynamic",
    "launch__grid_size",
    "launch__block_size",
    "launch__stream_id",
    "device__attribute_display_name",
]

COLUMNS = [
    "step", "batch", "heads", "tokens", "head_dim", "kv_tokens", "key_padding", "kernels", "main_kernel", "duration_us",
    "dram_read_bytes", "dram_write_bytes", "dram_bytes", "min_bytes", "traffic_ratio",
    "dram_throughput_pct", "sm_throughput_pct", "achieved_occupancy_pct",
    "theoretical_occupancy_pct", "occupancy_limiter", "registers_per_thread",
    "shared_mem_per_block_bytes", "grid_blocks", "block_threads", "grid_dims", "block_dims",
    "status", "gpu", "date", "ncu_version",
]


# The harness's own kernels (harness/timing.cu holds the stream before timed runs, ceilings.cu
# fills the GEMM inputs): not part of any step, left out of every row.
HARNESS_KERNELS = re.compile(r"\b(hold_stream|fill_hashed)\b")

# Units ncu may print (--print-units base asks for the first of each; the rest are handled).
TIME_NS = {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
           "second": 1e9, "s": 1e9}
BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "KB": 1e3,
         "MB": 1e6, "GB": 1e9, "KiB": 1024, "MiB": 2 ** 20, "GiB": 2 ** 30}


class UsageError(Exception):
    pass


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def number(value, digits=6):
    return "" if value is None else f"{value:.{digits}g}"


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="ncu_profile.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default="build", help="folder with stepN and bench (default build)")
    parser.add_argument("--out", required=True, help="output folder: profile.csv and profile/ go there")
    parser.add_argument("--tokens", default="577", help="token count N (default 577, ViT at 384 px)")
    parser.add_argument("--batch", default="32", help="B (default 32, the bench's)")
    parser.add_argument("--heads", default="12", help="H (default 12)")
    parser.add_argument("--head-dim", default="64", help="D (default 64)")
    parser.add_argument("--kv-tokens", default="0", help="keys N_k for cross-attention (default 0: N)")
    parser.add_argument("--key-padding", action="store_true", help="the step's --key-padding mask")
    parser.add_argument("--steps", default="all", help="all (every stepN, then eager) or ids, e.g. v0,v3,eager")
    parser.add_argument("--ncu", help="ncu to use (default: PATH, then /usr/local/cuda/bin)")
    parser.add_argument("--kernel-regex", default="attention", help="the steps' kernel filter (default attention)")
    parser.add_argument("--timeout", default="300", help="seconds per step (default 300)")
    parser.add_argument("--sections", default="", help="ncu sections to add, comma separated")
    args = parser.parse_args(argv)
    for flag in ("tokens", "timeout", "batch", "heads", "head_dim", "kv_tokens"):
        text = getattr(args, flag)
        if not text.isdigit() or (int(text) < 1 and flag != "kv_tokens"):
            raise UsageError(f"--{flag}: '{text}' is not a positive integer")
        setattr(args, flag, int(text))
    return args


def find_ncu(given):
    if given:
        if os.access(given, os.X_OK):
            return given
        raise FileNotFoundError(f"--ncu {given}: not an executable")
    found = shutil.which("ncu")
    if found:
        return found
    for folder in (os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "bin"), "/usr/local/cuda/bin"):
        if os.access(os.path.join(folder, "ncu"), os.X_OK):
            return os.path.join(folder, "ncu")
    raise FileNotFoundError("ncu not found (install Nsight Compute or pass --ncu PATH)")


def discover_steps(build_dir):
    """Every stepN executable, in step order, then the eager baseline when bench is there."""
    steps = []
    for name in os.listdir(build_dir):
        match = re.fullmatch(r"step(\d+)", name)
        path = os.path.join(build_dir, name)
        if match and os.path.isfile(path) and os.access(path, os.X_OK):
            steps.append((int(match.group(1)), f"v{match.group(1)}"))
    ids = [step for _, step in sorted(steps)]
    if os.access(os.path.join(build_dir, "bench"), os.X_OK):
        ids.append("eager")
    return ids


def command_for(step, args, ncu, report):
    shape = ["--tokens", str(args.tokens), "--batch", str(args.batch), "--heads", str(args.heads),
             "--head-dim", str(args.head_dim), "--iters", "1", "--warmup", "0", "--check", "none"]
    if args.kv_tokens:
        shape += ["--kv-tokens", str(args.kv_tokens)]
    if args.key_padding:
        shape += ["--key-padding"]
    profiler = [ncu, "--clock-control", "none", "--metrics", ",".join(METRICS), "--export", report,
                "--force-overwrite"]
    for section in filter(None, args.sections.split(",")):
        profiler += ["--section", section]
    if step == "eager":
        return profiler + [os.path.join(args.build_dir, "bench"), "--steps", "eager"] + shape
    binary = os.path.join(args.build_dir, "step" + step[1:])
    return profiler + ["--kernel-name", "regex:" + args.kernel_regex, binary] + shape + ["--no-ceilings"]


def to_float(text):
    text = (text or "").strip().replace(",", "")  # ncu may print thousands separators
    try:
        return float(text)
    except ValueError:
        return None


def parse_raw_csv(text):
    """ncu --page raw --csv: a header row, maybe a units row, then one row per kernel.
    Returns (kernels as dicts of raw strings, units by column)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return [], {}
    rows = list(csv.reader(lines[start:]))
    header, body = rows[0], rows[1:]
    units = {}
    if body and not body[0][0].strip().isdigit():
        units = dict(zip(header, body[0]))
        body = body[1:]
    kernels = [dict(zip(header, row)) for row in body if row and row[0].strip().isdigit()]
    kernels.sort(key=lambda kernel: int(kernel["ID"]))
    return kernels, units


def metric(kernel, units, name, scale=None):
    """A metric's value as a float in base units (ns, bytes), or None when absent."""
    value = to_float(kernel.get(name))
    if value is None or scale is None:
        return value
    unit = units.get(name, "").strip()
    unit = unit.removesuffix("/block")  # launch__shared_mem_per_block_* come in byte/block
    if unit and unit not in scale:
        return None  # a unit we do not know: an empty cell beats a wrong number
    return value * scale.get(unit, 1)


def last_invocation(kernels, units):
    """The kernels the step's last launch issued: those on the stream of the last profiled
    kernel (the runner's stream), second half (the command launches the step twice)."""
    def stream(kernel):
        value = metric(kernel, units, "launch__stream_id")
        return value if value is not None else kernel.get("Stream")
    kernels = [kernel for kernel in kernels if not HARNESS_KERNELS.search(kernel.get("Kernel Name", ""))]
    if not kernels:
        return [], "no kernel was profiled"
    last_stream = stream(kernels[-1])
    on_stream = [kernel for kernel in kernels if stream(kernel) == last_stream]
    half = len(on_stream) // 2
    names = [kernel.get("Kernel Name") for kernel in on_stream]
    if len(on_stream) % 2 == 0 and names[:half] == names[half:]:
        return on_stream[half:], ""
    return on_stream, f"expected two identical launches on the step's stream, found {len(on_stream)} kernels; summed them all"


def summarize(step, kernels, units, args):
    """One profile.csv row from the kernels of one invocation."""
    durations = [metric(k, units, "gpu__time_duration.sum", TIME_NS) for k in kernels]
    total_ns = sum(d for d in durations if d is not None) if any(d is not None for d in durations) else None
    main = max(kernels, key=lambda k: metric(k, units, "gpu__time_duration.sum", TIME_NS) or 0)

    def summed(name):
        values = [metric(k, units, name, BYTES) for k in kernels]
        return None if any(v is None for v in values) else sum(values)

    def weighted(name):  # a percentage over several kernels, weighted by their durations
        pairs = [(metric(k, units, name), d) for k, d in zip(kernels, durations)]
        if any(v is None or d is None for v, d in pairs) or not total_ns:
            return None
        return sum(v * d for v, d in pairs) / total_ns

    limits = {name: metric(main, units, f"launch__occupancy_limit_{name}")
              for name in ("registers", "shared_mem", "warps", "blocks")}
    known = {name: value for name, value in limits.items() if value is not None}
    limiter = ""
    if known:
        lowest = min(known.values())
        limiter = "+".join(name for name, value in known.items() if value == lowest)

    shared = [metric(main, units, f"launch__shared_mem_per_block_{kind}", BYTES) for kind in ("static", "dynamic")]
    dram_read, dram_write = summed("dram__bytes_read.sum"), summed("dram__bytes_write.sum")
    dram = dram_read + dram_write if dram_read is not None and dram_write is not None else None
    keys = args.kv_tokens or args.tokens  # read Q, K, V and write O once, 2 bytes an element
    min_bytes = 2.0 * args.batch * args.heads * args.head_dim * (2 * args.tokens + 2 * keys)
    main_name = main.get("Kernel Name", "")
    return {
        "kernels": len(kernels),
        "main_kernel": main_name[:120],
        "duration_us": number(total_ns / 1e3 if total_ns is not None else None),
        "dram_read_bytes": number(dram_read, 12),
        "dram_write_bytes": number(dram_write, 12),
        "dram_bytes": number(dram, 12),
        "min_bytes": number(min_bytes, 12),
        "traffic_ratio": number(dram / min_bytes if dram is not None else None, 4),
        "dram_throughput_pct": number(weighted("dram__throughput.avg.pct_of_peak_sustained_elapsed"), 4),
        "sm_throughput_pct": number(weighted("sm__throughput.avg.pct_of_peak_sustained_elapsed"), 4),
        "achieved_occupancy_pct": number(metric(main, units, "sm__warps_active.avg.pct_of_peak_sustained_active"), 4),
        "theoretical_occupancy_pct": number(metric(main, units, "sm__maximum_warps_per_active_cycle_pct"), 4),
        "occupancy_limiter": limiter,
        "registers_per_thread": number(metric(main, units, "launch__registers_per_thread")),
        "shared_mem_per_block_bytes": number(sum(shared) if None not in shared else None),
        "grid_blocks": number(metric(main, units, "launch__grid_size"), 12),
        "block_threads": number(metric(main, units, "launch__block_size")),
        "grid_dims": main.get("Grid Size", ""),
        "block_dims": main.get("Block Size", ""),
        "gpu_from_ncu": main.get("device__attribute_display_name", "").strip(),
    }


def run_ncu(command, log_path, timeout):
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        try:
            return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            log.write(f"\nprofile.py: timed out after {timeout} s\n")
            return None


def failure_reason(log_path, returncode):
    with open(log_path, encoding="utf-8", errors="replace") as log:
        text = log.read()
    if "ERR_NVGPUCTRPERM" in text:
        return ("no permission to read the GPU's performance counters (ERR_NVGPUCTRPERM): run as "
                "root or set the driver option NVreg_RestrictProfilingToAdminUsers=0")
    if returncode is None:
        return "timed out"
    errors = [line.strip() for line in text.splitlines() if line.startswith("==ERROR==")]
    if errors:
        return " ".join(errors[0].split())[:200]
    return f"ncu exited {returncode}"


def refusal(log_path, step):
    """The step's one-line refusal (exit 2) when this GPU cannot run it at this shape: its compute
    capability, or the shared memory the shape needs. Nothing ran, so the row is skipped."""
    program = "step" + step[1:] + ": "
    with open(log_path, encoding="utf-8", errors="replace") as log:
        for line in log:
            if line.startswith(program) and ("does not serve" in line or
                                             "needs a GPU of compute capability" in line):
                return line[len(program):].strip()
    return None


def unknown_metrics(log_path):
    """Metrics ncu named as unknown in its errors, so a rerun can leave them out."""
    with open(log_path, encoding="utf-8", errors="replace") as log:
        errors = [line for line in log if line.startswith("==ERROR==") and "metric" in line.lower()]
    return [name for name in METRICS if any(name in line for line in errors)]


def profile_step(step, args, ncu, folder):
    report = os.path.join(folder, step)
    log_path = os.path.join(folder, f"{step}.log")
    command = command_for(step, args, ncu, report)
    returncode = run_ncu(command, log_path, args.timeout)
    dropped = unknown_metrics(log_path) if returncode else []
    if dropped:  # keep the row: leave the unknown metrics' cells empty
        index = command.index("--metrics") + 1
        command[index] = ",".join(name for name in METRICS if name not in dropped)
        returncode = run_ncu(command, log_path, args.timeout)
    if returncode != 0 or not os.path.exists(report + ".ncu-rep"):
        refused = refusal(log_path, step) if step != "eager" else None
        if refused:
            return None, "skipped: " + refused
        return None, "failed: " + failure_reason(log_path, returncode)

    imported = None
    for extra in (["--print-units", "base"], []):  # older ncu has no --print-units
        result = subprocess.run([ncu, "--import", report + ".ncu-rep", "--csv", "--page", "raw"] + extra,
                                capture_output=True, text=True, timeout=args.timeout)
        if result.returncode == 0:
            imported = result.stdout
            break
    if imported is None:
        return None, f"failed: ncu --import exited {result.returncode}: {' '.join(result.stderr.split())[:160]}"
    with open(os.path.join(folder, f"{step}_raw.csv"), "w", encoding="utf-8") as raw:
        raw.write(imported)
    if args.sections:  # the sections' own page: every metric of each, with its unit
        details = subprocess.run([ncu, "--import", report + ".ncu-rep", "--csv", "--page", "details"],
                                 capture_output=True, text=True, timeout=args.timeout)
        with open(os.path.join(folder, f"{step}_details.csv"), "w", encoding="utf-8") as page:
            page.write(details.stdout if details.returncode == 0 else details.stderr)
    kernels, units = parse_raw_csv(imported)
    chosen, note = last_invocation(kernels, units)
    if not chosen:
        hint = f" (the filter regex:{args.kernel_regex} matched none)" if step != "eager" else ""
        return None, f"failed: ncu profiled no kernel{hint}"
    summary = summarize(step, chosen, units, args)
    status = "profiled" + (f" ({note})" if note else "") + (f"; no metric {','.join(dropped)}" if dropped else "")
    return summary, status


def gpu_name():
    try:
        result = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                                capture_output=True, text=True, timeout=30)
        return result.stdout.strip().splitlines()[0] if result.returncode == 0 and result.stdout.strip() else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def run(argv):
    args = parse_args(argv)
    if not os.path.isdir(args.build_dir):
        raise UsageError(f"--build-dir {args.build_dir}: no such folder")
    ncu = find_ncu(args.ncu)
    steps = discover_steps(args.build_dir) if args.steps == "all" else args.steps.split(",")
    if not steps:
        raise UsageError(f"no stepN executables in {args.build_dir}")
    for step in steps:
        program = "bench" if step == "eager" else ("step" + step[1:] if re.fullmatch(r"v\d+", step) else None)
        if program is None:
            raise UsageError(f"--steps: '{step}' is neither a step id (v0, v1, ...) nor eager")
        if not os.access(os.path.join(args.build_dir, program), os.X_OK):
            raise UsageError(f"--steps: no executable {os.path.join(args.build_dir, program)}")
    folder = os.path.join(args.out, "profile")
    os.makedirs(folder, exist_ok=True)
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    version = version[-1] if version else ""
    fallback_gpu = gpu_name()

    any_failed = False
    csv_path = os.path.join(args.out, "profile.csv")
    with open(csv_path, "w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        for step in steps:
            print(f"profiling {step} at N={args.tokens} ...", flush=True)
            summary, status = profile_step(step, args, ncu, folder)
            row = dict.fromkeys(COLUMNS, "")
            row.update(step=step, batch=args.batch, heads=args.heads, tokens=args.tokens,
                       head_dim=args.head_dim, kv_tokens=args.kv_tokens or args.tokens,
                       key_padding=int(args.key_padding),
                       status=status, date=utc_now(), ncu_version=version, gpu=fallback_gpu)
            if summary:
                row["gpu"] = summary.pop("gpu_from_ncu") or fallback_gpu
                row.update(summary)
            any_failed = any_failed or status.startswith("failed")
            writer.writerow(row)
            out.flush()
            print(f"  {step}: {status}; {row['duration_us'] or '-'} us, DRAM {row['dram_bytes'] or '-'} B "
                  f"({row['traffic_ratio'] or '-'}x the minimum), occupancy {row['achieved_occupancy_pct'] or '-'}% "
                  f"of {row['theoretical_occupancy_pct'] or '-'}% (limit: {row['occupancy_limiter'] or '-'})",
                  flush=True)
    print(f"wrote {csv_path}")
    return 1 if any_failed else 0


def main():
    try:
        return run(sys.argv[1:])
    except UsageError as error:
        print(f"ncu_profile.py: {error}", file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        print(f"ncu_profile.py: {error}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
