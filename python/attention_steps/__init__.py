"""The attention steps of this repository, from Python.

Three layers:
  - ctypes over libattention_steps.so (this module; the standard library only): list the steps,
    ask whether one serves a shape on the current GPU, run one on raw device pointers;
  - the PyTorch operator torch.ops.attention_steps.attention (attention_steps.torch_op; built by
    `pip install --no-build-isolation ./python`), which torch.compile and CUDA graphs take;
  - on top of it, imported on first use (torch is never needed to import this package):
    attention(q, k, v, step) on CUDA fp16 tensors, swap_attention() which puts a step inside
    torchvision's ViT models, and use_steps(), which makes F.scaled_dot_product_attention run
    the fastest step that serves each call (PyTorch's own for the rest).

    import torch, torchvision, attention_steps
    q, k, v = (torch.randn(32, 12, 197, 64, device="cuda", dtype=torch.half) for _ in range(3))
    o = attention_steps.attention(q, k, v, step="v6")          # [B, H, N, D], like SDPA
    model = torchvision.models.vit_b_16().cuda().half().eval()
    attention_steps.swap_attention(model, step="v8")            # every encoder block
    with torch.inference_mode():
        logits = model(torch.randn(32, 3, 224, 224, device="cuda", dtype=torch.half))
    attention_steps.use_steps()   # timm's, Hugging Face's ViTs: F.scaled_dot_product_attention

  varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) runs images
  of several sizes in one call, their tokens packed [total, H, D] (FlashAttention's varlen).

The library is found as attention_steps._capi says: load_library(path), the environment
variable ATTENTION_STEPS_LIBRARY, <checkout>/build/libattention_steps.so, the system loader.
"""
from ._capi import (ABI_VERSION, CUDA_ERROR, ENVIRONMENT_VARIABLE, OK, REFUSED,
                    AttentionStepsError, CudaError, DeviceInfo, Library, LibraryNotFoundError,
                    StepInfo, StepRefused, load_library)

# name -> the submodule that holds it, imported on first use because it imports torch.
_TORCH_NAMES = {name: "torch_bridge" for name in (
    "attention", "swap_attention", "restore_attention", "StepSelfAttention", "swappable_blocks")}
_TORCH_NAMES.update({name: "sdpa" for name in ("scaled_dot_product_attention", "use_steps")})
_TORCH_NAMES.update({name: "varlen" for name in ("varlen_attention", "packed_step")})




def _torch_installed():
    """Whether torch can be imported, asked without importing it."""
    import importlib.util
    return importlib.util.find_spec("torch") is not None


# `from attention_steps import *` takes the torch layer's names only where torch is installed:
# elsewhere it imports the ctypes layer, as `import attention_steps` does.
__all__ = ["ABI_VERSION", "OK", "REFUSED", "CUDA_ERROR", "ENVIRONMENT_VARIABLE",
           "AttentionStepsError", "CudaError", "StepRefused", "LibraryNotFoundError",
           "DeviceInfo", "StepInfo", "Library", "load_library", "list_steps", "device_info",
           "check", "refusal", "max_tokens", "shared_bytes", "workspace_bytes", "choose_step",
           *(_TORCH_NAMES if _torch_installed() else [])]


def list_steps(library=None):
    """Every registered step and baseline (StepInfo), in order: v0, v1, ..., then eager."""
    return (library or load_library()).steps()


def device_info(library=None):
    """The current CUDA device (DeviceInfo); CudaError "no CUDA device found (...)" without one."""
    return (library or load_library()).device()


def check(step, shape, library=None):
    """Raises StepRefused with the reason when `step` does not serve shape (B, H, N, D) here."""
    (library or load_library()).check(step, shape)


def refusal(step, shape, library=None):
    """Why `step` does not serve shape (B, H, N, D) on the current GPU, or None when it does."""
    return (library or load_library()).refusal(step, shape)


def max_tokens(step, head_dim, library=None):
    """The largest N `step` serves at head_dim on the current GPU; None when it serves any N."""
    return (library or load_library()).max_tokens(step, head_dim)


def shared_bytes(step, tokens, head_dim, library=None):
    """Dynamic shared memory per block `step` needs at N = tokens (no GPU needed)."""
    return (library or load_library()).shared_bytes(step, tokens, head_dim)


def workspace_bytes(step, shape, library=None):
    """Scratch device memory `step` needs at shape (B, H, N, D); 0 for most steps."""
    return (library or load_library()).workspace_bytes(step, shape)


def choose_step(shape, *, backward=False, library=None, **call):
    """The step that serves a call of shape (B, H, N, D) here (or on a GPU of
    compute_capability=...): the highest-numbered forward step that writes L, or backward step,
    that serves its dtype, kv_tokens, key_padding_mask, causal and deterministic; StepRefused
    with each candidate's reason when none does. The one answer every layer asks for."""
    return (library or load_library()).choose_step(shape, backward=backward, **call)


def __getattr__(name):
    # The torch layers on first use: `import attention_steps` works where torch is absent.
    if name in _TORCH_NAMES:
        import importlib
        try:
            module = importlib.import_module(f"{__name__}.{_TORCH_NAMES[name]}")
        except ImportError as error:
            raise ImportError(
                f"attention_steps.{name} needs PyTorch ({error}); the ctypes layer "
                "(list_steps, check, Library.run) works without it") from error
        return getattr(module, name)
    raise AttributeError(f"module 'attention_steps' has no attribute '{name}'")
