#!/usr/bin/env python3
"""A ViT that takes images of several sizes in one batch: their tokens packed, no padding.

torchvision's vit_b_16 (seeded random weights, fp16, eval, inference mode) run on a list of
images of different sizes (sides multiples of 16): each image is cut into patches by the model's
own convolution, gets the class token and the position embedding resized to its grid (bicubic, as
models fine-tuned at another resolution do), and the tokens of all images are packed into one
[total, E] tensor. Every encoder block then runs on the packed tokens: LayerNorm, the MLP and
the projections work token by token and need no change; attention runs once for all images with
attention_steps.varlen_attention (each image attending within itself). The class token of each
image gives its logits.

Checked against the same blocks run image by image with F.scaled_dot_product_attention (the
attention path alone differs): the largest error against the output's size, with a tolerance of
the fp16 noise the per-image forward shows against itself in fp32 (3x, as
scripts/vit_end_to_end.py derives). Timed (CUDA events, median of 20 after warm-up): packed, and
the per-image loop. The comparison is on the encoder's output, every token of every image
(torchvision initialises the classification head to zeros, so random-weight logits are all 0).

Then one training step's gradients: a fixed random projection of the encoder's output, summed,
back through all twelve blocks (the packed path's attention backward is the backward step that
takes packed sequences), to the weights of the patch convolution and of the first block's
attention projection; checked the same way against the per-image path (fp16 against its own
fp32 noise, 3x), and the forward + backward timed both ways (median of 10).

    python3 scripts/varlen_vit.py [--sides 224,384,512,224,640] [--out varlen_vit.csv]
"""
import argparse
import sys

import measuring

COLUMNS = ["gpu", "sides", "total_tokens", "packed_ms", "per_image_ms", "max_error",
           "reference_noise", "tolerance", "passed", "train_packed_ms", "train_per_image_ms",
           "grad_max_error", "grad_reference_noise", "grad_tolerance", "grad_passed"]


def image_tokens(model, image, F, torch):
    """One image's tokens [1 + h w, E]: patches, the class token, the position embedding resized
    to its h x w grid."""
    x = model.conv_proj(image[None])  # [1, E, h, w]
    h, w = x.shape[-2:]
    x = x.flatten(2).transpose(1, 2)
    position = model.encoder.pos_embedding  # [1, 1 + g g, E] for the g x g grid it was made for
    grid = int(round((position.shape[1] - 1) ** 0.5))
    grid_position = position[:, 1:].reshape(1, grid, grid, -1).permute(0, 3, 1, 2)
    if (h, w) != (grid, grid):
        grid_position = F.interpolate(grid_position.float(), size=(h, w), mode="bicubic",
                                      align_corners=False).to(x.dtype)
    grid_position = grid_position.permute(0, 2, 3, 1).reshape(1, h * w, -1)
    return torch.cat([model.class_token + position[:, :1], x + grid_position], dim=1)[0]


