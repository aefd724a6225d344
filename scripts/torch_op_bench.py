#!/usr/bin/env python3
"""The operator torch.ops.attention_steps.attention as a PyTorch user meets it, in one process:

  host_us_per_call   host time of one call, the operator (through attention_steps.attention,
                     and bare) beside F.scaled_dot_product_attention, on a tiny shape where the
                     GPU waits for the host: the wall time of a loop of calls, without the sync
  graph_replay       a CUDA graph captured around the operator, replayed on new inputs:
                     largest difference from SDPA in fp32 (the check), and µs per replay
  graph_breaks       torch._dynamo.explain of vit_b_16 with the step swapped in
  images_per_s       vit_b_16 at each image size, batch 32, fp16, inference: stock and swapped,
                     eager, torch.compile, torch.compile(mode="reduce-overhead"); the windows
                     of all variants alternate (after one untimed round), so a drift of the
                     GPU's clock hits them alike; a window under 90% of its variant's median
                     is timed again

Rows go to --csv as they are measured (a run cut short keeps what it measured):
    measure,variant,implementation,image_size,batch,value,unit,low,high,windows,note
value is the median of the windows, low and high their extremes.

    python3 scripts/torch_op_bench.py --csv docs/results/h100/torch_op.csv
"""
import argparse
import csv
import statistics
import sys
import time

import measuring

FIELDS = ["measure", "variant", "implementation", "image_size", "batch", "value", "unit", "low",
          "high", "windows", "note"]


class Rows:
    def __init__(self, path):
        self.file = open(path, "w", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=FIELDS)
        self.writer.writeheader()
        self.file.flush()

    def add(self, **row):
        row = {field: row.get(field, "") for field in FIELDS}
        for field in ("value", "low", "high"):
            if isinstance(row[field], float):
                row[field] = f"{row[field]:.4g}"
        self.writer.writerow(row)
        self.file.flush()
        print(", ".join(f"{k}={v}" for k, v in row.items() if v != ""), flush=True)


def spread(values):
    return statistics.median(values), min(values), max(values)


def host_time(torch, rows, args):
    import torch.nn.functional as F

    import attention_steps
    from attention_steps import torch_op

    op = torch_op.load()
    shape = (1, 1, 64, 64)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.half) for _ in range(3))
    packed = torch.randn(1, 64, 3, 1, 64, device="cuda", dtype=torch.half).permute(2, 0, 3, 1, 4)
    q_view, k_view, v_view = packed.unbind(0)  # sliced once: the loop times the call alone
    calls = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "attention(v6)": lambda: attention_steps.attention(q, k, v, step="v6"),
        f"attention({args.step})": lambda: attention_steps.attention(q, k, v, step=args.step),
        f"attention({args.step}, packed views)":
            lambda: attention_steps.attention(q_view, k_view, v_view, step=args.step),
        f"torch.ops bare ({args.step})": lambda: op(q, k, v, args.step),
    }
    windows = {name: [] for name in calls}
    with torch.inference_mode():
        for call in calls.values():
            for _ in range(200):
                call()
        torch.cuda.synchronize()
        for _ in range(args.windows):  # the variants alternate window by window
            for name, call in calls.items():
                start = time.perf_counter()
                for _ in range(args.calls):
                    call()
                elapsed = time.perf_counter() - start
                torch.cuda.synchronize()
                windows[name].append(elapsed / args.calls * 1e6)
    for name, values in windows.items():
        median, low, high = spread(values)
        rows.add(measure="host_us_per_call", variant="inference_mode", implementation=name,
                 batch=1, value=median, unit="us", low=low, high=high, windows=len(values),
                 note=f"shape {list(shape)}, {args.calls} calls per window, wall time of the "
                      "loop without its sync")


def graph_replay(torch, rows, args):
    import torch.nn.functional as F

    import attention_steps

    qkv = torch.randn(32, 197, 3, 12, 64, device="cuda", dtype=torch.half).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        attention_steps.attention(q, k, v, step=args.step)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention_steps.attention(q, k, v, step=args.step)
    errors = []
    for seed in range(3):
        torch.manual_seed(100 + seed)
        qkv.copy_(torch.randn_like(qkv))
        graph.replay()
        reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        errors.append((out.float() - reference).abs().max().item())
    replay_ms = measuring.window_ms(torch, graph.replay, 100)
    rows.add(measure="graph_replay", variant="captured", implementation=args.step, batch=32,
             value=max(errors), unit="max abs error vs fp32 SDPA", windows=len(errors),
             note="[32, 12, 197, 64] packed views; 3 replays on new inputs")
    rows.add(measure="graph_replay", variant="captured", implementation=args.step, batch=32,
             value=replay_ms * 1000, unit="us per replay", windows=1,
             note="100 replays")


