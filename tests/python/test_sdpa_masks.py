#!/usr/bin/env python3
"""The SDPA entry point (attention_steps.sdpa.scaled_dot_product_attention, what use_steps() puts
in place of F.scaled_dot_product_attention) with cross-attention, key-padding masks and
is_causal with N != N_k (#31):

  - served calls, in fp16 and bf16 at head dims 32, 64, 80 and 128 (one test per head dim, each
    skipped with the library's reason where no step serves its calls here): cross-attention
    (N_k > N, N_k < N, DETR's 100 queries against 1050 keys), boolean key-padding masks in the
    forms SDPA takes them ([B, 1, 1, N_k], [1, N_k], expand()ed to [B, 1, N, N_k] and to
    [B, H, N, N_k]), a padded cross-attention, is_causal with N < N_k, N > N_k and N = N_k: O
    and dQ, dK, dV against PyTorch's own SDPA (its math backend in fp32, through autograd), with
    harness/check.hpp's tolerances (4u for O, 8u for the gradients), and the profiler's record
    that the operator ran, forward and backward;
  - a batch element whose keys are all padding: O = 0 and zero gradients, no NaN anywhere (the
    library's definition; PyTorch's answer there depends on its backend), the other elements
    against PyTorch;
  - what stays PyTorch's: a mask of another shape ([N, N_k], a different mask per head, a
    [B, 1, N, N_k] tensor whose rows are equal only in value), a float mask of 0 and -inf, a mask
    with is_causal, grouped-query attention: each gets the reason of FALLBACKS it should, runs no
    operator and returns PyTorch's own result, bit for bit (or PyTorch's error); verbose says so
    once;
  - no device sync: a masked cross-attention call traced by torch.compile(fullgraph=True) with no
    graph break (the mask expand()ed inside the traced function), and captured in a CUDA graph
    and replayed on new inputs and a new mask.

Run with python3 (exit 77, ctest's skipped, without torch, a GPU or the operator) or with pytest:

    PYTHONPATH=python ATTENTION_STEPS_LIBRARY=build/libattention_steps.so \\
        python3 -m pytest -v tests/python/test_sdpa_masks.py
"""
import contextlib
import io
import unittest

import torch_gpu
from torch_gpu import per_head_dim, torch_dtype

SKIP_REASON = torch_gpu.skip_reason("the SDPA entry's mask and cross-attention tests")
if SKIP_REASON is None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attention_steps import choice, sdpa


def setUpModule():
    if SKIP_REASON is not None:
        raise unittest.SkipTest(SKIP_REASON)
    choice.prepare(torch.cuda.current_device())  # before any torch.compile traces


HEAD_DIMS = (32, 64, 80, 128)
DTYPES = ("fp16", "bf16")
UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}  # harness/check.hpp
# Reasons that are the library's answer for this GPU (no step serves that part of the call here),
# not sdpa.py's routing: a call with one of them is skipped, not failed.
LIBRARY_LIMITS = ("head_dim", "gradient", "cross", "padding", "causal", "tokens")
BATCH, HEADS = 2, 3


