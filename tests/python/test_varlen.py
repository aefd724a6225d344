#!/usr/bin/env python3
"""attention_steps.varlen_attention: sequences of different lengths packed into one call.

  - for each head dim of HEAD_DIMS (one test each), packed sequences against SDPA run sequence by
    sequence in fp32, with the tolerances of harness/check.hpp, and L against log-sum-exp in
    fp64: lengths 1, around the tiles (127, 128, 129, 208, 209), one long and many short, empty
    sequences among them; fp16 and bf16; self-attention (cu_seqlens_q = cu_seqlens_k) and
    cross-attention (other key lengths, one sequence with no key: O = 0, L = -inf); causal in
    both alignments (True is FlashAttention's bottom right);
  - q, k, v as slices of one packed projection [total, 3, H, D], read in place;
  - gradients through autograd (the backward step that takes packed sequences) against fp64
    autograd of the same reference, with harness/check.hpp's tolerances for gradients: the same
    mixes of lengths, self- and cross-attention, causal in both alignments, fp16 and bf16, the
    deterministic mode (the same bits twice); a key no row sees and a row that sees no key get
    exactly 0;
  - the bad inputs, each a clear error before anything is launched: prefix sums not int32, not on
    the GPU, not starting at 0, decreasing, not ending at the token count, a sequence longer than
    its max_seqlen; a head dim no step serves;
  - torch.library.opcheck of the operator (its fake) and torch.compile(fullgraph=True).

Run with python3 (exit 77, ctest's skipped, without torch, a GPU or the operator) or pytest.
"""
import math
import unittest

import torch_gpu
from torch_gpu import per_head_dim, torch_dtype

SKIP_REASON = torch_gpu.skip_reason("the packed sequences' tests")
if SKIP_REASON is None:
    import torch
    import torch.nn.functional as F

    import attention_steps as steps
    from attention_steps import torch_op, varlen
    torch_op.load()


def setUpModule():
    if SKIP_REASON is not None:
        raise unittest.SkipTest(SKIP_REASON)


HEAD_DIMS = (32, 64, 80, 96, 128, 256)
HEADS = 3
UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}  # harness/check.hpp
SELF_LENGTHS = ([1, 127, 128, 129, 1, 208, 209, 0, 17], [1025, 1, 2, 17, 65, 3], [0, 5, 0], [300])
CROSS_LENGTHS = (([17, 130, 1, 64], [65, 1, 200, 0]), ([100, 100], [1050, 7]))


def prefix_sums(lengths):
    sums = [0]
    for length in lengths:
        sums.append(sums[-1] + length)
    return torch.tensor(sums, dtype=torch.int32, device="cuda")


def packed(lengths, head_dim, dtype, scale=1.0):
    return torch.randn(sum(lengths), HEADS, head_dim, device="cuda", dtype=dtype) * scale


def reference(q, k, v, q_lengths, k_lengths, causal):
    """O (fp32) and L (fp64) sequence by sequence: SDPA's math on each sequence alone, the causal
    diagonal at the bottom right or top left of each; rows with no key O = 0, L = -inf."""
    outputs, lses = [], []
    q_start = k_start = 0
    for n, n_k in zip(q_lengths, k_lengths):
        qs = q[q_start:q_start + n].double().transpose(0, 1)   # [H, n, D]
        ks = k[k_start:k_start + n_k].double().transpose(0, 1)
        vs = v[k_start:k_start + n_k].double().transpose(0, 1)
        scores = qs @ ks.transpose(1, 2) / math.sqrt(q.shape[-1])
        if causal is not None:
            diagonal = n_k - n if causal == "bottom-right" else 0
            seen = torch.arange(n_k, device="cuda")[None, :] <= torch.arange(n, device="cuda")[:, None] + diagonal
            scores = scores.masked_fill(~seen, -math.inf)
        lse = torch.logsumexp(scores, dim=-1)  # -inf where a row sees no key
        weights = torch.where(torch.isfinite(lse)[..., None], torch.exp(scores - lse[..., None]),
                              torch.zeros_like(scores))
        outputs.append((weights @ vs).transpose(0, 1))
        lses.append(lse)
        q_start += n
        k_start += n_k
    return torch.cat(outputs), torch.cat(lses, dim=-1)  # fp64: differentiable, for the gradients


