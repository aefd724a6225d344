#!/usr/bin/env python3
"""The other models, end to end, with step 8 in every attention: ViT-H/14, SETR-Naive and
DETR-R50, stock PyTorch against the same model with every nn.MultiheadAttention swapped
(attention_steps.mha.swap_multihead_attention), in fp16, at batch 1 (latency) and batch 32
(throughput).

  vit_h_14    torchvision's, 224 px: N = 257 tokens, 16 heads of D = 80, 32 blocks
  setr_naive  SETR-Naive: torchvision's ViT-L/16 encoder at 384 px without its class token
              (N = 576, 16 heads of D = 64, 24 blocks), then the naive head (1x1 conv, batch
              norm, ReLU, 1x1 conv to 150 classes, bilinear upsampling to the image)
  detr_e3/e6/e12  DETR-R50 as its paper describes it: torchvision's resnet50 to stride 32, a 1x1
              projection to d_model 256, sine positional embeddings, 3, 6 or 12 encoder layers
              (self-attention over the 25 x 42 = 1050 positions of an 800 x 1333 image, 8 heads
              of D = 32) and 6 decoder layers (self-attention over 100 object queries,
              cross-attention from them to the 1050 positions), sequence-first, post-norm,
              positional embeddings added to queries and keys, not values, in every layer, the
              class and box heads. Batch 32 holds images of mixed sizes padded to 800 x 1333 at
              the bottom and right, so the key-padding mask matters; batch 1 is one 800 x 1333
              image (its mask has no padding, and still goes to the kernels).

Random weights from a fixed seed (the speed and the check do not depend on training). Each model
is checked first, at batch 2: its outputs with the steps against stock's, with the tolerance
scripts/vit_end_to_end.py derives (3 times stock fp16's own distance to the model run in fp32,
at least 4u relative). Then each (model, batch) is timed: stock and swapped alternate in
--windows windows of CUDA-event-timed forwards after a warm-up (each window about --window-ms
long, Python's garbage collector held off); a row holds the median of the windows, their lowest
and highest, and vs_stock (stock's median time over this one's) with the lowest and highest of
that ratio window by window (each window of stock beside the next of the swapped model, so that
a drift in the machine's speed moves both). Every row also holds attention's share of the
GPU time, from one forward under torch.profiler (its kernels sorted by scripts/measuring.py, as for vit_end_to_end.py:
SDPA's for stock, the step's for the swapped model, and under torch.compile the
kernels Inductor names after them): the f of Amdahl's law, with the largest attention kernel's
own time and the forward's kernel time in all (profiled_gpu_ms, to set beside median_ms). With
--compiled, the same timing for both under torch.compile(mode="reduce-overhead") (CUDA graphs),
as long as --deadline-s allows; a row that would not fit says so. The log says what each phase took.

Compiling is most of the time: 20 compilations of whole models (5 models, 2 batches, stock and
swapped), each 15-30 s on the H100 machine's CPU. So with --compiled, --compile-helpers processes
(one per model at most) first compile the same models the same way and run each once, in
parallel, while this process checks the models; they fill torch.compile's on-disk caches
(Inductor's FX graph cache, AOTAutograd's), and this process's own compilations then load what
they made instead of making it again. Nothing they do is timed: they only move compile work off
the clock of this stage. The log counts the cache hits.

    python3 scripts/models_end_to_end.py --csv models_end_to_end.csv [--models vit_h_14,...]
        [--batches 1,32] [--windows 9] [--window-ms 150] [--compiled] [--compile-helpers 5]
        [--deadline-s 420]

Needs torch, torchvision and the operator (pip install --no-build-isolation ./python).
Exit status: 0 every check passed, 1 a check failed, 3 no CUDA device or no operator.
"""
import argparse
import copy
import csv
import gc
import math
import os
import statistics
import subprocess
import sys
import time

UNIT_ROUNDOFF = 2.0 ** -11
TOLERANCE_FACTOR = 3.0
MODELS = ["vit_h_14", "setr_naive", "detr_e3", "detr_e6", "detr_e12"]
FIELDS = ["model", "batch", "mode", "implementation", "median_ms", "low_ms", "high_ms", "windows",
          "forwards_per_window", "items_per_s", "vs_stock", "vs_stock_low", "vs_stock_high",
          "attention_calls", "attention_ms", "attention_share", "attention_kernel",
          "attention_kernel_ms", "profiled_gpu_ms", "check", "note"]


