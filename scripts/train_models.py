#!/usr/bin/env python3
"""Training through attention_steps.use_steps() beside stock PyTorch (#31): does a model train the
same when the steps serve its attention, forward and backward?

  vit_huge  timm's vit_huge_patch14_224 (pretrained=False, 1000 classes), 32 blocks of 16 heads
            of D = 80, N = 257 tokens at --vit-image-size 224; the batch is reduced to --batch
            (8) from the batches ViT-H trains with, so that four runs fit in minutes. Loss:
            cross-entropy on --batches (16) fixed batches of seeded random images and labels,
            cycled: the model memorises them over the epochs, so the loss falls (with 4 batches it
            fell to 1e-5 within 20 steps, and the rest of the run compared nothing).
  detr      transformers' DetrForObjectDetection built in code (DetrConfig: timm's resnet18
            backbone, use_pretrained_backbone=False, attn_implementation="sdpa", dropout 0.0 so
            that no dropout mask depends on the order of random draws; transformers' own ResNet
            of the same depth where the installed DetrConfig takes no timm backbone): 6 encoder
            layers of 8 heads of D = 32 over the feature map's positions (16 x 24 = 384 at the
            --detr-canvas 512x768), 6 decoder layers (self-attention of 100 object queries,
            cross-attention from them to the positions), each batch's images of mixed sizes
            padded to the canvas, so the key-padding mask matters. Loss: cross-entropy of the
            class logits against fixed random classes plus the L1 distance of the boxes to fixed
            random boxes, for every query (no Hungarian matching, whose discrete choices would
            make the losses jump; and no scipy needed).

Each model is trained --steps (100) steps from the same weights (built once from --seed) on the
same batches, under torch.autocast(bfloat16) with fp32 weights and AdamW, four times:

  stock        PyTorch's own F.scaled_dot_product_attention, its default backend choice;
  stock_again  the same again: the run-to-run difference of stock itself (nondeterministic
               kernels: atomics in convolutions' and attention's backward);
  stock_<alt>  stock with SDPA restricted to --alt-backend (math: PyTorch's reference
               implementation, fp32 inside): the same model and seed with another of PyTorch's
               own attention kernels. Where stock_again is bitwise stock (every kernel
               deterministic), this is the only difference between stock runs there is to
               compare with;
  steps        use_steps(): every call the steps serve runs them (v8 or v6 forward, v10 or v9
               backward, the library's choice), the others PyTorch's (the first step's calls
               are counted and printed, with the reason for each that is not served).

The issue's criterion is that the losses over the steps stay within the difference between two
stock runs of the same seed. Here S = max over steps of |steps - stock| and the band R = max over
steps of the larger of |stock_again - stock| and |stock_<alt> - stock|. The run says whether
S <= R (the criterion read literally) and passes a model when S <= --factor x R (default 2):
a kernel that differs from stock's by its own rounding gives a difference made of two kernels'
rounding errors (about sqrt(2) times one, where stock_<alt>'s math backend adds almost none of
its own), amplified by training the same way, and the maximum of 100 noisy differences
fluctuates from run to run; a wrong gradient (a mask not applied, a padded key's dK) moves the
losses by far more than that. It fails a model whose losses are not finite, or whose band is 0
(nothing to compare with: choose another --alt-backend).

DETR's masks: transformers (the versions whose DETR calls SDPA, through its attention interface
and masking_utils) builds each key-padding mask as a materialised [B, 1, N, N_k] tensor
(masking_utils.sdpa_mask; no mask at all where no image of the batch is padded, which it finds
by reading the mask on the host), whose rows are equal only in value; attention_steps.sdpa
cannot tell it from a general mask without reading it (a device sync) and hands those calls to
PyTorch. --detr-masks views (the default) makes DETR's
create_bidirectional_mask return the same mask as a view, the [B, N_k] padding expand()ed to
[B, 1, N, N_k] (what sdpa_mask does for masks that do not depend on the query), in all four runs
alike, so that the steps serve the masked calls; --detr-masks transformers keeps transformers'
masks (the steps then serve the unmasked calls only).

    python3 scripts/train_models.py [--models vit_huge,detr] [--steps 100] [--csv losses.csv]

Writes one CSV row per model and step: model, step and the loss of each run. Needs torch, the
operator (pip install --no-build-isolation ./python), timm (both models) and transformers
(detr); nothing is downloaded. 70 s on an H200 with the defaults (chapter 14). Exit status: 0
every model passed, 1 one did not, 3 no CUDA device, no operator or a package missing.
"""
import argparse
import contextlib
import csv
import math
import sys
import time