class Checks(unittest.TestCase):
    def assert_matches(self, q, k, v, q_lengths, k_lengths, causal=False, dtype="fp16"):
        alignment = {False: None, True: "bottom-right"}.get(causal, causal)
        o, lse = steps.varlen_attention(q, k, v, prefix_sums(q_lengths), prefix_sums(k_lengths),
                                        max(q_lengths), max(k_lengths), causal=causal)
        want_o, want_lse = reference(q, k, v, q_lengths, k_lengths, alignment)
        self.assertEqual(o.shape, q.shape)
        self.assertEqual(lse.shape, (HEADS, q.shape[0]))
        self.assertTrue(torch.isfinite(o).all(), "a non-finite output")
        want_o = want_o.float()
        error = (o.float() - want_o).norm() / max(want_o.norm().item(), 1e-30)
        self.assertLessEqual(error.item(), 4 * UNIT_ROUNDOFF[dtype])
        largest = (o.float() - want_o).abs().max().item() if o.numel() else 0.0
        self.assertLessEqual(largest, 4 * UNIT_ROUNDOFF[dtype] * v.abs().max().item())
        finite = torch.isfinite(want_lse)
        self.assertTrue(torch.equal(finite, torch.isfinite(lse)), "L = -inf exactly where no key is seen")
        if finite.any():
            self.assertLessEqual((lse.double()[finite] - want_lse[finite]).abs().max().item(),
                                 4 * UNIT_ROUNDOFF["fp16"])


@per_head_dim(HEAD_DIMS)
class PackedAgainstSdpa(Checks):
    def check(self, head_dim):
        try:
            step = varlen.packed_step(head_dim)
        except ValueError as why:
            self.skipTest(str(why))
        if steps.refusal(step, (1, HEADS, 1, head_dim)) is not None:
            self.skipTest(steps.refusal(step, (1, HEADS, 1, head_dim)))
        torch.manual_seed(head_dim)
        for dtype in ("fp16", "bf16"):
            for lengths in SELF_LENGTHS:
                for causal in (False, "top-left"):
                    with self.subTest(dtype=dtype, lengths=lengths, causal=causal):
                        q, k, v = (packed(lengths, head_dim, torch_dtype(dtype)) for _ in range(3))
                        self.assert_matches(q, k, v, lengths, lengths, causal, dtype)
            for q_lengths, k_lengths in CROSS_LENGTHS:
                for causal in (False, True, "top-left"):
                    with self.subTest(dtype=dtype, q_lengths=q_lengths, k_lengths=k_lengths, causal=causal):
                        q = packed(q_lengths, head_dim, torch_dtype(dtype))
                        k, v = (packed(k_lengths, head_dim, torch_dtype(dtype)) for _ in range(2))
                        self.assert_matches(q, k, v, q_lengths, k_lengths, causal, dtype)
        # Slices of one packed projection [total, 3, H, D], read in place.
        lengths = [197, 50, 129]
        qkv = torch.randn(sum(lengths), 3, HEADS, head_dim, device="cuda", dtype=torch.half)
        q, k, v = qkv.unbind(1)
        self.assert_matches(q, k, v, lengths, lengths)


def unseen(q_lengths, k_lengths, alignment):
    """The rows that see no key and the keys that no row sees (bool [total_q], [total_k]): their
    gradients are exactly 0."""
    rows, keys = [], []
    for n, n_k in zip(q_lengths, k_lengths):
        diagonal = n_k - n if alignment == "bottom-right" else 0
        causal = alignment is not None
        rows += [n_k == 0 or (causal and i + diagonal < 0) for i in range(n)]
        keys += [n == 0 or (causal and j > n - 1 + diagonal) for j in range(n_k)]
    return (torch.tensor(rows, dtype=torch.bool, device="cuda"),
            torch.tensor(keys, dtype=torch.bool, device="cuda"))


