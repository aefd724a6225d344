#!/usr/bin/env python3
"""Whole models training through attention_steps.use_steps() (#31): one training step (forward and
backward, torch.autocast(bfloat16)) of each model with random weights, nothing downloaded,
counting the attention calls it makes (F.scaled_dot_product_attention, wrapped by
scripts/train_models.py's SdpaCounter) and how many the steps served (sdpa._why_not's answer,
which routes them; the calls that reached the operator; the operator's backward in the
profiler):

  - timm's vit_huge_patch14_224 (pretrained=False), batch 2 at 224 px: 32 calls of 16 heads of
    D = 80, N = 257;
  - transformers' ViTForImageClassification from a ViTConfig built here, attn_implementation
    "sdpa": 4 calls of 6 heads of D = 64, N = 197;
  - transformers' DetrForObjectDetection from a DetrConfig built here (timm's resnet18 backbone
    with use_pretrained_backbone=False, or transformers' own ResNet-18), attn_implementation
    "sdpa", 3 images of mixed sizes padded to 256 x 384 (8 x 12 = 96 positions): 6 encoder
    self-attentions (masked), 6 decoder self-attentions of the 100 queries, 6 cross-attentions
    from them to the positions (masked); with the key-padding masks as views (train_models.py's
    detr_padding_masks_as_views), and with transformers' own materialised masks, which stay
    PyTorch's ("an attention mask other than a key-padding mask").

Every call must be served, but for those the library's choice does not serve on this GPU (its
reasons: a head dim, a gradient, cross-attention or a mask no step serves here), which are
printed; a model none of whose calls is served here is skipped with them. The loss must be finite
and within 1e-2 (relative) of stock PyTorch's on the same weights and batch, the gradients
finite. Each model is skipped, saying why, where its package is missing, and DETR where the
installed transformers builds none that calls SDPA (its older DetrAttention computes attention
with torch.bmm; attention_steps.mha cannot swap it either: it is no nn.MultiheadAttention).

Run with python3 (exit 77, ctest's skipped, without torch, a GPU or the operator) or pytest:

    PYTHONPATH=python ATTENTION_STEPS_LIBRARY=build/libattention_steps.so \\
        python3 -m pytest -v -s tests/python/test_models_training.py
"""
import contextlib
import importlib.util
import pathlib
import unittest

import torch_gpu

SKIP_REASON = torch_gpu.skip_reason("the models' training tests")
if SKIP_REASON is None:
    import torch

    from attention_steps import sdpa

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("train_models",
                                               REPOSITORY / "scripts" / "train_models.py")
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)  # the standard library only at import


def setUpModule():
    if SKIP_REASON is not None:
        raise unittest.SkipTest(SKIP_REASON)


def installed(package):
    return importlib.util.find_spec(package) is not None


