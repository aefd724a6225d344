#!/usr/bin/env python3
"""scripts/compare_backward.py without a GPU: its argument parsing (shapes with N_k and a
key-padding mask, the defaults, the refusals), the masks it makes ("detr" and a fraction), and the
rows of --training (numbers where an implementation ran, the reason where it refused), with the
standard library only; and, where torch imports, the views of the v10_views row and
--training's whole loop on the CPU with stand-ins for the GPU (the steps' operator, SDPA's
backends, the timing), FlashAttention-2 refusing a mask as it does.

    PYTHONPATH=python python3 tests/python/test_compare_backward.py
"""
import contextlib
import csv
import importlib.util
import io
import pathlib
import sys
import types
import unittest
import warnings
from unittest import mock

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPOSITORY / "scripts"))  # what python gives the script: its `measuring`
_spec = importlib.util.spec_from_file_location("compare_backward",
                                               REPOSITORY / "scripts" / "compare_backward.py")
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)

try:
    import torch
except ImportError:
    torch = None


def parse(*argv):
    return script.parse_arguments(["--csv", "out.csv", *argv])


def refused_to_parse(*argv):
    """argparse's message for arguments it refuses (it exits 2)."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parse(*argv)
    except SystemExit as exit:
        assert exit.code == 2, exit.code
        return stderr.getvalue()
    raise AssertionError(f"{argv} parsed")


class Arguments(unittest.TestCase):
    def test_importing_the_script_needs_no_torch(self):
        self.assertTrue(callable(script.main))

    def test_training_defaults_to_the_eight_shapes_of_the_issue(self):
        _, cases = parse("--training")
        self.assertEqual([(c.batch, c.heads, c.tokens, c.head_dim, c.kv_tokens, c.key_padding)
                          for c in cases],
                         [(32, 12, 197, 64, 197, None), (32, 12, 577, 64, 577, None),
                          (32, 12, 1025, 64, 1025, None), (8, 12, 4097, 64, 4097, None),
                          (8, 16, 4097, 128, 4097, None), (32, 16, 257, 80, 257, None),
                          (32, 8, 1050, 32, 1050, None), (32, 8, 100, 32, 1050, "detr")])

    def test_without_training_the_five_of_chapter_15(self):
        _, cases = parse()
        self.assertEqual([tuple(c[:4]) for c in cases], script.SHAPES)
        self.assertTrue(all(c.kv_tokens == c.tokens and c.key_padding is None for c in cases))

    def test_shapes_with_keys_and_padding(self):
        args, cases = parse("--training", "--shapes", "2,3,65,64; 2,3,17,32,130@0.25;"
                            "1,1,5,64,9@detr;4,2,8,64,8@none", "--key-padding", "detr")
        self.assertEqual(cases, [script.Case(2, 3, 65, 64, 65, "detr"),
                                 script.Case(2, 3, 17, 32, 130, 0.25),
                                 script.Case(1, 1, 5, 64, 9, "detr"),
                                 script.Case(4, 2, 8, 64, 8, None)])
        self.assertEqual(args.key_padding, "detr")

    def test_refusals(self):
        for argv, fragment in (
                (("--training", "--shapes", "2,3,65"), "B,H,N,D or B,H,N,D,N_k"),
                (("--training", "--shapes", "2,3,65,64,0"), "at least 1"),
                (("--training", "--shapes", "2,3,x,64"), "integers"),
                (("--training", "--shapes", "2,3,65,64@0.5x"), "neither 'none', 'detr'"),
                (("--training", "--key-padding", "1.0"), "[0, 1)"),
                (("--training", "--shapes", " ; "), "no shape given"),
                (("--shapes", "2,3,65,64,130"), "--training only"),
                (("--key-padding", "0.5"), "--training only"),
                (("--warm-s", "-1"), "negative")):
            with self.subTest(argv=argv):
                self.assertIn(fragment, refused_to_parse(*argv))

    def test_help_documents_the_shapes_and_the_padding(self):
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout), self.assertRaises(SystemExit):
            parse("--help")
        text = " ".join(stdout.getvalue().split())
        for fragment in ("B,H,N,D[,N_k][@PADDING]", "'detr'", "25 x 42 for 1050",
                         "round(F * N_k)", "--key-padding"):
            self.assertIn(fragment, text)


class Masks(unittest.TestCase):
    def test_detr_grid_is_detrs_feature_map(self):
        self.assertEqual(script.detr_grid(1050), (25, 42))
        self.assertEqual(script.detr_grid(7), (1, 7))  # a prime: one row

    def test_detr_padding_pads_right_and_bottom_of_smaller_images(self):
        mask = script.padded_keys("detr", 5, 1050)
        self.assertEqual((len(mask), len(mask[0])), (5, 1050))
        self.assertFalse(any(mask[0]))  # the largest image fills the map
        self.assertEqual(mask[4], mask[0])  # the sizes go round DETR_IMAGES
        self.assertEqual(sum(mask[1]), (25 - 20) * 42)  # 0.8 of 25 rows
        self.assertEqual(sum(mask[2]), 25 * (42 - 30))  # ceil(0.7 * 42) = 30 columns
        self.assertEqual(sum(mask[3]), 25 * 42 - 15 * 38)
        for row in mask:
            self.assertFalse(row[0])  # no image is all padding: every query sees a key
            for y in range(25):  # within a row of the map, padding is a suffix
                line = row[y * 42:(y + 1) * 42]
                self.assertEqual(line, sorted(line))
        self.assertEqual(script.padded_share(mask[:4]), (210 + 300 + 480) / 4200)  # about a quarter

    def test_a_fraction_pads_the_last_keys_and_keeps_one(self):
        self.assertEqual(script.padded_keys(0.25, 2, 8), [[False] * 6 + [True] * 2] * 2)
        self.assertEqual(script.padded_keys(0.99, 1, 4), [[False, True, True, True]])
        self.assertEqual(script.padded_keys(0.0, 1, 3), [[False] * 3])
        self.assertIsNone(script.padded_keys(None, 2, 8))
        self.assertEqual(script.padded_share(None), 0.0)

    def test_describe(self):
        self.assertEqual(script.describe(script.Case(32, 8, 100, 32, 1050, "detr")),
                         "(32, 8, 100x1050, 32, key padding detr)")
        self.assertEqual(script.describe(script.Case(32, 12, 197, 64, 197, None)),
                         "(32, 12, 197, 64)")


class Rows(unittest.TestCase):
    case = script.Case(32, 8, 100, 32, 1050, "detr")

    def test_a_refused_implementation_gets_its_reason_instead_of_numbers(self):
        windows = {(path, name): [10.0, 12.0, 11.0] if name == "steps" else [20.0, 22.0, 21.0]
                   for path in script.PATHS for name in ("steps", "cudnn")}
        flushed = {key: [value + 1 for value in values] for key, values in windows.items()}
        rows = script.training_rows(self.case, "fp16", windows, flushed,
                                    {"flash": "No available kernel. Aborting execution.; Flash "
                                              "attention does not support non-null attn_mask."},
                                    {"steps": "steps' note", "cudnn": "cudnn's note"})
        self.assertEqual([(r["path"], r["implementation"]) for r in rows],
                         [(p, n) for p in script.PATHS for n in script.IMPLEMENTATIONS])
        for row in rows:
            self.assertEqual(set(row), set(script.TRAINING_FIELDS))
            self.assertEqual((row["kv_tokens"], row["key_padding"]), (1050, "detr"))
        steps, flash, cudnn = rows[:3]
        self.assertEqual((steps["windows_median_us"], steps["windows_low_us"],
                          steps["windows_high_us"], steps["flushed_median_us"]),
                         ("11.0", "10.0", "12.0", "12.0"))
        self.assertEqual(steps["vs_cudnn_windows"], "0.524")  # 11 / 21
        self.assertEqual(steps["vs_flash_windows"], "")  # flash refused: no ratio to it
        self.assertEqual(cudnn["vs_cudnn_flushed"], "1.000")
        self.assertEqual(flash["windows_median_us"], "")
        self.assertEqual(flash["note"], "refused: No available kernel. Aborting execution.; "
                                        "Flash attention does not support non-null attn_mask.")
        self.assertEqual(steps["note"], "steps' note")

    def test_refusal_reason_takes_the_first_line_and_torch_s_warnings(self):
        caught = [types.SimpleNamespace(message=UserWarning(
                      "Flash attention does not support non-null attn_mask. (Triggered internally "
                      "at /pytorch/aten/src/ATen/native/transformers/sdp_utils_cpp.h:261.)")),
                  types.SimpleNamespace(message=UserWarning(
                      "Flash attention does not support non-null attn_mask."))]
        self.assertEqual(script.refusal_reason(RuntimeError("No available kernel. Aborting "
                                                            "execution.\nmore"), caught),
                         "No available kernel. Aborting execution.; Flash attention does not "
                         "support non-null attn_mask.")
        self.assertEqual(script.refusal_reason(NotImplementedError(""), []), "NotImplementedError")


@unittest.skipIf(torch is None, "torch does not import: the v10_views row's tensors are not made")
class Views(unittest.TestCase):
    """The tensors of the v10_views row: the same values, laid out as training leaves them."""

    def test_packed_projection_and_token_major_views(self):
        q, k, v, o = (torch.randn(2, 3, 5, 8) for _ in range(4))
        views = script.packed_views(torch, q, k, v)
        for view, tensor in zip(views, (q, k, v)):
            self.assertTrue(torch.equal(view, tensor))
            self.assertEqual(view.stride(), (5 * 3 * 3 * 8, 8, 3 * 3 * 8, 1))  # [B, N, 3, H, D]
        self.assertEqual(views[0].data_ptr() + 3 * 8 * views[0].element_size(), views[1].data_ptr())
        o_view = script.token_major_view(o)
        self.assertTrue(torch.equal(o_view, o))
        self.assertEqual(o_view.stride(), (5 * 3 * 8, 8, 3 * 8, 1))  # [B, N, H, D]


@unittest.skipIf(torch is None, "torch does not import: --training's loop is not run")
class TrainingLoopOnTheCpu(unittest.TestCase):
    """--training end to end on the CPU: the steps' forward stood in by SDPA's math (with the mask
    the script hands it), FlashAttention-2 refusing an attn_mask as torch does, the timing by
    counting calls."""

    def run_script(self, cases, causal=False):
        args = types.SimpleNamespace(causal=causal, forward_step="v8", dtype="fp16", warm_s=0.0,
                                     windows=2, calls=1, flushed_calls=3)
        seen = []

        def steps_attention(q, k, v, step, causal_name, mask):
            seen.append((tuple(q.shape), tuple(k.shape), mask is not None, step, causal_name))
            attend = script.sdpa_attn_mask(torch, mask, q.shape[2], k.shape[2], causal_name is not None)
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=attend, is_causal=causal_name is not None and attend is None)

        backends = types.SimpleNamespace(FLASH_ATTENTION="flash", CUDNN_ATTENTION="cudnn",
                                         MATH="math")

        class Functional:  # F with SDPA's backend rule: FlashAttention-2 takes no attn_mask
            backend = None

            @staticmethod
            def scaled_dot_product_attention(*inputs, attn_mask=None, is_causal=False):
                if Functional.backend == "flash" and attn_mask is not None:
                    warnings.warn("Flash attention does not support non-null attn_mask. "
                                  "(Triggered internally at sdp_utils_cpp.h:261.)")
                    raise RuntimeError("No available kernel. Aborting execution.")
                return torch.nn.functional.scaled_dot_product_attention(
                    *inputs, attn_mask=attn_mask, is_causal=is_causal)

        @contextlib.contextmanager
        def sdpa_kernel(backend):
            Functional.backend = backend
            try:
                yield
            finally:
                Functional.backend = None

        def timed(torch_module, run, calls, flush=None):
            for _ in range(calls):
                run()
            return [0.01] * calls

        out = io.StringIO()
        with mock.patch.object(script, "DEVICE", "cpu"), \
                mock.patch.object(script, "steps_attention", steps_attention), \
                mock.patch.object(script, "backward_step_name", lambda *a: "v10"), \
                mock.patch.object(script.measuring, "FLUSH_BYTES", 64), \
                mock.patch.object(script.measuring, "warm_up", lambda t, runs, s: [r() for r in runs]), \
                mock.patch.object(script.measuring, "window_ms", lambda t, run, calls: (run(), 0.02)[1]), \
                mock.patch.object(script.measuring, "flushed_call_ms", timed), \
                contextlib.redirect_stdout(io.StringIO()):
            status = script.training(torch, Functional, sdpa_kernel, backends, args, cases,
                                     torch.float32, out)
        self.assertEqual(status, 0)
        return list(csv.DictReader(io.StringIO(out.getvalue()))), seen

    def test_detr_cross_attention_with_padding_and_a_plain_shape(self):
        cases = [script.Case(2, 2, 5, 8, 12, "detr"), script.Case(2, 2, 6, 8, 6, None)]
        rows, seen = self.run_script(cases)
        self.assertEqual(len(rows), 2 * len(script.PATHS) * len(script.IMPLEMENTATIONS))
        masked = {(r["path"], r["implementation"]): r for r in rows[:6]}
        for path in script.PATHS:
            self.assertEqual(masked[(path, "flash")]["windows_median_us"], "")
            self.assertIn("refused: No available kernel", masked[(path, "flash")]["note"])
            self.assertIn("does not support non-null attn_mask", masked[(path, "flash")]["note"])
            for name in ("steps", "cudnn"):
                self.assertEqual(masked[(path, name)]["windows_median_us"], "20.0")
                self.assertEqual(masked[(path, name)]["flushed_median_us"], "10.0")
        note = masked[("backward", "steps")]["note"]
        self.assertIn("% of keys padded (detr)", note)
        self.assertIn("backward v10", note)
        errors = [float(e) for e in note.split("fp32 math: ")[1].split(", ")]
        self.assertEqual(len(errors), 3)
        self.assertTrue(all(e < 1e-5 for e in errors), errors)  # the stand-in is SDPA itself
        self.assertEqual(seen[0], ((2, 2, 5, 8), (2, 2, 12, 8), True, "v8", None))
        plain = rows[6:]
        self.assertTrue(all(r["windows_median_us"] == "20.0" for r in plain))
        self.assertEqual({r["key_padding"] for r in plain}, {"none"})
        self.assertEqual({r["kv_tokens"] for r in plain}, {"6"})

    def test_causal_with_padding_folds_both_into_sdpa_s_mask(self):
        attend = script.sdpa_attn_mask(torch, torch.tensor([[False, False, True]]), 2, 3, True)
        self.assertEqual(attend.tolist(), [[[[True, False, False], [True, True, False]]]])
        self.assertIsNone(script.sdpa_attn_mask(torch, None, 2, 3, True))
        rows, seen = self.run_script([script.Case(1, 1, 4, 8, 4, 0.25)], causal=True)
        self.assertEqual(seen[0][-1], "top-left")
        self.assertEqual(len(rows), 6)


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() and result.testsRun > len(result.skipped) else 1)