def attending_rows(batch, kv_tokens):
    """[B, N_k] bool, True where a key takes part (SDPA's convention): batch 0 every key, batch 1
    a prefix with holes (its first key kept), batch 2 (when there is one) no key at all."""
    rows = torch.ones(batch, kv_tokens, device="cuda", dtype=torch.bool)
    if batch > 1:
        rows[1, kv_tokens // 2:] = False
        rows[1, 1::3] = False
        rows[1, 0] = True
    if batch > 2:
        rows[2] = False
    return rows


# The served forms: (name, N, N_k, mask from the [B, N_k] rows and the shape, is_causal).
SERVED_FORMS = (
    ("cross-attention, N < N_k", 65, 130, None, False),
    ("cross-attention, N > N_k", 130, 17, None, False),
    ("cross-attention, DETR's 100 x 1050", 100, 1050, None, False),
    ("padding [B, 1, 1, N_k]", 65, 65, lambda rows, shape: rows[:, None, None, :], False),
    ("padding [1, N_k], one row for all", 65, 65, lambda rows, shape: rows[1:2], False),
    ("padding expanded to [B, 1, N, N_k]", 100, 1050,
     lambda rows, shape: rows[:, None, None, :].expand(shape[0], 1, shape[2], rows.shape[1]), False),
    ("padding expanded to [B, H, N, N_k]", 17, 130,
     lambda rows, shape: rows[:, None, None, :].expand(shape[0], shape[1], shape[2], rows.shape[1]),
     False),
    ("padded cross-attention [B, 1, 1, N_k]", 100, 1050,
     lambda rows, shape: rows[:, None, None, :], False),
    ("is_causal, N = N_k", 65, 65, None, True),
    ("is_causal, N < N_k (top left)", 17, 130, None, True),
    ("is_causal, N > N_k (top left)", 130, 17, None, True),
)


def ran_operator(function):
    """(what function() returned, whether the operator ran forward, whether it ran backward): the
    profiler's record of attention_steps::attention and attention_backward."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as recorded:
        result = function()
    names = {event.name for event in recorded.events()}
    return (result, "attention_steps::attention" in names,
            "attention_steps::attention_backward" in names)


def pytorch_reference(q, k, v, d_o, attn_mask, is_causal):
    """O, dQ, dK, dV by PyTorch's own SDPA (math backend) in fp32, through autograd."""
    exact = [t.detach().float().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH):
        out = sdpa._pytorch_sdpa(*exact, attn_mask=attn_mask, is_causal=is_causal)
    return (out.detach(), *torch.autograd.grad(out, exact, d_o.float()))


def library_limit(reason):
    return any(reason.startswith(sdpa.FALLBACKS[key]) for key in LIBRARY_LIMITS)


class Case(unittest.TestCase):
    def inputs(self, dtype, batch, tokens, kv_tokens, head_dim, seed):
        torch.manual_seed(seed)
        q = torch.randn(batch, HEADS, tokens, head_dim, device="cuda", dtype=torch_dtype(dtype),
                        requires_grad=True)
        k, v = (torch.randn(batch, HEADS, kv_tokens, head_dim, device="cuda",
                            dtype=torch_dtype(dtype), requires_grad=True) for _ in range(2))
        d_o = torch.randn(batch, HEADS, tokens, head_dim, device="cuda", dtype=torch_dtype(dtype))
        return q, k, v, d_o

    def steps_call(self, q, k, v, d_o, attn_mask, is_causal):
        """O, dQ, dK, dV through the SDPA entry, with whether the operator ran both ways."""
        def run():
            out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                    is_causal=is_causal)
            return (out.detach(), *torch.autograd.grad(out, (q, k, v), d_o))
        return ran_operator(run)

    def assert_output(self, got, want, v, dtype, what):
        u = UNIT_ROUNDOFF[dtype]
        error = got.float() - want
        with self.subTest(what=what, tensor="O"):
            self.assertEqual(got.dtype, v.dtype)
            self.assertTrue(torch.isfinite(got).all())
            self.assertLessEqual((error.norm() / want.norm()).item(), 4 * u)
            self.assertLessEqual(error.abs().max().item(), 4 * u * v.abs().max().item())

    def assert_gradients(self, got, want, dtype, what):
        """harness/check.hpp's tolerances for gradients: 8u relative Frobenius error, 8u times the
        largest reference value (at least dV's) on any element."""
        u = UNIT_ROUNDOFF[dtype]
        floor = want[2].abs().max().item()
        for name, g, w in zip(("dQ", "dK", "dV"), got, want):
            with self.subTest(what=what, tensor=name):
                self.assertEqual(tuple(g.shape), tuple(w.shape))
                self.assertTrue(torch.isfinite(g).all())
                error = g.float() - w
                relative = error.norm() / w.norm() if w.norm() > 0 else error.norm()
                self.assertLessEqual(relative.item(), 8 * u)
                self.assertLessEqual(error.abs().max().item(), 8 * u * max(floor, w.abs().max().item()))


@per_head_dim(HEAD_DIMS)
class Served(Case):
    def check(self, head_dim):
        ran, limits = 0, []
        for dtype in DTYPES:
            for number, (name, tokens, kv_tokens, make_mask, is_causal) in enumerate(SERVED_FORMS):
                what = f"{name}, {dtype}, head dim {head_dim}"
                q, k, v, d_o = self.inputs(dtype, BATCH, tokens, kv_tokens, head_dim,
                                           seed=number * 131 + head_dim)
                attn_mask = None if make_mask is None else \
                    make_mask(attending_rows(BATCH, kv_tokens), q.shape)
                step, reason = sdpa._why_not(q, k, v, attn_mask, 0.0, is_causal)
                if step is None:
                    # A form sdpa.py must recognise: only the library's answer may refuse it.
                    self.assertTrue(library_limit(reason), f"{what}: {reason}")
                    limits.append(f"{what}: {reason}")
                    continue
                ran += 1
                (out, *grads), forward, backward = self.steps_call(q, k, v, d_o, attn_mask, is_causal)
                with self.subTest(what=what, check="the operator ran"):
                    self.assertTrue(forward, "no attention_steps::attention in the profile")
                    self.assertTrue(backward, "no attention_steps::attention_backward in the profile")
                want_out, *want_grads = pytorch_reference(q, k, v, d_o, attn_mask, is_causal)
                self.assert_output(out, want_out, v, dtype, what)
                self.assert_gradients(grads, want_grads, dtype, what)
        for line in limits:
            print(f"  not served here (the library's answer): {line}")
        if not ran:
            self.skipTest(f"head dim {head_dim}: the library serves none of these calls here "
                          f"({limits[0] if limits else 'no reason'})")


