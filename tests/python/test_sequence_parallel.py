"""attention_steps.sequence_parallel on the GPU (#32): partial results merged with L against the
unsplit call, in one process (the key blocks split by hand, one of them wholly masked, rows with
no key at all); ring and all-to-all attention in a process group of one GPU; and, where there are
two or more GPUs, both on 2 and on up to 4 GPUs (one process each, NCCL) against one GPU's call
over the whole sequence: outputs and dQ, dK, dV at a tail N, fp16 and bf16, with a key-padding
mask, causal balanced and not. Skipped (77) without torch, a GPU or the operator; the multi-GPU
tests skip on one GPU, saying so.

    python3 tests/python/test_sequence_parallel.py
"""
import os
import socket
import tempfile
import unittest

import torch_gpu

SKIP_REASON = torch_gpu.skip_reason("the sequence-parallel tests")
if SKIP_REASON is None:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from attention_steps import choice
    from attention_steps.sequence_parallel import (SequenceLayout, all_to_all_attention,
                                                   merge_partials, ring_attention, split_sequence)


def setUpModule():
    if SKIP_REASON is not None:
        raise unittest.SkipTest(SKIP_REASON)


# Relative Frobenius error against the one-GPU call of the same steps: the split rounds each
# partial O, dQ, dK and dV to the input's type before it is added up in fp32.
TOLERANCE = {"fp16": 4e-3, "bf16": 3e-2}


def relative_error(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()


def forward_step(q, causal, masked, cross):
    step, why = choice.serving(q.device.index, q.dtype, q.shape[-1], causal=causal, masked=masked,
                               cross=cross)
    if step is None:
        raise unittest.SkipTest(f"no forward step serves the call here: {why}")
    return step


def whole_sequence(q, k, v, d_o, causal, mask):
    """O and dQ, dK, dV of the plain call over the whole sequence (the reference)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    alignment = "top-left" if causal else None
    step = forward_step(q, alignment, mask is not None, False)
    o = torch.ops.attention_steps.attention(*leaves, step, None, mask, True, alignment)[0]
    grads = torch.autograd.grad(o, leaves, d_o)
    return o.detach(), grads


def inputs(batch, heads, tokens, head_dim, dtype, masked, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, d_o = (torch.randn((batch, heads, tokens, head_dim), device="cuda", dtype=dtype,
                                generator=generator) for _ in range(4))
    mask = None
    if masked:  # a quarter of the keys padded; the last batch element's keys all padded
        mask = torch.rand((batch, tokens), device="cuda", generator=generator) < 0.25
        mask[-1] = True
    return q, k, v, d_o, mask


def compare(test, got_o, got_grads, want_o, want_grads, dtype_name, what):
    for name, got, want in zip(("O", "dQ", "dK", "dV"), (got_o, *got_grads), (want_o, *want_grads)):
        test.assertFalse(got.isnan().any().item(), f"{what}: NaN in {name}")
        error = relative_error(got, want)
        test.assertLess(error, TOLERANCE[dtype_name], f"{what}: {name} relative error {error:.2e}")


class Merge(unittest.TestCase):
    """Attention over three blocks of keys, merged with L, against one call over all of them."""

    def test_blocks_merged_with_l(self):
        for dtype_name in ("fp16", "bf16"):
            for masked in (False, True):
                with self.subTest(dtype=dtype_name, masked=masked):
                    self.check(torch_gpu.torch_dtype(dtype_name), dtype_name, masked)

    def check(self, dtype, dtype_name, masked):
        q, k, v, _, mask = inputs(3, 2, 197, 64, dtype, masked)
        if masked:
            mask[0, 50:120] = True  # the second block wholly padded for the first batch element
        step = forward_step(q, None, masked, False)
        want_o, want_lse = torch.ops.attention_steps.attention(q, k, v, step, None, mask, True, None)
        outputs, log_sum_exps = [], []
        for start, stop in ((0, 50), (50, 120), (120, 197)):
            block_mask = mask[:, start:stop].contiguous() if masked else None
            block_step = forward_step(q, None, masked, True)
            o, lse = torch.ops.attention_steps.attention(q, k[:, :, start:stop], v[:, :, start:stop],
                                                         block_step, None, block_mask, True, None)
            outputs.append(o)
            log_sum_exps.append(lse)
        o, lse = merge_partials(outputs, log_sum_exps)
        self.assertFalse(o.isnan().any().item())
        error = relative_error(o, want_o)
        self.assertLess(error, TOLERANCE[dtype_name], f"O relative error {error:.2e}")
        finite = torch.isfinite(want_lse)
        self.assertTrue(torch.equal(finite, torch.isfinite(lse)))
        self.assertLess((lse[finite] - want_lse[finite]).abs().max().item(), 1e-3)
        if masked:  # the last batch element sees no key: O = 0 and L = -inf
            self.assertTrue(torch.equal(o[-1], torch.zeros_like(o[-1])))
            self.assertTrue(torch.isneginf(lse[-1]).all().item())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CASES = [  # (dtype, causal, balanced, masked)
    ("fp16", False, False, False), ("bf16", False, False, True), ("fp16", True, True, False),
    ("bf16", True, True, True), ("fp16", True, False, True)]


def run_cases(test, world, rank):
    """Every case at a tail N on `world` GPUs: ring and all-to-all against the whole call."""
    heads = 4  # divisible by 1, 2 and 4 GPUs, for all-to-all
    tokens = 2 * world * 64 + 37  # no chunk a whole number of tiles
    for dtype_name, causal, balanced, masked in CASES:
        what = f"{world} GPU(s), rank {rank}, {dtype_name}, causal={causal}, balanced={balanced}, masked={masked}"
        q, k, v, d_o, mask = inputs(2, heads, tokens, 64, torch_gpu.torch_dtype(dtype_name), masked)
        want_o, want_grads = whole_sequence(q, k, v, d_o, causal, mask)
        layout = SequenceLayout(tokens, world, balanced)
        mine = [split_sequence(t, layout, rank) for t in (q, k, v, d_o, want_o, *want_grads)]
        local_mask = split_sequence(mask, layout, rank, dim=1) if masked else None
        for name, attend in (("ring", ring_attention), ("all-to-all", all_to_all_attention)):
            leaves = [t.clone().requires_grad_() for t in mine[:3]]
            o = attend(*leaves, layout, causal=causal, key_padding_mask=local_mask)
            grads = torch.autograd.grad(o, leaves, mine[3])
            compare(test, o, grads, mine[4], mine[5:], dtype_name, f"{name}, {what}")


class OneGpu(unittest.TestCase):
    """Both entries in a process group of one GPU: the ring's one turn, no communication."""

    @classmethod
    def setUpClass(cls):
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                world_size=1)

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()

    def test_against_the_whole_call(self):
        run_cases(self, 1, 0)

    def test_refusals(self):
        layout = SequenceLayout(100, 1)
        q = torch.zeros((1, 2, 100, 64), device="cuda", dtype=torch.half)
        with self.assertRaisesRegex(ValueError, r"must all be \[B, H, 100, D\]"):
            ring_attention(q[:, :, :99], q[:, :, :99], q[:, :, :99], layout)
        with self.assertRaisesRegex(TypeError, "float16 or bfloat16 alike"):
            ring_attention(q, q.float(), q, layout)
        with self.assertRaisesRegex(ValueError, "the layout is for 2 GPUs; the group has 1"):
            ring_attention(q, q, q, SequenceLayout(100, 2))
        with self.assertRaisesRegex(ValueError, "key_padding_mask must be bool"):
            ring_attention(q, q, q, layout, key_padding_mask=torch.zeros((1, 100), device="cuda"))