MODELS = ("vit_huge", "detr")
ALT_BACKENDS = ("math", "efficient", "flash", "cudnn")
# Reasons that are the library's answer for this GPU, not sdpa.py's routing (attention_steps.sdpa).
LIBRARY_LIMITS = ("head_dim", "gradient", "cross", "padding", "causal", "tokens")


# ---------------------------------------------------------------- models, inputs and losses

def build_vit_huge(torch, image_size=224, classes=1000):
    """timm's vit_huge_patch14_224 with random weights (timm's own initialisation, from the
    current seed), on the GPU."""
    import timm
    kwargs = dict(pretrained=False, num_classes=classes, img_size=image_size)
    try:
        with torch.device("cuda"):  # initialised on the GPU: seconds rather than a minute
            model = timm.create_model("vit_huge_patch14_224", **kwargs)
    except (RuntimeError, TypeError, NotImplementedError):
        model = timm.create_model("vit_huge_patch14_224", **kwargs).cuda()
    return model


def build_hf_vit(torch, layers=4, classes=10):
    """transformers' ViTForImageClassification from a ViTConfig built here (hidden 384, 6 heads of
    D = 64, 224 px, patches of 16: N = 197), attn_implementation="sdpa", random weights."""
    from transformers import ViTConfig, ViTForImageClassification
    config = ViTConfig(hidden_size=384, num_hidden_layers=layers, num_attention_heads=6,
                       intermediate_size=1536, image_size=224, patch_size=16, num_labels=classes,
                       attn_implementation="sdpa")
    return ViTForImageClassification(config).cuda()


def build_detr(torch, layers=6, classes=10):
    """(transformers' DetrForObjectDetection with random weights, what its backbone is). Raises
    RuntimeError saying why where the installed transformers cannot build one with SDPA."""
    from transformers import DetrConfig, DetrForObjectDetection
    common = dict(encoder_layers=layers, decoder_layers=layers, num_labels=classes, dropout=0.0,
                  attention_dropout=0.0, activation_dropout=0.0, attn_implementation="sdpa")
    tried = []
    try:
        config = DetrConfig(use_timm_backbone=True, backbone="resnet18",
                            use_pretrained_backbone=False, **common)
        return DetrForObjectDetection(config).cuda(), "timm resnet18 (random weights)"
    except Exception as error:  # noqa: BLE001  an older or newer DetrConfig: the other backbone
        tried.append(f"timm resnet18: {type(error).__name__}: {error}")
    try:
        from transformers import ResNetConfig
        backbone = ResNetConfig(depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                                layer_type="basic", out_features=["stage4"])
        config = DetrConfig(use_timm_backbone=False, backbone_config=backbone,
                            use_pretrained_backbone=False, **common)
        return DetrForObjectDetection(config).cuda(), "transformers ResNet-18 (random weights)"
    except Exception as error:  # noqa: BLE001
        tried.append(f"transformers ResNet-18: {type(error).__name__}: {error}")
    raise RuntimeError("transformers built no DETR with attn_implementation='sdpa' here: " +
                       "; ".join(tried))


@contextlib.contextmanager
def detr_padding_masks_as_views(torch):
    """While open, transformers' DETR gets each key-padding mask as a view: its [B, N_k] padding
    expand()ed to [B, 1, N, N_k] (stride 0 over queries), where masking_utils.sdpa_mask
    materialises one row per query. The same values, so PyTorch computes the same; the steps can
    see from the strides alone that it is a key-padding mask. Yields whether there was anything
    to change (an older DETR makes no such call)."""
    from transformers.models.detr import modeling_detr
    original = getattr(modeling_detr, "create_bidirectional_mask", None)
    if original is None:
        yield False
        return

    def as_view(config, *args, **kwargs):
        names = ("inputs_embeds", "attention_mask")  # the positional order of both versions
        given = dict(zip(names, args))
        embeds = kwargs.get("inputs_embeds", kwargs.get("input_embeds", given.get("inputs_embeds")))
        keys = kwargs.get("attention_mask", given.get("attention_mask"))
        if (keys is None or embeds is None or keys.dim() != 2 or kwargs.get("or_mask_function")
                or kwargs.get("and_mask_function") or kwargs.get("past_key_values") is not None
                or getattr(config, "_attn_implementation", None) != "sdpa"):
            return original(config, *args, **kwargs)
        keys = keys.to(device=embeds.device, dtype=torch.bool)  # True: the key takes part
        return keys[:, None, None, :].expand(keys.shape[0], 1, embeds.shape[1], keys.shape[1])

    modeling_detr.create_bidirectional_mask = as_view
    try:
        yield True
    finally:
        modeling_detr.create_bidirectional_mask = original


