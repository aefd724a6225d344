#!/usr/bin/env python3
"""Whole Vision Transformers with the steps inside: checked, timed and profiled on a GPU.

For each model and image size (default: vit_b_16 at 224, 384 and 512 px, vit_l_16 at 224 px),
batch 32, fp16, eval mode under torch.inference_mode(), with seeded random weights (or
--weights):

  stock     torchvision's model as it runs: nn.MultiheadAttention's fast path, whose attention
            is scaled_dot_product_attention (cuDNN or FlashAttention kernels on an H100);
  vN, eager every step and baseline of libattention_steps.so that serves the shape
            [B, H, N, D] on this GPU (the library says why it does not), swapped into every
            encoder block with attention_steps.swap_attention: the same in-projection, the
            step's kernel, the same out-projection.

Each row: the logits against the stock model's (max abs and relative Frobenius error) within
a tolerance derived below; the whole forward timed with CUDA events (warm-up, then the median
of several runs, no synchronisation between them); then, once every row of the model size is
timed (a profiler session can leave launch overhead behind), the GPU time of one or two
profiled forwards (torch.profiler) split into kernel categories: attention (the step's kernels, or SDPA's),
GEMMs (cuBLAS, cuDNN convolution), LayerNorm, GELU, elementwise (residual and bias adds),
layout copies (permute/contiguous, including the two the bridge adds per block), other.

Tolerance. Every fp16 implementation differs from exact arithmetic by rounding noise that
builds up through 12 to 32 blocks of GEMMs, LayerNorms, GELUs and attention; its size depends
on the model and its weights, so it is measured, not guessed: the same model run in fp32 (the
fp16 weights widened, TF32 off) is the near-exact reference, and the stock fp16 model's distance
to it, e_stock, is the noise of a correct fp16 forward. A correct step makes the same kind of
rounding (fp32 accumulation, fp16 in and out), so its distance to the reference is about e_stock
too, and by the triangle inequality its distance to the stock model is at most about
2 * e_stock. We allow 3 * e_stock (a 1.5x margin for the spread of random rounding), separately
for the relative Frobenius error and the max abs error, and never less than 4u relative
(u = 2^-11, the per-kernel tolerance of harness/check.hpp) or 4u * max|logit| absolute. A wiring
mistake (heads mixed up, a wrong scale, a lost bias) moves the logits by O(1), hundreds of times
more; an error of a few ulps in one kernel is the per-kernel tests' job (fp64 reference).

Time budget. The default set finishes in about 2 to 3 minutes on an H100. Steps v0 to v3 take
milliseconds to a second per attention call at these shapes, so each step's cost is predicted
before it runs, from one attention call timed alone: forward ~= stock forward + blocks * call.
A step whose fewest runs (the check, 2 timed, 1 profiled) would exceed --impl-budget-s, or the
time left before --deadline-s (less a reserve for the model sizes still to come), is skipped
with that reason in its row; a slow step gets fewer timed runs (at least 2).

  scripts/vit_end_to_end.py [--models vit_b_16@224,vit_b_16@384,vit_b_16@512,vit_l_16@224]
      [--batch 32] [--steps all|stock,v6,...] [--weights [MODEL=]PATH] [--seed 0]
      [--out-dir docs/results/<gpu>] [--library PATH] [--quick] [--no-profile]
      [--timing-s 2] [--impl-budget-s 20] [--deadline-s 225]

Models: vit_b_16, vit_b_32, vit_l_16, vit_l_32, vit_h_14 at any image size that is a multiple of
the patch. --quick: vit_b_16@224 and vit_b_32@224, short timing, small budgets.
Writes OUTDIR/vit_end_to_end.csv (one row per model, image size, implementation),
OUTDIR/vit_end_to_end_kernels.csv (GPU time per kernel category) and
OUTDIR/vit_end_to_end_info.txt (versions, GPU, settings); prints a table.
Needs torch and torchvision with CUDA, and libattention_steps.so (found as attention_steps
finds it: --library, $ATTENTION_STEPS_LIBRARY, <checkout>/build/).
Exit status: 0 every row passed or was skipped for a stated reason, 1 a check failed or a row
hit an error, 2 usage error, 3 no torch, no CUDA device or no library.
"""
import argparse
import datetime
import math
import os
import pathlib
import platform
import re
import statistics
import sys
import time

