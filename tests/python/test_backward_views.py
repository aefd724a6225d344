#!/usr/bin/env python3
"""The backward reads Q, K, V, O and dO where they lie (#31): a backward step that takes views
(takes_strides: v10) gets the forward's q, k and v as slices of one packed projection (or of
DETR's sequence-first ones), O as the forward wrote it ([B, N, H, D] memory) and dO as autograd
hands it back through that layout, with no copy; a step that does not (v9, eager_backward) gets
contiguous copies, as before.

  - autograd through the operator: q, k, v from a packed projection [B, N, 3, H, D] and O
    consumed as [B, N, H, D] give the gradients contiguous inputs give: the same bits in the
    deterministic mode (torch.use_deterministic_algorithms), within fp16's rounding of dQ's sum
    without it;
  - attention_backward itself, for every backward step that runs here: on views (packed, and
    sequence-first cross-attention where the step serves it) the bits it gives on contiguous
    copies of the same values; views that do not qualify (q, k and v of different strides, a
    misaligned view) are copied and give them too; dQ, dK and dV are contiguous; opcheck on views;
  - the profile: the backward of a training step on views launches no copy (aten::copy_,
    aten::contiguous, aten::clone, a copy kernel) where its backward step takes views, and, as a
    check of the check, does where it does not.

Run with python3 (exit 77, ctest's skipped, without torch, a GPU or the operator) or pytest:

    PYTHONPATH=python ATTENTION_STEPS_LIBRARY=build/libattention_steps.so \\
        python3 -m pytest -v tests/python/test_backward_views.py
"""
import unittest

import torch_gpu
from torch_gpu import torch_dtype

SKIP_REASON = torch_gpu.skip_reason("the backward's view tests")
if SKIP_REASON is None:
    import torch

    import attention_steps as steps
    from attention_steps import choice, torch_op
    from attention_steps._capi import StepRefused
    attention_op = torch_op.load()


def setUpModule():
    if SKIP_REASON is not None:
        raise unittest.SkipTest(SKIP_REASON)


HEAD_DIMS = (32, 64, 80, 96, 128)
UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}  # harness/check.hpp
COPY_OPS = ("aten::copy_", "aten::contiguous", "aten::clone", "aten::_to_copy")


def forward_step(head_dim, dtype="fp16", cross=False):
    """The forward step that writes L the library chooses here, or None."""
    return choice.serving(torch.cuda.current_device(), torch_dtype(dtype), head_dim, cross=cross)[0]


def backward_step(shape, dtype="fp16", deterministic=False, kv_tokens=None):
    """The backward step autograd runs for the call (attn_choose_step), or None."""
    try:
        return steps.load_library().choose_step(shape, backward=True, dtype=dtype,
                                                deterministic=deterministic, kv_tokens=kv_tokens)
    except StepRefused:
        return None


def takes_strides(step):
    return steps.load_library().step(step).takes_strides


def backward_steps_here(head_dim, dtype="fp16", cross=False):
    """Every backward step (baselines too) that serves head_dim and dtype on this GPU."""
    found = []
    for info in steps.list_steps():
        if not info.is_backward or head_dim not in info.head_dims:
            continue
        if (dtype == "bf16" and not info.takes_bf16) or (cross and not info.takes_kv_tokens):
            continue
        if steps.refusal(info.id, (1, 1, 1, head_dim)) is None:
            found.append(info.id)
    return found


def tokens_first(t):
    """[B, H, N, D] values as a view of [B, N, H, D] memory: O as a step that takes views writes
    it, dO as autograd hands it back when O is consumed as [B, N, H*D]."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def sequence_first(t):
    """[B, H, N, D] values as a view of [N, B, H, D] memory (DETR's [N, B, E] projections)."""
    return t.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)


def packed(q, k, v):
    """q, k, v ([B, H, N, D] each) as views of one projection [B, N, 3, H, D], as a ViT block's."""
    x = torch.stack([t.transpose(1, 2) for t in (q, k, v)], dim=2).contiguous()
    return x.permute(2, 0, 3, 1, 4).unbind(0)