def image_batches(torch, count, batch, image_size, classes, seed):
    """`count` batches of seeded random images [B, 3, S, S] and labels, on the GPU."""
    generator = torch.Generator().manual_seed(seed + 1)
    return [{"images": torch.randn(batch, 3, image_size, image_size, generator=generator).cuda(),
             "labels": torch.randint(0, classes, (batch,), generator=generator).cuda()}
            for _ in range(count)]


def detr_batches(torch, count, batch, canvas, seed, queries=100, classes=10):
    """`count` DETR batches: seeded random images of mixed sizes (the first of each batch fills
    the canvas, the others 50-85% of each side, so that the last row and column of the feature
    map, a 32nd of the canvas, are padding), zero beyond their size, pixel_mask 1 on each
    image and 0 on its padding, and fixed targets for every query (a class in [0, classes], the
    last being "no object", and a box in (0, 1))."""
    generator = torch.Generator().manual_seed(seed + 2)
    height, width = canvas
    batches = []
    for _ in range(count):
        pixels = torch.zeros(batch, 3, height, width)
        mask = torch.zeros(batch, height, width, dtype=torch.long)
        for i in range(batch):
            h, w = (height, width) if i == 0 else (
                int(height * (0.5 + 0.35 * torch.rand((), generator=generator).item())),
                int(width * (0.5 + 0.35 * torch.rand((), generator=generator).item())))
            pixels[i, :, :h, :w] = torch.randn(3, h, w, generator=generator)
            mask[i, :h, :w] = 1
        batches.append({
            "pixel_values": pixels.cuda(), "pixel_mask": mask.cuda(),
            "classes": torch.randint(0, classes + 1, (batch, queries), generator=generator).cuda(),
            "boxes": (0.1 + 0.8 * torch.rand(batch, queries, 4, generator=generator)).cuda()})
    return batches


def vit_loss(torch, model, batch):
    return torch.nn.functional.cross_entropy(model(batch["images"]).float(), batch["labels"])


def hf_vit_loss(torch, model, batch):
    logits = model(pixel_values=batch["images"]).logits
    return torch.nn.functional.cross_entropy(logits.float(), batch["labels"])


def detr_loss(torch, model, batch):
    out = model(pixel_values=batch["pixel_values"], pixel_mask=batch["pixel_mask"])
    classes = torch.nn.functional.cross_entropy(out.logits.float().flatten(0, 1),
                                                batch["classes"].flatten())
    return classes + torch.nn.functional.l1_loss(out.pred_boxes.float(), batch["boxes"])


# ---------------------------------------------------------------- counting the attention calls

class SdpaCounter:
    """While open, counts the calls of F.scaled_dot_product_attention and of the operator that
    attention_steps.sdpa calls: `reasons` holds, for each SDPA call, None when a step serves it
    (sdpa._why_not's answer, which routes the call) or the reason it goes to PyTorch's;
    `shapes` the call's (query, key, mask) shapes; `operator_calls` counts what reached the
    operator. Install it after use_steps(): it wraps whatever F.scaled_dot_product_attention is."""

    def __init__(self, torch):
        self.torch = torch
        self.reasons, self.shapes, self.operator_calls = [], [], 0

    def __enter__(self):
        from attention_steps import sdpa
        self.sdpa, functional = sdpa, self.torch.nn.functional
        self.inner, self.operator = functional.scaled_dot_product_attention, sdpa._attention_op
        functional.scaled_dot_product_attention = self
        if self.operator is not None:
            def counted(*args, **kwargs):
                self.operator_calls += 1
                return self.operator(*args, **kwargs)
            sdpa._attention_op = counted
        return self

    def __exit__(self, *exc):
        self.torch.nn.functional.scaled_dot_product_attention = self.inner
        self.sdpa._attention_op = self.operator
        return False

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                 *args, **kwargs):
        self.reasons.append(self.sdpa._why_not(query, key, value, attn_mask, dropout_p,
                                               is_causal)[1])
        self.shapes.append((tuple(query.shape), tuple(key.shape),
                            None if attn_mask is None else tuple(attn_mask.shape)))
        return self.inner(query, key, value, attn_mask, dropout_p, is_causal, *args, **kwargs)

    @property
    def served(self):
        return sum(reason is None for reason in self.reasons)

    def fallbacks(self):
        """{reason: how many calls}, for the calls not served."""
        counts = {}
        for reason in self.reasons:
            if reason is not None:
                counts[reason] = counts.get(reason, 0) + 1
        return counts

    def library_limit(self, reason):
        return any(reason.startswith(self.sdpa.FALLBACKS[key]) for key in LIBRARY_LIMITS)

    def summary(self):
        text = f"{len(self.reasons)} attention calls, {self.served} served by the steps"
        for reason, count in self.fallbacks().items():
            text += f"\n    {count} to PyTorch's: {reason}"
        return text


