#!/usr/bin/env python3
"""Gradients through the operator where the forward is served with keys of another count
(cross-attention) or a key-padding mask (#31: the backward is served wherever the forward is):

  - for each head dim of HEAD_DIMS, one test each (so that each passes or skips on its own):
    cross-attention (N_k > N, N_k < N, DETR's 100 queries against 1050 keys) and a key-padding
    mask (self- and cross-attention; a batch element with every key padded), in fp16 and bf16,
    the forward and backward steps the library chooses (attention_steps.choice), against torch's
    own autograd of SDPA's math backend in fp64 (fp32 too for the mask, as a second witness), with
    the tolerances of harness/check.hpp for gradients;
  - what the library defines beyond SDPA: a padded key gets dK = dV = 0 exactly, a row that sees
    no key dQ = 0 (SDPA gives NaN there);
  - the deterministic mode (torch.use_deterministic_algorithms) gives the same bits twice;
  - torch.library.opcheck of attention_backward with N_k != N and a mask (its fake: dK and dV
    shaped like k and v), and a compiled training step with both without a graph break.

A head dim where the library's choice says no step serves the call on this GPU is skipped with
the library's reason. Run with python3 (exit 77, ctest's skipped, without torch, a GPU or the
operator) or with pytest:

    PYTHONPATH=python ATTENTION_STEPS_LIBRARY=build/libattention_steps.so \\
        python3 -m pytest -v tests/python/test_backward_masks.py
"""
import unittest

import torch_gpu
from torch_gpu import per_head_dim, torch_dtype

SKIP_REASON = torch_gpu.skip_reason("the backward's cross-attention and mask tests")
if SKIP_REASON is None:
    import torch
    import torch.nn.functional as F

    import attention_steps as steps
    from attention_steps import choice, torch_op
    attention_op = torch_op.load()


def setUpModule():
    if SKIP_REASON is not None:
        raise unittest.SkipTest(SKIP_REASON)


HEAD_DIMS = (32, 64, 80, 96, 128)
DTYPES = ("fp16", "bf16")
UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}  # harness/check.hpp
# (N, N_k): more keys than queries, fewer, DETR's decoder, tails of the tiles.
CROSS_SHAPES = ((65, 130), (130, 17), (100, 1050), (1, 65), (17, 1))
MASKED_SHAPES = ((65, 65), (100, 1050), (17, 130), (130, 17))


def served(head_dim, dtype, *, masked=False, cross=False):
    """(forward step, None) when the library chooses a forward step that writes L and a backward
    step for such a call on this GPU, else (None, why not: the library's reasons)."""
    device = torch.cuda.current_device()
    forward, why = choice.serving(device, torch_dtype(dtype), head_dim, masked=masked, cross=cross)
    if forward is None:
        return None, f"no forward step: {why}"
    backward, why = choice.serving(device, torch_dtype(dtype), head_dim, backward=True,
                                   masked=masked, cross=cross)
    if backward is None:
        return None, f"no backward step: {why}"
    return forward, None