import measuring

REPOSITORY = pathlib.Path(__file__).resolve().parents[1]
DEVICE = "cuda"  # where models and tensors live (a test of this script's logic may change it)
sys.path.insert(0, str(REPOSITORY / "python"))

DEFAULT_MODELS = "vit_b_16@224,vit_b_16@384,vit_b_16@512,vit_l_16@224"
QUICK_MODELS = "vit_b_16@224,vit_b_32@224"
KNOWN_MODELS = ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14")
UNIT_ROUNDOFF = 2.0 ** -11
TOLERANCE_FACTOR = 3.0
MIN_RELATIVE_TOLERANCE = 4 * UNIT_ROUNDOFF
FEWEST_FORWARDS = 4                 # the check, 2 timed, 1 profiled
RESERVE_PER_MODEL_SIZE_S = 20.0     # kept for each model size still to come

ROW_COLUMNS = [
    "gpu", "date", "model", "image_size", "tokens", "batch", "blocks", "heads", "head_dim",
    "implementation", "status", "images_per_s", "median_ms", "min_ms", "max_ms", "runs",
    "speedup_vs_stock", "attention_share", "attention_ms", "attention_call_ms",
    "max_abs_error", "relative_error", "max_abs_tolerance", "relative_tolerance",
    "relative_error_vs_fp32", "max_abs_error_vs_fp32", "attention_by", "weights", "note"]
KERNEL_COLUMNS = [
    "gpu", "date", "model", "image_size", "implementation", "category", "gpu_ms", "share",
    "kernels", "top_kernel", "top_kernel_ms"]
class UsageError(Exception):
    pass


class EnvironmentProblem(Exception):
    pass


def number(value, digits=6):
    return "" if value is None or (isinstance(value, float) and not math.isfinite(value)) \
        else f"{value:.{digits}g}"


def parse_arguments(argv):
    parser = argparse.ArgumentParser(
        description="The steps inside whole torchvision ViTs: logits checked against the stock "
                    "model, forward timed, GPU time split by kernel category.")
    parser.add_argument("--models", help=f"MODEL@IMAGE,... (default {DEFAULT_MODELS})")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", default="all",
                        help="all (every step and baseline of the library), or stock,v6,...")
    parser.add_argument("--weights", action="append", default=[],
                        help="[MODEL=]PATH of a state_dict to load (repeatable); without MODEL= "
                             "for every model of the set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", help="default docs/results/<gpu>/")
    parser.add_argument("--gpu-name", help="the <gpu> folder name (default from the GPU's name)")
    parser.add_argument("--library", help="path of libattention_steps.so")
    parser.add_argument("--quick", action="store_true",
                        help=f"models {QUICK_MODELS}, short timing and budgets")
    parser.add_argument("--no-profile", action="store_true", help="skip the torch.profiler runs")
    parser.add_argument("--timing-s", type=float, default=None,
                        help="seconds of timed forwards per row (default 2, --quick 0.5)")
    parser.add_argument("--impl-budget-s", type=float, default=None,
                        help="skip a row whose fewest runs would take longer (default 20, "
                             "--quick 5)")
    parser.add_argument("--deadline-s", type=float, default=225.0,
                        help="rows that would end after this many seconds are skipped")
    args = parser.parse_args(argv)
    args.models = args.models or (QUICK_MODELS if args.quick else DEFAULT_MODELS)
    args.timing_s = args.timing_s if args.timing_s is not None else (0.5 if args.quick else 2.0)
    args.impl_budget_s = args.impl_budget_s if args.impl_budget_s is not None else \
        (5.0 if args.quick else 20.0)
    if args.batch < 1:
        raise UsageError(f"--batch {args.batch}: must be at least 1")
    for flag in ("timing_s", "impl_budget_s", "deadline_s"):
        if getattr(args, flag) <= 0:
            raise UsageError(f"--{flag.replace('_', '-')}: must be positive")
    configs = []
    for item in args.models.split(","):
        name, _, size = item.strip().partition("@")
        if name not in KNOWN_MODELS:
            raise UsageError(f"--models: unknown model '{name}' (known: {', '.join(KNOWN_MODELS)})")
        patch = int(name.rsplit("_", 1)[1])
        try:
            image = int(size) if size else 224
        except ValueError:
            raise UsageError(f"--models: '{item}': the image size must be an integer") from None
        if image < patch or image % patch:
            raise UsageError(f"--models: '{item}': the image size must be a multiple of the "
                             f"patch, {patch}")
        configs.append((name, image))
    args.configs = configs
    weights = {}
    for item in args.weights:
        model, separator, path = item.partition("=")
        if not separator:
            model, path = "*", item
        elif model not in KNOWN_MODELS:
            raise UsageError(f"--weights: unknown model '{model}'")
        if not os.path.isfile(path):
            raise UsageError(f"--weights: no such file '{path}'")
        weights[model] = path
    args.weights = weights
    return args


