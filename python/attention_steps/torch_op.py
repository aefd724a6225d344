"""torch.ops.attention_steps.attention, the steps as a PyTorch operator, and what torch.compile
needs to trace it.

The operator itself is C++ (csrc/operator.cpp), built by `pip install --no-build-isolation
./python` against the installed torch and linked to libattention_steps.so:

    attention(Tensor q, Tensor k, Tensor v, str step, float? scale=None,
              Tensor? key_padding_mask=None, bool return_log_sum_exp=False,
              str? causal=None) -> (Tensor, Tensor)

returns O (fp16 [B, H, N, D]; for a step that takes views, a view of [B, N, H, D] memory, or of
[N, B, H, D] memory when q is sequence-first: O keeps q's order of batch and tokens) and L
(fp32 [B, H, N], each row's log-sum-exp, when return_log_sum_exp; an empty tensor otherwise).
causal: None, "top-left" (query i sees keys j <= i, as SDPA's is_causal=True) or "bottom-right"
(j <= i + N_k - N, as FlashAttention), for a step that takes a causal mask; autograd's backward
gets the same masks (causal and key-padding) and N_k, and runs the backward step the library
chooses for them:

    attention_backward(Tensor d_o, Tensor q, Tensor k, Tensor v, Tensor o, Tensor log_sum_exp,
                       str step, float? scale=None, bool deterministic=False, str? causal=None,
                       Tensor? key_padding_mask=None) -> (Tensor, Tensor, Tensor)

returns dQ shaped like q and dK, dV shaped like k and v (contiguous); and packed sequences of
different lengths (attention_steps.varlen):

    varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
                     int max_seqlen_q, int max_seqlen_k, str step, str? causal=None,
                     float? scale=None, bool return_log_sum_exp=False) -> (Tensor, Tensor)
    varlen_attention_backward(Tensor d_o, Tensor q, Tensor k, Tensor v, Tensor o,
                              Tensor log_sum_exp, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
                              int max_seqlen_q, int max_seqlen_k, str step, str? causal=None,
                              float? scale=None, bool deterministic=False) -> (Tensor, Tensor, Tensor)

return O [total_q, H, D] and L [H, total_q], and dQ, dK, dV like q, k, v. This module loads them,
registers their fake implementations (the shapes and strides of the outputs from the shapes of
the inputs alone, so torch.compile traces the operators without running them, also with dynamic
shapes, and without a graph break) and varlen_attention's autograd (its backward runs
varlen_attention_backward with the backward step that takes packed sequences).
"""
import functools

import torch

from ._capi import load_library

BUILD_COMMAND = "pip install --no-build-isolation ./python (after CMake built the library)"
# torch.library.register_fake, which the fake implementations below use, came in torch 2.4; the
# operator was built and tested with torch 2.11 (python/README.md).
OLDEST_TORCH = (2, 4)


@functools.lru_cache(maxsize=None)
def _takes_strides(step):
    return load_library().step(step).takes_strides


def needs_grad(tensors):
    """Whether autograd will want a backward of these inputs: then the forward keeps L, which the
    backward step (v9 or v10) rebuilds P from (writing it costs the forward 1-12%, chapter 12)."""
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


def _fake_attention(q, k, v, step, scale=None, key_padding_mask=None, return_log_sum_exp=False,
                    causal=None):
    # The same outputs as the CUDA implementation, for fake (and symbolic) shapes.
    batch, heads, tokens, head_dim = q.shape
    if _takes_strides(step) and batch > 1 and tokens > 1 and q.stride(2) > q.stride(0):
        o = q.new_empty((tokens, batch, heads, head_dim)).permute(1, 2, 0, 3)  # sequence-first
    elif _takes_strides(step):
        o = q.new_empty((batch, tokens, heads, head_dim)).transpose(1, 2)
    else:
        o = q.new_empty((batch, heads, tokens, head_dim))
    rows = (batch, heads, tokens) if return_log_sum_exp else (0,)
    return o, q.new_empty(rows, dtype=torch.float32)