def gradients(q, k, v, d_o, q_lengths, k_lengths, causal, deterministic=False):
    """(dq, dk, dv) of the steps through autograd, of the fp64 reference, and the rows of each
    that must be exactly 0 (unseen)."""
    alignment = {False: None, True: "bottom-right"}.get(causal, causal)
    inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    torch.use_deterministic_algorithms(deterministic)
    try:
        o, _ = steps.varlen_attention(*inputs, prefix_sums(q_lengths), prefix_sums(k_lengths),
                                      max(q_lengths), max(k_lengths), causal=causal)
        got = torch.autograd.grad(o, inputs, d_o)
    finally:
        torch.use_deterministic_algorithms(False)
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want_o, _ = reference(*exact, q_lengths, k_lengths, alignment)
    want = torch.autograd.grad(want_o, exact, d_o.double())
    rows, keys = unseen(q_lengths, k_lengths, alignment)
    return got, want, (rows, keys, keys)


@per_head_dim(HEAD_DIMS)
class GradientsAgainstFp64(unittest.TestCase):
    def assert_gradients(self, got, want, zero_rows, dtype):
        """harness/check.hpp's tolerances for gradients: 8u relative Frobenius error, 8u times the
        largest reference value (at least dV's) on any element; exactly 0 on zero_rows."""
        u = UNIT_ROUNDOFF[dtype]
        floor = want[2].abs().max().item() if want[2].numel() else 0.0
        for name, g, w, zeros in zip(("dq", "dk", "dv"), got, want, zero_rows):
            with self.subTest(gradient=name):
                self.assertEqual(tuple(g.shape), tuple(w.shape))
                self.assertTrue(torch.isfinite(g).all(), "a non-finite gradient")
                if w.numel() == 0:
                    continue
                error = g.double() - w
                relative = error.norm() / w.norm() if w.norm() > 0 else error.norm()
                self.assertLessEqual(relative.item(), 8 * u)
                self.assertLessEqual(error.abs().max().item(), 8 * u * max(floor, w.abs().max().item()))
                self.assertTrue((g[zeros] == 0).all(), "a gradient the masks make 0 is not 0")

    def check(self, head_dim):
        try:
            step = varlen.packed_step(head_dim, backward=True)
        except ValueError as why:
            self.skipTest(str(why))
        if steps.refusal(step, (1, HEADS, 1, head_dim)) is not None:
            self.skipTest(steps.refusal(step, (1, HEADS, 1, head_dim)))
        torch.manual_seed(head_dim + 1)
        cases = [(lengths, lengths, causal) for lengths in SELF_LENGTHS for causal in (False, "top-left")]
        cases += [(q_lengths, k_lengths, causal) for q_lengths, k_lengths in CROSS_LENGTHS
                  for causal in (False, True, "top-left")]
        for dtype in ("fp16", "bf16"):
            for q_lengths, k_lengths, causal in cases:
                with self.subTest(dtype=dtype, q_lengths=q_lengths, k_lengths=k_lengths, causal=causal):
                    q = packed(q_lengths, head_dim, torch_dtype(dtype))
                    k, v = (packed(k_lengths, head_dim, torch_dtype(dtype)) for _ in range(2))
                    d_o = packed(q_lengths, head_dim, torch_dtype(dtype))
                    self.assert_gradients(*gradients(q, k, v, d_o, q_lengths, k_lengths, causal), dtype)
        # The deterministic mode: checked, and the same bits twice.
        lengths = [197, 1, 130, 65]
        q, k, v, d_o = (packed(lengths, head_dim, torch.half) for _ in range(4))
        first, want, zeros = gradients(q, k, v, d_o, lengths, lengths, "top-left", deterministic=True)
        self.assert_gradients(first, want, zeros, "fp16")
        second, _, _ = gradients(q, k, v, d_o, lengths, lengths, "top-left", deterministic=True)
        for a, b in zip(first, second):
            self.assertTrue(torch.equal(a, b), "the deterministic mode gave other bits")


