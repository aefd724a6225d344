#!/usr/bin/env python3
"""Training with the steps, for real, on a GPU.

digits  A small ViT (torchvision's VisionTransformer: 32 x 32 images in 2 x 2 patches, so
        N = 257 tokens, 4 layers, 4 heads of D = 64) learns scikit-learn's handwritten digits
        (shipped in the package: python/attention_steps/data/digits.npz), upsampled from 8 x 8.
        Three runs of the same recipe (2000 steps of batch 64, each image shifted by up to 3
        pixels, AdamW at 7e-4 with 100 warm-up steps and a cosine decay, gradients clipped at
        norm 1, fp16 autocast with a gradient scaler):
          stock  seed 0     PyTorch's attention
          stock  seed 1     the same with another seed: another initialisation, another data order
          steps  seed 0     the steps in every block (swap_attention: the forward step, then the
                            backward step autograd picks: v10 on an H100, v9 elsewhere), the
                            initialisation and data order of stock seed 0
        The steps' curve must track stock seed 0's: the running mean (20 steps) of their losses'
        difference must stay below the largest running mean of the two stock seeds' difference,
        the variation the recipe itself has. Test accuracy of each run on the held-out 20%.
vit     One training step of torchvision's vit_b_16 (--models: others) (forward, backward,
        AdamW) in fp16 autocast with a gradient scaler (bf16 autocast without one with
        --dtype bf16), batch 32, at each image size: images/s (CUDA events, median of
        windows) and peak memory, stock and with the steps.

    python3 scripts/train_digits.py --out-dir OUT [--parts digits,vit] [--steps 2000]
--dtype bf16 trains in bf16 autocast instead (no gradient scaler: bf16 has fp32's range),
writing OUT/training_digits_bf16.csv and .txt, and OUT/training_<models>_bf16.csv.

Writes OUT/training_digits.csv (the three loss curves), OUT/training_digits.txt (the verdict,
the accuracies) and OUT/training_vit_b_16.csv.
"""
import argparse
import csv
import os
import statistics
import sys
import time

import measuring

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python",
                    "attention_steps", "data", "digits.npz")
WINDOW = 20  # steps of the running mean the curves are compared by



def backward_step():
    """The backward step autograd runs on this GPU (the operator's choice, csrc/operator.cpp)."""
    import torch
    return "v10" if torch.cuda.get_device_capability() == (9, 0) else "v9"

def digits(torch, device):
    """(train images, train labels, test images, test labels): [N, 3, 32, 32] floats, a fixed
    80/20 split of the 1,797 digits."""
    import numpy as np
    import torch.nn.functional as F
    path = DATA
    if not os.path.isfile(path):  # installed with pip: the copy beside the package
        import attention_steps
        path = os.path.join(os.path.dirname(attention_steps.__file__), "data", "digits.npz")
    data = np.load(path)
    images = torch.tensor(data["images"], dtype=torch.float32) / 16.0
    labels = torch.tensor(data["labels"], dtype=torch.long)
    images = F.interpolate(images[:, None], size=32, mode="bilinear", align_corners=False)
    images = ((images - 0.3) / 0.35).expand(-1, 3, -1, -1).contiguous()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(1234))
    split = int(0.8 * len(labels))
    train, test = order[:split], order[split:]
    return (images[train].to(device), labels[train].to(device), images[test].to(device),
            labels[test].to(device))


def small_vit(torchvision):
    return torchvision.models.VisionTransformer(image_size=32, patch_size=2, num_layers=4,
                                                num_heads=4, hidden_dim=256, mlp_dim=512,
                                                num_classes=10)


def shifted(torch, images, shift, generator):
    """Each image moved by its own whole-pixel offset, up to `shift` pixels each way, the border
    filled with the background (the augmentation; offsets from the run's own generator)."""
    import torch.nn.functional as F
    count, size = images.shape[0], images.shape[-1]
    background = float(images[0, 0, 0, 0])  # every digit's corner is blank
    padded = F.pad(images, (shift,) * 4, value=background)
    offsets = torch.randint(0, 2 * shift + 1, (2, count), generator=generator).to(images.device)
    span = torch.arange(size, device=images.device)
    rows = (offsets[0][:, None] + span)[:, None, :, None]
    columns = (offsets[1][:, None] + span)[:, None, None, :]
    return padded[torch.arange(count, device=images.device)[:, None, None, None],
                  torch.arange(images.shape[1], device=images.device)[None, :, None, None],
                  rows, columns]


