#!/usr/bin/env python3
"""Plans the long-sequence sweep of scripts/gpu-check.sh: which steps run at which N.

A step runs at a token count N when `bench --list` gives it no N limit on this GPU ("any"), it
is not excluded, the ViT sweep timed it (bench's default sweep times the forward steps; the
backward ones are left to gpu-check's backward stage), and its estimated bench time at N stays
within the budget. A step this GPU
cannot run ("none": its compute capability range leaves the GPU out) is left out with that
reason. The estimate scales the
step's median at the largest N of the ViT sweep by (N / N_measured)^2, the growth of
attention's work, and counts the runs bench makes for one shape: one checked run, the
warm-ups, one probe and the timed runs (up to 50 within about 2 s, at least 5). Steps are
grouped by the largest N they reach, so one bench call serves each group.

Prints "# ..." notes and one "TOKENS<TAB>STEPS" line per bench call. Writes, for every
(step, N) left out, a row in the bench CSV schema (no header) whose status says why, so the
sweep's CSV shows a missing point as skipped rather than leaving a silent gap.

  scripts/plan_long_sweep.py --list FILE --bench-csv FILE [--tokens 2049,4097,8193,16385]
                             [--exclude v0] [--budget-seconds 25] [--warmup 3]
                             [--skipped-rows FILE]

Exit status: 0 planned, 2 usage error or unreadable input.
"""
import argparse
import csv
import datetime
import math
import sys

# harness/report.cpp, csv_header()
BENCH_COLUMNS = (
    "step,batch,heads,tokens,head_dim,median_us,min_us,max_us,iters,warmup,buffer_sets,"
    "tflops,gbps,fraction_tensor_peak,fraction_bandwidth,tensor_peak_tflops,copy_gbps,"
    "status,relative_error,max_abs_error,checked_slices,gpu,date"
).split(",")
AUTO_ITERS, AUTO_SECONDS, MIN_ITERS = 50, 2.0, 5  # harness/options.hpp, harness/timing.cu


def fail(message):
    print(f"plan_long_sweep.py: {message}", file=sys.stderr)
    sys.exit(2)


def token_list(text):
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers")
    if any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(f"'{text}': token counts must be at least 1")
    return sorted(set(values))


def read_list(path):
    """bench --list, tab-separated: id, largest N on this GPU (a number, "any", or "none" when
    this GPU cannot run the step), head dims, compute capability ("8.0+", "9.0"), title.
    Returns (id, limit, capability): limit 0 for any N, None for none."""
    steps = []
    try:
        with open(path, encoding="utf-8") as file:
            for line in file:
                fields = line.rstrip("\n").split("\t")
                if len(fields) < 5:
                    continue
                limit = {"any": 0, "none": None}.get(fields[1])
                if limit is None and fields[1] != "none":
                    limit = int(fields[1])
                steps.append((fields[0], limit, fields[3]))
    except (OSError, ValueError) as error:
        fail(f"cannot read bench --list output '{path}': {error}")
    if not steps:
        fail(f"'{path}' lists no steps (expected bench --list output)")
    return steps


def read_bench(path):
    try:
        with open(path, newline="", encoding="utf-8") as file:
            reader = csv.DictReader(file)
            if reader.fieldnames != BENCH_COLUMNS:
                fail(f"'{path}' does not have the bench CSV columns")
            return list(reader)
    except OSError as error:
        fail(f"cannot read '{path}': {error}")


