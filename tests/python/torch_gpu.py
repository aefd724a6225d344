"""What every GPU suite of the PyTorch operator checks before it runs: torch imports, it sees a
CUDA device, and the operator is built and loads. A suite asks once, at import:

    SKIP_REASON = torch_gpu.skip_reason("the backward's view tests")
    if SKIP_REASON is None:
        import torch  # and what else the tests use

raises unittest.SkipTest(SKIP_REASON) in setUpModule (for pytest), and ends with
torch_gpu.main(SKIP_REASON): exit 77, which ctest counts as skipped, with the reason, or the
tests, failing when none of them ran. torch_dtype and per_head_dim are the suites' shared helpers.
"""
import sys
import unittest


def skip_reason(what):
    """None when torch, a CUDA device and the operator are all there; else why `what` (the
    suite's tests, in a few words) did not run."""
    try:
        import torch
    except ImportError as error:
        return f"{error}; {what} did not run"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device; {what} did not run"
    from attention_steps import torch_op
    try:
        torch_op.load()
    except ImportError as error:
        return str(error)
    return None


def torch_dtype(name):
    """"fp16" or "bf16" as torch's dtype."""
    import torch
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def per_head_dim(head_dims):
    """A class decorator: one test method per head dim, test_d32, test_d64, ..., each calling
    self.check(head_dim), so that each passes, fails or skips on its own."""
    def decorate(cls):
        for head_dim in head_dims:
            def test(self, head_dim=head_dim):
                self.check(head_dim)
            test.__name__ = f"test_d{head_dim}"
            test.__doc__ = f"{cls.__name__} at head dim {head_dim}"
            setattr(cls, test.__name__, test)
        return cls
    return decorate


def main(reason):
    """The suite as a script: exit 77 saying why when `reason` is set, else run the tests and exit
    1 unless they passed and at least one of them ran."""
    if reason is not None:
        print(f"SKIPPED: {reason}")
        sys.exit(77)
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() and result.testsRun > len(result.skipped) else 1)