def _fake_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, step,
                           causal=None, scale=None, return_log_sum_exp=False):
    # O [total_q, H, D] contiguous, L [H, total_q] (attention_steps.varlen).
    total, heads, _ = q.shape
    rows = (heads, total) if return_log_sum_exp else (0,)
    return q.new_empty(q.shape), q.new_empty(rows, dtype=torch.float32)


def _fake_varlen_attention_backward(d_o, q, k, v, o, log_sum_exp, cu_seqlens_q, cu_seqlens_k,
                                    max_seqlen_q, max_seqlen_k, step, causal=None, scale=None,
                                    deterministic=False):
    # dQ like q, dK and dV like k and v, contiguous [total, H, D].
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _varlen_setup_context(ctx, inputs, output):
    # What varlen_attention's backward needs: the inputs, O and L, the lengths and the options.
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, _, causal, scale, _ = inputs
    o, log_sum_exp = output
    ctx.save_for_backward(q, k, v, o, log_sum_exp, cu_seqlens_q, cu_seqlens_k)
    ctx.lengths = (max_seqlen_q, max_seqlen_k)
    ctx.causal, ctx.scale = causal, scale
    ctx.mark_non_differentiable(log_sum_exp)


def _varlen_backward(ctx, grad_o, _grad_log_sum_exp):
    # The backward step that takes packed sequences at this head dim (v10), on what the forward kept.
    from .varlen import packed_step  # varlen imports this module
    q, k, v, o, log_sum_exp, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    if log_sum_exp.numel() != q.shape[0] * q.shape[1]:
        raise NotImplementedError("attention_steps: the forward kept no L; call varlen_attention "
                                  "with return_log_sum_exp=True (attention_steps.varlen_attention does)")
    dq, dk, dv = torch.ops.attention_steps.varlen_attention_backward(
        grad_o, q, k, v, o, log_sum_exp, cu_seqlens_q, cu_seqlens_k, *ctx.lengths,
        packed_step(q.shape[-1], backward=True), ctx.causal, ctx.scale,
        torch.are_deterministic_algorithms_enabled())
    return dq, dk, dv, None, None, None, None, None, None, None, None


def _fake_attention_backward(d_o, q, k, v, o, log_sum_exp, step, scale=None,
                             deterministic=False, causal=None, key_padding_mask=None):
    # dQ like q, dK and dV like k and v ([B, H, N_k, D] in cross-attention), all contiguous.
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@functools.lru_cache(maxsize=None)
def load():
    """Loads the operator (once) and returns torch.ops.attention_steps.attention; ImportError
    that says how to build it when it was not."""
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version < OLDEST_TORCH:
        raise ImportError(f"the attention_steps operator needs torch {'.'.join(map(str, OLDEST_TORCH))} "
                          f"or newer (torch.library.register_fake); this is {torch.__version__}")
    try:
        from . import _operator  # noqa: F401  (loading the library registers the operator)
    except ImportError as error:
        raise ImportError(f"the attention_steps operator is not built here ({error}): "
                          f"{BUILD_COMMAND}") from error
    torch.library.register_fake("attention_steps::attention")(_fake_attention)
    torch.library.register_fake("attention_steps::attention_backward")(_fake_attention_backward)
    torch.library.register_fake("attention_steps::varlen_attention")(_fake_varlen_attention)
    torch.library.register_fake("attention_steps::varlen_attention_backward")(_fake_varlen_attention_backward)
    torch.library.register_autograd("attention_steps::varlen_attention", _varlen_backward,
                                    setup_context=_varlen_setup_context)
    return torch.ops.attention_steps.attention


def load_if_built():
    """torch.ops.attention_steps.attention, or None where it is not built. Callers resolve it
    once, at import, so that nothing on their call path loads anything while torch.compile
    traces it."""
    try:
        return load()
    except ImportError:
        return None


def available():
    """Whether the operator is built and loads."""
    try:
        load()
    except ImportError:
        return False
    return True