def bench_seconds(run_seconds, warmup):
    """What bench spends on one shape of one step when one run takes run_seconds."""
    iters = min(max(math.floor(AUTO_SECONDS / max(run_seconds, 1e-6)), MIN_ITERS), AUTO_ITERS)
    return run_seconds * (1 + warmup + 1 + iters)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", required=True, help="bench --list output")
    parser.add_argument("--bench-csv", required=True, help="the ViT sweep's CSV")
    parser.add_argument("--tokens", type=token_list, default=token_list("2049,4097,8193,16385"))
    parser.add_argument("--exclude", default="v0", help="comma-separated step ids (default v0)")
    parser.add_argument("--budget-seconds", type=float, default=25.0)
    parser.add_argument("--warmup", type=int, default=3, help="warm-ups bench will be given")
    parser.add_argument("--skipped-rows", help="write the left-out (step, N) rows here")
    args = parser.parse_args()

    steps = read_list(args.list)
    rows = read_bench(args.bench_csv)
    excluded = {step for step in args.exclude.split(",") if step}
    if not rows:
        fail(f"'{args.bench_csv}' holds no rows")
    template = rows[0]  # shape, ceilings and GPU of the run the estimates come from

    # The largest measured N per step, from rows that ran at head dim 64 and passed.
    measured = {}
    for row in rows:
        if row["status"] != "passed" or not row["median_us"] or row["head_dim"] != "64":
            continue
        tokens, seconds = int(row["tokens"]), float(row["median_us"]) * 1e-6
        if row["step"] not in measured or tokens > measured[row["step"]][0]:
            measured[row["step"]] = (tokens, seconds)

    skipped = []  # (step, tokens, reason)
    reach = {}    # step -> the token counts it runs
    for step, limit, capability in steps:
        if limit is None:
            print(f"# {step}: this GPU cannot run it (it needs compute capability {capability})")
            skipped += [(step, n, f"{step} does not run on this GPU (bench --list: none; it needs compute capability "
                                  f"{capability})") for n in args.tokens]
            continue
        if step in excluded:
            print(f"# {step}: excluded from the long sweep (far too slow at these sizes)")
            skipped += [(step, n, "excluded from the long sweep by gpu-check.sh") for n in args.tokens]
            continue
        if limit:
            print(f"# {step}: has an N limit ({limit}); the long sweep runs the steps without one")
            skipped += [(step, n, f"{step} serves N <= {limit} (bench --list)" if n > limit else
                         f"the long sweep runs only steps without an N limit; {step} serves N <= {limit}")
                        for n in args.tokens]
            continue
        if step not in measured:
            # The backward steps and baselines (bench times them only when named; the backward
            # stage measures them), or a forward step whose ViT timing failed: nothing to
            # estimate from, and the eager backward alone would take minutes at N = 16385.
            print(f"# {step}: no passed timing in the ViT sweep to estimate from; left out")
            skipped += [(step, n, "not run by gpu-check.sh: no passed timing in the ViT sweep to "
                                  "estimate its time from (a backward step: the backward stage times it)")
                        for n in args.tokens]
            continue
        base_tokens, base_seconds = measured[step]
        reach[step] = []
        for n in args.tokens:
            run = base_seconds * (n / base_tokens) ** 2
            total = bench_seconds(run, args.warmup)
            if total <= args.budget_seconds:
                reach[step].append(n)
            else:
                skipped.append((step, n, f"not run by gpu-check.sh: estimated {total:.0f} s for this "
                                         f"shape ({run:.3g} s a run, from {base_seconds:.3g} s at "
                                         f"N={base_tokens} times (N/{base_tokens})^2), over its "
                                         f"budget of {args.budget_seconds:g} s"))
        left_out = [n for n in args.tokens if n not in reach[step]]
        print(f"# {step}: runs at N = {','.join(map(str, reach[step])) or 'none'}"
              + (f"; left out N = {','.join(map(str, left_out))} (over the time budget)" if left_out else ""))

    # One bench call per distinct reach; steps that reach no N make no call.
    groups = {}
    for step, tokens in reach.items():
        if tokens:
            groups.setdefault(tuple(tokens), []).append(step)
    for tokens, group in sorted(groups.items(), key=lambda item: -len(item[0])):
        print(",".join(map(str, tokens)) + "\t" + ",".join(group))

    if args.skipped_rows:
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        with open(args.skipped_rows, "w", newline="", encoding="utf-8") as file:
            writer = csv.writer(file, lineterminator="\n")
            for step, tokens, reason in sorted(skipped, key=lambda item: (item[1], item[0])):
                row = dict.fromkeys(BENCH_COLUMNS, "")
                row.update(step=step, batch=template["batch"], heads=template["heads"],
                           tokens=tokens, head_dim=template["head_dim"], iters=0, warmup=0,
                           buffer_sets=1, tensor_peak_tflops=template["tensor_peak_tflops"],
                           copy_gbps=template["copy_gbps"], status=f"skipped: {reason}",
                           checked_slices=0, gpu=template["gpu"], date=date)
                writer.writerow([row[column] for column in BENCH_COLUMNS])


if __name__ == "__main__":
    main()
