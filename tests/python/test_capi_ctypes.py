#!/usr/bin/env python3
"""The ctypes layer of python/attention_steps, with the standard library only (no torch):
the package imports without torch, finds and loads libattention_steps.so, lists the steps,
refuses bad calls with the library's reason, and without a GPU raises CudaError "no CUDA
device found (...)" instead of crashing.

Run by ctest (python.ctypes) with PYTHONPATH=python and ATTENTION_STEPS_LIBRARY set; by hand:
  PYTHONPATH=python ATTENTION_STEPS_LIBRARY=build/libattention_steps.so \\
      python3 tests/python/test_capi_ctypes.py
"""
import os
import subprocess
import sys
import unittest

import attention_steps as steps


def has_gpu():
    try:
        steps.device_info()
    except steps.CudaError:
        return False
    return True


class Package(unittest.TestCase):
    def test_imports_without_torch(self):
        # A fresh interpreter: importing the package and listing the steps must not import torch.
        code = ("import sys, attention_steps as s; s.list_steps(); "
                "sys.exit(1 if 'torch' in sys.modules else 0)")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_star_import(self):
        # Without torch it takes the ctypes layer; with torch, the torch layer's names too; and it
        # never imports torch itself.
        code = ("import sys; from attention_steps import *; list_steps; "
                "torch_seen = 'torch' in sys.modules; "
                "import importlib.util; has_torch = importlib.util.find_spec('torch') is not None; "
                "sys.exit(2 if torch_seen and not has_torch else 0)")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_torch_names_say_they_need_torch(self):
        try:
            import torch  # noqa: F401
        except ImportError:
            with self.assertRaisesRegex(ImportError, "needs PyTorch"):
                steps.attention  # noqa: B018
        else:
            self.assertTrue(callable(steps.attention))

    def test_unknown_attribute(self):
        with self.assertRaises(AttributeError):
            steps.no_such_thing  # noqa: B018

    def test_library_not_found_says_where_it_looked(self):
        with self.assertRaises(steps.LibraryNotFoundError) as caught:
            steps.load_library("/nonexistent/libattention_steps.so")
        self.assertIn("/nonexistent/libattention_steps.so", str(caught.exception))
        self.assertIn(steps.ENVIRONMENT_VARIABLE, str(caught.exception))

    def test_a_library_path_in_the_environment_is_the_only_place_looked_at(self):
        saved = os.environ.get(steps.ENVIRONMENT_VARIABLE)
        os.environ[steps.ENVIRONMENT_VARIABLE] = "/nonexistent/folder"
        try:
            with self.assertRaises(steps.LibraryNotFoundError) as caught:
                steps._capi.Library()  # not load_library(): that keeps the one already loaded
            self.assertIn("/nonexistent/folder", str(caught.exception))
            self.assertNotIn("build folder", str(caught.exception))
        finally:
            if saved is None:
                del os.environ[steps.ENVIRONMENT_VARIABLE]
            else:
                os.environ[steps.ENVIRONMENT_VARIABLE] = saved

    def test_shape_sizes_must_be_integers(self):
        for shape in ((1, 1, "197", 64), (1, 1, 197.5, 64), (1, 1, 197.0, 64)):
            with self.assertRaisesRegex(TypeError, "integers"):
                steps.check("v0", shape)

    def test_library_found_by_folder(self):
        path = os.environ.get(steps.ENVIRONMENT_VARIABLE)
        if not path:
            self.skipTest(f"{steps.ENVIRONMENT_VARIABLE} is not set")
        library = steps.load_library(os.path.dirname(os.path.abspath(path)))
        self.assertEqual(library.steps(), steps.list_steps())


class Listing(unittest.TestCase):
    def test_steps_in_order_with_their_limits(self):
        listed = steps.list_steps()
        ids = [info.id for info in listed]
        self.assertEqual(ids[0], "v0")
        self.assertEqual(ids[-2:], ["eager", "eager_backward"])  # baselines after the steps
        self.assertEqual(len(ids), len(set(ids)))
        for info in listed:
            self.assertTrue(info.title)
            self.assertTrue(info.head_dims)
            self.assertIn(64, info.head_dims)  # every step serves the ViT head dim
            self.assertGreaterEqual(info.min_compute_capability, 75)
            self.assertEqual(info.is_baseline, info.id in ("eager", "eager_backward"))
        self.assertTrue(steps.load_library().step("eager").uses_workspace)

    def test_sizes_without_a_gpu(self):
        self.assertEqual(steps.shared_bytes("v0", 197, 64), 0)
        self.assertEqual(steps.workspace_bytes("eager", (32, 12, 197, 64)), 32 * 12 * 197 * 197 * 2)
        self.assertEqual(steps.workspace_bytes("v0", (32, 12, 197, 64)), 0)
        with_shared = [info for info in steps.list_steps() if info.uses_shared_memory]
        if with_shared:
            self.assertGreater(steps.shared_bytes(with_shared[0].id, 197, 64), 0)