def gpu_slug(name):
    """'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA A100-SXM4-80GB' -> 'a100'."""
    words = [w for w in re.split(r"[\s\-_]+", name.lower()) if w not in ("nvidia", "geforce", "tesla")]
    chosen = []
    for word in words:
        chosen.append(word)
        if any(c.isdigit() for c in word):
            break
    return re.sub(r"[^a-z0-9]+", "-", "-".join(chosen)).strip("-") or "gpu"


# ---- the model ------------------------------------------------------------------------------

def build_model(torch, torchvision, name, image, seed, weights_path):
    """Seeded random weights on the GPU: torchvision's initialisation, then every parameter it
    leaves at zero (the classifier head, the biases, the class token) drawn too, so no bias and
    no head can hide a wiring mistake; then the weights file, when given."""
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        model = getattr(torchvision.models, name)(image_size=image)
    generator = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter.any():
                continue
            std = 1.0 / math.sqrt(parameter.shape[-1]) if parameter_name == "heads.head.weight" \
                else 0.02
            parameter.copy_(std * torch.randn(parameter.shape, device=DEVICE, generator=generator))
    label = f"random (seed {seed})"
    if weights_path:
        from torchvision.models.vision_transformer import interpolate_embeddings
        state = torch.load(weights_path, map_location="cpu", weights_only=True)
        for key in ("model", "state_dict"):
            if isinstance(state, dict) and isinstance(state.get(key), dict):
                state = state[key]
        position = state.get("encoder.pos_embedding")
        if position is not None and position.shape != model.encoder.pos_embedding.shape:
            state = interpolate_embeddings(image, model.patch_size, state)
        model.load_state_dict(state, strict=True)
        label = os.path.basename(weights_path)
    return model.eval(), label


def blocks_of(model):
    layers = list(model.encoder.layers)
    attention = layers[0].self_attention
    return len(layers), attention.num_heads, attention.head_dim


# ---- timing and profiling -------------------------------------------------------------------

def time_attention_call(torch, call):
    """One attention call alone, in ms: the first call warms up; a slow one (over 0.1 s) is
    timed once more, a fast one the median of up to 20 within about 0.2 s."""
    first = measuring.each_call_ms(torch, [call])[0]
    if first > 100:
        return measuring.each_call_ms(torch, [call])[0]
    count = max(3, min(20, int(200 / max(first, 1e-3))))
    return statistics.median(measuring.each_call_ms(torch, [call] * count))


def attention_backend(top_kernel):
    lowered = top_kernel.lower()
    if "cudnn" in lowered:
        return "cuDNN"
    if "flash" in lowered:
        return "FlashAttention"
    if "fmha" in lowered or "cutlass" in lowered:
        return "memory-efficient (cutlass fmha)"
    return top_kernel[:60] or "?"


