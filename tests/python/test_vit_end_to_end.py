#!/usr/bin/env python3
"""The logic of scripts/vit_end_to_end.py on a CPU: its GPU calls replaced by CPU stand-ins
(CUDA events by the wall clock, the library by a fake whose "steps" are
scaled_dot_product_attention), a small model (vit_b_32 at 64 px, batch 2). Checks that a
correct step passes, a wrong one (attention with the wrong scale) FAILS, a refused step and one
over the time budget are skipped with their reasons, the CSVs have their columns, and the exit
status says a check failed. The kernel-name classification is checked on names seen on an H100.

Exit 77 (ctest: skipped) where torch or torchvision does not import.
"""
import csv
import importlib.util
import io
import pathlib
import sys
import tempfile
import time
import unittest
from contextlib import redirect_stdout

try:
    import torch
    import torch.nn.functional as F
    import torchvision  # noqa: F401
except ImportError as error:
    print(f"SKIPPED: {error}; the end-to-end script's CPU test did not run")
    sys.exit(77)

import attention_steps
from attention_steps import torch_bridge

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPOSITORY / "scripts"))  # what python gives the script: its `measuring`
spec = importlib.util.spec_from_file_location("vit_end_to_end",
                                              REPOSITORY / "scripts" / "vit_end_to_end.py")
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


class WallClockEvent:
    def __init__(self, enable_timing=True):
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def elapsed_time(self, end):
        return (end.at - self.at) * 1000.0


def info(step_id, head_dims=(32, 64, 80, 128), baseline=False, capability=(75, 0)):
    return attention_steps.StepInfo(
        step_id, f"fake {step_id}", baseline, tuple(head_dims), capability[0], capability[1],
        uses_shared_memory=False, uses_workspace=baseline, takes_strides=False,
        writes_log_sum_exp=False)


class FakeLibrary:
    path = "fake library"

    def steps(self):
        return [info("v0"), info("v6"), info("v7", (64, 128), capability=(90, 90)),
                info("v9"), info("eager", baseline=True)]

    def step(self, step_id):
        return next(s for s in self.steps() if s.id == step_id)

    def device(self):
        return attention_steps.DeviceInfo(0, "fake GPU", 80, 166912)

    def refusal(self, step, shape):
        if step == "v7":
            return "v7 needs a GPU of compute capability 9.0 exactly; this GPU, fake GPU, is 8.0"
        return None


def fake_attention(q, k, v, step="v6", *, scale=None, causal=None):  # torch_bridge.attention's signature
    if step == "v0":
        time.sleep(0.5)  # slow: 12 calls a forward, 4 forwards: over the budget the test sets
    scale = 1.0 if step == "v9" else None  # v9: the wrong scale, a wiring mistake
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale).half()