class BadInputs(unittest.TestCase):
    def setUp(self):
        self.q = torch.randn(10, HEADS, 64, device="cuda", dtype=torch.half)
        self.good = prefix_sums([4, 6])

    def refused(self, error, text, cu_q=None, cu_k=None, max_q=6, max_k=6, q=None):
        with self.assertRaises(error) as raised:
            q = self.q if q is None else q
            steps.varlen_attention(q, q, q, self.good if cu_q is None else cu_q,
                                   self.good if cu_k is None else cu_k, max_q, max_k)
        self.assertIn(text, str(raised.exception))

    def test_each_is_named(self):
        self.refused(TypeError, "must be a torch.int32 tensor", cu_q=self.good.long())
        self.refused(ValueError, "the prefix sums go on q's GPU", cu_k=self.good.cpu())
        self.refused(ValueError, "must start at 0", cu_q=prefix_sums([4, 6]) + 1)
        self.refused(ValueError, "decreases at entry 2",
                     cu_q=torch.tensor([0, 7, 4, 10], dtype=torch.int32, device="cuda"))
        self.refused(ValueError, "ends at 9, but the tensor holds 10 tokens", cu_q=prefix_sums([4, 5]))
        self.refused(ValueError, "longer than its max_seqlen (5)", max_k=5)
        self.refused(ValueError, "must count the same sequences", cu_k=prefix_sums([4, 3, 3]))
        with self.assertRaises(ValueError) as raised:
            steps.varlen_attention(self.q, self.q, self.q, self.good, self.good, 6, 6, causal="diagonal")
        self.assertIn("causal is 'diagonal'", str(raised.exception))
        with self.assertRaises(ValueError) as raised:  # no step takes packed sequences at D = 48
            q = torch.randn(10, HEADS, 48, device="cuda", dtype=torch.half)
            steps.varlen_attention(q, q, q, self.good, self.good, 6, 6)
        self.assertIn("no step takes packed sequences at head dim 48", str(raised.exception))

    def test_empty_and_all_empty(self):
        q = torch.randn(0, HEADS, 64, device="cuda", dtype=torch.half)
        zeros = prefix_sums([0, 0])
        o, lse = steps.varlen_attention(q, q, q, zeros, zeros, 0, 0)
        self.assertEqual(o.shape, (0, HEADS, 64))


class Compiles(unittest.TestCase):
    def test_opcheck_and_compile(self):
        step = varlen.packed_step(64)
        if steps.refusal(step, (1, HEADS, 1, 64)) is not None:
            self.skipTest(steps.refusal(step, (1, HEADS, 1, 64)))
        lengths = [65, 1, 130]
        q, k, v = (packed(lengths, 64, torch.half) for _ in range(3))
        sums = prefix_sums(lengths)
        torch.library.opcheck(torch.ops.attention_steps.varlen_attention.default,
                              (q, k, v, sums, sums, 130, 130, step, None, None, True),
                              test_utils=("test_schema", "test_faketensor"))

        def attend(q, k, v, sums):
            return steps.varlen_attention(q, k, v, sums, sums, 130, 130, step=step,
                                          check_lengths=False)[0] * 2
        compiled = torch.compile(attend, fullgraph=True)
        self.assertTrue(torch.equal(compiled(q, k, v, sums), attend(q, k, v, sums)))
        # The backward's op and its fake; gradients through the compiled function.
        backward_step = varlen.packed_step(64, backward=True)
        o, lse = torch.ops.attention_steps.varlen_attention(q, k, v, sums, sums, 130, 130, step, None, None, True)
        torch.library.opcheck(torch.ops.attention_steps.varlen_attention_backward.default,
                              (torch.randn_like(o), q, k, v, o, lse, sums, sums, 130, 130, backward_step),
                              test_utils=("test_schema", "test_faketensor"))
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        compiled(*inputs, sums).sum().backward()
        eager = [t.clone().requires_grad_() for t in (q, k, v)]
        attend(*eager, sums).sum().backward()
        for a, b in zip(inputs, eager):
            self.assertTrue(torch.equal(a.grad, b.grad))


if __name__ == "__main__":
    torch_gpu.main(SKIP_REASON)
