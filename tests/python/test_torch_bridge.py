#!/usr/bin/env python3
"""The PyTorch layer of python/attention_steps.

Without --gpu (runs on a CPU, ctest python.torch_bridge): where the operator is built, its
tensor checks (type, rank, dtype, device) raise clear errors; StepSelfAttention wired with
scaled_dot_product_attention in place of a step gives the stock model's logits for vit_b_32 and
vit_b_16; swap_attention finds every encoder block of vit_b_16, vit_b_32, vit_l_16 and vit_h_14
(built on the meta device), keeps the state_dict, refuses a head dim the step does not serve,
and restore_attention undoes it.

With --gpu (ctest python.torch_bridge_gpu): every step that serves the shape, through
attention(), against SDPA in fp32 with the tolerances of harness/check.hpp; a caller's stream;
the eager baseline's workspace; a refusal; vit_b_16 with v6 swapped in against the stock model.

Exit 77 (ctest: skipped) when torch or torchvision does not import, or (--gpu) when torch sees
no CUDA device or the operator is not built (tests/python/test_torch_op.py tests it further).
"""
import sys
import unittest

GPU = "--gpu" in sys.argv
if GPU:
    sys.argv.remove("--gpu")

try:
    import torch
    import torch.nn.functional as F
    import torchvision
except ImportError as error:
    print(f"SKIPPED: {error}; the torch bridge tests did not run")
    sys.exit(77)
if GPU and not torch.cuda.is_available():
    print(f"SKIPPED: torch {torch.__version__} sees no CUDA device; the GPU tests of the torch "
          "bridge did not run")
    sys.exit(77)

import attention_steps as steps  # noqa: E402
from attention_steps import torch_bridge, torch_op  # noqa: E402

OPERATOR = torch_op.available()
if GPU and not OPERATOR:
    print("SKIPPED: the operator is not built (pip install --no-build-isolation ./python); the "
          "GPU tests of the torch bridge did not run")
    sys.exit(77)

UNIT_ROUNDOFF = 2.0 ** -11  # harness/check.hpp: fp16; both tolerances are 4u
MODELS = {"vit_b_16": (12, 64), "vit_b_32": (12, 64), "vit_l_16": (24, 64), "vit_h_14": (32, 80)}


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def randomize_zeros(model, seed=0):
    """Random values for the parameters torchvision initialises to zero (the classifier head,
    the biases), so that no bias or the head can hide a wiring mistake."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.device.type != "meta" and not parameter.any():
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model


@unittest.skipIf(GPU, "CPU tests")
@unittest.skipUnless(OPERATOR, "the operator is not built (pip install --no-build-isolation ./python)")
class TensorChecks(unittest.TestCase):
    """The operator's own checks, which run before anything needs a GPU."""

    def setUp(self):
        self.q = torch.randn(2, 3, 17, 64, dtype=torch.half)

    def assert_error(self, error, pattern, q):
        with self.assertRaisesRegex(error, pattern):
            steps.attention(q, q, q, step="v6")

    def test_not_a_tensor(self):
        self.assert_error(RuntimeError, "Expected a value of type 'Tensor' for argument 'q'", [1.0, 2.0])

    def test_rank(self):
        self.assert_error(ValueError, r"4 dimensions \[B, H, N, D\]", self.q[0])

    def test_dtype(self):
        self.assert_error(TypeError, "q is Float; the steps take torch.float16", self.q.float())

    def test_cpu_tensor(self):
        self.assert_error(ValueError, "on cpu; the steps run on CUDA tensors", self.q)


