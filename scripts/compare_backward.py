#!/usr/bin/env python3
"""The backward of attention, steps v9 and v10 beside PyTorch's SDPA backward (FlashAttention-2 and
cuDNN), in one process, on the GPU, fp16 or bf16 [B, H, N, D]:

  v9        torch.ops.attention_steps.attention_backward (D = rowsum(dO o O), the kernel, dQ's
            conversion), after the forward (v6, with L) ran once outside the timing
  v10       the same call with step v10, the Hopper backward (on an H100 only), on the same O and L
  v10_views the same call on the same values where training leaves them: Q, K and V views of one
            [B, N, 3, H, D] projection, O and dO [B, N, H, D] (the out-projection's layout); its
            note gives its time over v10's on contiguous tensors
  eager     the same call with the library's cuBLAS eager backward (eager_backward: P and dS
            materialised, N x N, five GEMMs), on the same O and L
  flash     torch.autograd.grad of F.scaled_dot_product_attention under SDPBackend.FLASH_ATTENTION
  cudnn     the same under SDPBackend.CUDNN_ATTENTION

All of them first run in turn for --warm-s seconds (the GPU reaches its top clock:
measuring.warm_up), then each is timed in windows of back-to-back calls between two CUDA
events; the implementations alternate window by window, each window in an order rotated by one,
and the row holds the median of the windows and their extremes.
FLOPs of a backward are counted as FlashAttention counts them: 2.5 times the forward's
4 B H N^2 D. The v9 and eager rows also check their dQ, dK, dV against SDPA's math backend in
fp32 on the same inputs (relative Frobenius error of each); v10's too.

    python3 scripts/compare_backward.py --csv docs/results/h100/backward.csv
    python3 scripts/compare_backward.py --dtype bf16 --csv backward_bf16.csv   # no eager row:
                                                               # eager_backward takes fp16 only
    python3 scripts/compare_backward.py --causal --csv causal.csv  # is_causal=True; v10 and the
                     # SDPA rows only (v9 and eager_backward take no causal mask), the forward of
                     # O and L by v8; FLOPs count the N (N + 1) / 2 pairs a causal mask leaves

--training measures the path training takes instead, every implementation through autograd:
  steps     attention_steps.attention(q, k, v, step=--forward-step, key_padding_mask=...) on
            inputs that require grad (the forward keeps O where it wrote it, L and the mask), then
            torch.autograd.grad, which runs the backward step the library chooses for the call
            (its N_k and mask included; v10 on an H100)
  flash, cudnn   F.scaled_dot_product_attention under that backend (a key-padding mask as its
            boolean attn_mask), then torch.autograd.grad
each as the backward alone (the forward ran once, outside the timing, its graph retained) and as
forward + backward, each timed two ways: in windows of back-to-back calls (as above) and call by
call with the L2 cache flushed before each (measuring.flushed_call_ms, as triton's do_bench),
both in the row. An implementation that refuses the call (FlashAttention-2 takes no attn_mask; a
head dim no backward step serves) gets its rows with the reason in the note instead of numbers.
Its CSV has its own columns (TRAINING_FIELDS). Shapes may have keys of another count and a
key-padding mask (SHAPES_HELP); by default the eight of issue #31 (TRAINING_SHAPES): the five ViT
shapes, (32, 16, 257, 80), (32, 8, 1050, 32) (DETR's encoder) and DETR's decoder
cross-attention, 100 queries against 1050 keys with the "detr" padding.

    python3 scripts/compare_backward.py --training --csv training.csv
    python3 scripts/compare_backward.py --training --shapes "32,8,100,32,1050" \\
        --key-padding 0.25 --csv cross.csv
"""
import argparse
import collections
import csv
import math
import re
import statistics
import sys
import warnings

import measuring

SHAPES = [(32, 12, 197, 64), (32, 12, 577, 64), (32, 12, 1025, 64), (8, 12, 4097, 64),
          (8, 16, 4097, 128)]
# --training's default: the five above, the two other head dims and DETR's two attentions (its
# encoder's self-attention over 1050 positions, its decoder's 100 object queries against them,
# with the images' padding marked), as --shapes writes them.
TRAINING_SHAPES = ("32,12,197,64;32,12,577,64;32,12,1025,64;8,12,4097,64;8,16,4097,128;"
                   "32,16,257,80;32,8,1050,32;32,8,100,32,1050@detr")
