"""The steps on PyTorch tensors, and inside torchvision's Vision Transformers.

attention(q, k, v, step) runs a step on CUDA fp16 tensors [B, H, N, D] through the operator
torch.ops.attention_steps.attention (attention_steps.torch_op), on the current stream of their
device, into a fresh tensor: O = softmax(Q K^T / sqrt(D)) V, what
torch.nn.functional.scaled_dot_product_attention(q, k, v) computes. It works under
torch.compile (fullgraph) and inside CUDA graphs.

swap_attention(model, step) replaces the self-attention of every encoder block of a
torchvision VisionTransformer (vit_b_16, vit_b_32, vit_l_16, vit_h_14, any image size) with
StepSelfAttention: the block's own in-projection weights, the step's kernel on [B, H, N, D],
and the block's own out-projection, so the model computes what it computed before. With no step
named, each call runs the step the library chooses for it on its GPU (attention_steps.choice).
restore_attention(model) puts the original modules back.

Autograd: a forward on inputs that require grad keeps O and L, and backward runs the backward
step the library chooses for the call on the GPU (attn_choose_step, told N_k, the key-padding
mask and the causal alignment: v10, the Hopper backward, on an H100; v9, the FlashAttention-2
backward, elsewhere; at the head dims they serve); where none serves it, backward raises
NotImplementedError with each step's reason.
"""
import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from . import choice, torch_op
from ._capi import StepRefused, load_library

RECORD_PREFIX = "attention_steps::"  # profiler ranges around each kernel call: attention_steps::v6
_attention_op = torch_op.load_if_built()


def attention(q, k, v, step="v6", *, scale=None, causal=None, key_padding_mask=None):
    """O = softmax(scale Q K^T) V by step `step` (scale None: 1/sqrt(D)), for CUDA fp16
    [B, H, N, D] tensors q, and k, v of one shape [B, H, N_k, D] (N_k = N but for a step that
    serves cross-attention). Any strides: a step that takes views (v7, v8)
    reads q, k and v in place when they share strides with rows of D contiguous (slices of one
    packed projection) and returns O as a view of [B, N, H, D] memory ([N, B, H, D] when q is
    sequence-first); other steps get contiguous copies. Queued on the current stream of their device. Raises ValueError for a
    shape the step does not serve on this GPU (with the library's reason) and for bad tensors,
    TypeError for a dtype other than float16 and bfloat16 (bfloat16 for the steps that take it:
    v6 and v8), RuntimeError for a CUDA failure. causal: None, "top-left" (query i sees keys
    j <= i, as SDPA's is_causal=True) or "bottom-right" (j <= i + N_k - N), for a step that takes
    a causal mask (v0, v6, v8; v9 and v10 in the backward). key_padding_mask: None, or bool
    [B, N_k], True where a key is padding (PyTorch's), for a step that takes one; a row with no
    key left gets O = 0 (and zero gradients). The backward gets the same masks."""
    operator = _attention_op if _attention_op is not None else torch_op.load()  # says how to build it
    return operator(q, k, v, step, scale, key_padding_mask, torch_op.needs_grad((q, k, v)),
                    causal)[0]


