"""The steps on PyTorch tensors, and inside torchvision's Vision Transformers.

attention(q, k, v, step) runs a step on CUDA fp16 tensors [B, H, N, D] (contiguous), on the
current stream of their device, into a fresh tensor: O = softmax(Q K^T / sqrt(D)) V, what
torch.nn.functional.scaled_dot_product_attention(q, k, v) computes.

swap_attention(model, step) replaces the self-attention of every encoder block of a
torchvision VisionTransformer (vit_b_16, vit_b_32, vit_l_16, vit_h_14, any image size) with
StepSelfAttention: the block's own in-projection weights, the step's kernel on [B, H, N, D],
and the block's own out-projection, so the model computes what it computed before.
restore_attention(model) puts the original modules back.

There is no backward: run under torch.inference_mode() or torch.no_grad().
"""
import torch
import torch.nn.functional as F
from torch import nn

from ._capi import StepRefused, load_library

RECORD_PREFIX = "attention_steps::"  # profiler ranges around each kernel call: attention_steps::v6


def _check_inputs(q, k, v, views=False):
    """Raises for tensors a step cannot take. With views=True (a step that takes strides),
    q, k and v may be views with one set of strides whose rows of D values are contiguous."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(tensor).__name__}")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions [B, H, N, D]; it has shape "
                             f"{tuple(tensor.shape)}")
    if not q.shape == k.shape == v.shape:
        raise ValueError("q, k and v must have the same shape [B, H, N, D]; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.dtype != torch.float16:
            raise TypeError(f"{name} is {tensor.dtype}; the steps take torch.float16 only "
                            "(call .half())")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if views:
            if tensor.stride(-1) != 1 or tensor.stride()[:3] != q.stride()[:3]:
                raise ValueError(f"{name} (strides {tensor.stride()}): the step takes views whose "
                                 "rows of D values are contiguous, one set of strides for q, k "
                                 "and v")
        elif not tensor.is_contiguous():
            raise ValueError(f"{name} is not contiguous (strides {tensor.stride()} for shape "
                             f"{tuple(tensor.shape)}); the steps read [B, H, N, D] row-major: "
                             "call .contiguous()")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.device.type != "cuda":
            raise ValueError(f"{name} is on {tensor.device}; the steps run on CUDA tensors")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k and v must be on one device; got {q.device}, {k.device}, "
                         f"{v.device}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError("the steps have no backward: run under torch.inference_mode() or "
                           "torch.no_grad(), or detach the inputs")


def attention(q, k, v, step="v6", *, out=None, library=None):
    """O = softmax(Q K^T / sqrt(D)) V by step `step`, for CUDA fp16 [B, H, N, D] tensors q, k, v
    of one shape; O is `out` or a new tensor like q. Contiguous tensors for every step; views
    (rows of D contiguous, one set of strides for q, k and v; `out` a view too) for a step that
    takes strides (v7, v8), read and written in place without a copy. Queued on the current
    stream of their device; raises StepRefused (with the library's reason) for a shape the step
    does not serve on this GPU, CudaError for a CUDA failure, TypeError/ValueError for bad
    tensors."""
    library = library or load_library()
    info = library.step(step)
    _check_inputs(q, k, v, views=info.takes_strides)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    elif (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or
          (not out.is_contiguous() and not (info.takes_strides and out.stride(-1) == 1))):
        raise ValueError(f"out must be a {tuple(q.shape)} {q.dtype} tensor on {q.device}, "
                         f"contiguous{' or a view with rows of D contiguous' if info.takes_strides else ''}")
    strided = not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous() and
                   out.is_contiguous())
    with torch.cuda.device(q.device):  # the library runs on the current device
        stream = torch.cuda.current_stream(q.device).cuda_stream
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
        if strided:
            library.run(step, *pointers, tuple(q.shape), stream, qkv_strides=q.stride()[:3],
                        o_strides=out.stride()[:3])
            return out
        workspace_bytes = 0
        if info.uses_workspace:
            workspace_bytes = library.workspace_bytes(step, tuple(q.shape))
        if workspace_bytes > 0:
            # From torch's caching allocator: stream-ordered like the tensors themselves.
            workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device)
            library.run(step, *pointers, tuple(q.shape), stream, workspace.data_ptr(),
                        workspace_bytes)
        else:
            library.run(step, *pointers, tuple(q.shape), stream)
    return out


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

    def __init__(self, mha, step="v6", attention_fn=None, library=None):
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
        self.step = step
        self.attention_fn = attention_fn
        self.library = library
        self._original = (mha,)  # a tuple: kept out of the module tree and the state_dict

    def extra_repr(self):
        kernel = getattr(self.attention_fn, "__name__", "attention_fn") if self.attention_fn \
            else f"step={self.step}"
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
        qkv = qkv.view(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.attention_fn is None and (self.library or load_library()).step(self.step).takes_strides:
            # No layout copies: the step reads q, k, v as views of the projection [B, N, 3, H, D]
            # and writes O as [B, N, H, D], which is the out-projection's input [B, N, E].
            o = torch.empty(batch, tokens, self.num_heads, self.head_dim, dtype=qkv.dtype,
                            device=qkv.device)
            with torch.profiler.record_function(RECORD_PREFIX + self.step):
                attention(qkv[0], qkv[1], qkv[2], step=self.step, out=o.transpose(1, 2),
                          library=self.library)
            return self.out_proj(o.view(batch, tokens, embed)), None
        qkv = qkv.contiguous()  # [3, B, H, N, D]: q, k, v contiguous
        if self.attention_fn is not None:
            o = self.attention_fn(qkv[0], qkv[1], qkv[2])
        else:
            with torch.profiler.record_function(RECORD_PREFIX + self.step):
                o = attention(qkv[0], qkv[1], qkv[2], step=self.step, library=self.library)
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


def swap_attention(model, step="v6", *, attention_fn=None, library=None):
    """Puts step `step` (or attention_fn) into every encoder block of a torchvision ViT, in
    place; a block swapped before just changes step. Returns the number of blocks. Raises
    StepRefused when the step does not serve the blocks' head dim (other limits, such as the
    largest N, are judged at each call), ValueError when the model has no such block."""
    blocks = swappable_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no `self_attention` nn.MultiheadAttention "
                         "to swap (expected a torchvision VisionTransformer)")
    if attention_fn is None:
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
            current.step, current.attention_fn, current.library = step, attention_fn, library
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