# ---- one model size -------------------------------------------------------------------------

class Clock:
    def __init__(self, deadline_s):
        self.start = time.monotonic()
        self.deadline_s = deadline_s

    def elapsed(self):
        return time.monotonic() - self.start

    def left(self):
        return self.deadline_s - self.elapsed()


def errors(torch, logits, reference):
    difference = (logits - reference).float()
    return (difference.abs().max().item(),
            (difference.norm() / reference.float().norm().clamp_min(1e-30)).item())


# Left as one function: its phases (check, time, profile) share the model, the inputs and the
# tolerances, and it only runs on a GPU; split it when other models join it (DETR, SETR).
def run_model_size(torch, torchvision, steps_module, library, args, name, image, clock,
                   models_left, gpu, date, log):
    rows, kernel_rows = [], []
    model, weights_label = build_model(torch, torchvision, name, image, args.seed,
                                       args.weights.get(name) or args.weights.get("*"))
    blocks, heads, head_dim = blocks_of(model)
    tokens = (image // model.patch_size) ** 2 + 1
    shape = (args.batch, heads, tokens, head_dim)
    base = {"gpu": gpu, "date": date, "model": name, "image_size": image, "tokens": tokens,
            "batch": args.batch, "blocks": blocks, "heads": heads, "head_dim": head_dim,
            "weights": weights_label}
    generator = torch.Generator(device=DEVICE).manual_seed(args.seed + 2)
    images = torch.randn(args.batch, 3, image, image, device=DEVICE, generator=generator).half()
    q, k, v = (torch.randn(shape, device=DEVICE, generator=generator).half() for _ in range(3))
    forward = lambda: model(images)  # noqa: E731

    with torch.inference_mode():
        # The near-exact reference: the fp16 weights widened to fp32 (exactly), TF32 off.
        model.half().float()
        reference = model(images.float()).float()
        model.half()
        stock_logits = forward().float()
        noise_abs, noise_rel = errors(torch, stock_logits, reference)
        tolerance_rel = max(TOLERANCE_FACTOR * noise_rel, MIN_RELATIVE_TOLERANCE)
        tolerance_abs = max(TOLERANCE_FACTOR * noise_abs,
                            4 * UNIT_ROUNDOFF * reference.abs().max().item())
        log(f"{name}@{image}: N = {tokens}, {blocks} blocks of {heads} heads x {head_dim}; "
            f"stock fp16 vs fp32: max abs {noise_abs:.3g}, relative {noise_rel:.3g} -> "
            f"tolerance max abs {tolerance_abs:.3g}, relative {tolerance_rel:.3g}")
        stock_ms = statistics.median(measuring.each_call_ms(torch, [forward] * 3))  # the estimate stock runs by

        def check_and_time(implementation, estimate_s, logits, call_ms, note=""):
            """Checks and times the model as it now is: one row."""
            row = dict(base, implementation=implementation, status="passed", note=note,
                       attention_call_ms=number(call_ms), max_abs_tolerance=number(tolerance_abs),
                       relative_tolerance=number(tolerance_rel))
            max_abs, relative = errors(torch, logits, stock_logits)
            fp32_abs, fp32_rel = errors(torch, logits, reference)
            row.update(max_abs_error=number(max_abs), relative_error=number(relative),
                       relative_error_vs_fp32=number(fp32_rel),
                       max_abs_error_vs_fp32=number(fp32_abs))
            if not torch.isfinite(logits).all():
                row["status"] = "FAILED: non-finite logits"
            elif relative > tolerance_rel or max_abs > tolerance_abs:
                row["status"] = (f"FAILED: logits differ from stock: relative {relative:.3g} "
                                 f"(tolerance {tolerance_rel:.3g}), max abs {max_abs:.3g} "
                                 f"(tolerance {tolerance_abs:.3g})")
            runs = max(2 if estimate_s > 1.0 else 3,
                       min(30, int(args.timing_s / max(estimate_s, 1e-4))))
            if estimate_s < 0.2:
                measuring.each_call_ms(torch, [forward] * 3)  # warm-up; a slow step was warmed by its check
            times = measuring.each_call_ms(torch, [forward] * runs)
            median = statistics.median(times)
            row.update(median_ms=number(median), min_ms=number(min(times)),
                       max_ms=number(max(times)), runs=runs,
                       images_per_s=number(args.batch / (median / 1000.0)))
            row["_median_ms"], row["_estimate_s"] = median, estimate_s
            return row

        def profile_row(row):
            """The kernel categories of one or two profiled forwards of the model as it now is."""
            profiled, attention_by = measuring.profile_forward(
                torch, forward, 1 if row["_estimate_s"] > 0.2 else 2,
                steps_module.torch_bridge.RECORD_PREFIX)
            total = sum(entry["ms"] for entry in profiled.values())
            row.update(attention_ms=number(profiled["attention"]["ms"]),
                       attention_share=number(profiled["attention"]["ms"] / total if total else None),
                       attention_by=attention_by)
            if row["implementation"] == "stock":
                row["note"] = (row["note"] + "; " if row["note"] else "") + "attention kernels: " + \
                    attention_backend(profiled["attention"]["top_kernel"])
            for category in measuring.CATEGORIES:
                entry = profiled[category]
                kernel_rows.append({
                    "gpu": gpu, "date": date, "model": name, "image_size": image,
                    "implementation": row["implementation"], "category": category,
                    "gpu_ms": number(entry["ms"]),
                    "share": number(entry["ms"] / total if total else None),
                    "kernels": number(entry["kernels"], 4), "top_kernel": entry["top_kernel"],
                    "top_kernel_ms": number(entry["top_kernel_ms"])})
            return profiled["attention"]["ms"]

        # Every row is checked and timed before any is profiled: a profiler session can leave
        # launch overhead behind, and the rows of one model size are compared with each other.
        sdpa_ms = time_attention_call(
            torch, lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
        stock = check_and_time("stock", stock_ms / 1000.0, stock_logits, sdpa_ms,
                               note="attention_call_ms: SDPA alone on contiguous [B, H, N, D]")
        stock_ms = stock["_median_ms"]
        stock["speedup_vs_stock"] = "1"
        rows.append(stock)
        log(describe(stock))
        # What attention costs inside the stock forward, for the estimates: one profiled forward
        # would leave the profiler behind before the steps are timed, so SDPA alone per block.
        stock_attention_ms = blocks * sdpa_ms

        for step in args.step_order:
            row = dict(base, implementation=step)
            try:
                why = library.refusal(step, shape)
                if why is not None:
                    row["status"] = f"skipped: {why}"
                    rows.append(row)
                    log(describe(row))
                    continue
                call_ms = time_attention_call(
                    torch, lambda step=step: steps_module.attention(q, k, v, step=step))
                row["attention_call_ms"] = number(call_ms)
                estimate_s = max(stock_ms - stock_attention_ms + blocks * call_ms,
                                 blocks * call_ms) / 1000.0
                fewest_s = FEWEST_FORWARDS * estimate_s
                available_s = clock.left() - RESERVE_PER_MODEL_SIZE_S * models_left
                if fewest_s > min(args.impl_budget_s, available_s):
                    limit = (f"--impl-budget-s {args.impl_budget_s:g}"
                             if fewest_s > args.impl_budget_s else
                             f"the {max(available_s, 0):.0f} s left before --deadline-s "
                             f"{args.deadline_s:g}")
                    row["status"] = (f"skipped: time budget: one forward would take about "
                                     f"{estimate_s:.2f} s ({blocks} attention calls of "
                                     f"{call_ms:.3g} ms, timed alone); its fewest runs (check, "
                                     f"2 timed, 1 profiled) about {fewest_s:.0f} s > {limit}")
                else:
                    steps_module.swap_attention(model, step=step, library=library)
                    try:
                        row = check_and_time(step, estimate_s, forward().float(), call_ms)
                    finally:
                        steps_module.restore_attention(model)
                    row["speedup_vs_stock"] = number(stock_ms / row["_median_ms"], 4)
            except Exception as error:  # a row's error goes into its row; the run goes on
                row["status"] = f"error: {type(error).__name__}: {error}".replace("\n", " ")
            rows.append(row)
            log(describe(row))

        if not args.no_profile:
            for row in rows:
                if "_median_ms" not in row:
                    continue  # skipped or failed before it was timed
                if clock.left() - RESERVE_PER_MODEL_SIZE_S * models_left < 2 * row["_estimate_s"]:
                    row["note"] = (f"{row['note']}; " if row.get("note") else "") + \
                        f"not profiled: the run reached --deadline-s {args.deadline_s:g}"
                    continue
                try:
                    if row["implementation"] != "stock":
                        steps_module.swap_attention(model, step=row["implementation"],
                                                    library=library)
                    try:
                        profile_row(row)
                    finally:
                        steps_module.restore_attention(model)
                except Exception as error:
                    row["note"] = (f"{row.get('note', '')}; " if row.get("note") else "") + \
                        f"profile failed: {type(error).__name__}: {error}".replace("\n", " ")
                if row.get("attention_share"):
                    log(f"{name}@{image} {row['implementation']}: attention "
                        f"{float(row['attention_share']) * 100:.1f}% of GPU time "
                        f"({row['attention_ms']} ms a forward, found by {row['attention_by']})")
    del model
    torch.cuda.empty_cache()
    return rows, kernel_rows


def describe(row):
    parts = [f"{row['model']}@{row['image_size']} {row['implementation']}: {row['status']}"]
    if row.get("median_ms"):
        parts.append(f"{row['median_ms']} ms ({row['images_per_s']} images/s, {row['runs']} runs)")
    if row.get("attention_share"):
        parts.append(f"attention {float(row['attention_share']) * 100:.1f}% of GPU time")
    if row.get("relative_error"):
        parts.append(f"logits vs stock: relative {row['relative_error']}, max abs {row['max_abs_error']}")
    return "; ".join(parts)


def print_table(rows):
    header = f"{'model':<9} {'px':>4} {'impl':<6} {'ms':>9} {'img/s':>8} {'vs stock':>8} " \
             f"{'attn %':>6} {'rel err':>8}  status"
    print(header)
    print("-" * len(header))
    for row in rows:
        share = f"{float(row['attention_share']) * 100:.1f}" if row.get("attention_share") else ""
        status = row["status"] if len(row["status"]) <= 70 else row["status"][:67] + "..."
        print(f"{row['model']:<9} {row['image_size']:>4} {row['implementation']:<6} "
              f"{row.get('median_ms', ''):>9} {row.get('images_per_s', ''):>8} "
              f"{row.get('speedup_vs_stock', ''):>8} {share:>6} {row.get('relative_error', ''):>8}  "
              f"{status}")


def main(argv):
    try:
        args = parse_arguments(argv)
    except UsageError as error:
        print(f"vit_end_to_end.py: {error}", file=sys.stderr)
        return 2
    try:
        import torch
        import torchvision
    except ImportError as error:
        print(f"vit_end_to_end.py: needs torch and torchvision ({error})", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print(f"vit_end_to_end.py: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 3
    import attention_steps
    from attention_steps import torch_bridge  # noqa: F401  (attention_steps.torch_bridge below)
    try:
        library = attention_steps.load_library(args.library)
        device = library.device()
    except (attention_steps.LibraryNotFoundError, attention_steps.CudaError) as error:
        print(f"vit_end_to_end.py: {error}", file=sys.stderr)
        return 3

    listed = [info.id for info in library.steps() if not info.is_backward]
    if args.steps == "all":
        chosen = listed
    else:
        chosen = [s.strip() for s in args.steps.split(",") if s.strip() and s.strip() != "stock"]
        unknown = [s for s in chosen if s not in listed]
        if unknown:
            print(f"vit_end_to_end.py: --steps: unknown {', '.join(unknown)} (the library has "
                  f"{', '.join(listed)})", file=sys.stderr)
            return 2
    # Fast steps first (the later the step, the faster), then the baselines, then v3 .. v0:
    # a deadline cuts the slow ones.
    numbered = sorted((s for s in chosen if re.fullmatch(r"v\d+", s)), key=lambda s: -int(s[1:]))
    fast = [s for s in numbered if int(s[1:]) >= 4]
    args.step_order = fast + [s for s in chosen if s not in numbered] + \
        [s for s in numbered if s not in fast]

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gpu = torch.cuda.get_device_name()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    out_dir = pathlib.Path(args.out_dir or REPOSITORY / "docs" / "results" /
                           (args.gpu_name or gpu_slug(gpu)))
    out_dir.mkdir(parents=True, exist_ok=True)
    info = [
        f"date_utc: {date}", f"gpu: {gpu} (library sees: {device.name}, compute capability "
        f"{device.compute_capability})", f"python: {platform.python_version()}",
        f"torch: {torch.__version__} cuda {torch.version.cuda} cudnn {torch.backends.cudnn.version()}",
        f"torchvision: {torchvision.__version__}", f"library: {library.path}",
        f"command: {' '.join([sys.argv[0]] + list(argv))}",
        f"settings: batch {args.batch}, seed {args.seed}, models {args.models}, steps "
        f"{','.join(args.step_order)}, timing {args.timing_s:g} s, impl budget "
        f"{args.impl_budget_s:g} s, deadline {args.deadline_s:g} s, profile {not args.no_profile}",
        f"tolerance: {TOLERANCE_FACTOR:g} x (stock fp16 vs fp32), at least {MIN_RELATIVE_TOLERANCE:.3g} "
        "relative and 4u * max|logit| absolute",
        "timing: CUDA events around each forward, queued back to back, median",
    ]
    (out_dir / "vit_end_to_end_info.txt").write_text("\n".join(info) + "\n")

    def log(text):
        print(f"[{clock.elapsed():6.1f} s] {text}", flush=True)

    clock = Clock(args.deadline_s)
    log(f"{gpu}; library {library.path}; out {out_dir}")
    all_rows, all_kernels = [], []
    for index, (name, image) in enumerate(args.configs):
        models_left = len(args.configs) - index - 1
        try:
            rows, kernels = run_model_size(torch, torchvision, attention_steps, library, args, name,
                                           image, clock, models_left, gpu, date, log)
        except Exception as error:  # the whole model size failed (out of memory, say)
            rows = [{"gpu": gpu, "date": date, "model": name, "image_size": image,
                     "batch": args.batch, "implementation": "stock",
                     "status": f"error: {type(error).__name__}: {error}".replace("\n", " ")}]
            kernels = []
            log(describe(rows[0]))
            torch.cuda.empty_cache()
        order = {step: position for position, step in enumerate(["stock"] + listed)}
        rows.sort(key=lambda row: order.get(row["implementation"], len(order)))
        all_rows += rows
        all_kernels += kernels
        measuring.write_csv(out_dir / "vit_end_to_end.csv", ROW_COLUMNS, all_rows)
        measuring.write_csv(out_dir / "vit_end_to_end_kernels.csv", KERNEL_COLUMNS, all_kernels)

    print()
    print_table(all_rows)
    print(f"\n{len(all_rows)} rows in {clock.elapsed():.0f} s: {out_dir / 'vit_end_to_end.csv'}, "
          f"{out_dir / 'vit_end_to_end_kernels.csv'}")
    failed = [row for row in all_rows if row["status"].startswith(("FAILED", "error"))]
    passed = [row for row in all_rows if row["status"] == "passed"]
    skipped = len(all_rows) - len(failed) - len(passed)
    print(f"{len(passed)} passed, {len(failed)} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
