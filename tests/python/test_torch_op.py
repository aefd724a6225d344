#!/usr/bin/env python3
"""torch.ops.attention_steps.attention on a GPU, as PyTorch uses an operator.

  - every step that serves the shape, on contiguous tensors, on slices of one packed projection
    and on views of sequence-first projections, at tail shapes (N = 1, 65, 130), against SDPA in
    fp32 with the tolerances of harness/check.hpp, and O's strides (q's order of batch and tokens
    for a step that takes views); L against log-sum-exp in fp64; another scale;
  - torch.library.opcheck (schema, fake tensor, autograd registration, AOT dispatch with
    dynamic shapes) at a tail shape, on packed views and on sequence-first cross-attention;
  - a CUDA graph capture of the operator, replayed on new inputs;
  - torch.compile(fullgraph=True), with static and with dynamic shapes, and no graph break
    in a torchvision ViT with a step swapped in;
  - the SDPA-compatible entry point: a small model that calls F.scaled_dot_product_attention
    runs the steps after use_steps(), and what no step serves (a mask, a gradient) goes to
    PyTorch's, said once when asked;
  - autograd: the forward steps that write L, then the backward step (v10 on an H100, v9
    elsewhere), against SDPA's math backend in fp64,
    and a compiled training step without a graph break;
  - bf16: the steps that take it (v6 forward, v9 backward) with bf16's tolerances, and a model
    trained under torch.autocast(bfloat16) through the SDPA entry point;
  - cross-attention and a key-padding mask, where a step serves them, against SDPA;
  - a causal mask in both alignments (forward, SDPA's is_causal=True, gradients), against SDPA;
  - no step named: attention_steps.choice's table is attn_choose_step's answer, and the module
    swaps run the step it names, or the module's own forward for a call no step serves;
  - the clear errors: a backward no step serves, cross-attention or a mask a step does not take,
    a dtype.

Needs the operator built (pip install --no-build-isolation ./python) and a CUDA device; exit 77
(ctest: skipped) without torch, a GPU, or the operator, saying which.
"""
import contextlib
import io
import sys
import unittest

try:
    import torch
    import torch.nn.functional as F
    import torchvision
except ImportError as error:
    print(f"SKIPPED: {error}; the operator tests did not run")
    sys.exit(77)
if not torch.cuda.is_available():
    print(f"SKIPPED: torch {torch.__version__} sees no CUDA device; the operator tests did not run")
    sys.exit(77)

import attention_steps as steps  # noqa: E402
from attention_steps import choice, sdpa, torch_op  # noqa: E402

try:
    attention_op = torch_op.load()
except ImportError as error:
    print(f"SKIPPED: {error}")
    sys.exit(77)

UNIT_ROUNDOFF = 2.0 ** -11  # harness/check.hpp: fp16; both tolerances are 4u, L's too
BF16_UNIT_ROUNDOFF = 2.0 ** -8  # the same tolerances in bf16 (harness/check.hpp), L's excepted


def served_steps(head_dim=None):
    """(step id, head dim) for every step that runs on this GPU at N = 1."""
    found = []
    for info in steps.list_steps():
        if info.is_backward:  # dQ, dK, dV: the operator runs forward steps
            continue
        for dim in info.head_dims:
            if (head_dim is None or dim == head_dim) and \
                    steps.refusal(info.id, (1, 1, 1, dim)) is None:
                found.append((info.id, dim))
    return found


def fastest(head_dim=64):
    """The step the SDPA entry point picks at this head dim here (v8 on an H100, v6 elsewhere)."""
    return choice.serving(torch.cuda.current_device(), torch.float16, head_dim)[0]


def packed_qkv(batch, heads, tokens, head_dim):
    """q, k, v as views of one projection [B, N, 3, H, D], as a ViT block makes them."""
    qkv = torch.randn(batch, tokens, 3, heads, head_dim, device="cuda", dtype=torch.half)
    return qkv.permute(2, 0, 3, 1, 4).unbind(0)


def sequence_first(batch, heads, tokens, head_dim, kv_tokens=None):
    """q, k, v as [B, H, N, D] views of sequence-first projections [N, B, H*D], as DETR's
    modules make them (q of N rows, k and v of N_k)."""
    def projection(rows):
        x = torch.randn(rows, batch, heads * head_dim, device="cuda", dtype=torch.half)
        return x.unflatten(-1, (heads, head_dim)).permute(1, 2, 0, 3)
    return projection(tokens), projection(kv_tokens or tokens), projection(kv_tokens or tokens)


