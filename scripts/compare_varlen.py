#!/usr/bin/env python3
"""Images of several sizes in one batch: packed sequences against the same images padded.

For each mix of ViT images (their token counts: (side / patch)^2 + 1) and head dim, in one
process on one GPU, the forward attention of:

  - packed:        attention_steps.varlen_attention on the tokens packed [total, H, D]
                   (the step that takes packed sequences: v8 on an H100);
  - steps padded:  the images padded to the longest, [B, H, N_max, D], with a key-padding mask,
                   through the steps (attention_steps.attention, the library's choice);
  - SDPA padded:   the same padded batch through F.scaled_dot_product_attention with the mask as a
                   boolean attn_mask (PyTorch picks its backend; cuDNN and FlashAttention take no
                   arbitrary mask, so this is what a PyTorch user pays today);

timed two ways: each call after an L2 flush (measuring.flushed_call_ms, as do_bench) and windows
of back-to-back calls (measuring.rotated_windows), medians reported. TFLOP/s count the real tokens'
pairs only (4 H D sum n_i^2 forward, 2.5 times that backward), for every column, so they compare
the time to the same answer. The padding fraction is the share of the padded batch's pairs that
are padding; the target: packed saves at least that fraction, less 10 points, of the padded time.

--backward times the backward alone instead, on O, L and a dO made once: packed by the operator's
varlen_attention_backward (v10 on an H100), steps padded by attention_backward with the mask (the
library's backward choice), SDPA padded by torch.autograd.grad through its forward's graph
(retained), as training runs it.

    python3 scripts/compare_varlen.py --out varlen.csv [--dtype bf16] [--calls 30] [--backward]
"""
import argparse
import random
import sys

import measuring

# The mixes: name -> image sides at patch 16 (224 -> 197 tokens, 384 -> 577, 512 -> 1025,
# 768 -> 2305, 1024 -> 4097), and a seeded draw of 32 images from 224 to 1024 px.
MIXES = {
    "vit-sizes": [224] * 8 + [384] * 8 + [512] * 4 + [768] * 2 + [1024],
    "two-sizes": [224] * 16 + [384] * 16,
}
SHAPES = ((12, 64), (16, 80), (16, 128))  # (heads, head dim): ViT-B, ViT-H/14, D = 128
COLUMNS = ["gpu", "mix", "images", "heads", "head_dim", "dtype", "direction", "total_tokens", "longest",
           "padding_fraction", "method", "flushed_us", "window_us", "tflops_flushed",
           "tflops_window", "saved_vs_steps_padded", "saved_vs_sdpa_padded"]


def seeded_sides(count=32, seed=2026):
    draw = random.Random(seed)
    return [16 * draw.randint(14, 64) for _ in range(count)]