FIELDS = ["batch", "heads", "tokens", "head_dim", "implementation", "median_us", "low_us",
          "high_us", "windows", "tflops", "vs_flash", "vs_cudnn", "note"]
TRAINING_FIELDS = ["batch", "heads", "tokens", "kv_tokens", "head_dim", "key_padding", "dtype",
                   "path", "implementation", "windows_median_us", "windows_low_us",
                   "windows_high_us", "flushed_median_us", "flushed_low_us", "flushed_high_us",
                   "vs_cudnn_windows", "vs_cudnn_flushed", "vs_flash_windows", "vs_flash_flushed",
                   "note"]
# A bf16 run's CSV has one more column, dtype, last: the fp16 file keeps its columns.
IMPLEMENTATIONS = ("steps", "flash", "cudnn")  # --training's, in the order of the rows
PATHS = ("backward", "forward+backward")
DEVICE = "cuda"  # where the tensors go (a test runs the script's logic on the CPU)

# One shape of --shapes: N_k = tokens for self-attention; key_padding None (no mask), "detr" or
# a fraction of the keys padded.
Case = collections.namedtuple("Case", "batch heads tokens head_dim kv_tokens key_padding")

SHAPES_HELP = """shapes separated by ';', each B,H,N,D[,N_k][@PADDING]: N_k keys (default N) and a
key-padding mask, PADDING one of 'none', 'detr' or a fraction F in [0, 1). 'detr': the N_k keys
are an image's feature map of rows x cols (the factors of N_k nearest DETR's 800 x 1333 aspect:
25 x 42 for 1050), flattened row by row as DETR does, and batch element b holds an image of
ceil(rows * h) x ceil(cols * w) in its top-left corner, (h, w) going round DETR_IMAGES (full;
0.8 high; 0.7 wide; 0.6 high and 0.9 wide), the rest of the map padding (about a quarter of the
keys); F: every batch element pads its last round(F * N_k) keys (at least one key kept).
Entries without @ take --key-padding. Default: the five of chapter 15; with --training the
eight of issue #31 (TRAINING_SHAPES)."""
DETR_ASPECT = 800 / 1333  # DETR's images: shorter side 800, longer at most 1333
DETR_IMAGES = ((1.0, 1.0), (0.8, 1.0), (1.0, 0.7), (0.6, 0.9))  # (height, width) of the map


def padding_spec(text):
    """--key-padding's and @PADDING's value: None (no mask), "detr" or a fraction in [0, 1)."""
    text = text.strip().lower()
    if text in ("", "none"):
        return None
    if text == "detr":
        return "detr"
    try:
        fraction = float(text)
    except ValueError:
        raise ValueError(f"key padding '{text}': neither 'none', 'detr' nor a fraction") from None
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"key padding {text}: a fraction of the keys must be in [0, 1)")
    return fraction


def padding_name(padding):
    """How the CSV names a padding: "none", "detr", "0.25"."""
    return "none" if padding is None else str(padding)


def parse_shapes(text, key_padding=None):
    """--shapes as Cases (see SHAPES_HELP); ValueError, naming the entry, for a malformed one."""
    cases = []
    for entry in (part.strip() for part in text.split(";")):
        if not entry:
            continue
        sizes, at, padding = entry.partition("@")
        try:
            numbers = [int(x) for x in sizes.split(",")]
        except ValueError:
            raise ValueError(f"shape '{entry}': sizes must be integers, B,H,N,D[,N_k]") from None
        if len(numbers) not in (4, 5) or min(numbers) < 1:
            raise ValueError(f"shape '{entry}': give B,H,N,D or B,H,N,D,N_k, each at least 1")
        batch, heads, tokens, head_dim = numbers[:4]
        kv_tokens = numbers[4] if len(numbers) == 5 else tokens
        try:
            mask = padding_spec(padding) if at else key_padding
        except ValueError as error:
            raise ValueError(f"shape '{entry}': {error}") from None
        cases.append(Case(batch, heads, tokens, head_dim, kv_tokens, mask))
    return cases