def train_run(torch, torchvision, data, seed, steps, use_steps, lr, warmup, shift, batch=64,
              dtype="fp16"):
    import math

    import attention_steps
    train_x, train_y, test_x, test_y = data
    torch.manual_seed(seed)
    model = small_vit(torchvision).cuda()
    if use_steps:
        attention_steps.swap_attention(model, step=use_steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    # Linear warm-up, then a cosine down to a tenth of the rate at the last step.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    autocast_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == "fp16")  # bf16 needs no loss scaling
    order = torch.Generator(device="cpu").manual_seed(seed)
    losses = []
    permutation, position = torch.randperm(len(train_y), generator=order), 0
    model.train()
    for _ in range(steps):
        if position + batch > len(train_y):
            permutation, position = torch.randperm(len(train_y), generator=order), 0
        index = permutation[position:position + batch].to(train_x.device)
        position += batch
        images = shifted(torch, train_x[index], shift, order) if shift else train_x[index]
        with torch.autocast("cuda", dtype=autocast_dtype):
            loss = torch.nn.functional.cross_entropy(model(images), train_y[index])
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    with torch.inference_mode(), torch.autocast("cuda", dtype=autocast_dtype):
        predicted = model(test_x).argmax(dim=1)
    return losses, (predicted == test_y).float().mean().item()


def running_mean(values):
    return [statistics.fmean(values[max(0, i - WINDOW + 1):i + 1]) for i in range(len(values))]


def digits_part(torch, torchvision, args, step):
    data = digits(torch, "cuda")
    runs = {}
    for name, seed, steps_id in (("stock_seed0", 0, None), ("stock_seed1", 1, None),
                                 (f"steps_seed0", 0, step)):
        started = time.time()
        runs[name] = train_run(torch, torchvision, data, seed, args.steps, steps_id, args.lr,
                               args.warmup, args.shift, dtype=args.dtype)
        print(f"digits {name}: final loss {runs[name][0][-1]:.4f}, test accuracy "
              f"{runs[name][1]:.4f} ({time.time() - started:.0f} s)", flush=True)
    stock0, stock1, swapped = (runs[k][0] for k in ("stock_seed0", "stock_seed1", "steps_seed0"))
    seed_gap = running_mean([abs(a - b) for a, b in zip(stock0, stock1)])
    steps_gap = running_mean([abs(a - b) for a, b in zip(stock0, swapped)])
    bound = max(seed_gap[WINDOW - 1:])
    tracked = max(steps_gap[WINDOW - 1:])
    suffix = "_bf16" if args.dtype == "bf16" else ""
    with open(os.path.join(args.out_dir, f"training_digits{suffix}.csv"), "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["step", "loss_stock_seed0", "loss_stock_seed1", "loss_steps_seed0"])
        for i, values in enumerate(zip(stock0, stock1, swapped)):
            writer.writerow([i + 1] + [f"{v:.5f}" for v in values])
    verdict = "tracks" if tracked <= bound else "DOES NOT TRACK"
    lines = [
        f"steps: {step} forward, {backward_step()} backward; {args.steps} training steps, batch 64, AdamW at "
        f"peak rate {args.lr} ({args.warmup} warm-up steps, cosine decay), images shifted by up "
        f"to {args.shift} pixels, " + ("bf16 autocast" if args.dtype == "bf16" else
                                         "fp16 autocast with a gradient scaler"),
        f"largest running mean ({WINDOW} steps) of |loss stock seed 0 - loss stock seed 1|: "
        f"{bound:.4f} (the bound)",
        f"largest running mean ({WINDOW} steps) of |loss stock seed 0 - loss steps seed 0|: "
        f"{tracked:.4f}: the steps' curve {verdict} stock's",
        f"test accuracy: stock seed 0 {runs['stock_seed0'][1]:.4f}, stock seed 1 "
        f"{runs['stock_seed1'][1]:.4f}, steps seed 0 {runs['steps_seed0'][1]:.4f} "
        f"({len(data[3])} test images)",
    ]
    with open(os.path.join(args.out_dir, f"training_digits{suffix}.txt"), "w") as out:
        out.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return tracked <= bound


def vit_part(torch, torchvision, args, step):
    import attention_steps
    autocast_dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    rows = []
    for model_name, size in ((m, s) for m in args.models for s in args.sizes):
        for name in ("stock", step):
            torch.manual_seed(0)
            model = getattr(torchvision.models, model_name)(image_size=size).cuda()
            if name != "stock":
                attention_steps.swap_attention(model, step=name)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            scaler = torch.amp.GradScaler("cuda", enabled=args.dtype == "fp16")
            images = torch.randn(args.batch, 3, size, size, device="cuda")
            labels = torch.randint(0, 1000, (args.batch,), device="cuda")

            def train_step():
                with torch.autocast("cuda", dtype=autocast_dtype):
                    loss = torch.nn.functional.cross_entropy(model(images), labels)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()

            model.train()
            for _ in range(3):
                train_step()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            rates = [args.batch / measuring.window_ms(torch, train_step, 5) * 1000
                     for _ in range(args.windows)]
            row = {"model": model_name, "image_size": size, "batch": args.batch,
                   "implementation": name, "images_per_s": f"{statistics.median(rates):.1f}",
                   "low": f"{min(rates):.1f}", "high": f"{max(rates):.1f}",
                   "windows": len(rates),
                   "peak_memory_gib": f"{torch.cuda.max_memory_allocated() / 2**30:.2f}"}
            if args.dtype == "bf16":
                row["dtype"] = "bf16"
            rows.append(row)
            print(", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
            del model, optimizer
            torch.cuda.empty_cache()
    # The default run keeps its file name (gpu-check's training stage); others name what they ran.
    file_name = ("training_vit_b_16.csv" if args.models == ["vit_b_16"] and args.dtype == "fp16"
                 else f"training_{'_'.join(args.models)}_{args.dtype}.csv")
    with open(os.path.join(args.out_dir, file_name), "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--parts", default="digits,vit", type=lambda t: set(t.split(",")))
    # The recipe: chosen by --sweep runs of stock seed 0 on the H100 (chapter 16).
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=7e-4, help="peak learning rate (AdamW)")
    parser.add_argument("--warmup", type=int, default=100, help="steps of linear warm-up")
    parser.add_argument("--shift", type=int, default=3,
                        help="augmentation: each training image moved by up to this many pixels")
    parser.add_argument("--sweep", default="", help="lr:warmup,...: stock seed 0 alone at each "
                        "(choosing the recipe), printed, nothing written")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16",
                        help="the autocast type of both parts (bf16: no gradient scaler)")
    parser.add_argument("--models", default="vit_b_16", type=lambda t: t.split(","),
                        help="torchvision ViTs of the vit part, e.g. vit_b_16,vit_l_16")
    parser.add_argument("--sizes", default="224,384", type=lambda t: [int(s) for s in t.split(",")])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--windows", type=int, default=5)
    args = parser.parse_args(argv)
    import torch
    import torchvision
    if not torch.cuda.is_available():
        print("torch sees no CUDA device: nothing trained", file=sys.stderr)
        return 77
    from attention_steps import choice
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    step = choice.serving(torch.cuda.current_device(), dtype, 64)[0]  # the forward use_steps runs
    os.makedirs(args.out_dir, exist_ok=True)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; forward step {step}",
          flush=True)
    if args.sweep:
        data = digits(torch, "cuda")
        for pair in args.sweep.split(","):
            lr, warmup = pair.split(":")
            losses, accuracy = train_run(torch, torchvision, data, 0, args.steps, None,
                                         float(lr), int(warmup), args.shift)
            print(f"sweep {args.steps} steps, shift {args.shift}, lr {lr} warmup {warmup}: final loss {losses[-1]:.4f}, mean of the "
                  f"last 20 {statistics.fmean(losses[-20:]):.4f}, test accuracy {accuracy:.4f}",
                  flush=True)
        return 0
    ok = True
    if "digits" in args.parts:
        ok = digits_part(torch, torchvision, args, step)
    if "vit" in args.parts:
        vit_part(torch, torchvision, args, step)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
