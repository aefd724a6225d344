#!/usr/bin/env python3
"""Data-parallel training of torchvision ViTs with the steps' attention, beside stock, on several
GPUs (#32): torch.nn.parallel.DistributedDataParallel or FSDP2 (torch.distributed.fsdp.
fully_shard, one unit per encoder block and one for the rest), bf16 autocast, AdamW, a batch of
seeded random images and labels per GPU (each GPU its own).

  --mode speed   two models built from one seed, stock and with the steps (swap_attention: the
                 library's choice per call, step 8 forward and step 10 backward on an H100), each
                 wrapped alike; --warmup steps of each, then --repeats rounds of --steps timed
                 steps of each, the two interleaved step by step (CUDA events around each step,
                 the steps queued back to back: measuring.each_call_ms; each GPU's median, the
                 slowest GPU's taken). One row per model, round and attention: images/s per GPU
                 and the steps' ratio to stock in the same round.
  --mode losses  --loss-steps steps four times from one seed on the same batches: stock, stock
                 again (the run-to-run difference of stock itself), stock with SDPA held to
                 FlashAttention-2 (the difference another attention kernel makes) and the
                 steps; one row per step with the four losses (rank 0's, which DDP and FSDP2
                 make every GPU's).
  --mode profile after --warmup steps, --steps steps of each model under torch.profiler; rank 0
                 writes each one's operator table (by self CUDA time, and by self CPU time) to
                 --csv's name with .stock.txt / .steps.txt appended, and one row per model and
                 attention to --csv: the profiled steps' wall time, the GPU's busy time (the
                 sum of kernel times) and the time the GPU spent waiting.

    torchrun --nproc-per-node 2 scripts/train_distributed.py --parallel ddp --models vit_b_16 \\
        --csv ddp.csv
    torchrun --nproc-per-node 4 scripts/train_distributed.py --parallel fsdp2 --mode losses \\
        --models vit_h_14 --batch 8 --csv fsdp2_losses.csv

Needs torch, torchvision, the operator (pip install --no-build-isolation ./python) and NCCL.
Chapter 19 has its results on 2 and 4 H200s. Exit status: 0 done, 3 no CUDA device or operator.
"""
import argparse
import contextlib
import csv
import functools
import statistics
import sys
import time

import measuring

MODELS = ("vit_b_16", "vit_h_14")
FIELDS = ["model", "parallel", "gpus", "gpu_name", "batch_per_gpu", "round", "attention",
          "step_ms", "images_per_s_per_gpu", "vs_stock"]
LOSS_FIELDS = ["model", "parallel", "gpus", "step", "stock", "stock_again", "stock_flash",
               "steps"]
PROFILE_FIELDS = ["model", "parallel", "gpus", "attention", "steps", "wall_ms_per_step",
                  "kernel_ms_per_step", "gpu_idle_fraction", "nccl_ms_per_step",
                  "attention_ms_per_step"]


def parse_arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parallel", choices=("ddp", "fsdp2"), required=True)
    parser.add_argument("--mode", choices=("speed", "losses", "profile"), default="speed")
    parser.add_argument("--models", default="vit_b_16", type=lambda text: text.split(","))
    parser.add_argument("--batch", type=int, default=32, help="images per GPU per step")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=20,
                        help="timed steps of each model per round (speed), profiled steps (profile)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps before them")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, stock and steps in each")
    parser.add_argument("--loss-steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", required=True, help="written by rank 0")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        parser.error(f"--models: {', '.join(unknown)} not among {', '.join(MODELS)}")
    return args


def build(torch, torchvision, name, image_size, seed, with_steps, parallel, device):
    """The model from `seed` (the same weights every time), its attention swapped for the steps'
    before it is wrapped (FSDP2 replaces the parameters of the modules it shards: a swap after
    it would keep the sharded ones), then wrapped."""
    import attention_steps
    torch.manual_seed(seed)
    model = getattr(torchvision.models, name)(image_size=image_size).to(device)
    if with_steps:
        attention_steps.swap_attention(model)  # the library's choice per call, backward included
    if parallel == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    from torch.distributed.fsdp import fully_shard
    for block in model.encoder.layers:
        fully_shard(block)
    fully_shard(model)
    return model