class TrainingStep(unittest.TestCase):
    def tearDown(self):
        sdpa.use_steps(False)
        torch.cuda.empty_cache()

    def training_step(self, model, loss_fn, batch):
        """(SdpaCounter of the step's calls, the operator's backward calls in the profile, the
        loss, stock PyTorch's loss on the same weights and batch): one step under
        autocast(bfloat16) through use_steps()."""
        from torch.profiler import ProfilerActivity, profile
        model.train()
        sdpa.use_steps(False)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            stock = loss_fn(torch, model, batch).float()
        sdpa.use_steps()
        counter = script.SdpaCounter(torch)
        with profile(activities=[ProfilerActivity.CPU]) as recorded:
            with counter:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = loss_fn(torch, model, batch)
                loss.backward()
        backward = sum(event.name == "attention_steps::attention_backward"
                       for event in recorded.events())
        return counter, backward, loss.detach().float(), stock

    def check(self, what, model, loss_fn, batch, calls, allowed=(), no_calls=None):
        """One training step: `calls` attention calls, each served but for the library's limits
        here (and the FALLBACKS keys in `allowed`); returns the counter. `no_calls`: the reason
        to skip with where the model makes no SDPA call at all."""
        counter, backward, loss, stock = self.training_step(model, loss_fn, batch)
        if no_calls and not counter.reasons:
            self.skipTest(no_calls)
        print(f"\n{what}: {counter.summary()}; the operator ran {counter.operator_calls} times "
              f"forward, its backward {backward} times; loss {loss.item():.5f}, stock's "
              f"{stock.item():.5f}")
        self.assertEqual(len(counter.reasons), calls, f"{what}: {counter.shapes}")
        for reason, count in counter.fallbacks().items():
            expected = counter.library_limit(reason) or any(
                reason.startswith(sdpa.FALLBACKS[key]) for key in allowed)
            self.assertTrue(expected, f"{what}: {count} calls went to PyTorch's: {reason}")
        self.assertEqual(counter.operator_calls, counter.served)
        self.assertGreaterEqual(backward, counter.served)  # each served call's backward ran it
        self.assertTrue(torch.isfinite(loss))
        self.assertLessEqual((loss - stock).abs().item(), 1e-2 * max(1.0, stock.abs().item()))
        for name, parameter in model.named_parameters():
            if parameter.grad is not None:
                self.assertTrue(torch.isfinite(parameter.grad).all(), name)
        if counter.served == 0:
            self.skipTest(f"{what}: the library serves none of its calls here "
                          f"({'; '.join(counter.fallbacks())})")
        return counter

    @unittest.skipUnless(installed("timm"), "timm is not installed: timm's ViT-H/14 did not run")
    def test_timm_vit_huge_patch14_224(self):
        torch.manual_seed(0)
        model = script.build_vit_huge(torch, 224)
        batch = script.image_batches(torch, 1, 2, 224, 1000, seed=0)[0]
        counter = self.check("timm vit_huge_patch14_224, batch 2", model, script.vit_loss, batch, 32)
        self.assertEqual({shape[0] for shape in counter.shapes}, {(2, 16, 257, 80)})

    @unittest.skipUnless(installed("transformers"),
                         "transformers is not installed: its ViT did not run")
    def test_transformers_vit(self):
        torch.manual_seed(1)
        model = script.build_hf_vit(torch, layers=4)
        batch = script.image_batches(torch, 1, 2, 224, 10, seed=1)[0]
        self.check(f"transformers ViT ({model.config._attn_implementation}), batch 2", model,
                   script.hf_vit_loss, batch, 4)

    def detr(self, masks_as_views):
        """One training step of DETR (6 + 6 layers): the counter, or a skip saying why not."""
        if not installed("transformers"):
            self.skipTest("transformers is not installed: DETR did not run")
        views = script.detr_padding_masks_as_views(torch) if masks_as_views else \
            contextlib.nullcontext(False)
        with views as changed:
            torch.manual_seed(2)
            try:
                model, backbone = script.build_detr(torch, layers=6)
            except RuntimeError as error:
                self.skipTest(str(error))
            batch = script.detr_batches(torch, 1, 3, (256, 384), seed=2)[0]
            if masks_as_views and not changed:
                self.skipTest("this transformers' DETR makes no create_bidirectional_mask call "
                              "(it calls no SDPA)")
            what = f"transformers DETR, {backbone}, masks {'as views' if masks_as_views else 'of transformers'}"
            return self.check(
                what, model, script.detr_loss, batch, 18, allowed=() if masks_as_views else ("mask",),
                no_calls="this transformers' DETR calls no F.scaled_dot_product_attention: its "
                         "DetrAttention computes attention with torch.bmm, so use_steps() has "
                         "nothing to serve, and attention_steps.mha cannot swap it (it is no "
                         "nn.MultiheadAttention)")

    def test_transformers_detr_masks_as_views(self):
        counter = self.detr(masks_as_views=True)
        masked = [shapes for shapes in counter.shapes if shapes[2] is not None]
        self.assertEqual(len(masked), 12)  # the encoder's self-attention and the cross-attention
        self.assertTrue(any(q[2] != k[2] for q, k, _ in counter.shapes))  # cross-attention

    def test_transformers_detr_with_its_own_masks(self):
        # transformers' masks are materialised [B, 1, N, N_k] tensors: PyTorch's ("mask"); the
        # decoder's unmasked self-attention is the steps' where the library serves it.
        counter = self.detr(masks_as_views=False)
        unmasked = [reason for (_, _, mask), reason in zip(counter.shapes, counter.reasons)
                    if mask is None]
        self.assertEqual(len(unmasked), 6)

if __name__ == "__main__":
    torch_gpu.main(SKIP_REASON)