# ---------------------------------------------------------------- training

def train(torch, model, initial, batches, loss_fn, steps, lr, *, backend=None, counter=None):
    """Per-step losses (floats) of `steps` AdamW steps from the weights `initial` (a state_dict),
    under autocast(bfloat16), SDPA restricted to `backend` when given. `counter` (an SdpaCounter,
    not yet open) counts the first step's attention calls."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    model.load_state_dict(initial)
    model.train()
    parameters = [p for p in model.parameters() if p.requires_grad]
    for p in parameters:
        p.grad = None
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.05)
    restricted = (lambda: sdpa_kernel(getattr(SDPBackend, backend.upper()))) if backend else \
        contextlib.nullcontext
    losses = []
    for step in range(steps):
        batch = batches[step % len(batches)]
        counting = counter if counter is not None and step == 0 else contextlib.nullcontext()
        with restricted(), counting:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(torch, model, batch)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return torch.stack(losses).float().cpu().tolist()


def compare(runs, alt, factor):
    """The verdict on one model's runs ({name: losses}): the differences, the band, pass or not."""
    stock = runs["stock"]

    def largest_difference(name):
        return max(abs(a - b) for a, b in zip(runs[name], stock))

    finite = all(math.isfinite(x) for losses in runs.values() for x in losses)
    same = largest_difference("stock_again")
    other = largest_difference(f"stock_{alt}") if alt else 0.0
    steps = largest_difference("steps")
    band = max(same, other)
    means = {f"mean_{name}": sum(abs(a - b) for a, b in zip(runs[name], stock)) / len(stock)
             for name in runs if name != "stock"}
    return {"finite": finite, "stock_again": same, f"stock_{alt}": other, "steps": steps,
            "band": band, "bitwise_again": runs["stock_again"] == stock,
            "within": finite and steps <= band, "passed": finite and band > 0 and steps <= factor * band,
            **means}