def misaligned(t):
    """The values of t ([B, H, N, D]) as a view of [B, N, H, D] memory that starts 8 bytes past a
    16-byte boundary: strides a step could take, an address it cannot (the operator copies it)."""
    batch, heads, tokens, head_dim = t.shape
    flat = torch.empty(t.numel() + 8, device=t.device, dtype=t.dtype)
    memory = flat[4:4 + t.numel()].view(batch, tokens, heads, head_dim)
    memory.copy_(t.transpose(1, 2))
    return memory.transpose(1, 2)


def copies_in(function):
    """The copy ops and copy kernels a profile of function() shows."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        function()
        torch.cuda.synchronize()
    return sorted({event.name for event in profile.events()
                   if event.name in COPY_OPS or "copy_kernel" in event.name.lower()
                   or "memcpy dtod" in event.name.lower()})


class Case(unittest.TestCase):
    def assert_same(self, got, want, dtype, deterministic, what):
        """The same bits in the deterministic mode; else within fp16's (bf16's) rounding of
        dQ's sum taken in another order: 8u times the gradient's largest value."""
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            with self.subTest(what=what, gradient=name, deterministic=deterministic):
                self.assertEqual(tuple(g.shape), tuple(w.shape))
                self.assertTrue(torch.isfinite(w).all())
                if deterministic:
                    self.assertTrue(torch.equal(g, w), f"{(g != w).sum().item()} of {g.numel()} "
                                    "elements differ")
                else:
                    worst = (g.float() - w.float()).abs().max().item()
                    self.assertLessEqual(worst, 8 * UNIT_ROUNDOFF[dtype] * w.float().abs().max().item())


class ThroughAutograd(Case):
    """A training step's shape of the call: q, k, v sliced from one packed projection, O read
    back as [B, N, H*D] (the out-projection's input), against contiguous q, k, v and dO."""

    def run_both(self, head_dim, dtype, tokens, deterministic):
        batch, heads = 2, 3
        forward = forward_step(head_dim, dtype)
        if forward is None or backward_step((batch, heads, tokens, head_dim), dtype, deterministic) is None:
            self.skipTest(f"head dim {head_dim}, {dtype}: no training call is served here")
        torch.manual_seed(tokens + head_dim)
        x = torch.randn(batch, tokens, 3, heads, head_dim, device="cuda", dtype=torch_dtype(dtype))
        g = torch.randn(batch, tokens, heads * head_dim, device="cuda", dtype=torch_dtype(dtype))
        previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(deterministic)
        try:
            q, k, v = x.detach().requires_grad_().permute(2, 0, 3, 1, 4).unbind(0)
            out = steps.attention(q, k, v, step=forward)
            y = out.transpose(1, 2).reshape(batch, tokens, heads * head_dim)  # O as [B, N, H*D]
            got = torch.autograd.grad(y, (q, k, v), g)
            contiguous = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
            out_contiguous = steps.attention(*contiguous, step=forward)
            d_o = g.view(batch, tokens, heads, head_dim).transpose(1, 2).contiguous()
            want = torch.autograd.grad(out_contiguous, contiguous, d_o)
        finally:
            torch.use_deterministic_algorithms(previous)
        self.assertTrue(torch.equal(out, out_contiguous), f"{forward}'s O on views differs from "
                        "its O on contiguous tensors: the backwards' inputs differ")
        for gradient in got:
            self.assertTrue(gradient.is_contiguous())
        return got, want

    def test_packed_projection_and_o_as_tokens_first(self):
        ran = False
        for dtype in ("fp16", "bf16"):
            for head_dim in HEAD_DIMS:
                if forward_step(head_dim, dtype) is None:
                    continue
                for tokens in (65, 197):
                    for deterministic in (True, False):
                        if backward_step((2, 3, tokens, head_dim), dtype, deterministic) is None:
                            continue
                        ran = True
                        got, want = self.run_both(head_dim, dtype, tokens, deterministic)
                        self.assert_same(got, want, dtype, deterministic,
                                         f"{dtype} D={head_dim} N={tokens}")
        if not ran:
            self.skipTest("no forward and backward step serve a training call here")


class TheBackwardOperator(Case):
    """attention_backward on views against the same values contiguous, for each backward step."""

    def inputs(self, head_dim, dtype, tokens, kv_tokens=None, batch=2, heads=3):
        """Contiguous q, k, v, O (from the forward the library chooses), L and dO."""
        kv_tokens = kv_tokens or tokens
        forward = forward_step(head_dim, dtype, cross=kv_tokens != tokens)
        if forward is None:
            return None
        torch.manual_seed(tokens * 3 + kv_tokens + head_dim)
        dt = torch_dtype(dtype)
        q = torch.randn(batch, heads, tokens, head_dim, device="cuda", dtype=dt)
        k, v = (torch.randn(batch, heads, kv_tokens, head_dim, device="cuda", dtype=dt)
                for _ in range(2))
        o, lse = attention_op(q, k, v, forward, None, None, True)
        d_o = torch.randn_like(q)
        return q, k, v, o.contiguous(), lse, d_o

    def check(self, step, dtype, contiguous, viewed, what, deterministic_only=False):
        op = torch.ops.attention_steps.attention_backward
        q, k, v, o, lse, d_o = contiguous
        vd_o, vq, vk, vv, vo = viewed  # in the operator's order
        for deterministic in (True,) if deterministic_only else (True, False):
            want = op(d_o, q, k, v, o, lse, step, None, deterministic)
            got = op(vd_o, vq, vk, vv, vo, lse, step, None, deterministic)
            for gradient in got:
                self.assertTrue(gradient.is_contiguous())
            self.assert_same(got, want, dtype, deterministic, f"{step} {what}")

    def test_packed_views_every_backward_step(self):
        ran = False
        for dtype in ("fp16", "bf16"):
            for head_dim in HEAD_DIMS:
                for tokens in (65, 197):
                    problem = self.inputs(head_dim, dtype, tokens)
                    if problem is None:
                        continue
                    q, k, v, o, lse, d_o = problem
                    viewed = (tokens_first(d_o), *packed(q, k, v), tokens_first(o))
                    for step in backward_steps_here(head_dim, dtype):
                        ran = True
                        self.check(step, dtype, problem, viewed,
                                   f"{dtype} D={head_dim} N={tokens} packed")
        if not ran:
            self.skipTest("no backward step runs here")

    def test_sequence_first_cross_attention(self):
        ran = False
        for head_dim in (64, 128):
            for tokens, kv_tokens in ((100, 1050), (65, 17)):
                problem = self.inputs(head_dim, "fp16", tokens, kv_tokens)
                if problem is None:
                    continue
                q, k, v, o, lse, d_o = problem
                viewed = (sequence_first(d_o), sequence_first(q), sequence_first(k),
                          sequence_first(v), sequence_first(o))
                for step in backward_steps_here(head_dim, cross=True):
                    ran = True
                    self.check(step, "fp16", problem, viewed,
                               f"D={head_dim} N={tokens} N_k={kv_tokens} sequence-first")
        if not ran:
            self.skipTest("no backward step serves cross-attention here")

    def test_views_that_do_not_qualify_are_copied(self):
        problem = self.inputs(64, "fp16", 197)
        steps_here = backward_steps_here(64)
        if problem is None or not steps_here:
            self.skipTest("no forward and backward step serve D = 64 here")
        q, k, v, o, lse, d_o = problem
        pq, pk, pv = packed(q, k, v)
        cases = {
            # q contiguous, k and v packed: no strides shared, all three copied
            "q, k, v of different strides": (tokens_first(d_o), q, pk, pv, tokens_first(o)),
            "misaligned O and dO": (misaligned(d_o), pq, pk, pv, misaligned(o)),
            "dO expanded (stride 0 over heads)": (d_o[:, :1].expand_as(d_o), pq, pk, pv, o),
        }
        for what, viewed in cases.items():
            expected = problem
            if what.startswith("dO expanded"):  # the contiguous call gets the same values
                expected = (q, k, v, o, lse, viewed[0].contiguous())
            for step in steps_here:
                self.check(step, "fp16", expected, viewed, what, deterministic_only=True)

    def test_opcheck_on_views(self):
        problem = self.inputs(64, "fp16", 65)
        step = backward_step((2, 3, 65, 64), deterministic=True)
        if problem is None or step is None:
            self.skipTest("no forward and backward step serve D = 64 here")
        q, k, v, o, lse, d_o = problem
        op = torch.ops.attention_steps.attention_backward.default
        args = (tokens_first(d_o), *packed(q, k, v), tokens_first(o), lse, step, None, True)
        torch.library.opcheck(op, args)


class NoCopies(unittest.TestCase):
    """The backward of a training step on views copies nothing where its step takes views."""

    def training_call(self, head_dim=64, tokens=197):
        batch, heads = 2, 3
        forward = forward_step(head_dim)
        step = backward_step((batch, heads, tokens, head_dim))
        if forward is None or step is None:
            self.skipTest("no forward and backward step serve D = 64 here")
        torch.manual_seed(1)
        x = torch.randn(batch, tokens, 3, heads, head_dim, device="cuda", dtype=torch.half)
        g = torch.randn(batch, tokens, heads * head_dim, device="cuda", dtype=torch.half)
        q, k, v = x.requires_grad_().permute(2, 0, 3, 1, 4).unbind(0)
        out = steps.attention(q, k, v, step=forward)
        y = out.transpose(1, 2).reshape(batch, tokens, heads * head_dim)
        return step, forward, (q, k, v), y, g

    def test_the_backward_copies_nothing_where_its_step_takes_views(self):
        step, forward, inputs, y, g = self.training_call()
        if not takes_strides(step):
            self.skipTest(f"the backward step here, {step}, reads contiguous tensors: the operator "
                          "copies them for it (v10, on Hopper, takes views)")
        if not takes_strides(forward):
            self.skipTest(f"the forward step here, {forward}, writes a contiguous O")
        torch.autograd.grad(y, inputs, g, retain_graph=True)  # warm-up: the library's first call
        copies = copies_in(lambda: torch.autograd.grad(y, inputs, g, retain_graph=True))
        self.assertEqual(copies, [], f"the backward ({step}) copied its inputs")

    def test_the_operator_on_views_copies_nothing_for_a_step_that_takes_them(self):
        step, forward, (q, k, v), y, g = self.training_call()
        o, lse = attention_op(q.detach(), k.detach(), v.detach(), forward, None, None, True)
        d_o = g.view(y.shape[0], y.shape[1], q.shape[1], q.shape[3]).transpose(1, 2)
        op = torch.ops.attention_steps.attention_backward
        ran = False
        for backward in backward_steps_here(64):
            args = (d_o, q.detach(), k.detach(), v.detach(), tokens_first(o), lse, backward, None, True)
            op(*args)
            copies = copies_in(lambda: op(*args))
            with self.subTest(step=backward, takes_strides=takes_strides(backward)):
                if takes_strides(backward):
                    ran = True
                    self.assertEqual(copies, [], f"{backward} takes views, yet its call copied")
                else:  # the check of the check: a step that reads contiguous tensors gets copies
                    self.assertNotEqual(copies, [], f"{backward} reads contiguous tensors, yet no "
                                        "copy was seen: the profile misses copies")
        if not ran:
            self.skipTest("no backward step that takes views runs here (v10 needs Hopper)")


if __name__ == "__main__":
    torch_gpu.main(SKIP_REASON)