def build(torch, torchvision, name, seed):
    """(model, inputs(batch) -> tuple of tensors, attention calls per forward), with seeded
    random weights: each model's own initialisation, then every parameter it leaves at zero
    (torchvision's ViT head, the biases) drawn as well, so that the outputs are not zero and no
    bias can hide a wiring mistake."""
    model, inputs, calls = build_model(torch, torchvision, name, seed)
    generator = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for parameter in model.parameters():
            if not parameter.any():
                parameter.copy_(0.02 * torch.randn(parameter.shape, generator=generator))
    return model, inputs, calls


def build_model(torch, torchvision, name, seed):
    from torch import nn
    import torch.nn.functional as F
    torch.manual_seed(seed)

    if name == "vit_h_14":
        model = torchvision.models.vit_h_14(image_size=224)
        return model, lambda batch, g: (torch.randn(batch, 3, 224, 224, generator=g),), 32

    if name == "setr_naive":
        class SETRNaive(nn.Module):
            def __init__(self, classes=150):
                super().__init__()
                self.vit = torchvision.models.vit_l_16(image_size=384)
                self.head = nn.Sequential(nn.Conv2d(1024, 256, 1), nn.BatchNorm2d(256), nn.ReLU(),
                                          nn.Conv2d(256, classes, 1))

            def forward(self, images):
                encoder = self.vit.encoder
                x = self.vit._process_input(images)  # [B, 576, 1024]: patches, no class token
                x = encoder.ln(encoder.layers(encoder.dropout(x + encoder.pos_embedding[:, 1:])))
                side = images.shape[-1] // 16
                x = x.transpose(1, 2).reshape(x.shape[0], -1, side, side)
                return F.interpolate(self.head(x), size=images.shape[-2:], mode="bilinear",
                                     align_corners=False)
        return SETRNaive(), lambda batch, g: (torch.randn(batch, 3, 384, 384, generator=g),), 24

    encoder_layers = int(name.split("_e")[1])

    class EncoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = nn.MultiheadAttention(256, 8, dropout=0.1)
            self.linear1, self.linear2 = nn.Linear(256, 2048), nn.Linear(2048, 256)
            self.norm1, self.norm2 = nn.LayerNorm(256), nn.LayerNorm(256)

        def forward(self, src, mask, pos):
            q = k = src + pos
            src = self.norm1(src + self.self_attn(q, k, src, key_padding_mask=mask,
                                                  need_weights=False)[0])
            return self.norm2(src + self.linear2(F.relu(self.linear1(src))))

    class DecoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = nn.MultiheadAttention(256, 8, dropout=0.1)
            self.multihead_attn = nn.MultiheadAttention(256, 8, dropout=0.1)
            self.linear1, self.linear2 = nn.Linear(256, 2048), nn.Linear(2048, 256)
            self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(256) for _ in range(3))

        def forward(self, tgt, memory, mask, pos, query_pos):
            q = k = tgt + query_pos
            tgt = self.norm1(tgt + self.self_attn(q, k, tgt, need_weights=False)[0])
            tgt = self.norm2(tgt + self.multihead_attn(tgt + query_pos, memory + pos, memory,
                                                       key_padding_mask=mask,
                                                       need_weights=False)[0])
            return self.norm3(tgt + self.linear2(F.relu(self.linear1(tgt))))

    class DETR(nn.Module):
        def __init__(self):
            super().__init__()
            resnet = torchvision.models.resnet50()
            self.backbone = nn.Sequential(*list(resnet.children())[:-2])  # stride 32, 2048 ch
            self.input_proj = nn.Conv2d(2048, 256, 1)
            self.query_embed = nn.Embedding(100, 256)
            self.encoder = nn.ModuleList(EncoderLayer() for _ in range(encoder_layers))
            self.decoder = nn.ModuleList(DecoderLayer() for _ in range(6))
            self.decoder_norm = nn.LayerNorm(256)
            self.class_embed = nn.Linear(256, 92)
            self.bbox_embed = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256),
                                            nn.ReLU(), nn.Linear(256, 4))

        @staticmethod
        def sine_positions(mask, dtype):
            """DETR's normalised sine embedding of the unpadded positions: [B, 256, h, w]."""
            not_mask = (~mask).float()
            y, x = not_mask.cumsum(1), not_mask.cumsum(2)
            y = y / (y[:, -1:, :] + 1e-6) * 2 * math.pi
            x = x / (x[:, :, -1:] + 1e-6) * 2 * math.pi
            dim_t = 10000 ** (2 * (torch.arange(128, device=mask.device) // 2) / 128)
            pos_x, pos_y = x[..., None] / dim_t, y[..., None] / dim_t
            pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), 4).flatten(3)
            pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), 4).flatten(3)
            return torch.cat((pos_y, pos_x), 3).permute(0, 3, 1, 2).to(dtype)

        def forward(self, images, padding):
            features = self.backbone(images)
            mask = F.interpolate(padding[None].float(), size=features.shape[-2:])[0].bool()
            pos = self.sine_positions(mask, features.dtype).flatten(2).permute(2, 0, 1)
            src = self.input_proj(features).flatten(2).permute(2, 0, 1)  # [hw, B, 256]
            mask = mask.flatten(1)                                        # [B, hw]
            for layer in self.encoder:
                src = layer(src, mask, pos)
            query_pos = self.query_embed.weight.unsqueeze(1).repeat(1, images.shape[0], 1)
            tgt = torch.zeros_like(query_pos)
            for layer in self.decoder:
                tgt = layer(tgt, src, mask, pos, query_pos)
            hs = self.decoder_norm(tgt)
            return self.class_embed(hs), self.bbox_embed(hs).sigmoid()

    def inputs(batch, g):
        images = torch.zeros(batch, 3, 800, 1333)
        padding = torch.ones(batch, 800, 1333, dtype=torch.bool)  # True: padding
        for i in range(batch):
            # Batch 1: one full-size image; larger batches: sizes as DETR's resizing gives them
            # (shorter side 608..800, longer up to 1333), padded at the bottom and right.
            h, w = (800, 1333) if batch == 1 else (
                int(torch.randint(608, 801, (1,), generator=g)),
                int(torch.randint(800, 1334, (1,), generator=g)))
            images[i, :, :h, :w] = torch.randn(3, h, w, generator=g)
            padding[i, :h, :w] = False
        return images, padding
    return DETR(), inputs, encoder_layers + 12