@unittest.skipIf(GPU, "CPU tests")
class SwapOnCpu(unittest.TestCase):
    """The swap's wiring, with scaled_dot_product_attention in place of a step's kernel."""

    def check_model(self, name, image_size, batch):
        torch.manual_seed(0)
        model = randomize_zeros(getattr(torchvision.models, name)(image_size=image_size)).eval()
        images = torch.randn(batch, 3, image_size, image_size)
        keys = list(model.state_dict())
        with torch.inference_mode():
            stock = model(images)
            blocks, _ = MODELS[name]
            self.assertEqual(steps.swap_attention(model, attention_fn=sdpa), blocks)
            self.assertEqual(list(model.state_dict()), keys)
            swapped = model(images)
            self.assertEqual(steps.restore_attention(model), blocks)
            restored = model(images)
        self.assertGreater(stock.abs().max().item(), 0.1)  # the head is not zero
        torch.testing.assert_close(swapped, stock, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(restored, stock, rtol=0, atol=0)
        self.assertEqual(list(model.state_dict()), keys)

    def test_vit_b_32_logits_equal_stock(self):
        self.check_model("vit_b_32", 224, 2)

    def test_vit_b_16_at_another_image_size(self):
        self.check_model("vit_b_16", 64, 2)  # N = 17: any image size works

    def test_every_model_is_found_on_the_meta_device(self):
        for name, (blocks, head_dim) in MODELS.items():
            with torch.device("meta"):
                model = getattr(torchvision.models, name)()
            self.assertEqual(steps.swap_attention(model, step="v6"), blocks, name)
            swapped = [module for module in model.modules()
                       if isinstance(module, torch_bridge.StepSelfAttention)]
            self.assertEqual(len(swapped), blocks)
            self.assertEqual({module.head_dim for module in swapped}, {head_dim})
            self.assertEqual(steps.swap_attention(model, step="v0"), blocks)  # re-swap: new step
            self.assertEqual({module.step for module in swapped}, {"v0"})
            self.assertEqual(steps.restore_attention(model), blocks)
            self.assertFalse(any(isinstance(module, torch_bridge.StepSelfAttention)
                                 for module in model.modules()))

    def test_head_dim_not_served_is_refused_at_swap(self):
        with torch.device("meta"):
            model = torchvision.models.vit_h_14()
        served = [info for info in steps.list_steps() if 80 not in info.head_dims]
        if not served:
            self.skipTest("every step serves head dim 80")
        with self.assertRaisesRegex(steps.StepRefused, "does not serve head dim 80"):
            steps.swap_attention(model, step=served[0].id)

    def test_not_a_vit(self):
        with self.assertRaisesRegex(ValueError, "no `self_attention`"):
            steps.swap_attention(torch.nn.Linear(3, 3), step="v6")

    def test_misuse_of_the_module(self):
        mha = torch.nn.MultiheadAttention(64, 2, batch_first=True).eval()
        module = torch_bridge.StepSelfAttention(mha, attention_fn=sdpa)
        x, y = torch.randn(1, 5, 64), torch.randn(1, 5, 64)
        with self.assertRaisesRegex(ValueError, "need_weights=False"):
            module(x, x, x)
        with self.assertRaisesRegex(ValueError, "self-attention only"):
            module(x, y, y, need_weights=False)
        with torch.inference_mode():
            out, weights = module(x, x, x, need_weights=False)
            expected, _ = mha(x, x, x, need_weights=False)
        self.assertIsNone(weights)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        with self.assertRaisesRegex(ValueError, "batch_first"):
            torch_bridge.StepSelfAttention(torch.nn.MultiheadAttention(64, 2))

    @unittest.skipUnless(OPERATOR, "the operator is not built")
    def test_fp32_model_with_a_step_says_fp16(self):
        model = torchvision.models.vit_b_32(image_size=64).eval()
        steps.swap_attention(model, step="v6")
        with torch.inference_mode(), self.assertRaisesRegex(TypeError, "float16"):
            model(torch.randn(1, 3, 64, 64))


@unittest.skipUnless(GPU, "GPU tests (--gpu)")
class OnTheGpu(unittest.TestCase):
    def compare(self, q, k, v, out):  # as tests/python/test_torch_op.py does
        reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        error = (out.float() - reference)
        relative = (error.norm() / reference.norm()).item()
        largest = error.abs().max().item()
        self.assertTrue(torch.isfinite(out).all())
        self.assertLessEqual(relative, 4 * UNIT_ROUNDOFF)
        self.assertLessEqual(largest, 4 * UNIT_ROUNDOFF * v.abs().max().item())

    def test_every_step_against_sdpa(self):
        torch.manual_seed(1)
        ran = 0
        for info in steps.list_steps():
            if info.is_backward:  # a backward step has no forward to run
                continue
            for head_dim in info.head_dims:
                shape = (2, 3, 65, head_dim)
                why = steps.refusal(info.id, shape)
                if why is not None:
                    self.assertIn("compute capability", why)  # only a GPU it cannot run on
                    continue
                q, k, v = (torch.randn(shape, device="cuda", dtype=torch.half) for _ in range(3))
                with self.subTest(step=info.id, head_dim=head_dim):
                    self.compare(q, k, v, steps.attention(q, k, v, step=info.id))
                    ran += 1
        self.assertGreater(ran, 0)

    def test_on_a_side_stream(self):
        q, k, v = (torch.randn(4, 12, 197, 64, device="cuda", dtype=torch.half) for _ in range(3))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = steps.attention(q, k, v, step="v6")
        side.synchronize()
        self.compare(q, k, v, out)

    def test_refusal_names_the_reason(self):
        limited = [(info.id, steps.max_tokens(info.id, 64)) for info in steps.list_steps()
                   if not info.is_backward and steps.refusal(info.id, (1, 1, 1, 64)) is None]
        limited = [(step, largest) for step, largest in limited if largest is not None]
        if not limited:
            self.skipTest("no step has an N limit on this GPU")
        step, largest = limited[0]
        q = torch.randn(1, 1, largest + 1, 64, device="cuda", dtype=torch.half)
        with self.assertRaisesRegex(ValueError, "--tokens"):
            steps.attention(q, q, q, step=step)

    def test_vit_b_16_with_v6_matches_stock(self):
        torch.manual_seed(0)
        model = randomize_zeros(torchvision.models.vit_b_16()).cuda().half().eval()
        images = torch.randn(4, 3, 224, 224, device="cuda", dtype=torch.half)
        with torch.inference_mode():
            stock = model(images).float()
            steps.swap_attention(model, step="v6")
            swapped = model(images).float()
        relative = ((swapped - stock).norm() / stock.norm()).item()
        self.assertLess(relative, 1e-2)  # fp16 end to end; scripts/vit_end_to_end.py derives it


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() and result.testsRun > len(result.skipped) else 1)