class EndToEndOnCpu(unittest.TestCase):
    def setUp(self):
        self.patches = [
            (script, "DEVICE", "cpu"),
            (script.measuring, "PROFILER_ACTIVITIES", ("CPU",)),  # CUDA profiling would look for a GPU
            (torch.cuda, "is_available", lambda: True),
            (torch.cuda, "get_device_name", lambda *args: "NVIDIA H100 80GB HBM3"),
            (torch.cuda, "Event", WallClockEvent),
            (torch.cuda, "synchronize", lambda *args: None),
            (torch.cuda, "empty_cache", lambda: None),
            (torch.backends.cudnn, "version", lambda: None),
            (attention_steps, "load_library", lambda path=None: FakeLibrary()),
            (torch_bridge, "attention", fake_attention),
        ]
        self.saved = [(owner, name, getattr(owner, name)) for owner, name, _ in self.patches]
        for owner, name, value in self.patches:
            setattr(owner, name, value)

    def tearDown(self):
        for owner, name, value in self.saved:
            setattr(owner, name, value)

    def test_rows_statuses_and_files(self):
        with tempfile.TemporaryDirectory() as out:
            output = io.StringIO()
            with redirect_stdout(output):
                status = script.main(["--models", "vit_b_32@64", "--batch", "2", "--out-dir", out,
                                      "--timing-s", "0.2", "--impl-budget-s", "20"])
            text = output.getvalue()
            self.assertEqual(status, 1, text)  # v9 failed its check
            with open(pathlib.Path(out) / "vit_end_to_end.csv") as handle:
                rows = {row["implementation"]: row for row in csv.DictReader(handle)}
            with open(pathlib.Path(out) / "vit_end_to_end_kernels.csv") as handle:
                header, *kernel_rows = list(csv.reader(handle))
                kernel_rows = len(kernel_rows)
            self.assertTrue((pathlib.Path(out) / "vit_end_to_end_info.txt").is_file())
        self.assertEqual(header, script.KERNEL_COLUMNS)
        self.assertEqual(list(rows), ["stock", "v0", "v6", "v7", "v9", "eager"])  # registry order
        self.assertEqual(rows["stock"]["status"], "passed", text)
        self.assertEqual(rows["stock"]["tokens"], "5")  # (64 / 32)^2 + 1
        self.assertEqual(rows["stock"]["speedup_vs_stock"], "1")
        for step in ("v6", "eager"):
            self.assertEqual(rows[step]["status"], "passed", text)
            self.assertLess(float(rows[step]["relative_error"]), float(rows[step]["relative_tolerance"]))
            self.assertGreater(float(rows[step]["images_per_s"]), 0)
            self.assertTrue(rows[step]["speedup_vs_stock"])
        self.assertTrue(rows["v9"]["status"].startswith("FAILED: logits differ"), rows["v9"])
        self.assertGreater(float(rows["v9"]["relative_error"]), 0.01)
        self.assertTrue(rows["v7"]["status"].startswith("skipped: v7 needs a GPU"), rows["v7"])
        self.assertIn("time budget", rows["v0"]["status"])
        self.assertIn("--impl-budget-s 20", rows["v0"]["status"])
        self.assertTrue(rows["v0"]["attention_call_ms"])
        self.assertIn("1 failed", text)
        self.assertEqual(kernel_rows, len(script.measuring.CATEGORIES) * 4)  # stock, v6, v9, eager

    def test_weights_file_at_another_image_size(self):
        saved = torchvision.models.vit_b_32(image_size=64)
        with tempfile.TemporaryDirectory() as folder:
            path = pathlib.Path(folder) / "vit_b_32_64px.pth"
            torch.save({"model": saved.state_dict()}, path)
            model, label = script.build_model(torch, torchvision, "vit_b_32", 96, 0, str(path))
        self.assertEqual(label, "vit_b_32_64px.pth")
        self.assertEqual(tuple(model.encoder.pos_embedding.shape), (1, 10, 768))  # interpolated
        torch.testing.assert_close(model.heads.head.weight, saved.heads.head.weight)
        random, label = script.build_model(torch, torchvision, "vit_b_32", 64, 0, None)
        self.assertEqual(label, "random (seed 0)")
        self.assertGreater(random.heads.head.weight.abs().min().item(), 0)  # not left at zero
        again, _ = script.build_model(torch, torchvision, "vit_b_32", 64, 0, None)
        torch.testing.assert_close(again.heads.head.weight, random.heads.head.weight, rtol=0, atol=0)

    def test_usage_errors(self):
        for argv in (["--models", "vit_x_16@224"], ["--models", "vit_b_16@100"],
                     ["--batch", "0"], ["--weights", "/nonexistent.pth"]):
            with self.subTest(argv=argv), redirect_stdout(io.StringIO()):
                import contextlib
                with contextlib.redirect_stderr(io.StringIO()):
                    self.assertEqual(script.main(argv), 2)


class Span:
    def __init__(self, start, end):
        self.start, self.end = start, end