def prepare(torch, torchvision, mha, name, seed, step):
    """(stock, swapped, modules swapped, inputs(batch, generator), attention calls): fp16
    instances of model `name` on the GPU in eval mode, the same for the timing process and the
    compile helpers, so that the helpers compile the very graphs the timed runs will ask for.
    Two instances, so that no run, eager or compiled, ever sees its modules change."""
    model, make_inputs, calls = build(torch, torchvision, name, seed)
    model = model.cuda().eval().half()
    swapped = copy.deepcopy(model)
    swapped_count = mha.swap_multihead_attention(swapped, step)
    return model, swapped, swapped_count, make_inputs, calls


def fill_compile_caches(torch, torchvision, mha, args):
    """--compile-helper: compile each named model, stock and swapped, at every batch, exactly as
    the timing process does, and run it once (which compiles it); the on-disk caches keep what
    the compilations made. Returns 0."""
    for name in args.models:
        stock, swapped, _, make_inputs, _ = prepare(torch, torchvision, mha, name, args.seed,
                                                    args.step)
        g = torch.Generator().manual_seed(args.seed + 1)
        for batch in args.batches:
            inputs = half([t.cuda() for t in make_inputs(batch, g)])
            for instance in (stock, swapped):
                with torch.inference_mode():
                    torch.compile(instance, mode="reduce-overhead")(*inputs)
                torch.cuda.synchronize()
                torch._dynamo.reset()
    return 0


def cache_hits(torch):
    """How many compilations so far loaded their result from the caches (FX graph, AOTAutograd)."""
    from torch._dynamo.utils import counters
    inductor, aot = counters["inductor"], counters["aot_autograd"]
    return (f"cache hits: FX graph {inductor['fxgraph_cache_hit']} (misses "
            f"{inductor['fxgraph_cache_miss']}, bypassed {inductor['fxgraph_cache_bypass']}); "
            f"AOTAutograd {aot['autograd_cache_hit']} (misses {aot['autograd_cache_miss']}, "
            f"bypassed {aot['autograd_cache_bypass']})")