def worker(rank, world, init_file, failures):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        test = unittest.TestCase()
        run_cases(test, world, rank)
        layout = SequenceLayout(64 * world + 5, world)
        q = torch.zeros((1, world + 1, layout.local_tokens(rank), 64), device="cuda", dtype=torch.half)
        with test.assertRaisesRegex(ValueError, "the heads must be a multiple of the GPU count"):
            all_to_all_attention(q, q, q, layout)
    except Exception as error:  # noqa: BLE001 (reported to the parent with the rank)
        failures.put(f"rank {rank}: {type(error).__name__}: {error}")
        raise
    finally:
        dist.destroy_process_group()


class SeveralGpus(unittest.TestCase):
    def check(self, world):
        if torch.cuda.device_count() < world:
            self.skipTest(f"{world} GPUs needed, {torch.cuda.device_count()} here")
        context = mp.get_context("spawn")
        failures = context.SimpleQueue()
        with tempfile.TemporaryDirectory() as folder:
            processes = [context.Process(target=worker, args=(rank, world, os.path.join(folder, "init"), failures))
                         for rank in range(world)]
            for process in processes:
                process.start()
            for process in processes:
                process.join(600)
            for process in processes:
                if process.is_alive():  # a hang: say so rather than wait for ever
                    process.terminate()
                    failures.put(f"a rank still ran after 600 s (exit code {process.exitcode})")
        messages = []
        while not failures.empty():
            messages.append(failures.get())
        self.assertEqual(messages, [])
        self.assertEqual([process.exitcode for process in processes], [0] * world)

    def test_two_gpus(self):
        self.check(2)

    def test_four_gpus(self):
        self.check(4)


if __name__ == "__main__":
    torch_gpu.main(SKIP_REASON)