def o_strides(step, batch, heads, tokens, head_dim, layout):
    """The strides of O from the operator: contiguous for a step that reads contiguous tensors;
    for one that takes views, [B, N, H, D] memory, or [N, B, H, D] for sequence-first q."""
    if not steps.load_library().step(step).takes_strides:
        return (heads * tokens * head_dim, tokens * head_dim, head_dim, 1)
    if layout == "sequence-first views" and batch > 1 and tokens > 1:
        return (heads * head_dim, head_dim, batch * heads * head_dim, 1)
    return (tokens * heads * head_dim, head_dim, heads * head_dim, 1)


def unit_roundoff(dtype):
    return BF16_UNIT_ROUNDOFF if dtype == torch.bfloat16 else UNIT_ROUNDOFF


class Checks(unittest.TestCase):
    def assert_close_to_sdpa(self, q, k, v, out, scale=None):
        reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale)
        error = out.float() - reference
        u = unit_roundoff(q.dtype)
        self.assertEqual(out.dtype, q.dtype)
        self.assertTrue(torch.isfinite(out).all())
        self.assertLessEqual((error.norm() / reference.norm()).item(), 4 * u)
        self.assertLessEqual(error.abs().max().item(), 4 * u * v.abs().max().item())

    def assert_close_to_sdpa_masked(self, q, k, v, out, attend):
        reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attend)
        error = out.float() - reference
        self.assertTrue(torch.isfinite(out).all())
        self.assertLessEqual((error.norm() / reference.norm()).item(), 4 * UNIT_ROUNDOFF)
        self.assertLessEqual(error.abs().max().item(), 4 * UNIT_ROUNDOFF * v.abs().max().item())

    def assert_log_sum_exp(self, q, k, rows, scale=None):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        expected = torch.logsumexp(scale * (q.double() @ k.double().transpose(-1, -2)), dim=-1)
        self.assertEqual(rows.dtype, torch.float32)
        self.assertEqual(tuple(rows.shape), tuple(q.shape[:3]))
        self.assertLessEqual((rows.double() - expected).abs().max().item(), 4 * UNIT_ROUNDOFF)