def half(tensors):
    return [t.half() if t.is_floating_point() else t for t in tensors]


def relative(a, b):
    return ((a - b).norm() / b.norm()).item()


def flat(torch, output):
    outputs = output if isinstance(output, tuple) else (output,)
    return torch.cat([o.float().flatten() for o in outputs])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv")
    parser.add_argument("--models", default=",".join(MODELS), type=lambda t: t.split(","))
    parser.add_argument("--batches", default="1,32", type=lambda t: [int(b) for b in t.split(",")])
    parser.add_argument("--windows", type=int, default=9)
    parser.add_argument("--window-ms", type=float, default=150,
                        help="each window's length: as many forwards as fill it (2 to 50)")
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--compile-helpers", type=int, default=5,
                        help="processes that fill the compile caches first (0: none)")
    parser.add_argument("--compile-helper", action="store_true",
                        help="be one of them: compile the models and exit (no --csv needed)")
    parser.add_argument("--deadline-s", type=float, default=420)
    parser.add_argument("--step", default="v8")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.compile_helper and not args.csv:
        parser.error("--csv is required")
    started = time.time()

    import torch
    import torchvision
    from attention_steps import mha, torch_op
    import measuring  # beside this script: the timing and the profiler's categories it shares
    why_not = measuring.cannot_run(torch, torch_op, "measured")
    if why_not:
        print(why_not, file=sys.stderr)
        return 3
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32: exact
    if args.compile_helper:
        return fill_compile_caches(torch, torchvision, mha, args)
    helpers = []
    if args.compiled and args.compile_helpers > 0:
        # The models dealt out to at most --compile-helpers helpers, which share the CPUs.
        groups = [args.models[i::args.compile_helpers] for i in range(args.compile_helpers)]
        threads = max(1, (os.cpu_count() or 1) // len([g for g in groups if g]))
        for group in (g for g in groups if g):
            command = [sys.executable, os.path.abspath(__file__), "--compile-helper",
                       "--models", ",".join(group), "--batches", ",".join(map(str, args.batches)),
                       "--step", args.step, "--seed", str(args.seed)]
            helpers.append((group, subprocess.Popen(
                command, env={**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": str(threads)},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        print(f"{len(helpers)} compile helpers started, {threads} compile threads each", flush=True)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, torchvision "
          f"{torchvision.__version__}, step {args.step}", flush=True)
    out = open(args.csv, "w", newline="")
    writer = csv.DictWriter(out, fieldnames=FIELDS)
    writer.writeheader()
    failed = False

    def write(row):
        writer.writerow(row)
        out.flush()
        print(", ".join(f"{k}={v}" for k, v in row.items() if v != ""), flush=True)

    def phase(text, since):
        print(f"[{time.time() - started:6.1f} s] {text} ({time.time() - since:.1f} s)", flush=True)

    def attention_profile(function, inputs):
        """Attention's GPU time in one forward (ms), its share of all the forward's kernels, and
        its largest kernel: SDPA's in stock, the step's (inside attention_steps::) swapped."""
        try:
            with torch.inference_mode():
                result, _ = measuring.profile_forward(torch, lambda: function(*inputs), 1,
                                                      "attention_steps::")
        except RuntimeError as error:  # the row keeps its timing; the log says why no share
            print(f"no profile: {error}", flush=True)
            return {}
        total = sum(category["ms"] for category in result.values())
        attention = result["attention"]
        return {"attention_ms": f"{attention['ms']:.3f}",
                "attention_share": f"{attention['ms'] / total:.4f}" if total else "",
                "attention_kernel": attention["top_kernel"][:100],
                "attention_kernel_ms": f"{attention['top_kernel_ms']:.3f}",
                "profiled_gpu_ms": f"{total:.3f}"}

    # Every model is built and checked first; then the eager rows of all, then the compiled ones
    # as far as --deadline-s allows (compiling takes longest).
    prepared = {}
    for name in args.models:
        since = time.time()
        model, swapped, swapped_count, make_inputs, calls = prepare(
            torch, torchvision, mha, name, args.seed, args.step)
        g = torch.Generator().manual_seed(args.seed + 1)
        check_inputs = [t.cuda() for t in make_inputs(2, g)]
        with torch.inference_mode():
            # The check: stock fp16's distance to fp32 (its fp16 weights, widened) is the noise;
            # the steps may be 3 times it.
            reference = flat(torch, model.float()(*check_inputs))
            model.half()
            check_inputs = half(check_inputs)
            stock = flat(torch, model(*check_inputs))
            steps = flat(torch, swapped(*check_inputs))
        models = {"stock": model, "steps": swapped}
        noise = relative(stock, reference)
        tolerance = max(TOLERANCE_FACTOR * noise, 4 * UNIT_ROUNDOFF)
        error = relative(steps, stock)
        check = "passed" if error <= tolerance and math.isfinite(error) else "FAILED"
        failed |= check != "passed"
        note = (f"outputs vs stock (batch 2): relative {error:.3g}, tolerance {tolerance:.3g} "
                f"(stock fp16 vs fp32: {noise:.3g}); {swapped_count} modules swapped")
        print(f"{name}: {note}: {check}", flush=True)
        prepared[name] = (models, {b: half([t.cuda() for t in make_inputs(b, g)]) for b in args.batches},
                          calls, check, note)
        phase(f"{name} built and checked", since)

    if helpers:  # nothing is timed while they compile
        since = time.time()
        for group, helper in helpers:
            output, _ = helper.communicate()
            if helper.returncode != 0:
                print(f"compile helper for {','.join(group)} failed ({helper.returncode}); its "
                      f"output:\n{output[-3000:]}", flush=True)
        phase("the compile helpers are done", since)

    for mode in ["eager"] + (["compiled"] if args.compiled else []):
        for name, (models, inputs_of, calls, check, note) in prepared.items():
            for batch, inputs in inputs_of.items():
                base = {"model": name, "batch": batch, "mode": mode, "attention_calls": calls,
                        "check": check}
                if time.time() - started > args.deadline_s:
                    for implementation in models:
                        write({**base, "implementation": implementation,
                               "note": f"not run: past --deadline-s {args.deadline_s:.0f}"})
                    continue
                since = time.time()
                runners = {}
                forward_ms = {}
                for implementation, instance in models.items():
                    function = torch.compile(instance, mode="reduce-overhead") if mode == "compiled" \
                        else instance
                    with torch.inference_mode():  # compiles (and records its graphs), warms up
                        warm_ups = measuring.each_call_ms(torch, [lambda: function(*inputs)] * 3)
                    forward_ms[implementation] = warm_ups[-1]
                    runners[implementation] = function
                phase(f"{name}, batch {batch}, {mode}: compiled and warmed up, {cache_hits(torch)}"
                      if mode == "compiled" else f"{name}, batch {batch}, {mode}: warmed up", since)
                since = time.time()
                forwards = max(2, min(50, math.ceil(args.window_ms / max(forward_ms.values()))))
                windows = {k: [] for k in runners}
                gc.collect()
                gc.disable()  # a collection inside a window would be timed as the model's
                try:
                    with torch.inference_mode():
                        for _ in range(args.windows):
                            for implementation, function in runners.items():
                                windows[implementation].append(measuring.window_ms(
                                    torch, lambda: function(*inputs), forwards))
                finally:
                    gc.enable()
                # Attention's share, Amdahl's f, for stock and swapped; compiled too (the kernels
                # a CUDA graph replays, found by name).
                profiles = {k: attention_profile(f, inputs) for k, f in runners.items()}
                medians = {k: statistics.median(v) for k, v in windows.items()}
                paired = {k: [a / b for a, b in zip(windows["stock"], v)] for k, v in windows.items()}
                for implementation, values in windows.items():
                    write({**base, "implementation": implementation,
                           "median_ms": f"{medians[implementation]:.3f}",
                           "low_ms": f"{min(values):.3f}", "high_ms": f"{max(values):.3f}",
                           "windows": len(values), "forwards_per_window": forwards,
                           "items_per_s": f"{batch * 1000 / medians[implementation]:.1f}",
                           "vs_stock": f"{medians['stock'] / medians[implementation]:.3f}",
                           "vs_stock_low": f"{min(paired[implementation]):.3f}",
                           "vs_stock_high": f"{max(paired[implementation]):.3f}",
                           **profiles[implementation],
                           "note": note if implementation == "steps" else ""})
                phase(f"{name}, batch {batch}, {mode}: timed", since)
                del runners
                torch._dynamo.reset()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