def model_setup(torch, name, args):
    """(model, batches, loss function, learning rate, description) for one of MODELS."""
    if name == "vit_huge":
        model = build_vit_huge(torch, args.vit_image_size)
        batches = image_batches(torch, args.batches, args.batch, args.vit_image_size, 1000,
                                args.seed)
        return model, batches, vit_loss, 5e-5, (
            f"timm vit_huge_patch14_224, {args.vit_image_size} px, batch {args.batch}")
    model, backbone = build_detr(torch)
    batches = detr_batches(torch, args.batches, args.batch, args.detr_canvas, args.seed)
    return model, batches, detr_loss, 1e-4, (
        f"transformers DetrForObjectDetection, {backbone}, canvas "
        f"{args.detr_canvas[0]}x{args.detr_canvas[1]}, batch {args.batch}, masks: {args.detr_masks}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), type=lambda t: t.split(","))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batches", type=int, default=16, help="distinct batches, cycled")
    parser.add_argument("--vit-image-size", type=int, default=224)
    parser.add_argument("--detr-canvas", default="512x768",
                        type=lambda t: tuple(int(x) for x in t.split("x")))
    parser.add_argument("--detr-masks", choices=("views", "transformers"), default="views")
    parser.add_argument("--alt-backend", choices=ALT_BACKENDS + ("none",), default="math",
                        help="the SDPA backend of the run stock_<alt> (none: no such run)")
    parser.add_argument("--factor", type=float, default=2.0,
                        help="pass when max |steps - stock| <= factor x the stock runs' band")
    parser.add_argument("--csv", help="per-step losses, one row per model and step")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    alt = None if args.alt_backend == "none" else args.alt_backend

    import importlib.util
    missing = [package for package in ("torch", "timm") + (("transformers",) if "detr" in args.models else ())
               if importlib.util.find_spec(package) is None]
    if missing:
        print(f"{', '.join(missing)} not installed: needs torch, timm and transformers (detr)",
              file=sys.stderr)
        return 3
    import torch
    from attention_steps import sdpa, torch_op
    import measuring  # beside this script (imported here: the tests load this file from elsewhere)
    why_not = measuring.cannot_run(torch, torch_op, "trained")
    if why_not:
        print(why_not, file=sys.stderr)
        return 3
    started = time.time()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.steps} steps, seed "
          f"{args.seed}, bf16 autocast, runs: stock, stock_again"
          f"{f', stock_{alt}' if alt else ''}, steps", flush=True)
    names = ["stock", "stock_again"] + ([f"stock_{alt}"] if alt else []) + ["steps"]
    rows, failed = [], False
    for name in args.models:
        masks = detr_padding_masks_as_views(torch) if name == "detr" and args.detr_masks == "views" \
            else contextlib.nullcontext()
        with masks:
            torch.manual_seed(args.seed)
            try:
                model, batches, loss_fn, lr, description = model_setup(torch, name, args)
            except RuntimeError as error:
                print(f"{name}: not built: {error}", flush=True)
                failed = True
                continue
            initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
            print(f"\n{name}: {description}", flush=True)
            runs, served = {}, 0
            for run in names:
                since = time.time()
                torch.manual_seed(args.seed)
                counter = None
                if run == "steps":
                    sdpa.use_steps()
                    counter = SdpaCounter(torch)
                try:
                    runs[run] = train(torch, model, initial, batches, loss_fn, args.steps, lr,
                                      backend=alt if run == f"stock_{alt}" else None,
                                      counter=counter)
                finally:
                    sdpa.use_steps(False)
                print(f"  {run:12s} first loss {runs[run][0]:.5f}, last {runs[run][-1]:.5f} "
                      f"({time.time() - since:.1f} s)", flush=True)
                if counter is not None:
                    print("  steps' first training step: " + counter.summary().replace("\n", "\n  "),
                          flush=True)
                    served = counter.served
            del model, initial, batches
            torch.cuda.empty_cache()
        verdict = compare(runs, alt, args.factor)
        if not served:  # the steps ran nothing: the runs compare stock with stock
            print(f"  the steps served none of {name}'s attention calls: nothing to compare "
                  "(FAILED)", flush=True)
            verdict["passed"] = False
        failed |= not verdict["passed"]
        reference = f"stock_{alt}" if alt else "stock_again"
        print(f"  max |stock_again - stock| = {verdict['stock_again']:.3e} (mean "
              f"{verdict['mean_stock_again']:.3e})"
              f"{' (bitwise the same run)' if verdict['bitwise_again'] else ''}", flush=True)
        if alt:
            print(f"  max |{reference} - stock| = {verdict[reference]:.3e} (mean "
                  f"{verdict['mean_' + reference]:.3e})", flush=True)
        ratio = verdict["steps"] / verdict["band"] if verdict["band"] > 0 else math.inf
        print(f"  max |steps - stock| = {verdict['steps']:.3e} (mean {verdict['mean_steps']:.3e}): "
              f"{ratio:.2f} x the stock runs' band {verdict['band']:.3e}; within it: "
              f"{'yes' if verdict['within'] else 'no'}; within {args.factor:g} x: "
              f"{'PASSED' if verdict['passed'] else 'FAILED'}"
              f"{'' if verdict['finite'] else ' (losses not finite)'}", flush=True)
        for step in range(args.steps):
            rows.append({"model": name, "step": step, **{run: f"{runs[run][step]:.6f}" for run in names}})
    if args.csv:
        with open(args.csv, "w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=["model", "step"] + names)
            writer.writeheader()
            writer.writerows(rows)
        print(f"\nper-step losses: {args.csv}")
    print(f"{time.time() - started:.0f} s in all")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