class StepSelfAttention(nn.Module):
    """Self-attention of an nn.MultiheadAttention (batch_first) with a step's kernel inside:

        qkv = x W_in^T + b_in                       [B, N, 3E], the block's in-projection
        q, k, v = qkv as [3, B, H, N, D]            one layout copy (none for a step that
                                                    takes strides: q, k, v are views of qkv)
        o = step(q, k, v)                           [B, H, N, D] (written as [B, N, H, D] by a
                                                    step that takes strides)
        y = (o as [B, N, E]) W_out^T + b_out        one layout copy (none likewise), the
                                                    block's out-projection

    It shares its parameters with the module it replaces (the same Parameter objects, under the
    same state_dict names), so weights loaded into either are the other's. `attention_fn`
    (q, k, v) -> o replaces the library call, e.g. scaled_dot_product_attention to test the
    wiring without a GPU. Called as torchvision calls it: module(x, x, x, need_weights=False).
    """

    def __init__(self, mha, step=None, attention_fn=None, library=None):
        super().__init__()
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"expected nn.MultiheadAttention, got {type(mha).__name__}")
        unsupported = [why for why, present in (
            ("batch_first=False", not mha.batch_first),
            ("separate q/k/v projection weights (kdim/vdim)", not mha._qkv_same_embed_dim),
            ("bias_k/bias_v", mha.bias_k is not None or mha.bias_v is not None),
            ("add_zero_attn", mha.add_zero_attn)) if present]
        if unsupported:
            raise ValueError("StepSelfAttention takes torchvision's self-attention; this "
                             "nn.MultiheadAttention has " + ", ".join(unsupported))
        self.in_proj_weight = mha.in_proj_weight
        self.in_proj_bias = mha.in_proj_bias
        self.out_proj = mha.out_proj
        self.embed_dim, self.num_heads, self.head_dim = mha.embed_dim, mha.num_heads, mha.head_dim
        self.dropout = mha.dropout
        self.batch_first = True
        self._original = (mha,)  # a tuple: kept out of the module tree and the state_dict
        self.use(step, attention_fn, library)

    def use(self, step, attention_fn=None, library=None):
        """Runs `step` (or attention_fn; None: the step the library chooses for each call, see
        attention_steps.choice) from now on. What the forward needs to know of the step is read
        here, once: the forward makes no library call but the operator's, so torch.compile traces
        it whole."""
        self.step, self.attention_fn = step, attention_fn
        self.takes_strides = attention_fn is None and step is not None and \
            (library or load_library()).step(step).takes_strides

    def extra_repr(self):
        kernel = getattr(self.attention_fn, "__name__", "attention_fn") if self.attention_fn \
            else f"step={self.step or 'chosen per call'}"
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, {kernel}"

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        if not (query is key and key is value):
            raise ValueError("StepSelfAttention is self-attention only: pass the same tensor as "
                             "query, key and value")
        if need_weights:
            raise ValueError("StepSelfAttention computes no attention weights: call it with "
                             "need_weights=False (as torchvision's EncoderBlock does)")
        if key_padding_mask is not None or attn_mask is not None or is_causal:
            raise ValueError("StepSelfAttention takes no masks: every token attends to all")
        if self.training and self.dropout > 0:
            raise RuntimeError("StepSelfAttention has no attention dropout: call model.eval()")
        if query.dim() != 3:
            raise ValueError(f"expected [B, N, E] input; got shape {tuple(query.shape)}")
        batch, tokens, embed = query.shape
        if embed != self.embed_dim:
            raise ValueError(f"input has embedding {embed}; this block has {self.embed_dim}")
        qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)
        step, takes_strides = self.step, self.takes_strides
        if step is None and self.attention_fn is None:  # the library's choice for this call
            # qkv's dtype, not the input's: under autocast a float32 block's projection is bf16.
            step = choice.for_call(query.device.index, qkv.dtype, self.head_dim, tokens,
                                   needs_grad=torch_op.needs_grad((qkv,)))
            if step is None:  # no step serves it: the block's own module does
                return self._original[0](query, key, value, need_weights=False)
            takes_strides = choice.takes_strides(step)
        qkv = qkv.view(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if not takes_strides:
            qkv = qkv.contiguous()  # [3, B, H, N, D]: one copy for q, k and v together
        # A step that takes views reads q, k, v as views of the projection [B, N, 3, H, D] and
        # writes O into [B, N, H, D] memory: the transpose below is then the out-projection's
        # input [B, N, E] with no copy.
        if self.attention_fn is not None:
            o = self.attention_fn(qkv[0], qkv[1], qkv[2])
        else:
            # A profiler range per call (scripts/vit_end_to_end.py finds the kernels by it); not
            # while torch.compile traces, where it would be one more thing to trace.
            with (contextlib.nullcontext() if torch.compiler.is_compiling() else
                  torch.profiler.record_function(RECORD_PREFIX + step)):
                o = attention(qkv[0], qkv[1], qkv[2], step=step)
        o = o.transpose(1, 2).reshape(batch, tokens, embed)
        return self.out_proj(o), None


def swappable_blocks(model):
    """(parent, attribute) of every nn.MultiheadAttention or StepSelfAttention that `model`
    holds as `self_attention` (torchvision's EncoderBlock)."""
    found = []
    for parent in model.modules():
        child = getattr(parent, "self_attention", None)
        if isinstance(child, (nn.MultiheadAttention, StepSelfAttention)):
            found.append((parent, "self_attention"))
    return found


def swap_attention(model, step=None, *, attention_fn=None, library=None):
    """Puts step `step` (or attention_fn; None: the step the library chooses for each call on its
    GPU, the block's own module where none serves it) into every encoder block of a torchvision
    ViT, in place; a block swapped before just changes step. Returns the number of blocks. Raises
    StepRefused when the step does not serve the blocks' head dim (other limits, such as the
    largest N, are judged at each call), ValueError when the model has no such block."""
    blocks = swappable_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no `self_attention` nn.MultiheadAttention "
                         "to swap (expected a torchvision VisionTransformer)")
    if step is None and attention_fn is None and torch.cuda.is_available():
        for device_index in range(torch.cuda.device_count()):  # before any torch.compile traces
            choice.prepare(device_index, library)
    elif attention_fn is None:
        # Judged from the step's listing, not attn_check: that also needs a GPU, and a model's
        # wiring is swapped (and tested) on machines without one.
        info = (library or load_library()).step(step)
        head_dims = {getattr(parent, name).head_dim for parent, name in blocks}
        unserved = sorted(head_dims - set(info.head_dims))
        if unserved:
            raise StepRefused(f"{step} does not serve head dim {unserved[0]} (it serves head "
                              f"dims {', '.join(map(str, info.head_dims))})", 2)
    for parent, name in blocks:
        current = getattr(parent, name)
        if isinstance(current, StepSelfAttention):
            current.use(step, attention_fn, library)
        else:
            setattr(parent, name, StepSelfAttention(current, step, attention_fn, library))
    return len(blocks)


def restore_attention(model):
    """Puts the original nn.MultiheadAttention back into every swapped block; returns how many."""
    restored = 0
    for parent, name in swappable_blocks(model):
        current = getattr(parent, name)
        if isinstance(current, StepSelfAttention):
            setattr(parent, name, current._original[0])
            restored += 1
    return restored