class FakeEvent:
    def __init__(self, name, device, start=0.0, end=0.0, annotation=False, kernels=()):
        from torch.autograd import DeviceType
        from torch.autograd.profiler_util import Kernel
        self.name, self.time_range, self.is_user_annotation = name, Span(start, end), annotation
        self.device_type = getattr(DeviceType, device)
        self.kernels = [Kernel(kernel, 0, duration) for kernel, duration in kernels]


class FakeProfile:
    def __init__(self, events):
        self._events = events

    def __call__(self, activities=None):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def events(self):
        return self._events


class Attribution(unittest.TestCase):
    """What counts as attention in a profile: the eager baseline's GEMMs inside the bridge's
    range do, the model's GEMMs do not (times in microseconds, one forward)."""
    KERNELS = [("nvjet_gemm_qk", 0, 10), ("void softmax_rows(__half*)", 10, 15),
               ("nvjet_gemm_pv", 15, 25), ("nvjet_gemm_mlp", 30, 50),
               ("vectorized_layer_norm_kernel", 50, 55), ("GeluCUDAKernelImpl", 55, 60)]

    def profile(self, span, links):
        events = [FakeEvent(name, "CUDA", start, end) for name, start, end in self.KERNELS]
        if links:
            events.append(FakeEvent("attention_steps::eager", "CPU", kernels=[
                (name, end - start) for name, start, end in self.KERNELS[:3]]))
        if span:
            events.append(FakeEvent("attention_steps::eager", "CUDA", 0, 25, annotation=True))
        saved = torch.profiler.profile
        torch.profiler.profile = FakeProfile(events)
        try:
            return script.measuring.profile_forward(torch, lambda: None, 1, "attention_steps::")
        finally:
            torch.profiler.profile = saved

    def test_by_gpu_span_by_cpu_link_and_by_name(self):
        synchronize, torch.cuda.synchronize = torch.cuda.synchronize, lambda *args: None
        try:
            for span, links, by, attention, gemm in ((True, True, "gpu range", 25, 20),
                                                     (False, True, "cpu range", 25, 20),
                                                     (False, False, "name", 5, 40)):
                with self.subTest(by=by):
                    result, found_by = self.profile(span, links)
                    self.assertEqual(found_by, by)
                    self.assertAlmostEqual(result["attention"]["ms"] * 1000, attention)
                    self.assertAlmostEqual(result["gemm"]["ms"] * 1000, gemm)
                    self.assertAlmostEqual(result["layernorm"]["ms"] * 1000, 5)
                    self.assertAlmostEqual(result["gelu"]["ms"] * 1000, 5)
                    self.assertEqual(result["gemm"]["top_kernel"], "nvjet_gemm_mlp")
        finally:
            torch.cuda.synchronize = synchronize


class Names(unittest.TestCase):
    def test_kernel_categories(self):
        expect = {
            "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128": "attention",
            "void (anonymous namespace)::flash_attention_kernel<64, 4, 2, 64>(...)": "attention",
            "void (anonymous namespace)::softmax_rows(__half*, long, int)": "attention",
            "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>": "attention",
            "nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NTT": "gemm",
            "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64": "gemm",
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::Half>": "layernorm",
            "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl": "gelu",
            "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<"
            "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)": "layout",
            "void at::native::(anonymous namespace)::transform_bias_rescale_qkv_kernel<c10::Half>": "layout",
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::Half>": "elementwise",
            "void at::native::(anonymous namespace)::CatArrayBatchedCopy<...>": "layout",
            "Memset (Device)": "other",
        }
        for name, category in expect.items():
            self.assertEqual(script.measuring.category_of(name), category, name)

    def test_gpu_folder_names(self):
        self.assertEqual(script.gpu_slug("NVIDIA H100 80GB HBM3"), "h100")
        self.assertEqual(script.gpu_slug("NVIDIA A100-SXM4-80GB"), "a100")
        self.assertEqual(script.gpu_slug("NVIDIA GeForce RTX 4090"), "rtx-4090")
        self.assertEqual(script.gpu_slug("NVIDIA H200"), "h200")


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 else 1)