def padding_mask(batch, kv_tokens):
    """[B, N_k] bool, True where a key is padding: batch 0 keeps every key, batch 1 a prefix with
    holes (its first key kept), batch 2 (when there is one) none, so its rows see no key."""
    mask = torch.zeros(batch, kv_tokens, device="cuda", dtype=torch.bool)
    if batch > 1:
        mask[1, kv_tokens // 2:] = True
        mask[1, 1::3] = True
        mask[1, 0] = False
    if batch > 2:
        mask[2] = True
    return mask


def reference_gradients(q, k, v, d_o, mask, precision):
    """dQ, dK, dV by torch's autograd of SDPA's math backend in `precision` (float64 or
    float32), with the key-padding mask as SDPA's boolean attn_mask (True: takes part)."""
    exact = [t.detach().to(precision).requires_grad_() for t in (q, k, v)]
    attend = None if mask is None else ~mask[:, None, None, :]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = F.scaled_dot_product_attention(*exact, attn_mask=attend)
    return torch.autograd.grad(out, exact, d_o.to(precision))


class Case(unittest.TestCase):
    def skip_unless_served(self, head_dim, dtype, masked=False, cross=False):
        step, why = served(head_dim, dtype, masked=masked, cross=cross)
        if step is None:
            kind = " and ".join(name for name, on in (("cross-attention", cross),
                                                      ("a key-padding mask", masked)) if on)
            self.skipTest(f"head dim {head_dim}, {dtype}, {kind}: the library serves no training "
                          f"call here ({why})")
        return step

    def assert_gradients(self, got, want, dtype, what):
        """harness/check.hpp's tolerances for gradients: 8u relative Frobenius error, 8u times the
        largest reference value (at least dV's) on any element."""
        u = UNIT_ROUNDOFF[dtype]
        floor = want[2].abs().max().item()
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            with self.subTest(what=what, gradient=name):
                self.assertEqual(tuple(g.shape), tuple(w.shape))
                self.assertTrue(torch.isfinite(g).all())
                error = g.to(w.dtype) - w
                relative = error.norm() / w.norm() if w.norm() > 0 else error.norm()
                self.assertLessEqual(relative.item(), 8 * u)
                self.assertLessEqual(error.abs().max().item(), 8 * u * max(floor, w.abs().max().item()))

    def run_case(self, step, dtype, batch, heads, tokens, kv_tokens, head_dim, mask=None):
        """The steps' gradients (forward `step`, the backward autograd chooses) of q [B, H, N, D]
        and k, v [B, H, N_k, D]: (q, k, v, d_o, (dq, dk, dv))."""
        torch.manual_seed(tokens * 7 + kv_tokens + head_dim)
        q = torch.randn(batch, heads, tokens, head_dim, device="cuda", dtype=torch_dtype(dtype),
                        requires_grad=True)
        k, v = (torch.randn(batch, heads, kv_tokens, head_dim, device="cuda",
                            dtype=torch_dtype(dtype), requires_grad=True) for _ in range(2))
        d_o = torch.randn(batch, heads, tokens, head_dim, device="cuda", dtype=torch_dtype(dtype))
        out = steps.attention(q, k, v, step=step, key_padding_mask=mask)
        return q, k, v, d_o, torch.autograd.grad(out, (q, k, v), d_o)


@per_head_dim(HEAD_DIMS)
class CrossAttention(Case):
    def check(self, head_dim):
        ran = False
        for dtype in DTYPES:
            step = served(head_dim, dtype, cross=True)[0]
            if step is None:
                continue
            ran = True
            for tokens, kv_tokens in CROSS_SHAPES:
                what = f"{dtype} N={tokens} N_k={kv_tokens}"
                q, k, v, d_o, got = self.run_case(step, dtype, 2, 3, tokens, kv_tokens, head_dim)
                want = reference_gradients(q, k, v, d_o, None, torch.float64)
                self.assert_gradients(got, want, dtype, what)
        if not ran:  # skipped only where no dtype is served, with the fp16 reason
            self.skip_unless_served(head_dim, "fp16", cross=True)


@per_head_dim(HEAD_DIMS)
class KeyPaddingMask(Case):
    def check(self, head_dim):
        ran = False
        for dtype in DTYPES:
            for tokens, kv_tokens in MASKED_SHAPES:
                cross = tokens != kv_tokens
                step = served(head_dim, dtype, masked=True, cross=cross)[0]
                if step is None:
                    continue
                ran = True
                what = f"{dtype} N={tokens} N_k={kv_tokens}"
                mask = padding_mask(3, kv_tokens)
                q, k, v, d_o, got = self.run_case(step, dtype, 3, 2, tokens, kv_tokens, head_dim,
                                                  mask)
                seen = slice(0, 2)  # batch 2 sees no key: SDPA's answer there is NaN
                for precision in (torch.float64, torch.float32):
                    want = reference_gradients(q[seen], k[seen], v[seen], d_o[seen], mask[seen],
                                               precision)
                    self.assert_gradients([g[seen] for g in got], want, dtype,
                                          f"{what} against {precision}")
                dq, dk, dv = got
                with self.subTest(what=what, rule="no key seen: zero gradients"):
                    self.assertTrue(torch.equal(dq[2], torch.zeros_like(dq[2])))
                    self.assertTrue(torch.equal(dk[2], torch.zeros_like(dk[2])))
                    self.assertTrue(torch.equal(dv[2], torch.zeros_like(dv[2])))
                with self.subTest(what=what, rule="a padded key: dK = dV = 0 exactly"):
                    padded = mask[1]
                    self.assertTrue(torch.equal(dk[1][:, padded], torch.zeros_like(dk[1][:, padded])))
                    self.assertTrue(torch.equal(dv[1][:, padded], torch.zeros_like(dv[1][:, padded])))
        if not ran:
            self.skip_unless_served(head_dim, "fp16", masked=True)


class BesidesTheNumbers(Case):
    def test_deterministic_mode_gives_the_same_bits(self):
        step = self.skip_unless_served(64, "fp16", masked=True, cross=True)
        mask = padding_mask(3, 1050)
        torch.use_deterministic_algorithms(True)
        try:
            runs = [self.run_case(step, "fp16", 3, 2, 100, 1050, 64, mask)[4] for _ in range(2)]
        except NotImplementedError as error:  # no backward step with a deterministic mode here
            self.skipTest(str(error).splitlines()[0])
        finally:
            torch.use_deterministic_algorithms(False)
        for first, second in zip(*runs):
            self.assertTrue(torch.equal(first, second))

    def test_opcheck_of_the_backward_with_keys_of_another_count_and_a_mask(self):
        self.skip_unless_served(64, "fp16", masked=True, cross=True)
        library = steps.load_library()
        backward = library.choose_step((2, 3, 17, 64), backward=True, kv_tokens=130,
                                       key_padding_mask=True)
        forward = served(64, "fp16", masked=True, cross=True)[0]
        q = torch.randn(2, 3, 17, 64, device="cuda", dtype=torch.half)
        k, v = (torch.randn(2, 3, 130, 64, device="cuda", dtype=torch.half) for _ in range(2))
        mask = padding_mask(2, 130)
        o, lse = attention_op(q, k, v, forward, None, mask, True)
        d_o = torch.randn_like(q)
        op = torch.ops.attention_steps.attention_backward.default
        dq, dk, dv = op(d_o, q, k, v, o, lse, backward, None, False, None, mask)
        self.assertEqual((tuple(dq.shape), tuple(dk.shape), tuple(dv.shape)),
                         (tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        torch.library.opcheck(op, (d_o, q, k, v, o, lse, backward, None, False, None, mask))

    def test_a_mask_the_backward_step_does_not_take_is_refused_in_one_line(self):
        backward = [info for info in steps.list_steps() if info.is_backward and
                    not info.takes_key_padding_mask and 64 in info.head_dims and
                    steps.refusal(info.id, (1, 1, 1, 64)) is None]
        if not backward:
            self.skipTest("every backward step that runs here takes a key-padding mask")
        forward = served(64, "fp16")[0]
        q = torch.randn(1, 2, 65, 64, device="cuda", dtype=torch.half)
        o, lse = attention_op(q, q, q, forward, None, None, True)
        mask = padding_mask(1, 65)
        with self.assertRaisesRegex(ValueError, "does not serve --key-padding"):
            torch.ops.attention_steps.attention_backward(q, q, q, q, o, lse, backward[0].id, None,
                                                         False, None, mask)

    def test_compiled_training_step_with_cross_attention_and_a_mask(self):
        step = self.skip_unless_served(64, "fp16", masked=True, cross=True)
        mask = padding_mask(2, 130)

        def loss(q, k, v):
            return steps.attention(q, k, v, step=step, key_padding_mask=mask).float().square().sum()

        q = torch.randn(2, 3, 65, 64, device="cuda", dtype=torch.half, requires_grad=True)
        k, v = (torch.randn(2, 3, 130, 64, device="cuda", dtype=torch.half, requires_grad=True)
                for _ in range(2))
        torch._dynamo.reset()
        explained = torch._dynamo.explain(loss)(q, k, v)
        self.assertEqual(explained.graph_break_count, 0, explained.break_reasons)
        compiled = torch.compile(loss, fullgraph=True)
        grads = torch.autograd.grad(compiled(q, k, v), (q, k, v))
        expected = torch.autograd.grad(loss(q, k, v), (q, k, v))
        for g, e in zip(grads, expected):
            self.assertEqual(g.shape, e.shape)
            torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-3)


if __name__ == "__main__":
    torch_gpu.main(SKIP_REASON)