class EveryKeyPadded(Case):
    def test_zero_output_and_gradients_and_no_nan(self):
        ran = False
        for dtype in DTYPES:
            for tokens, kv_tokens in ((65, 65), (100, 1050)):
                what = f"{dtype}, N = {tokens}, N_k = {kv_tokens}"
                q, k, v, d_o = self.inputs(dtype, 3, tokens, kv_tokens, 64, seed=tokens + kv_tokens)
                rows = attending_rows(3, kv_tokens)  # batch 2: no key takes part
                attn_mask = rows[:, None, None, :]
                step, reason = sdpa._why_not(q, k, v, attn_mask, 0.0, False)
                if step is None:
                    self.assertTrue(library_limit(reason), f"{what}: {reason}")
                    continue
                ran = True
                (out, dq, dk, dv), forward, backward = self.steps_call(q, k, v, d_o, attn_mask, False)
                self.assertTrue(forward and backward, what)
                with self.subTest(what=what, check="no key: zeros, no NaN"):
                    for name, tensor in (("O", out), ("dQ", dq), ("dK", dk), ("dV", dv)):
                        self.assertTrue(torch.isfinite(tensor).all(), f"{name} has NaN or inf")
                        self.assertTrue(torch.equal(tensor[2], torch.zeros_like(tensor[2])), name)
                seen = slice(0, 2)
                want_out, *want_grads = pytorch_reference(q[seen], k[seen], v[seen], d_o[seen],
                                                          attn_mask[seen], False)
                self.assert_output(out[seen], want_out, v, dtype, what)
                self.assert_gradients([g[seen] for g in (dq, dk, dv)], want_grads, dtype, what)
        if not ran:
            self.skipTest("the library serves no padded call at head dim 64 here")


class StaysPyTorchs(Case):
    def assert_falls_back(self, key, q, k, v, attn_mask=None, is_causal=False, **extra):
        """The reason is FALLBACKS[key], no operator runs, and the result is PyTorch's own, bit for
        bit, or PyTorch's own error (both without autograd, so that both choose as inference does)."""
        q, k, v = (t.detach() for t in (q, k, v))
        step, reason = sdpa._why_not(q, k, v, attn_mask, 0.0, is_causal)
        self.assertIsNone(step)
        self.assertTrue(reason.startswith(sdpa.FALLBACKS[key]), reason)

        def ours():
            return sdpa.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                     is_causal=is_causal, **extra)

        def theirs():
            return sdpa._pytorch_sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **extra)

        try:
            want = theirs()
        except Exception as error:  # noqa: BLE001  PyTorch's own refusal: ours must be the same
            with self.assertRaises(type(error)):
                ours()
            return
        got, forward, _ = ran_operator(ours)
        self.assertFalse(forward, "the operator ran")
        torch.testing.assert_close(got, want, rtol=0, atol=0)

    def test_masks_of_other_shapes(self):
        q, k, v, _ = self.inputs("fp16", BATCH, 65, 130, 64, seed=21)
        general = torch.rand(65, 130, device="cuda") > 0.2  # a row of its own for each query
        self.assert_falls_back("mask", q, k, v, general)
        per_head = torch.rand(BATCH, HEADS, 1, 130, device="cuda") > 0.2
        self.assert_falls_back("mask", q, k, v, per_head)
        # Equal rows, but a tensor of its own for each (what transformers' sdpa_mask returns):
        # telling it from a general mask would need its values.
        rows = attending_rows(BATCH, 130)
        materialised = rows[:, None, None, :].expand(BATCH, 1, 65, 130).contiguous()
        self.assert_falls_back("mask", q, k, v, materialised)

    def test_a_float_mask(self):
        q, k, v, _ = self.inputs("fp16", BATCH, 65, 130, 64, seed=22)
        rows = attending_rows(BATCH, 130)
        additive = torch.zeros(BATCH, 1, 1, 130, device="cuda", dtype=torch.half)
        additive.masked_fill_(~rows[:, None, None, :], float("-inf"))
        self.assert_falls_back("float_mask", q, k, v, additive)
        additive.masked_fill_(~rows[:, None, None, :], torch.finfo(torch.half).min)
        self.assert_falls_back("float_mask", q, k, v, additive)

    def test_a_mask_with_is_causal(self):
        q, k, v, _ = self.inputs("fp16", BATCH, 65, 65, 64, seed=23)
        self.assert_falls_back("mask", q, k, v, attending_rows(BATCH, 65)[:, None, None, :],
                               is_causal=True)

    def test_grouped_query_attention(self):
        torch.manual_seed(24)
        q = torch.randn(BATCH, 4, 65, 64, device="cuda", dtype=torch.half)
        k, v = (torch.randn(BATCH, 2, 65, 64, device="cuda", dtype=torch.half) for _ in range(2))
        self.assert_falls_back("shape", q, k, v, enable_gqa=True)

    def test_verbose_says_so_once(self):
        q, k, v, _ = self.inputs("fp16", BATCH, 65, 130, 64, seed=25)
        additive = torch.zeros(BATCH, 1, 1, 130, device="cuda", dtype=torch.half)
        sdpa._settings["verbose"] = True
        sdpa._said.clear()
        said = io.StringIO()
        try:
            with torch.no_grad(), contextlib.redirect_stdout(said):
                for _ in range(3):
                    sdpa.scaled_dot_product_attention(q, k, v, attn_mask=additive)
        finally:
            sdpa._settings["verbose"] = False
        self.assertEqual(said.getvalue().count(sdpa.FALLBACKS["float_mask"]), 1, said.getvalue())