def packed_self_attention(mha, x, attend):
    """nn.MultiheadAttention's projections around `attend(q, k, v)` on packed [total, H, D]."""
    heads, width = mha.num_heads, mha.embed_dim
    qkv = (x @ mha.in_proj_weight.t() + mha.in_proj_bias).unflatten(-1, (3, heads, width // heads))
    q, k, v = qkv.unbind(1)  # views of one projection, read in place by a step that takes them
    return mha.out_proj(attend(q, k, v).flatten(1))


def forward(model, images, attend_packed, F, torch):
    """The encoder's output [total, E] (every image's tokens, packed) and the logits
    [len(images), classes] from each image's class token."""
    tokens = [image_tokens(model, image, F, torch) for image in images]
    lengths = [t.shape[0] for t in tokens]
    starts = torch.tensor([0] + lengths, device=tokens[0].device).cumsum(0)
    x = torch.cat(tokens)
    attend = attend_packed(starts.to(torch.int32), lengths)
    for block in model.encoder.layers:
        x = x + packed_self_attention(block.self_attention, block.ln_1(x), attend)
        x = x + block.mlp(block.ln_2(x))
    x = model.encoder.ln(x)
    return x, model.heads(x[starts[:-1]])  # logits from each image's class token


def median_ms(torch, run, calls):
    """The median milliseconds of `calls` calls of run(), after a second of warm-up."""
    measuring.warm_up(torch, [run], seconds=1.0)
    times = sorted(measuring.each_call_ms(torch, [run] * calls))
    return times[len(times) // 2]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", default="224,384,512,224,640,288,1024,224")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch
    import torch.nn.functional as F
    import torchvision

    import attention_steps as steps
    sides = [int(side) for side in args.sides.split(",")]
    torch.manual_seed(0)
    model = torchvision.models.vit_b_16().cuda().eval()
    images = [torch.randn(3, side, side, device="cuda") for side in sides]

    def packed(sums, lengths):  # the steps: one call for every image
        longest = max(lengths)
        return lambda q, k, v: steps.varlen_attention(q, k, v, sums, sums, longest, longest,
                                                      check_lengths=False)[0]

    def per_image(sums, lengths):  # PyTorch's: one SDPA call per image
        def attend(q, k, v):
            outputs = []
            for start, n in zip(sums.tolist(), lengths):
                pieces = [t[start:start + n].transpose(0, 1)[None] for t in (q, k, v)]
                outputs.append(F.scaled_dot_product_attention(*pieces)[0].transpose(0, 1))
            return torch.cat(outputs)
        return attend

    # A training step's gradients (this module's docstring) and its time.
    weights = [model.conv_proj.weight, model.encoder.layers[0].self_attention.in_proj_weight]
    probe = None

    def train_step(attend):
        model.zero_grad(set_to_none=True)
        output = forward(model, images, attend, F, torch)[0]
        (output.float() * probe).sum().backward()
        return torch.cat([weight.grad.double().flatten() for weight in weights])

    with torch.inference_mode():
        exact = forward(model, images, per_image, F, torch)[0].double()  # fp32: the near-exact one
    probe = torch.randn(exact.shape, device="cuda") / exact.shape[0] ** 0.5
    exact_grad = train_step(per_image)
    model.half()
    images = [image.half() for image in images]
    reference_grad, ours_grad = train_step(per_image), train_step(packed)
    grad_scale = exact_grad.abs().max().item()
    grad_noise = (reference_grad - exact_grad).abs().max().item() / grad_scale
    grad_error = (ours_grad - reference_grad).abs().max().item() / grad_scale
    grad_tolerance = 3 * max(grad_noise, 2.0 ** -11)
    train_timings = {name: median_ms(torch, lambda attend=attend: train_step(attend), 10)
                     for name, attend in (("packed", packed), ("per_image", per_image))}
    with torch.inference_mode():
        reference = forward(model, images, per_image, F, torch)[0].double()
        ours, logits = forward(model, images, packed, F, torch)
        ours = ours.double()
        assert logits.shape == (len(images), 1000)
        scale = exact.abs().max().item()
        noise = (reference - exact).abs().max().item() / scale
        error = (ours - reference).abs().max().item() / scale
        tolerance = 3 * max(noise, 2.0 ** -11)
        timings = {name: median_ms(torch, lambda attend=attend: forward(model, images, attend, F, torch), 20)
                   for name, attend in (("packed", packed), ("per_image", per_image))}
    total = sum((side // 16) ** 2 + 1 for side in sides)
    passed = error <= tolerance and grad_error <= grad_tolerance
    print(f"{torch.cuda.get_device_name()}: {len(sides)} images, sides {args.sides}, {total} tokens")
    print(f"encoder output: max error {error:.2e} of its scale against the per-image forward "
          f"(fp16 noise {noise:.2e}, tolerance {tolerance:.2e}): {'PASSED' if passed else 'FAILED'}")
    print(f"forward: packed {timings['packed']:.2f} ms, image by image {timings['per_image']:.2f} ms")
    print(f"gradients: max error {grad_error:.2e} of their scale against the per-image step (fp16 "
          f"noise {grad_noise:.2e}, tolerance {grad_tolerance:.2e})")
    print(f"forward + backward: packed {train_timings['packed']:.2f} ms, image by image "
          f"{train_timings['per_image']:.2f} ms")
    if args.out:
        measuring.write_csv(args.out, COLUMNS, [{
            "gpu": torch.cuda.get_device_name(), "sides": args.sides, "total_tokens": total,
            "packed_ms": f"{timings['packed']:.3f}", "per_image_ms": f"{timings['per_image']:.3f}",
            "max_error": f"{error:.3e}", "reference_noise": f"{noise:.3e}",
            "tolerance": f"{tolerance:.3e}", "passed": int(error <= tolerance),
            "train_packed_ms": f"{train_timings['packed']:.3f}",
            "train_per_image_ms": f"{train_timings['per_image']:.3f}",
            "grad_max_error": f"{grad_error:.3e}", "grad_reference_noise": f"{grad_noise:.3e}",
            "grad_tolerance": f"{grad_tolerance:.3e}", "grad_passed": int(grad_error <= grad_tolerance)}])
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