class EveryStep(Checks):
    def test_contiguous_and_views_at_tail_shapes(self):
        torch.manual_seed(1)
        ran = 0
        for step, head_dim in served_steps():
            for tokens in (1, 65, 130):
                for layout in ("contiguous", "packed views", "sequence-first views"):
                    with self.subTest(step=step, head_dim=head_dim, tokens=tokens, layout=layout):
                        if layout == "contiguous":
                            q, k, v = (torch.randn(2, 3, tokens, head_dim, device="cuda",
                                                   dtype=torch.half) for _ in range(3))
                        elif layout == "packed views":
                            q, k, v = packed_qkv(2, 3, tokens, head_dim)
                        else:
                            q, k, v = sequence_first(2, 3, tokens, head_dim)
                        out, rows = attention_op(q, k, v, step)
                        self.assertEqual(rows.numel(), 0)  # L only when asked
                        self.assert_close_to_sdpa(q, k, v, out)
                        # A step that takes views writes O in q's order of batch and tokens.
                        self.assertEqual(out.stride(), o_strides(step, 2, 3, tokens, head_dim, layout))
                        ran += 1
        self.assertGreater(ran, 0)

    def test_bf16_where_a_step_takes_it(self):
        torch.manual_seed(3)
        takers = [(s, d) for s, d in served_steps() if steps.load_library().step(s).takes_bf16]
        if not takers:
            self.skipTest("no step that takes bf16 runs here")
        for step, head_dim in takers:
            for tokens in (1, 65, 130):
                with self.subTest(step=step, head_dim=head_dim, tokens=tokens):
                    q, k, v = (torch.randn(2, 3, tokens, head_dim, device="cuda",
                                           dtype=torch.bfloat16) for _ in range(3))
                    out, rows = attention_op(q, k, v, step, None, None, True)
                    self.assert_close_to_sdpa(q, k, v, out)
                    self.assert_log_sum_exp(q, k, rows)

    def test_cross_attention_where_a_step_serves_it(self):
        torch.manual_seed(4)
        servers = [(s, d) for s, d in served_steps() if steps.load_library().step(s).takes_kv_tokens]
        self.assertTrue(servers, "no step that serves cross-attention runs here")
        for step, head_dim in servers:
            for tokens, kv_tokens in ((1, 65), (65, 1), (100, 1050), (130, 17)):
                for layout in ("contiguous", "sequence-first views"):  # DETR's: one strides
                    with self.subTest(step=step, head_dim=head_dim, tokens=tokens,
                                      kv_tokens=kv_tokens, layout=layout):
                        if layout == "contiguous":
                            q = torch.randn(2, 3, tokens, head_dim, device="cuda", dtype=torch.half)
                            k, v = (torch.randn(2, 3, kv_tokens, head_dim, device="cuda",
                                                dtype=torch.half) for _ in range(2))
                        else:
                            q, k, v = sequence_first(2, 3, tokens, head_dim, kv_tokens)
                        out, _ = attention_op(q, k, v, step)
                        self.assertEqual(tuple(out.shape), tuple(q.shape))
                        self.assertEqual(out.stride(), o_strides(step, 2, 3, tokens, head_dim, layout))
                        self.assert_close_to_sdpa(q, k, v, out)

    def test_key_padding_mask_where_a_step_takes_it(self):
        torch.manual_seed(7)
        takers = [(s, d) for s, d in served_steps()
                  if steps.load_library().step(s).takes_key_padding_mask]
        self.assertTrue(takers, "no step that takes a key-padding mask runs here")
        for step, head_dim in takers:
            for tokens, kv_tokens in ((65, 65), (100, 1050), (17, 130)):
                with self.subTest(step=step, head_dim=head_dim, tokens=tokens, kv_tokens=kv_tokens):
                    q = torch.randn(3, 2, tokens, head_dim, device="cuda", dtype=torch.half)
                    k, v = (torch.randn(3, 2, kv_tokens, head_dim, device="cuda", dtype=torch.half)
                            for _ in range(2))
                    # Batch 0 keeps every key, batch 1 a prefix and some holes, batch 2 none.
                    mask = torch.zeros(3, kv_tokens, device="cuda", dtype=torch.bool)
                    mask[1, kv_tokens // 2:] = True
                    mask[1, 1::3] = True
                    mask[1, 0] = False
                    mask[2] = True
                    writes_rows = steps.load_library().step(step).writes_log_sum_exp
                    out, rows = attention_op(q, k, v, step, None, mask, writes_rows)
                    attend = ~mask[:2, None, None, :]  # SDPA's boolean mask: True takes part
                    self.assert_close_to_sdpa_masked(q[:2], k[:2], v[:2], out[:2], attend)
                    self.assertTrue(torch.equal(out[2], torch.zeros_like(out[2])))
                    if writes_rows:  # L of a row with no key left: -inf
                        self.assertTrue(torch.isneginf(rows[2]).all())

    def test_log_sum_exp_and_scale(self):
        torch.manual_seed(2)
        writers = [(s, d) for s, d in served_steps()
                   if steps.load_library().step(s).writes_log_sum_exp]
        self.assertTrue(writers, "no step that writes L runs here")
        for step, head_dim in writers:
            for scale in (None, 0.3):
                with self.subTest(step=step, head_dim=head_dim, scale=scale):
                    q, k, v = packed_qkv(2, 3, 65, head_dim)
                    out, rows = attention_op(q, k, v, step, scale, None, True)
                    self.assert_close_to_sdpa(q, k, v, out, scale)
                    self.assert_log_sum_exp(q, k, rows, scale)


class AsAnOperator(Checks):
    def test_opcheck(self):
        step, head_dim = fastest(64), 64
        for layout in ("contiguous", "packed views", "sequence-first views"):
            for with_rows in (False, True):
                with self.subTest(step=step, layout=layout, log_sum_exp=with_rows):
                    if layout == "contiguous":
                        q, k, v = (torch.randn(2, 3, 65, head_dim, device="cuda",
                                               dtype=torch.half) for _ in range(3))
                    elif layout == "packed views":
                        q, k, v = packed_qkv(2, 3, 65, head_dim)
                    else:
                        q, k, v = sequence_first(2, 3, 65, head_dim, 130)
                    torch.library.opcheck(attention_op.default, (q, k, v, step, None, None,
                                                                 with_rows))

    def test_cuda_graph_capture_and_replay(self):
        for step, _ in served_steps(64):
            with self.subTest(step=step):
                q, k, v = packed_qkv(2, 3, 65, 64)
                side = torch.cuda.Stream()  # warm-up off the capture stream, as torch asks
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    steps.attention(q, k, v, step=step)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = steps.attention(q, k, v, step=step)
                for seed in (3, 4):  # new inputs into the captured tensors, then replay
                    torch.manual_seed(seed)
                    for tensor in (q, k, v):
                        tensor.copy_(torch.randn_like(tensor))
                    graph.replay()
                    torch.cuda.synchronize()
                    self.assert_close_to_sdpa(q, k, v, out)

    def test_compile_fullgraph_static_and_dynamic(self):
        step = fastest(64)

        def block(x, weight):
            batch, tokens, _ = x.shape
            q, k, v = (x @ weight).view(batch, tokens, 3, 2, 64).permute(2, 0, 3, 1, 4)
            return steps.attention(q, k, v, step=step).transpose(1, 2).reshape(batch, tokens, 128)

        weight = torch.randn(128, 384, device="cuda", dtype=torch.half) / 12
        for dynamic in (False, True):
            torch._dynamo.reset()
            compiled = torch.compile(block, fullgraph=True, dynamic=dynamic)
            with torch.inference_mode():
                for tokens in (65, 130):
                    with self.subTest(dynamic=dynamic, tokens=tokens):
                        x = torch.randn(2, tokens, 128, device="cuda", dtype=torch.half)
                        torch.testing.assert_close(compiled(x, weight), block(x, weight),
                                                   rtol=0, atol=0)

    def test_swapped_vit_has_no_graph_break(self):
        step = fastest(64)
        model = torchvision.models.vit_b_16(image_size=64).cuda().half().eval()
        steps.swap_attention(model, step=step)
        images = torch.randn(2, 3, 64, 64, device="cuda", dtype=torch.half)
        torch._dynamo.reset()
        with torch.inference_mode():
            explained = torch._dynamo.explain(model)(images)
        self.assertEqual(explained.graph_break_count, 0, explained.break_reasons)
        self.assertEqual(explained.graph_count, 1)


class TinyVit(torch.nn.Module):
    """A ViT block written the way timm's and Hugging Face's are: it calls
    F.scaled_dot_product_attention itself."""

    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(self.norm(x)).view(batch, tokens, 3, self.heads, dim // self.heads) \
            .permute(2, 0, 3, 1, 4).unbind(0)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return x + self.proj(o.transpose(1, 2).reshape(batch, tokens, dim))


class SdpaEntryPoint(Checks):
    def setUp(self):
        torch.manual_seed(5)
        self.model = TinyVit().cuda().half().eval()
        self.x = torch.randn(2, 197, 256, device="cuda", dtype=torch.half)

    def tearDown(self):
        steps.use_steps(False)

    def ran_steps(self, *args):
        """Whether the model's forward called the operator (the profiler's record of it)."""
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as recorded:
            self.model(*args)
        return any(e.name == "attention_steps::attention" for e in recorded.events())

    def test_one_line_swaps_a_model_that_calls_sdpa(self):
        with torch.inference_mode():
            stock = self.model(self.x)
            self.assertFalse(self.ran_steps(self.x))
            steps.use_steps()
            self.assertIs(F.scaled_dot_product_attention, steps.scaled_dot_product_attention)
            swapped = self.model(self.x)
            self.assertTrue(self.ran_steps(self.x))
            steps.use_steps(False)
            self.assertFalse(self.ran_steps(self.x))
        torch.testing.assert_close(swapped, stock, rtol=2e-3, atol=2e-3)

    def test_what_no_step_serves_falls_back_and_says_so_once(self):
        mask = torch.rand(197, 197, device="cuda") > 0.1
        steps.use_steps(verbose=True)
        sdpa._said.clear()
        said = io.StringIO()
        with torch.inference_mode(), contextlib.redirect_stdout(said):
            self.assertFalse(self.ran_steps(self.x, mask))
            self.model(self.x, mask)
            fallback = self.model(self.x, mask)
        self.assertEqual(said.getvalue().count("an attention mask"), 1, said.getvalue())
        steps.use_steps(False)
        with torch.inference_mode():
            torch.testing.assert_close(fallback, self.model(self.x, mask), rtol=0, atol=0)

    def test_training_runs_the_steps_both_ways(self):
        # A loss whose gradients are of order 1 (a mean's would be 1e-5 and lose most of their
        # bits in fp16), with random weights so that nothing cancels by symmetry.
        weights = torch.randn(self.x.shape, device="cuda")
        x = self.x.clone().requires_grad_()
        (self.model(x).float() * weights).sum().backward()
        stock = [x.grad.clone()] + [p.grad.clone() for p in self.model.parameters()]
        x.grad = None
        self.model.zero_grad()
        steps.use_steps()
        self.assertTrue(self.ran_steps(x))
        self.model.zero_grad()
        (self.model(x).float() * weights).sum().backward()  # v9 in the backward
        swapped = [x.grad] + [p.grad for p in self.model.parameters()]
        for a, b in zip(swapped, stock):
            self.assertLessEqual(((a.float() - b.float()).norm() / b.float().norm()).item(), 1e-2)

    def test_bf16_autocast_training_runs_the_steps(self):
        # A float32 model under torch.autocast(bfloat16), as bf16 training runs: the projections
        # hand SDPA bf16 tensors, which v6 (forward) and v9 (backward) take.
        model = TinyVit().cuda()
        x = torch.randn(2, 197, 256, device="cuda", requires_grad=True)
        weights = torch.randn(x.shape, device="cuda")

        def gradients():
            x.grad = None
            model.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                (model(x).float() * weights).sum().backward()
            return [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]

        stock = gradients()
        steps.use_steps()
        self.model = model
        with torch.autocast("cuda", dtype=torch.bfloat16):
            self.assertTrue(self.ran_steps(x))
        swapped = gradients()
        for a, b in zip(swapped, stock):
            self.assertLessEqual(((a - b).norm() / b.norm()).item(), 5e-2)

    def test_compiled_model_calls_the_operator(self):
        steps.use_steps()
        torch._dynamo.reset()
        with torch.inference_mode():
            explained = torch._dynamo.explain(self.model)(self.x)
        self.assertEqual(explained.graph_break_count, 0, explained.break_reasons)
        targets = [str(node.target) for graph in explained.graphs for node in graph.graph.nodes]
        self.assertTrue(any("attention_steps.attention" in t for t in targets), targets)


class ChosenPerCall(Checks):
    """No step named: the table of attention_steps.choice is the library's answer
    (attn_choose_step), and the module swaps run the step it names, or the module's own forward
    for a call no step serves."""

    def ran_operator(self, module, *args, **kwargs):
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as recorded:
            out = module(*args, **kwargs)
        return out, any(e.name == "attention_steps::attention" for e in recorded.events())

    def test_the_table_is_the_library_s_answer(self):
        device = torch.cuda.current_device()
        for dtype, name in ((torch.float16, "fp16"), (torch.bfloat16, "bf16")):
            for head_dim in (64, 128):
                for backward in (False, True):
                    with self.subTest(dtype=name, head_dim=head_dim, backward=backward):
                        self.assertEqual(
                            choice.serving(device, dtype, head_dim, backward=backward)[0],
                            steps.choose_step((2, 3, 65, head_dim), backward=backward, dtype=name))
        step, reason = choice.serving(device, torch.float16, 48)
        self.assertIsNone(step)
        self.assertIn("no step registers head dim 48", reason)

    def test_multihead_attention_runs_the_chosen_step_or_its_own(self):
        from attention_steps import mha
        torch.manual_seed(3)
        module = torch.nn.MultiheadAttention(128, 2, batch_first=True).cuda().half().eval()
        x = torch.randn(2, 65, 128, device="cuda", dtype=torch.half)
        with torch.no_grad():
            expected = module(x, x, x, need_weights=False)[0]
        holder = torch.nn.Sequential(module)
        self.assertEqual(mha.swap_multihead_attention(holder), 1)
        with torch.no_grad():
            out, ran = self.ran_operator(holder[0], x, x, x, need_weights=False)
        self.assertTrue(ran)
        self.assert_close(out[0], expected)
        # Training with a key-padding mask: the chosen steps where a backward step takes the mask
        # on this GPU (v10 on an H100, v9 elsewhere), the module's own otherwise; either way the
        # backward runs.
        holder.train()
        mask = torch.zeros(2, 65, device="cuda", dtype=torch.bool)
        mask[:, 60:] = True
        served = choice.for_call(torch.cuda.current_device(), torch.half, 64, 65, kv_tokens=65,
                                 masked=True, needs_grad=True) is not None
        with torch.no_grad():
            expected = module(x, x, x, key_padding_mask=mask, need_weights=False)[0]
        out, ran = self.ran_operator(holder[0], x, x, x, key_padding_mask=mask, need_weights=False)
        self.assertEqual(ran, served)
        self.assert_close(out[0], expected)
        out[0].float().sum().backward()  # no NotImplementedError
        self.assertTrue(all(torch.isfinite(p.grad).all() for p in holder.parameters()))

    def test_vit_blocks_run_the_chosen_step(self):
        torch.manual_seed(4)
        model = torchvision.models.VisionTransformer(
            image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=128,
            mlp_dim=256).cuda().half().eval()
        torch.nn.init.normal_(model.heads.head.weight)  # torchvision's is zeros: all logits 0
        images = torch.randn(2, 3, 32, 32, device="cuda", dtype=torch.half)
        with torch.no_grad():
            expected = model(images)
        self.assertEqual(steps.swap_attention(model), 1)
        with torch.no_grad():
            out, ran = self.ran_operator(model, images)
        self.assertTrue(ran)
        self.assert_close(out, expected)

    def test_float32_models_under_autocast_run_the_steps(self):
        # bf16 training as it is usually written: float32 weights and activations, attention
        # under torch.autocast(bfloat16). The blocks get float32 inputs, but their projections
        # (and SDPA's own arguments, which autocast casts) are bf16: the steps serve them.
        from attention_steps import mha
        torch.manual_seed(5)
        vit = torchvision.models.VisionTransformer(
            image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=128,
            mlp_dim=256).cuda()
        torch.nn.init.normal_(vit.heads.head.weight)
        images = torch.randn(2, 3, 32, 32, device="cuda")
        module = torch.nn.MultiheadAttention(128, 2, batch_first=True).cuda()
        x = torch.randn(2, 65, 128, device="cuda")
        q, k, v = (torch.randn(2, 2, 65, 64, device="cuda") for _ in range(3))

        def trained(model, *args, **kwargs):  # output and gradients of a forward and backward
            model.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out, ran = self.ran_operator(model, *args, **kwargs)
                out = out[0] if isinstance(out, tuple) else out
            out.float().square().sum().backward()
            return out, [p.grad.clone() for p in model.parameters()], ran

        stock_vit, stock_mha = trained(vit, images), trained(module, x, x, x, need_weights=False)
        self.assertEqual(steps.swap_attention(vit), 1)
        holder = torch.nn.Sequential(module)
        self.assertEqual(mha.swap_multihead_attention(holder), 1)
        for name, (out, grads, ran), (want, want_grads, _) in (
                ("torchvision ViT", trained(vit, images), stock_vit),
                ("nn.MultiheadAttention", trained(holder[0], x, x, x, need_weights=False), stock_mha)):
            with self.subTest(module=name):
                self.assertTrue(ran, f"{name}: the step did not run under autocast")
                self.assertEqual(out.dtype, want.dtype)
                self.assert_close(out, want, 5e-2)
                for grad, want_grad in zip(grads, want_grads):
                    self.assert_close(grad, want_grad, 5e-2)
        steps.use_steps()
        self.addCleanup(steps.use_steps, False)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            expected = sdpa._pytorch_sdpa(q, k, v)
            out, ran = self.ran_operator(F.scaled_dot_product_attention, q, k, v)
        self.assertTrue(ran, "SDPA's entry did not run a step on float32 inputs under autocast")
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assert_close(out, expected)

    def assert_close(self, out, expected, tolerance=1e-2):
        error = (out.float() - expected.float()).norm() / expected.float().norm()
        self.assertLessEqual(error.item(), tolerance)


class Gradients(unittest.TestCase):
    """Autograd through the operator: the forward step, then the backward step of this GPU (v10
    on an H100, v9 elsewhere), against SDPA's math backend in
    fp64, with the tolerances of harness/check.hpp for gradients (8u relative Frobenius; 8u times
    the largest reference value, at least dV's, on any element)."""

    def assert_gradients(self, step, shape, packed=False, scale=None, dtype=torch.half):
        torch.manual_seed(6)
        if packed:
            tensors = [t.detach().clone().requires_grad_() for t in packed_qkv(*shape)]
        else:
            tensors = [torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
                       for _ in range(3)]
        d_o = torch.randn(shape, device="cuda", dtype=dtype)
        u = unit_roundoff(dtype)
        out = steps.attention(*tensors, step=step, scale=scale)
        got = torch.autograd.grad(out, tensors, d_o)
        exact = [t.detach().double().requires_grad_() for t in tensors]
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            reference = F.scaled_dot_product_attention(*exact, scale=scale)
        want = torch.autograd.grad(reference, exact, d_o.double())
        floor = want[2].abs().max().item()
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            with self.subTest(gradient=name):
                error = g.double() - w
                self.assertTrue(torch.isfinite(g).all())
                # dQ and dK vanish at N = 1: the error is then measured as it is (check.cpp).
                relative = error.norm() / w.norm() if w.norm() > 0 else error.norm()
                self.assertEqual(g.dtype, dtype)
                self.assertLessEqual(relative.item(), 8 * u)
                self.assertLessEqual(error.abs().max().item(),
                                     8 * u * max(floor, w.abs().max().item()))

    def test_every_forward_step_that_writes_l_then_the_backward(self):
        for step, head_dim in served_steps():
            if head_dim not in (64, 128) or not steps.load_library().step(step).writes_log_sum_exp:
                continue
            for tokens in (1, 65, 197):
                with self.subTest(step=step, head_dim=head_dim, tokens=tokens):
                    self.assert_gradients(step, (2, 3, tokens, head_dim))
        with self.subTest("packed views, another scale"):
            self.assert_gradients(fastest(64), (2, 3, 130, 64), packed=True, scale=0.3)

    def test_bf16_through_v6_then_the_backward(self):
        if ("v6", 64) not in served_steps(64):
            self.skipTest("v6 does not run here")
        for head_dim in (64, 128):
            for tokens in (1, 65, 197):
                with self.subTest(head_dim=head_dim, tokens=tokens):
                    self.assert_gradients("v6", (2, 3, tokens, head_dim), dtype=torch.bfloat16)

    def test_autograd_runs_v10_on_hopper(self):
        if torch.cuda.get_device_capability() != (9, 0):
            self.skipTest("v10 runs on Hopper (compute capability 9.0) only")
        q, k, v = (torch.randn(2, 3, 197, 64, device="cuda", dtype=torch.half, requires_grad=True)
                   for _ in range(3))
        d_o = torch.randn(2, 3, 197, 64, device="cuda", dtype=torch.half)
        torch.use_deterministic_algorithms(True)  # the same bits, so the two can be compared
        try:
            got = torch.autograd.grad(steps.attention(q, k, v, step="v8"), (q, k, v), d_o)
        finally:
            torch.use_deterministic_algorithms(False)
        o, lse = torch.ops.attention_steps.attention(q, k, v, "v8", None, None, True)
        backward = torch.ops.attention_steps.attention_backward
        for step, same in (("v10", True), ("v9", False)):
            want = backward(d_o, q, k, v, o, lse, step, None, True)
            with self.subTest(step=step):
                self.assertEqual(all(torch.equal(g, w) for g, w in zip(got, want)), same)

    def test_deterministic_algorithms_give_the_same_bits(self):
        q, k, v = (torch.randn(2, 3, 197, 64, device="cuda", dtype=torch.half, requires_grad=True)
                   for _ in range(3))
        d_o = torch.randn(2, 3, 197, 64, device="cuda", dtype=torch.half)
        torch.use_deterministic_algorithms(True)
        try:
            runs = [torch.autograd.grad(steps.attention(q, k, v, step=fastest(64)), (q, k, v), d_o)
                    for _ in range(2)]
        finally:
            torch.use_deterministic_algorithms(False)
        for first, second in zip(*runs):
            self.assertTrue(torch.equal(first, second))

    def test_compiled_training_step_has_no_graph_break(self):
        step = fastest(64)

        def loss(q, k, v):
            return steps.attention(q, k, v, step=step).float().square().sum()

        q, k, v = (torch.randn(2, 3, 65, 64, device="cuda", dtype=torch.half, requires_grad=True)
                   for _ in range(3))
        torch._dynamo.reset()
        explained = torch._dynamo.explain(loss)(q, k, v)
        self.assertEqual(explained.graph_break_count, 0, explained.break_reasons)
        compiled = torch.compile(loss, fullgraph=True)
        grads = torch.autograd.grad(compiled(q, k, v), (q, k, v))
        expected = torch.autograd.grad(loss(q, k, v), (q, k, v))
        for g, e in zip(grads, expected):
            torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-3)


class CausalMask(Checks):
    """causal="top-left" (SDPA's is_causal=True) and "bottom-right", forward and backward."""

    @staticmethod
    def visible(tokens, kv_tokens, align):
        rows = torch.arange(tokens, device="cuda")[:, None]
        keys = torch.arange(kv_tokens, device="cuda")[None, :]
        return keys <= rows + (kv_tokens - tokens if align == "bottom-right" else 0)

    def test_forward_both_alignments_where_a_step_takes_it(self):
        torch.manual_seed(11)
        takers = [(s, d) for s, d in served_steps() if steps.load_library().step(s).takes_causal]
        self.assertTrue(takers, "no step that takes a causal mask runs here")
        for step, head_dim in takers:
            cross = steps.load_library().step(step).takes_kv_tokens
            for tokens, kv_tokens in ((1, 1), (65, 65), (130, 130), (17, 130), (130, 17)):
                if tokens != kv_tokens and not cross:
                    continue
                for align in ("top-left", "bottom-right"):
                    with self.subTest(step=step, head_dim=head_dim, tokens=tokens,
                                      kv_tokens=kv_tokens, align=align):
                        q = torch.randn(2, 3, tokens, head_dim, device="cuda", dtype=torch.half)
                        k, v = (torch.randn(2, 3, kv_tokens, head_dim, device="cuda",
                                            dtype=torch.half) for _ in range(2))
                        writes_rows = steps.load_library().step(step).writes_log_sum_exp
                        out, rows = attention_op(q, k, v, step, None, None, writes_rows, align)
                        attend = self.visible(tokens, kv_tokens, align)
                        seeing = attend.any(dim=-1)  # rows with a key; the others are O = 0
                        self.assert_close_to_sdpa_masked(q[:, :, seeing], k, v, out[:, :, seeing],
                                                         attend[seeing])
                        self.assertTrue(torch.equal(out[:, :, ~seeing],
                                                    torch.zeros_like(out[:, :, ~seeing])))
                        if writes_rows:
                            self.assertTrue(torch.isneginf(rows[:, :, ~seeing]).all())

    def test_sdpa_entry_serves_is_causal(self):
        torch.manual_seed(12)
        q, k, v = (torch.randn(2, 3, 197, 64, device="cuda", dtype=torch.half) for _ in range(3))
        expected = sdpa._pytorch_sdpa(q.float(), k.float(), v.float(), is_causal=True)
        self.assertEqual(sdpa._why_not(q, k, v, None, 0.0, True), (fastest(64), None))
        out = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
        error = out.float() - expected
        self.assertLessEqual((error.norm() / expected.norm()).item(), 4 * UNIT_ROUNDOFF)

    def test_gradients_where_a_backward_step_takes_it(self):
        library = steps.load_library()
        backward = [info for info in library.steps() if info.is_backward and info.takes_causal
                    and not info.is_baseline and library.refusal(info.id, (1, 1, 1, 64)) is None]
        if not backward:
            self.skipTest("no backward step that takes a causal mask runs here (v10 needs an H100)")
        torch.manual_seed(13)
        for dtype in (torch.half, torch.bfloat16):
            for tokens in (17, 65, 197):
                with self.subTest(dtype=dtype, tokens=tokens):
                    q, k, v = (torch.randn(2, 3, tokens, 64, device="cuda", dtype=dtype,
                                           requires_grad=True) for _ in range(3))
                    d_o = torch.randn(2, 3, tokens, 64, device="cuda", dtype=dtype)
                    out = attention_op(q, k, v, fastest(64), None, None, True, "top-left")[0]
                    grads = torch.autograd.grad(out, (q, k, v), d_o)
                    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
                    expected = torch.autograd.grad(
                        F.scaled_dot_product_attention(q64, k64, v64, is_causal=True),
                        (q64, k64, v64), d_o.double())
                    for name, got, want in zip("qkv", grads, expected):
                        relative = ((got.double() - want).norm() / want.norm()).item()
                        self.assertTrue(torch.isfinite(got).all(), name)
                        self.assertLessEqual(relative, 8 * unit_roundoff(dtype), name)


class ClearErrors(unittest.TestCase):
    def test_backward_where_no_backward_step_serves_raises_one_clear_line(self):
        # A head dim a forward step that writes L serves here and no backward step does, if any.
        device = torch.cuda.current_device()
        unserved = [(step, head_dim) for step, head_dim in served_steps()
                    if steps.load_library().step(step).writes_log_sum_exp and
                    choice.serving(device, torch.float16, head_dim, backward=True)[0] is None]
        if not unserved:
            self.skipTest("a backward step serves every head dim a forward step that writes L "
                          "serves here")
        step, head_dim = unserved[0]
        q, k, v = (torch.randn(1, 2, 65, head_dim, device="cuda", dtype=torch.half,
                               requires_grad=True) for _ in range(3))
        out = steps.attention(q, k, v, step=step)
        self.assertTrue(out.requires_grad)
        with self.assertRaisesRegex(NotImplementedError, "no backward step serves this call.*does "
                                    f"not serve --head-dim {head_dim}"):
            out.float().sum().backward()

    def test_what_no_step_serves_yet(self):
        q = torch.randn(1, 2, 65, 64, device="cuda", dtype=torch.half)
        kv = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.half)
        with self.assertRaisesRegex(ValueError, "does not serve --kv-tokens 64"):
            attention_op(q, kv, kv, "v1")
        mask = torch.ones(1, 65, device="cuda", dtype=torch.bool)
        with self.assertRaisesRegex(ValueError, "does not serve --key-padding"):
            attention_op(q, q, q, "v1", None, mask)
        with self.assertRaisesRegex(TypeError, "torch.bool"):
            attention_op(q, q, q, "v6", None, mask.to(torch.uint8))
        with self.assertRaisesRegex(ValueError, r"\[B, N_k\]"):
            attention_op(q, q, q, "v6", None, mask[:, :64])

    def test_tensor_checks(self):
        q = torch.randn(1, 2, 65, 64, device="cuda", dtype=torch.half)
        for tensor, error, pattern in (
                (q.float(), TypeError, "Float.*float16 and"),
                (q.cpu(), ValueError, "on cpu; the steps run on CUDA tensors"),
                (q[0], ValueError, r"4 dimensions \[B, H, N, D\]")):
            with self.subTest(pattern=pattern), self.assertRaisesRegex(error, pattern):
                attention_op(tensor, tensor, tensor, "v6")
        with self.assertRaisesRegex(ValueError, "unknown step 'v99'"):
            attention_op(q, q, q, "v99")
        with self.assertRaisesRegex(TypeError, "give them one dtype"):
            attention_op(q, q.bfloat16(), q, "v6")
        with self.assertRaisesRegex(ValueError, "does not serve --dtype bf16"):
            attention_op(q.bfloat16(), q.bfloat16(), q.bfloat16(), "v0")
        with self.assertRaisesRegex(ValueError, "does not write L"):
            attention_op(q, q, q, "v0", None, None, True)

    def test_a_shape_the_step_does_not_serve(self):
        limited = [(step, steps.max_tokens(step, 64)) for step, _ in served_steps(64)]
        limited = [(step, largest) for step, largest in limited if largest is not None]
        if not limited:
            self.skipTest("no step has an N limit on this GPU")
        step, largest = limited[0]
        q = torch.randn(1, 1, largest + 1, 64, device="cuda", dtype=torch.half)
        with self.assertRaisesRegex(ValueError, "--tokens"):
            attention_op(q, q, q, step)


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() and result.testsRun > len(result.skipped) else 1)