class NoDeviceSync(Case):
    def test_compiled_with_no_graph_break(self):
        q, k, v, _ = self.inputs("fp16", BATCH, 100, 1050, 32, seed=31)
        rows = attending_rows(BATCH, 1050)
        if sdpa._why_not(q, k, v, rows[:, None, None, :], 0.0, False)[0] is None:
            self.skipTest("no step serves a padded cross-attention at head dim 32 here")

        def attend(q, k, v, rows):  # the mask made inside the traced function, as models do
            mask = rows[:, None, None, :].expand(q.shape[0], 1, q.shape[2], k.shape[2])
            return sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        torch._dynamo.reset()
        explained = torch._dynamo.explain(attend)(q, k, v, rows)
        self.assertEqual(explained.graph_break_count, 0, explained.break_reasons)
        targets = [str(node.target) for graph in explained.graphs for node in graph.graph.nodes]
        self.assertTrue(any("attention_steps.attention" in t for t in targets), targets)
        compiled = torch.compile(attend, fullgraph=True)
        grads = torch.autograd.grad(compiled(q, k, v, rows).float().square().sum(), (q, k, v))
        expected = torch.autograd.grad(attend(q, k, v, rows).float().square().sum(), (q, k, v))
        for g, e in zip(grads, expected):
            torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-3)

    def test_cuda_graph_capture_and_replay(self):
        torch.manual_seed(32)
        q = torch.randn(BATCH, HEADS, 100, 32, device="cuda", dtype=torch.half)
        k, v = (torch.randn(BATCH, HEADS, 1050, 32, device="cuda", dtype=torch.half)
                for _ in range(2))
        rows = attending_rows(BATCH, 1050)
        mask = rows[:, None, None, :]
        if sdpa._why_not(q, k, v, mask, 0.0, False)[0] is None:
            self.skipTest("no step serves a padded cross-attention at head dim 32 here")
        side = torch.cuda.Stream()  # warm-up off the capture stream, as torch asks
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # a device sync inside would invalidate the capture
            out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        for seed in (33, 34):  # new inputs and a new mask into the captured tensors, then replay
            torch.manual_seed(seed)
            for tensor in (q, k, v):
                tensor.copy_(torch.randn_like(tensor))
            rows.copy_(torch.rand(rows.shape, device="cuda") > 0.3)
            rows[:, 0] = True
            graph.replay()
            torch.cuda.synchronize()
            want, *_ = pytorch_reference(q, k, v, torch.zeros_like(q), mask, False)
            self.assert_output(out, want, v, "fp16", f"replay {seed}")


if __name__ == "__main__":
    torch_gpu.main(SKIP_REASON)