class Choice(unittest.TestCase):
    """attn_choose_step for a GPU named by its compute capability: no GPU needed."""

    def listed(self, step_id):
        return any(info.id == step_id for info in steps.list_steps())

    def test_the_highest_numbered_step_that_serves(self):
        for capability, forward, backward in ((90, "v8", "v10"), (80, "v6", "v9")):
            if self.listed(forward):
                self.assertEqual(steps.choose_step((8, 12, 4097, 64), compute_capability=capability), forward)
            if self.listed(backward):
                self.assertEqual(steps.choose_step((8, 12, 4097, 64), backward=True,
                                                   compute_capability=capability), backward)

    def test_masks_dtype_and_cross_attention_narrow_the_choice(self):
        if not self.listed("v8"):
            self.skipTest("v8 is not in this build")
        self.assertEqual(steps.choose_step((2, 3, 65, 64), kv_tokens=130, key_padding_mask=True,
                                           causal="bottom-right", dtype="bf16",
                                           compute_capability=90), "v8")

    def test_the_backward_of_cross_attention_and_of_a_mask(self):
        # The backward step the listing says serves N_k != N, a key-padding mask or both at D = 64
        # on an H100 (the highest-numbered), or the refusal naming what none takes.
        def takers(**flags):
            return [info.id for info in steps.list_steps()
                    if info.is_backward and not info.is_baseline and 64 in info.head_dims and
                    info.min_compute_capability <= 90 and info.max_compute_capability in (0, 90) and
                    all(getattr(info, flag) for flag, wanted in flags.items() if wanted)]

        for cross, masked, refusal in ((True, False, "does not serve --kv-tokens 130"),
                                       (False, True, "does not serve --key-padding"),
                                       (True, True, "does not serve --")):
            with self.subTest(cross=cross, masked=masked):
                def choose():
                    return steps.choose_step((2, 3, 65, 64), kv_tokens=130 if cross else None,
                                             key_padding_mask=masked, backward=True,
                                             compute_capability=90)
                served = takers(takes_kv_tokens=cross, takes_key_padding_mask=masked)
                if served:
                    self.assertEqual(choose(), served[-1])
                else:
                    with self.assertRaisesRegex(steps.StepRefused, refusal):
                        choose()

    def test_none_serves(self):
        with self.assertRaisesRegex(steps.StepRefused, "no forward step that writes L serves"):
            steps.choose_step((1, 1, 64, 48), compute_capability=90)
        with self.assertRaisesRegex(steps.StepRefused, "not a GPU this library knows"):
            steps.choose_step((1, 1, 64, 64), compute_capability=61)
        with self.assertRaises(ValueError):
            steps.choose_step((1, 1, 64, 64), dtype="fp32", compute_capability=90)


class Refusals(unittest.TestCase):
    def test_unknown_step(self):
        with self.assertRaisesRegex(steps.StepRefused, "unknown step 'v99'") as caught:
            steps.check("v99", (1, 1, 64, 64))
        self.assertEqual(caught.exception.status, steps.REFUSED)

    def test_head_dim_refused_without_a_gpu(self):
        self.assertIn("--head-dim 48", steps.refusal("v0", (1, 1, 64, 48)))
        with self.assertRaisesRegex(steps.StepRefused, "--head-dim 48"):
            steps.max_tokens("v0", 48)

    def test_bad_sizes(self):
        with self.assertRaisesRegex(steps.StepRefused, "tokens 0"):
            steps.check("v0", (1, 1, 0, 64))
        with self.assertRaisesRegex(ValueError, "batch, heads, tokens, head_dim"):
            steps.check("v0", (1, 64, 64))
        with self.assertRaisesRegex(TypeError, "step id"):
            steps.check(6, (1, 1, 64, 64))

    def test_run_refuses_null_pointers_or_has_no_device(self):
        library = steps.load_library()
        with self.assertRaises(steps.AttentionStepsError) as caught:
            library.run("v0", 0, 0, 0, 0, (1, 1, 1, 64))
        expected = "q is NULL" if has_gpu() else "no CUDA device"
        self.assertIn(expected, str(caught.exception))


class NoDevice(unittest.TestCase):
    def setUp(self):
        if has_gpu():
            self.skipTest("a CUDA device is present: the no-device answers are tested without one")

    def test_every_gpu_question_answers_no_cuda_device(self):
        self.assertIn("no CUDA device found", steps.refusal("v6", (2, 3, 65, 64)))
        for call in (steps.device_info,
                     lambda: steps.check("v0", (2, 3, 65, 64)),
                     lambda: steps.max_tokens("v1", 64),
                     lambda: steps.load_library().run("v0", 16, 16, 16, 4096, (1, 1, 1, 64))):
            with self.assertRaisesRegex(steps.CudaError, "no CUDA device found") as caught:
                call()
            self.assertEqual(caught.exception.status, steps.CUDA_ERROR)


class WithDevice(unittest.TestCase):
    def setUp(self):
        if not has_gpu():
            self.skipTest("no CUDA device")

    def test_device_and_limits(self):
        info = steps.device_info()
        self.assertTrue(info.name)
        self.assertGreater(info.shared_bytes_per_block, 0)
        self.assertIsNone(steps.max_tokens("v0", 64))      # v0 uses no shared memory
        self.assertIsNone(steps.refusal("v0", (2, 3, 65, 64)))


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 else 1)
