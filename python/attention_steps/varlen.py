"""Sequences of different lengths in one call: images of several sizes, packed.

    o, lse = attention_steps.varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                              max_seqlen_q, max_seqlen_k, causal=False)

FlashAttention's varlen layout: the tokens of S sequences one after another, q [total_q, H, D],
k and v [total_k, H, D] (CUDA, float16 or bfloat16); cu_seqlens_q and cu_seqlens_k the int32
prefix sums of the lengths, [S + 1] on the same GPU (0, n_0, n_0 + n_1, ..., total); max_seqlen_q
and max_seqlen_k the longest lengths. Each sequence attends within itself, and no FLOP is spent
on padding. Returns O [total_q, H, D] and L [H, total_q] fp32 (each row's log-sum-exp; a row
that sees no key has O = 0 and L = -inf). causal: False, True or "bottom-right" (FlashAttention's
alignment, each sequence's last query seeing its last key), or "top-left" (PyTorch's is_causal);
with as many keys as queries the two agree.

The prefix sums are checked before anything is launched (int32, on q's GPU, starting at 0, never
decreasing, ending at the token counts, no length past its maximum): that reads them back to the
host, one small copy that waits for the GPU. check_lengths=False skips it, for callers that build
them correctly and must not synchronise (CUDA graphs).

Gradients flow through it: where q, k or v require grad, autograd runs the backward step that
takes packed sequences (v10, on Hopper) on O and L as the forward left them, in its deterministic
mode under torch.use_deterministic_algorithms(True).
"""
import torch

from . import torch_op
from ._capi import load_library

_operator_built = torch_op.load_if_built() is not None  # resolved at import, so that torch.compile
                                                      # traces no loading on the call path
_causal_alignments = {False: None, None: None, True: "bottom-right", "bottom-right": "bottom-right",
                      "top-left": "top-left"}


def _check_prefix_sums(name, sums, device, total, longest):
    if not isinstance(sums, torch.Tensor) or sums.dtype != torch.int32:
        raise TypeError(f"attention_steps: {name} must be a torch.int32 tensor; "
                        f"got {getattr(sums, 'dtype', type(sums).__name__)}")
    if sums.device != device:
        raise ValueError(f"attention_steps: {name} is on {sums.device}, q on {device}; "
                         "the prefix sums go on q's GPU")
    if sums.dim() != 1 or sums.numel() < 2:
        raise ValueError(f"attention_steps: {name} must be [S + 1] prefix sums of S >= 1 lengths; "
                         f"it has shape {list(sums.shape)}")
    host = sums.tolist()  # one small copy back: the check reads the values
    if host[0] != 0:
        raise ValueError(f"attention_steps: {name} must start at 0; it starts at {host[0]}")
    lengths = [b - a for a, b in zip(host, host[1:])]
    if min(lengths) < 0:
        at = lengths.index(min(lengths))
        raise ValueError(f"attention_steps: {name} decreases at entry {at + 1} "
                         f"({host[at]} then {host[at + 1]}); prefix sums never decrease")
    if host[-1] != total:
        raise ValueError(f"attention_steps: {name} ends at {host[-1]}, but the tensor holds "
                         f"{total} tokens")
    if max(lengths) > longest:
        at = lengths.index(max(lengths))
        raise ValueError(f"attention_steps: sequence {at} is {lengths[at]} tokens long ({name}), "
                         f"longer than its max_seqlen ({longest})")


def packed_step(head_dim, backward=False, library=None):
    """The highest-numbered forward step that takes packed sequences at `head_dim` (v8), or with
    backward=True the backward step (v10); ValueError naming those that do where none serves it."""
    steps = [info for info in (library or load_library()).steps()
             if info.takes_packed_sequences and bool(info.is_backward) == backward and not info.is_baseline]
    serving = [info.id for info in steps if head_dim in info.head_dims]
    if not serving:
        offered = ", ".join(f"{info.id} (head dims {', '.join(map(str, info.head_dims))})" for info in steps)
        kind = "backward step" if backward else "step"
        raise ValueError(f"attention_steps: no {kind} takes packed sequences at head dim {head_dim}; "
                         f"those that take them: {offered or 'none in this build'}")
    return serving[-1]


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     causal=False, scale=None, *, step=None, check_lengths=True):
    """O and L of packed sequences (this module's docstring). step: the forward step to run
    (None: packed_step's). ValueError for bad lengths or a call the step does not serve on this
    GPU (the library's reason), TypeError for a wrong dtype."""
    if causal not in _causal_alignments:
        raise ValueError(f"attention_steps: causal is {causal!r}; it must be False, True, "
                         "'bottom-right' or 'top-left'")
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"attention_steps: {name} must be an int >= 0; got {value!r}")
    if check_lengths:
        _check_prefix_sums("cu_seqlens_q", cu_seqlens_q, q.device, q.shape[0], max_seqlen_q)
        _check_prefix_sums("cu_seqlens_k", cu_seqlens_k, q.device, k.shape[0], max_seqlen_k)
        if cu_seqlens_q.numel() != cu_seqlens_k.numel():
            raise ValueError("attention_steps: cu_seqlens_q and cu_seqlens_k must count the same "
                             f"sequences; they hold {cu_seqlens_q.numel()} and {cu_seqlens_k.numel()} entries")
    alignment = _causal_alignments[causal]
    if step is None:
        step = packed_step(q.shape[-1])
    if not _operator_built:
        torch_op.load()  # raises ImportError saying how to build it
    return torch.ops.attention_steps.varlen_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max(max_seqlen_q, 1), max(max_seqlen_k, 1), step,
        alignment, scale, True)
