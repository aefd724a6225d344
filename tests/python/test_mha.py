#!/usr/bin/env python3
"""attention_steps.mha's wiring on a CPU, with scaled_dot_product_attention standing in for the
step (attention_fn): any nn.MultiheadAttention swapped computes what it computed before, in
self-attention and cross-attention, sequence-first and batch-first, packed or separate
projections, with a key-padding mask; q, k and v reach the step as views of the projections (one
packed GEMM for self-attention of one tensor), with one set of strides where the layout allows;
a stand-in that ignores the mask is caught; the calls the step cannot take (a float mask among
them, and CPU tensors under CPU autocast) go to the original module; restore puts the modules back. Then the models of
scripts/models_end_to_end.py (DETR with 3 encoder layers, SETR-Naive) swapped whole: outputs as
before, every attention module used.

Exit 77 (ctest: skipped) where torch or torchvision does not import.
"""
import importlib.util
import pathlib
import sys
import unittest

try:
    import torch
    import torch.nn.functional as F
    import torchvision
    from torch import nn
except ImportError as error:
    print(f"SKIPPED: {error}; the multi-head attention swap's CPU test did not run")
    sys.exit(77)

from attention_steps import mha

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("models_end_to_end",
                                              REPOSITORY / "scripts" / "models_end_to_end.py")
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