def detr_grid(keys):
    """(rows, cols) of a feature map of `keys` positions: the factors nearest DETR's aspect."""
    return min(((rows, keys // rows) for rows in range(1, keys + 1) if keys % rows == 0),
               key=lambda grid: (abs(grid[0] / grid[1] - DETR_ASPECT), grid[0]))


def padded_keys(padding, batch, keys):
    """The key-padding mask as lists of bools, [batch][keys], True where a key is padding
    (SHAPES_HELP); None for no mask. Every batch element keeps at least its first key."""
    if padding is None:
        return None
    if padding == "detr":
        rows, cols = detr_grid(keys)
        mask = []
        for b in range(batch):
            high, wide = DETR_IMAGES[b % len(DETR_IMAGES)]
            height, width = max(1, math.ceil(rows * high)), max(1, math.ceil(cols * wide))
            mask.append([y >= height or x >= width for y in range(rows) for x in range(cols)])
        return mask
    kept = keys - min(keys - 1, round(padding * keys))
    return [[j >= kept for j in range(keys)] for _ in range(batch)]


def padded_share(mask):
    """The share of padded keys in a mask of padded_keys (0 for None)."""
    if not mask:
        return 0.0
    return sum(map(sum, mask)) / (len(mask) * len(mask[0]))


def parse_arguments(argv=None):
    """The parsed arguments and the Cases to measure; argparse's error (SystemExit 2) for a
    malformed shape, a negative --warm-s, or what only --training measures asked without it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", required=True)
    parser.add_argument("--windows", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10, help="calls per window")
    parser.add_argument("--warm-s", type=float, default=2.0,
                        help="seconds of warm-up, every implementation in turn, before the windows")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    parser.add_argument("--causal", action="store_true", help="causal attention (top left)")
    parser.add_argument("--shapes", default=None, help=SHAPES_HELP)
    parser.add_argument("--key-padding", default="none", metavar="none|detr|F",
                        help="the key-padding mask of every --shapes entry that names none: "
                             "'detr' (images of a batch padded to one feature map, about a "
                             "quarter of the keys) or a fraction F of each batch element's last "
                             "keys (SHAPES_HELP in the script says exactly which); --training only")
    parser.add_argument("--training", action="store_true",
                        help="every implementation through autograd, backward alone and forward + "
                             "backward, by windows and with the L2 flushed")
    parser.add_argument("--forward-step", default="v8", help="the steps' forward with --training")
    parser.add_argument("--flushed-calls", type=int, default=50,
                        help="calls timed one by one with the L2 flushed (--training)")
    args = parser.parse_args(argv)
    if args.warm_s < 0:
        parser.error(f"--warm-s: {args.warm_s} is negative")
    try:
        default_padding = padding_spec(args.key_padding)
        if args.shapes is not None:
            cases = parse_shapes(args.shapes, default_padding)
        elif args.training:
            cases = parse_shapes(TRAINING_SHAPES)
        else:
            cases = [Case(*shape, shape[2], default_padding) for shape in SHAPES]
    except ValueError as error:
        parser.error(f"--shapes: {error}" if "shape" in str(error) else f"--key-padding: {error}")
    if not cases:
        parser.error("--shapes: no shape given")
    if not args.training:
        special = [case for case in cases if case.kv_tokens != case.tokens or case.key_padding]
        if special:
            parser.error("keys of another count (N_k) and --key-padding are measured with "
                         f"--training only (asked: {describe(special[0])})")
    return args, cases


def describe(case):
    """(32, 8, 100x1050, 32) with its padding, for messages."""
    keys = f"x{case.kv_tokens}" if case.kv_tokens != case.tokens else ""
    padded = f", key padding {case.key_padding}" if case.key_padding is not None else ""
    return f"({case.batch}, {case.heads}, {case.tokens}{keys}, {case.head_dim}{padded})"


def main(argv=None):
    args, cases = parse_arguments(argv)
    shapes = [case[:4] for case in cases]  # without --training: B, H, N, D (N_k = N, no mask)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attention_steps import torch_op
    if not torch.cuda.is_available():
        print("torch sees no CUDA device: nothing measured", file=sys.stderr)
        return 77
    attention = torch_op.load()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.half
    backward = torch.ops.attention_steps.attention_backward
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}", flush=True)
    out = open(args.csv, "w", newline="")
    if args.training:
        return training(torch, F, sdpa_kernel, SDPBackend, args, cases, dtype, out)
    writer = csv.DictWriter(out, fieldnames=FIELDS + (["dtype"] if args.dtype == "bf16" else []))
    writer.writeheader()
    for shape in shapes:
        batch, heads, tokens, head_dim = shape
        torch.manual_seed(0)
        q, k, v, d_o = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))
        causal = "top-left" if args.causal else None
        o, lse = attention(q, k, v, "v8" if args.causal else "v6", None, None, True, causal)

        def v9():
            return backward(d_o, q, k, v, o, lse, "v9")

        def v10():
            return backward(d_o, q, k, v, o, lse, "v10", None, False, causal)

        q_view, k_view, v_view = packed_views(torch, q, k, v)
        o_view, d_o_view = (token_major_view(t) for t in (o, d_o))

        def v10_views():
            return backward(d_o_view, q_view, k_view, v_view, o_view, lse, "v10", None, False, causal)

        def eager():
            return backward(d_o, q, k, v, o, lse, "eager_backward")

        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

        def sdpa_backward(backend):
            with sdpa_kernel(backend):
                result = F.scaled_dot_product_attention(*leaves, is_causal=args.causal)

            def run():
                return torch.autograd.grad(result, leaves, d_o, retain_graph=True)
            return run

        hopper = torch.cuda.get_device_capability() == (9, 0)  # v10 runs there alone
        calls = {**({"v9": v9} if not args.causal else {}),
                 **({"v10": v10, "v10_views": v10_views} if hopper else {}),
                 **({"eager": eager} if args.dtype == "fp16" and not args.causal else {}),
                 "flash": sdpa_backward(SDPBackend.FLASH_ATTENTION),
                 "cudnn": sdpa_backward(SDPBackend.CUDNN_ATTENTION)}
        # The check: the library's two against SDPA's math backend in fp32.
        want = math_gradients(torch, F, sdpa_kernel, SDPBackend, q, k, v, d_o, args.causal)
        errors = {name: relative_errors(calls[name](), want)
                  for name in ("v9", "v10", "v10_views", "eager") if name in calls}
        measuring.warm_up(torch, list(calls.values()), args.warm_s)
        windows = measuring.rotated_windows(torch, calls, args.windows, args.calls)
        medians = {name: statistics.median(values) for name, values in windows.items()}
        pairs = tokens * (tokens + 1) / 2.0 if args.causal else float(tokens) * tokens
        flops = 2.5 * 4.0 * batch * heads * pairs * head_dim
        for name, values in windows.items():
            row = {"batch": batch, "heads": heads, "tokens": tokens, "head_dim": head_dim,
                   "implementation": name, "median_us": f"{medians[name]:.1f}",
                   "low_us": f"{min(values):.1f}", "high_us": f"{max(values):.1f}",
                   "windows": len(values), "tflops": f"{flops / medians[name] / 1e6:.1f}",
                   "vs_flash": f"{medians[name] / medians['flash']:.3f}",
                   "vs_cudnn": f"{medians[name] / medians['cudnn']:.3f}",
                   "note": ("dQ, dK, dV relative error vs fp32 math: " +
                            ", ".join(f"{e:.2e}" for e in errors[name])) if name in errors else ""}
            if name == "v10_views":
                row["note"] = (f"{medians[name] / medians['v10']:.3f} of v10's time on contiguous "
                               f"tensors; {row['note']}")
            if args.dtype == "bf16":
                row["dtype"] = "bf16"
            writer.writerow(row)
            out.flush()
            print(", ".join(f"{key}={value}" for key, value in row.items() if value != ""),
                  flush=True)
        calls = leaves = None  # (not del: the closures above name leaves)
        torch.cuda.empty_cache()
    return 0


def packed_views(torch, q, k, v):
    """The values of q, k and v ([B, H, N, D]) as views of one [B, N, 3, H, D] tensor, as a
    packed projection leaves them: [B, H, N, D] views sharing one set of strides."""
    packed = torch.stack([t.transpose(1, 2) for t in (q, k, v)], dim=2)
    return tuple(packed[:, :, i].transpose(1, 2) for i in range(3))


def token_major_view(t):
    """The values of t ([B, H, N, D]) as a view of [B, N, H, D] memory, as step 8 writes O and
    the out-projection's gradient hands dO over."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def math_gradients(torch, F, sdpa_kernel, SDPBackend, q, k, v, d_o, causal, attn_mask=None):
    """dQ, dK, dV by SDPA's math backend in fp32, what the library's gradients are checked against
    (attn_mask: SDPA's boolean mask, True where a query sees a key; it then holds any causal mask)."""
    exact = [t.detach().float().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH):
        return torch.autograd.grad(
            F.scaled_dot_product_attention(*exact, attn_mask=attn_mask,
                                           is_causal=causal and attn_mask is None),
            exact, d_o.float())


def relative_errors(got, want):
    """The relative Frobenius error of each gradient."""
    return [((g.float() - w).norm() / w.norm()).item() for g, w in zip(got, want)]


def sdpa_attn_mask(torch, mask, tokens, kv_tokens, causal):
    """SDPA's boolean attn_mask for a key-padding mask (bool [B, N_k] on the device, True:
    padding) and the causal mask (top left), True where query i sees key j: [B, 1, N|1, N_k]; None
    without a key-padding mask (SDPA then takes is_causal)."""
    if mask is None:
        return None
    attend = ~mask[:, None, None, :]
    if causal:
        rows = torch.arange(tokens, device=mask.device)[:, None]
        attend = attend & (torch.arange(kv_tokens, device=mask.device)[None, :] <= rows)
    return attend


def refusal_reason(error, caught):
    """One line for an implementation that refused a call: the error's first line and the warnings
    torch gave on the way (SDPA says there why a backend was not used)."""
    said = []
    for warning in caught:
        text = re.sub(r"\s*\(Triggered internally at [^)]*\)", "", str(warning.message)).strip()
        if text and text not in said:
            said.append(text.splitlines()[0])
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return "; ".join([first] + said)


def steps_attention(q, k, v, step, causal, key_padding_mask):
    """The steps' forward through autograd (a test stands in for it)."""
    import attention_steps
    return attention_steps.attention(q, k, v, step=step, causal=causal,
                                     key_padding_mask=key_padding_mask)


def backward_step_name(case, dtype_name, causal):
    """The backward step the library chooses for the case on the current GPU, as autograd will,
    or why none does."""
    import attention_steps
    try:
        return attention_steps.choose_step(
            case[:4], backward=True, kv_tokens=case.kv_tokens, dtype=dtype_name,
            key_padding_mask=case.key_padding is not None, causal=causal)
    except attention_steps.AttentionStepsError as refused:
        return f"none ({refused})"


def training_rows(case, dtype_name, windows, flushed, refused, notes):
    """The rows of one case: for each path and implementation, the medians and extremes (us) of
    its windows and flushed calls with the ratios to cuDNN and FlashAttention-2 where those ran,
    or, for an implementation in `refused` (name -> reason), empty numbers and the reason.
    windows and flushed: {(path, name): [us, ...]}; notes: name -> the note of a measured row."""
    rows = []
    for path in PATHS:
        median = {name: (statistics.median(windows[(path, name)]),
                         statistics.median(flushed[(path, name)]))
                  for name in IMPLEMENTATIONS if (path, name) in windows}
        for name in IMPLEMENTATIONS:
            row = {"batch": case.batch, "heads": case.heads, "tokens": case.tokens,
                   "kv_tokens": case.kv_tokens, "head_dim": case.head_dim,
                   "key_padding": padding_name(case.key_padding), "dtype": dtype_name,
                   "path": path, "implementation": name}
            row.update({field: "" for field in TRAINING_FIELDS if field not in row})
            if name not in median:
                row["note"] = f"refused: {refused.get(name, 'not measured')}"
                rows.append(row)
                continue
            w, f = windows[(path, name)], flushed[(path, name)]
            row.update({"windows_median_us": f"{median[name][0]:.1f}", "windows_low_us": f"{min(w):.1f}",
                        "windows_high_us": f"{max(w):.1f}", "flushed_median_us": f"{median[name][1]:.1f}",
                        "flushed_low_us": f"{min(f):.1f}", "flushed_high_us": f"{max(f):.1f}",
                        "note": notes.get(name, "")})
            for base in ("cudnn", "flash"):
                for i, method in enumerate(("windows", "flushed")):
                    if base in median:
                        row[f"vs_{base}_{method}"] = f"{median[name][i] / median[base][i]:.3f}"
            rows.append(row)
    return rows


def training(torch, F, sdpa_kernel, SDPBackend, args, cases, dtype, out):
    """--training: the rows of TRAINING_FIELDS, two paths x three implementations a case; an
    implementation that refuses a case has its rows all the same, with the reason."""
    writer = csv.DictWriter(out, fieldnames=TRAINING_FIELDS)
    writer.writeheader()
    flush = torch.empty(measuring.FLUSH_BYTES, dtype=torch.uint8, device=DEVICE)
    causal = "top-left" if args.causal else None
    for case in cases:
        torch.manual_seed(0)
        q, d_o = (torch.randn(case[:4], device=DEVICE, dtype=dtype) for _ in range(2))
        kv_shape = (case.batch, case.heads, case.kv_tokens, case.head_dim)
        k, v = (torch.randn(kv_shape, device=DEVICE, dtype=dtype) for _ in range(2))
        padded = padded_keys(case.key_padding, case.batch, case.kv_tokens)
        mask = None if padded is None else torch.tensor(padded, dtype=torch.bool, device=DEVICE)
        attend = sdpa_attn_mask(torch, mask, case.tokens, case.kv_tokens, args.causal)

        def steps_forward(*inputs):
            return steps_attention(*inputs, args.forward_step, causal, mask)

        def sdpa_forward(backend):
            def forward(*inputs):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(
                        *inputs, attn_mask=attend, is_causal=args.causal and attend is None)
            return forward

        forwards = {"steps": steps_forward, "flash": sdpa_forward(SDPBackend.FLASH_ATTENTION),
                    "cudnn": sdpa_forward(SDPBackend.CUDNN_ATTENTION)}
        calls, refused, steps_output = {}, {}, None
        for name, forward in forwards.items():
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    result = forward(*leaves)
                    torch.autograd.grad(result, leaves, d_o, retain_graph=True)
                except (ValueError, NotImplementedError, RuntimeError) as error:  # not served
                    refused[name] = refusal_reason(error, caught)
                    print(f"{describe(case)} {name} refused: {refused[name]}", flush=True)
                    continue
            if name == "steps":
                steps_output = result
            calls[("backward", name)] = (
                lambda leaves=leaves, result=result: torch.autograd.grad(result, leaves, d_o, retain_graph=True))
            calls[("forward+backward", name)] = (
                lambda leaves=leaves, forward=forward: torch.autograd.grad(forward(*leaves), leaves, d_o))
        notes = {}
        share = f"{100 * padded_share(padded):.1f}% of keys padded ({padding_name(case.key_padding)}); " \
            if padded is not None else ""
        if steps_output is not None:
            want = math_gradients(torch, F, sdpa_kernel, SDPBackend, q, k, v, d_o, args.causal, attend)
            errors = relative_errors(calls[("backward", "steps")](), want)
            notes["steps"] = (f"{share}forward {args.forward_step} (O strides {tuple(steps_output.stride())}), "
                              f"backward {backward_step_name(case, args.dtype, causal)}, the "
                              "library's choice; dQ, dK, dV relative error vs fp32 math: " +
                              ", ".join(f"{e:.2e}" for e in errors))
        for name in ("flash", "cudnn"):
            notes[name] = share.rstrip("; ")

        measuring.warm_up(torch, list(calls.values()), args.warm_s)
        windows = measuring.rotated_windows(torch, calls, args.windows, args.calls) if calls else {}
        flushed = {key: [1000 * ms for ms in measuring.flushed_call_ms(torch, run, args.flushed_calls, flush)]
                   for key, run in calls.items()}
        for row in training_rows(case, args.dtype, windows, flushed, refused, notes):
            writer.writerow(row)
            out.flush()
            print(", ".join(f"{key}={value}" for key, value in row.items() if value != ""), flush=True)
        del calls, steps_output
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