def tokens_of(side, patch=16):
    return (side // patch) ** 2 + 1


def backward_calls(torch, F, steps, q, k, v, sums, longest, padded, mask, sdpa_mask, masked_step,
                   head_dim, dtype):
    """The three backwards, each on its own forward's O and L (made once) and one dO."""
    from attention_steps import varlen
    ops = torch.ops.attention_steps
    o, lse = steps.varlen_attention(q, k, v, sums, sums, longest, longest, check_lengths=False)
    d_o = torch.randn_like(o)
    packed_backward = varlen.packed_step(head_dim, backward=True)
    o_padded, lse_padded = ops.attention(*padded, masked_step, None, mask, True)
    d_o_padded = torch.randn_like(o_padded)
    padded_backward = steps.choose_step(tuple(padded[0].shape), dtype=dtype,
                                        key_padding_mask=True, backward=True)
    leaves = [t.detach().requires_grad_() for t in padded]
    sdpa_o = F.scaled_dot_product_attention(*leaves, attn_mask=sdpa_mask)
    return {
        "packed": lambda: ops.varlen_attention_backward(d_o, q, k, v, o, lse, sums, sums, longest,
                                                        longest, packed_backward),
        "steps padded": lambda: ops.attention_backward(d_o_padded, *padded, o_padded, lse_padded,
                                                       padded_backward, key_padding_mask=mask),
        "SDPA padded": lambda: torch.autograd.grad(sdpa_o, leaves, d_o_padded, retain_graph=True),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--backward", action="store_true", help="time the backward alone")
    args = parser.parse_args(argv)
    import torch
    import torch.nn.functional as F

    import attention_steps as steps
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    gpu = torch.cuda.get_device_name()
    mixes = dict(MIXES, seeded=seeded_sides())
    flush = torch.empty(measuring.FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    rows = []
    for mix, sides in mixes.items():
        lengths = [tokens_of(side) for side in sides]
        longest, total = max(lengths), sum(lengths)
        real_pairs = sum(n * n for n in lengths)
        padding_fraction = 1.0 - real_pairs / (len(lengths) * longest * longest)
        sums = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))],
                            dtype=torch.int32, device="cuda")
        for heads, head_dim in SHAPES:
            torch.manual_seed(0)
            q, k, v = (torch.randn(total, heads, head_dim, device="cuda", dtype=dtype) for _ in range(3))
            padded = []
            for packed_tensor in (q, k, v):  # [B, H, N_max, D], zeros past each image
                batch = torch.zeros(len(lengths), longest, heads, head_dim, device="cuda", dtype=dtype)
                for i, (start, n) in enumerate(zip(sums.tolist(), lengths)):
                    batch[i, :n] = packed_tensor[start:start + n]
                padded.append(batch.transpose(1, 2))
            mask = torch.arange(longest, device="cuda")[None, :] >= torch.tensor(lengths, device="cuda")[:, None]
            sdpa_mask = ~mask[:, None, None, :]  # True: attend
            masked_step = steps.choose_step((len(lengths), heads, longest, head_dim), dtype=args.dtype,
                                            key_padding_mask=True)
            if args.backward:
                calls = backward_calls(torch, F, steps, q, k, v, sums, longest, padded, mask,
                                       sdpa_mask, masked_step, head_dim, args.dtype)
            else:
                calls = {
                    "packed": lambda: steps.varlen_attention(q, k, v, sums, sums, longest, longest,
                                                             check_lengths=False),
                    "steps padded": lambda: steps.attention(*padded, step=masked_step, key_padding_mask=mask),
                    "SDPA padded": lambda: F.scaled_dot_product_attention(*padded, attn_mask=sdpa_mask),
                }
            measuring.warm_up(torch, list(calls.values()), seconds=1.0)
            flushed = {name: sorted(measuring.flushed_call_ms(torch, run, args.calls, flush))
                       for name, run in calls.items()}
            windows = measuring.rotated_windows(torch, calls, windows=5, calls_per_window=args.calls)
            flops = 4.0 * heads * head_dim * real_pairs * (2.5 if args.backward else 1.0)
            medians = {name: (1000 * flushed[name][len(flushed[name]) // 2],
                              sorted(windows[name])[len(windows[name]) // 2]) for name in calls}
            for name, (flushed_us, window_us) in medians.items():
                rows.append({
                    "gpu": gpu, "mix": mix, "images": len(lengths), "heads": heads,
                    "head_dim": head_dim, "dtype": args.dtype,
                    "direction": "backward" if args.backward else "forward", "total_tokens": total,
                    "longest": longest, "padding_fraction": f"{padding_fraction:.4f}", "method": name,
                    "flushed_us": f"{flushed_us:.1f}", "window_us": f"{window_us:.1f}",
                    "tflops_flushed": f"{flops / flushed_us / 1e6:.1f}",
                    "tflops_window": f"{flops / window_us / 1e6:.1f}",
                    "saved_vs_steps_padded": f"{1 - flushed_us / medians['steps padded'][0]:.4f}",
                    "saved_vs_sdpa_padded": f"{1 - flushed_us / medians['SDPA padded'][0]:.4f}",
                })
                print(f"{mix:10s} H={heads} D={head_dim} {name:13s} flushed {flushed_us:8.1f} us "
                      f"window {window_us:8.1f} us  {flops / flushed_us / 1e6:6.1f} TFLOP/s  "
                      f"(padding {padding_fraction:.3f})", flush=True)
    measuring.write_csv(args.out, COLUMNS, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