class StandIn:
    """What the step computes, on a CPU: padded keys get no weight. Counts its calls and keeps
    the last call's q, k and v (to see how they reached it)."""

    def __init__(self, honour_mask=True):
        self.calls, self.honour_mask = 0, honour_mask

    def __call__(self, q, k, v, key_padding_mask):
        self.calls += 1
        self.qkv = (q, k, v)
        mask = None
        if key_padding_mask is not None and self.honour_mask:
            mask = (~key_padding_mask)[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def relative(a, b):
    return ((a - b).norm() / b.norm()).item()


class Swap(unittest.TestCase):
    def attend(self, module, batch_first, cross, mask):
        torch.manual_seed(3)
        queries, keys = 7, 11 if cross else 7
        shape = (lambda n, e: (2, n, e)) if batch_first else (lambda n, e: (n, 2, e))
        query = torch.randn(shape(queries, module.embed_dim))
        key = torch.randn(shape(keys, module.kdim)) if cross else query
        value = torch.randn(shape(keys, module.vdim)) if cross else query
        padding = None
        if mask:
            padding = torch.zeros(2, keys, dtype=torch.bool)
            padding[0, 3:5] = True  # not a suffix: DETR's padded positions are not one either
            padding[1, -2:] = True
        return module(query, key, value, key_padding_mask=padding, need_weights=False)[0]

    def test_outputs_equal_the_module_s(self):
        for batch_first in (True, False):
            for kdim in (None, 24):  # 24: keys and values of another width, separate projections
                for cross in (False, True):
                    for mask in (False, True):
                        if kdim and not cross:
                            continue
                        with self.subTest(batch_first=batch_first, kdim=kdim, cross=cross, mask=mask):
                            torch.manual_seed(1)
                            parent = nn.Module()
                            parent.attention = nn.MultiheadAttention(
                                32, 4, batch_first=batch_first, kdim=kdim or 32,
                                vdim=kdim or 32).eval()
                            want = self.attend(parent.attention, batch_first, cross, mask)
                            stand_in = StandIn()
                            self.assertEqual(mha.swap_multihead_attention(parent, attention_fn=stand_in), 1)
                            self.assertIsInstance(parent.attention, mha.StepMultiheadAttention)
                            got = self.attend(parent.attention, batch_first, cross, mask)
                            self.assertEqual(stand_in.calls, 1)
                            self.assertLess(relative(got, want), 1e-6)

    def test_q_k_and_v_reach_the_step_as_views_of_the_projections(self):
        # What lets a step that takes views (v8) read them in place: one set of strides for the
        # three, no copy. Self-attention of one tensor: slices of one packed projection.
        # Sequence-first: [N, B, E] projections, whatever the key count.
        for batch_first in (True, False):
            for cross in (False, True):
                with self.subTest(batch_first=batch_first, cross=cross):
                    torch.manual_seed(1)
                    parent = nn.Module()
                    parent.attention = nn.MultiheadAttention(32, 4, batch_first=batch_first).eval()
                    stand_in = StandIn()
                    mha.swap_multihead_attention(parent, attention_fn=stand_in)
                    self.attend(parent.attention, batch_first, cross, mask=False)
                    q, k, v = stand_in.qkv
                    self.assertEqual(tuple(q.shape), (2, 4, 7, 8))
                    if not cross:  # one packed projection [.., .., 3E]: one storage
                        self.assertTrue(q.untyped_storage().data_ptr() ==
                                        k.untyped_storage().data_ptr() ==
                                        v.untyped_storage().data_ptr())
                    if not (batch_first and cross):  # batch-first cross-attention: strides differ
                        self.assertEqual(q.stride(), k.stride())
                        self.assertEqual(q.stride(), v.stride())
                    embed = 3 * 32 if not cross else 32
                    tokens_apart = embed if batch_first else 2 * embed
                    self.assertEqual(q.stride(2), tokens_apart)

    def test_a_float_mask_goes_to_the_module(self):
        # PyTorch adds a float key_padding_mask to the scores; the steps take padding only.
        torch.manual_seed(1)
        parent = nn.Module()
        parent.attention = nn.MultiheadAttention(32, 4).eval()
        x = torch.randn(7, 2, 32)
        bias = torch.zeros(2, 7)
        bias[0, 2] = -1.5
        want = parent.attention(x, x, x, key_padding_mask=bias, need_weights=False)[0]
        stand_in = StandIn()
        mha.swap_multihead_attention(parent, attention_fn=stand_in)
        got = parent.attention(x, x, x, key_padding_mask=bias, need_weights=False)[0]
        self.assertEqual(stand_in.calls, 0)
        self.assertLess(relative(got, want), 1e-6)

    def test_a_stand_in_that_ignores_the_mask_is_caught(self):
        torch.manual_seed(1)
        parent = nn.Module()
        parent.attention = nn.MultiheadAttention(32, 4).eval()
        want = self.attend(parent.attention, False, True, True)
        mha.swap_multihead_attention(parent, attention_fn=StandIn(honour_mask=False))
        self.assertGreater(relative(self.attend(parent.attention, False, True, True), want), 1e-2)

    def test_calls_the_step_cannot_take_go_to_the_module(self):
        parent = nn.Module()
        parent.attention = nn.MultiheadAttention(32, 4, batch_first=True).eval()
        stand_in = StandIn()
        mha.swap_multihead_attention(parent, attention_fn=stand_in)
        x = torch.randn(2, 5, 32)
        _, weights = parent.attention(x, x, x)  # need_weights defaults to True
        self.assertEqual(tuple(weights.shape), (2, 5, 5))
        parent.attention(x, x, x, need_weights=False, attn_mask=torch.zeros(5, 5, dtype=torch.bool))
        parent.attention.train()
        parent.attention(x, x, x, need_weights=False)  # dropout 0: the step still serves it
        self.assertEqual(stand_in.calls, 1)

    def test_cpu_autocast_goes_to_the_module(self):
        # The steps run CUDA tensors; under CPU autocast (bf16) a CPU call stays the module's,
        # as PyTorch runs it (the library's choice is not even asked).
        torch.manual_seed(4)
        module = nn.MultiheadAttention(32, 4, batch_first=True).eval()
        swapped = mha.StepMultiheadAttention(module).eval()  # the library's choice; no GPU table
        x = torch.randn(2, 5, 32)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            want = module(x, x, x, need_weights=False)[0]
            got = swapped(x, x, x, need_weights=False)[0]
        self.assertEqual(got.dtype, want.dtype)
        self.assertTrue(torch.equal(got, want))

    def test_restore(self):
        parent = nn.Module()
        original = parent.attention = nn.MultiheadAttention(32, 4)
        mha.swap_multihead_attention(parent, attention_fn=StandIn())
        self.assertEqual(mha.restore_multihead_attention(parent), 1)
        self.assertIs(parent.attention, original)


class Models(unittest.TestCase):
    def check_model(self, name, expected_modules):
        model, make_inputs, calls = script.build(torch, torchvision, name, 0)
        model.eval()
        inputs = make_inputs(2, torch.Generator().manual_seed(1))
        with torch.no_grad():
            want = script.flat(torch, model(*inputs))
            stand_in = StandIn()
            self.assertEqual(mha.swap_multihead_attention(model, attention_fn=stand_in), expected_modules)
            got = script.flat(torch, model(*inputs))
        self.assertEqual(stand_in.calls, calls)
        self.assertLess(relative(got, want), 1e-5)
        return model, inputs

    def test_detr_with_mixed_image_sizes(self):
        model, inputs = self.check_model("detr_e3", 3 + 12)
        self.assertTrue(inputs[1].any() and not inputs[1].all())  # padding, and images
        mha.restore_multihead_attention(model)
        with torch.no_grad():
            want = script.flat(torch, model(*inputs))
            mha.swap_multihead_attention(model, attention_fn=StandIn(honour_mask=False))
            self.assertGreater(relative(script.flat(torch, model(*inputs)), want), 1e-2)

    def test_setr_naive(self):
        self.check_model("setr_naive", 24)


if __name__ == "__main__":
    unittest.main(verbosity=2)