def batches(torch, args, rank, device, count):
    """`count` batches of random images and labels, seeded per GPU: the same in every run."""
    generator = torch.Generator(device=device).manual_seed(args.seed * 1000 + rank)
    return [(torch.randn((args.batch, 3, args.image_size, args.image_size), device=device,
                         generator=generator),
             torch.randint(0, 1000, (args.batch,), device=device, generator=generator))
            for _ in range(count)]


def train_step(torch, model, optimizer, images, labels):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def step_times_ms(torch, model, optimizer, data, warmup, steps):
    for images, labels in data[:warmup]:
        train_step(torch, model, optimizer, images, labels)
    return measuring.each_call_ms(torch, [functools.partial(train_step, torch, model, optimizer, *batch)
                                          for batch in data[warmup:warmup + steps]])


def slowest_median(torch, dist, times, device):
    """The largest of the GPUs' median step times: a data-parallel step ends with the slowest."""
    median = torch.tensor([statistics.median(times)], device=device)
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    return median.item()


def speed(torch, torchvision, dist, args, rank, world, device, writer):
    gpu_name = torch.cuda.get_device_name(device)
    data = batches(torch, args, rank, device, 4)
    for name in args.models:
        models = {attention: build(torch, torchvision, name, args.image_size, args.seed,
                                   attention == "steps", args.parallel, device)
                  for attention in ("stock", "steps")}
        optimizers = {attention: torch.optim.AdamW(model.parameters(), lr=args.lr)
                      for attention, model in models.items()}

        def step(attention, index):
            return functools.partial(train_step, torch, models[attention], optimizers[attention],
                                     *data[index % len(data)])

        for attention in ("stock", "steps"):
            for index in range(args.warmup):
                step(attention, index)()
        for round_number in range(1, args.repeats + 1):
            # The two interleaved step by step (stock, steps, steps, stock, ...), so a drift of
            # the machine over the round (clocks, a neighbour's traffic) falls on both alike.
            first = ("stock", "steps") if round_number % 2 else ("steps", "stock")
            order = [attention for index in range(args.steps)
                     for attention in (first if index % 2 == 0 else first[::-1])]
            times = measuring.each_call_ms(torch, [step(attention, index // 2)
                                                   for index, attention in enumerate(order)])
            step_ms = {attention: slowest_median(torch, dist, [t for t, a in zip(times, order)
                                                               if a == attention], device)
                       for attention in ("stock", "steps")}
            for attention in ("stock", "steps"):
                row = {"model": name, "parallel": args.parallel, "gpus": world, "gpu_name": gpu_name,
                       "batch_per_gpu": args.batch, "round": round_number, "attention": attention,
                       "step_ms": f"{step_ms[attention]:.2f}",
                       "images_per_s_per_gpu": f"{args.batch / step_ms[attention] * 1e3:.1f}",
                       "vs_stock": f"{step_ms['stock'] / step_ms[attention]:.3f}"}
                if writer:
                    writer.writerow(row)
                    print(", ".join(f"{key}={value}" for key, value in row.items()), flush=True)
        models.clear()  # before the next model is built
        optimizers.clear()
        torch.cuda.empty_cache()


def losses(torch, torchvision, dist, args, rank, world, device, writer):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    data = batches(torch, args, rank, device, 16)
    # stock_flash: stock with SDPA held to FlashAttention-2 instead of the kernel PyTorch picks
    # (cuDNN on an H100): how far changing nothing but the attention kernel moves the losses,
    # the band that matters where stock itself repeats bit for bit.
    for name in args.models:
        runs = {}
        for run, with_steps, kernel in (("stock", False, None), ("stock_again", False, None),
                                        ("stock_flash", False, SDPBackend.FLASH_ATTENTION),
                                        ("steps", True, None)):
            model = build(torch, torchvision, name, args.image_size, args.seed, with_steps,
                          args.parallel, device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
            with sdpa_kernel(kernel) if kernel else contextlib.nullcontext():
                runs[run] = [train_step(torch, model, optimizer, *data[step % len(data)]).item()
                             for step in range(args.loss_steps)]
            del model, optimizer
            torch.cuda.empty_cache()
        for step in range(args.loss_steps):
            if writer:
                writer.writerow({"model": name, "parallel": args.parallel, "gpus": world,
                                 "step": step, **{run: f"{values[step]:.6f}" for run, values in runs.items()}})
        if writer:
            def distance(run):
                return max(abs(a - b) for a, b in zip(runs["stock"], runs[run]))
            print(f"{name}, {args.parallel}, {world} GPUs: largest loss distance to stock over "
                  f"{args.loss_steps} steps: stock again {distance('stock_again'):.3g}, stock with "
                  f"FlashAttention-2 {distance('stock_flash'):.3g}, the steps "
                  f"{distance('steps'):.3g}", flush=True)


def profile(torch, torchvision, dist, args, rank, world, device, writer):
    """Where a step's time goes, stock against the steps: kernel time by operator, and how much
    of the step the GPU waits (for the host, or for communication it cannot overlap)."""
    from torch.profiler import ProfilerActivity, profile as profiler
    data = batches(torch, args, rank, device, 4)
    data = [data[i % len(data)] for i in range(args.warmup + args.steps)]
    for name in args.models:
        for attention in ("stock", "steps"):
            model = build(torch, torchvision, name, args.image_size, args.seed,
                          attention == "steps", args.parallel, device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
            for images, labels in data[:args.warmup]:
                train_step(torch, model, optimizer, images, labels)
            torch.cuda.synchronize()
            with profiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                start = time.perf_counter()
                for images, labels in data[args.warmup:args.warmup + args.steps]:
                    train_step(torch, model, optimizer, images, labels)
                torch.cuda.synchronize()
                wall_ms = (time.perf_counter() - start) * 1e3 / args.steps
            events = prof.key_averages()
            kernels = [e for e in events if e.device_type.name == "CUDA"]
            kernel_us = sum(e.self_device_time_total for e in kernels)
            nccl_us = sum(e.self_device_time_total for e in kernels if "nccl" in e.key.lower())
            attention_us = sum(e.self_device_time_total for e in kernels
                               if measuring.category_of(e.key) == "attention")
            if writer:
                with open(f"{args.csv}.{attention}.txt", "w") as table:
                    table.write(events.table(sort_by="self_cuda_time_total", row_limit=40))
                    table.write("\n\n")
                    table.write(events.table(sort_by="self_cpu_time_total", row_limit=40))
                kernel_ms = kernel_us / 1e3 / args.steps
                row = {"model": name, "parallel": args.parallel, "gpus": world,
                       "attention": attention, "steps": args.steps,
                       "wall_ms_per_step": f"{wall_ms:.2f}", "kernel_ms_per_step": f"{kernel_ms:.2f}",
                       "gpu_idle_fraction": f"{max(0.0, 1 - kernel_ms / wall_ms):.3f}",
                       "nccl_ms_per_step": f"{nccl_us / 1e3 / args.steps:.2f}",
                       "attention_ms_per_step": f"{attention_us / 1e3 / args.steps:.2f}"}
                writer.writerow(row)
                print(", ".join(f"{key}={value}" for key, value in row.items()), flush=True)
            del model, optimizer
            torch.cuda.empty_cache()


def main(argv=None):
    args = parse_arguments(argv)
    import torch
    import torch.distributed as dist
    import torchvision

    from attention_steps import torch_op
    why_not = measuring.cannot_run(torch, torch_op, "trained")
    if why_not:
        print(why_not, file=sys.stderr)
        return 3
    dist.init_process_group("nccl")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    out = open(args.csv, "w", newline="") if rank == 0 else None
    fields = {"speed": FIELDS, "losses": LOSS_FIELDS, "profile": PROFILE_FIELDS}[args.mode]
    writer = csv.DictWriter(out, fieldnames=fields) if out else None
    if writer:
        writer.writeheader()
    try:
        run = {"speed": speed, "losses": losses, "profile": profile}[args.mode]
        run(torch, torchvision, dist, args, rank, world, device, writer)
    finally:
        if out:
            out.close()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