def graph_breaks(torch, torchvision, rows, args):
    import attention_steps

    model = torchvision.models.vit_b_16().cuda().half().eval()
    attention_steps.swap_attention(model, step=args.step)
    images = torch.randn(2, 3, 224, 224, device="cuda", dtype=torch.half)
    torch._dynamo.reset()
    with torch.inference_mode():
        explained = torch._dynamo.explain(model)(images)
    rows.add(measure="graph_breaks", variant="torch._dynamo.explain", implementation=args.step,
             image_size=224, batch=2, value=float(explained.graph_break_count), unit="breaks",
             note=f"{explained.graph_count} graph(s); "
                  + "; ".join(str(r.reason) for r in explained.break_reasons)[:200])
    torch._dynamo.reset()


def images_per_s(torch, torchvision, rows, args, deadline):
    import attention_steps

    for size in args.sizes:
        if time.monotonic() > deadline:
            print(f"out of time before image size {size}", flush=True)
            return
        torch.manual_seed(0)
        stock = torchvision.models.vit_b_16(image_size=size)
        torch.nn.init.normal_(stock.heads.head.weight, std=0.02)  # zero by default: logits 0
        stock = stock.cuda().half().eval()
        swapped = torchvision.models.vit_b_16(image_size=size).cuda().half().eval()
        swapped.load_state_dict(stock.state_dict())
        attention_steps.swap_attention(swapped, step=args.step)
        images = torch.randn(args.batch, 3, size, size, device="cuda", dtype=torch.half)
        variants = {}
        for model, name in ((stock, "stock"), (swapped, args.step)):
            variants[("eager", name)] = model
            for mode in args.modes:
                variants[(f"compile {mode}", name)] = torch.compile(model, mode=mode)
        with torch.inference_mode():
            reference = stock(images).float()
            for key, forward in variants.items():
                started = time.monotonic()
                for _ in range(3):  # compiles, captures, warms
                    logits = forward(images)
                torch.cuda.synchronize()
                error = ((logits.float() - reference).norm() / reference.norm()).item()
                print(f"{size} px {key}: ready in {time.monotonic() - started:.0f} s, "
                      f"relative difference from stock eager {error:.2e}", flush=True)
            per_window = {key: [] for key in variants}
            def timed(forward):
                return args.batch / measuring.window_ms(torch, lambda: forward(images),
                                                        args.forwards) * 1e3

            for window in range(args.windows + 1):  # the first round of the alternation warms
                for key, forward in variants.items():
                    rate = timed(forward)
                    if window > 0:
                        per_window[key].append(rate)
            # A window under 90% of its variant's median is an odd one (the machine did something
            # else): it is timed once more, and the row says how many were.
            retimed = {}
            for key, values in per_window.items():
                median = statistics.median(values)
                odd = [i for i, rate in enumerate(values) if rate < 0.9 * median]
                for i in odd:
                    values[i] = timed(variants[key])
                retimed[key] = len(odd)
        for (variant, name), values in per_window.items():
            median, low, high = spread(values)
            rows.add(measure="images_per_s", variant=variant, implementation=name,
                     image_size=size, batch=args.batch, value=median, unit="images/s", low=low,
                     high=high, windows=len(values),
                     note=f"vit_b_16 fp16 inference; {args.forwards} forwards per window; "
                          f"{retimed[(variant, name)]} odd window(s) retimed")
        del variants, stock, swapped
        torch._dynamo.reset()
        torch.cuda.empty_cache()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", required=True)
    parser.add_argument("--step", default="v8", help="the step swapped in (default v8)")
    parser.add_argument("--sizes", default="224,384,512",
                        type=lambda text: [int(s) for s in text.split(",") if s])
    parser.add_argument("--modes", default="default,reduce-overhead",
                        type=lambda text: [s for s in text.split(",") if s])
    parser.add_argument("--parts", default="host,graph,breaks,images",
                        type=lambda text: set(text.split(",")))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--windows", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000, help="calls per host-time window")
    parser.add_argument("--forwards", type=int, default=20, help="forwards per images/s window")
    parser.add_argument("--budget-s", type=float, default=1e9,
                        help="start no new image size after this many seconds")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.budget_s

    import torch
    import torchvision
    if not torch.cuda.is_available():
        print("torch sees no CUDA device: nothing measured", file=sys.stderr)
        return 77
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"torchvision {torchvision.__version__}", flush=True)
    rows = Rows(args.csv)
    if "host" in args.parts:
        host_time(torch, rows, args)
    if "graph" in args.parts:
        graph_replay(torch, rows, args)
    if "breaks" in args.parts:
        graph_breaks(torch, torchvision, rows, args)
    if "images" in args.parts:
        images_per_s(torch, torchvision, rows, args, deadline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
