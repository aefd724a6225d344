"""Any nn.MultiheadAttention with a step's kernel inside: self-attention and cross-attention,
sequence-first or batch-first, with a key-padding mask.

swap_multihead_attention(model) replaces every nn.MultiheadAttention of `model` with
StepMultiheadAttention, which runs the step the library chooses for each call on its GPU (v8 on
an H100, v6 on other GPUs from sm_80; `step="v6"` names one instead), keeps the module's own
projections and runs

    q = query W_q^T + b_q,  k = key W_k^T + b_k,  v = value W_v^T + b_v     (the module's weights)
    o = step(q, k, v, key_padding_mask)        [B, H, N_q, D] against N_k keys
    y = o W_out^T + b_out

so a DETR decoder's cross-attention (100 queries against the 1050 positions of an image, keys
and values from the encoder's memory, with positional embeddings added to queries and keys but
not values) runs through the same kernel as a ViT's self-attention.

No copy is made on the way. The projections are computed in the layout the module's inputs come
in ([B, N, E] batch-first, [N, B, E] sequence-first), as one GEMM when query, key and value are
one tensor (a ViT's self-attention), and q, k and v are [B, H, N, D] views of them. A step that
takes views (v7, v8) reads them where they lie and writes O in the order of q's batch and token
dimensions (the operator's rule), so the out-projection reads O in place too; for any other step
the operator makes the contiguous copies. Where attention is a small share of a model's time,
these copies are what decides whether the swap pays (chapter 13). The views share their strides
when q, k and v come from one packed projection, or are sequence-first, or are batch-first with
as many keys as queries; batch-first cross-attention gets the operator's copies.

A call the step cannot take goes to the original module, unchanged: attention weights asked for
(need_weights=True), an attn_mask or is_causal, a float key_padding_mask (PyTorch adds it to the
scores; the steps take padding, not a bias), dropout while training, bias_k/bias_v or
add_zero_attn, a dtype other than float16 and bfloat16, a head dim the step does not serve, and,
where the step is chosen per call, a call no step serves (with its gradient when one is needed). These
are decided from the module and the call's arguments alone, never from tensor values, so
torch.compile traces the swapped module whole and a CUDA graph captures it.

A row whose keys are all padding gets O = 0 from the steps (the library's definition), where
PyTorch's module gives NaN; no model here pads every key of an image.
restore_multihead_attention(model) puts the original modules back.
"""
import torch
import torch.nn.functional as F
from torch import nn

from . import choice, torch_op
from ._capi import load_library

_attention_op = torch_op.load_if_built()

# [B, N, H, D] (batch-first) or [N, B, H, D] (sequence-first) to [B, H, N, D], and back.
_TO_HEADS = {True: (0, 2, 1, 3), False: (1, 2, 0, 3)}
_FROM_HEADS = {True: (0, 2, 1, 3), False: (2, 0, 1, 3)}


class StepMultiheadAttention(nn.Module):
    """nn.MultiheadAttention's forward with the step's kernel between the module's own in- and
    out-projections (the same Parameter objects). `attention_fn(q, k, v, key_padding_mask)`
    replaces the library call, to test the wiring without a GPU. step=None: the step the library
    chooses for each call (attention_steps.choice), the module's own forward where none serves it."""

    def __init__(self, mha, step=None, attention_fn=None, library=None):
        super().__init__()
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"expected nn.MultiheadAttention, got {type(mha).__name__}")
        # The module's own parameters, under their names: the state_dict is the module's.
        for name in ("in_proj_weight", "in_proj_bias", "q_proj_weight", "k_proj_weight",
                     "v_proj_weight"):
            if getattr(mha, name, None) is not None:
                setattr(self, name, getattr(mha, name))
        self.out_proj = mha.out_proj
        self._original = (mha,)  # a tuple: kept out of the module tree; it shares the parameters
        self.embed_dim, self.num_heads, self.head_dim = mha.embed_dim, mha.num_heads, mha.head_dim
        self.kdim, self.vdim = mha.kdim, mha.vdim
        self.batch_first = mha.batch_first
        self.step, self.attention_fn = step, attention_fn
        # Calls this module always hands to the original: known now, from the module alone.
        served = attention_fn is not None or step is None or \
            mha.head_dim in (library or load_library()).step(step).head_dims
        self.always_original = (mha.bias_k is not None or mha.bias_v is not None or
                                mha.add_zero_attn or not served)

    def extra_repr(self):
        kernel = "attention_fn" if self.attention_fn else f"step={self.step or 'chosen per call'}"
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, {kernel}"

    def _project(self, query, key, value):
        """q, k and v as [B, N, H, D] or [N, B, H, D] views of the projections (the input's
        layout): one GEMM for all three when query, key and value are one tensor and the module
        packs its weights, as PyTorch's own module does then; one GEMM each otherwise."""
        mha = self._original[0]
        split = (self.num_heads, self.head_dim)
        if mha._qkv_same_embed_dim and query is key and key is value:
            packed = F.linear(query, mha.in_proj_weight, mha.in_proj_bias)
            return packed.unflatten(-1, (3,) + split).unbind(-3)
        if mha._qkv_same_embed_dim:
            weights = mha.in_proj_weight.chunk(3)
        else:
            weights = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
        biases = mha.in_proj_bias.chunk(3) if mha.in_proj_bias is not None else (None,) * 3
        return tuple(F.linear(x, w, b).unflatten(-1, split)
                     for x, w, b in zip((query, key, value), weights, biases))

    def _original_forward(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                          average_attn_weights, is_causal):
        return self._original[0](query, key, value, key_padding_mask=key_padding_mask,
                                 need_weights=need_weights, attn_mask=attn_mask,
                                 average_attn_weights=average_attn_weights, is_causal=is_causal)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        mha = self._original[0]
        if (self.always_original or need_weights or attn_mask is not None or is_causal or
                (key_padding_mask is not None and key_padding_mask.dtype != torch.bool) or
                (self.training and mha.dropout > 0) or query.dim() != 3 or
                (self.attention_fn is None and
                 choice.projected_dtype(query) not in (torch.float16, torch.bfloat16))):
            return self._original_forward(query, key, value, key_padding_mask, need_weights,
                                          attn_mask, average_attn_weights, is_causal)
        q, k, v = (t.permute(_TO_HEADS[self.batch_first]) for t in self._project(query, key, value))
        step = self.step
        if step is None and self.attention_fn is None:  # the library's choice for this call
            step = choice.for_call(q.device.index, q.dtype, self.head_dim, q.shape[2],
                                   kv_tokens=k.shape[2], masked=key_padding_mask is not None,
                                   needs_grad=torch_op.needs_grad((q, k, v)))
            if step is None:
                return self._original_forward(query, key, value, key_padding_mask, need_weights,
                                              attn_mask, average_attn_weights, is_causal)
        if self.attention_fn is not None:
            o = self.attention_fn(q, k, v, key_padding_mask)
        else:
            operator = _attention_op if _attention_op is not None else torch_op.load()
            o = operator(q, k, v, step, None, key_padding_mask,
                         torch_op.needs_grad((q, k, v)))[0]
        # Back to the input's layout, [B, N, E] or [N, B, E]: a view where O was written so.
        o = o.permute(_FROM_HEADS[self.batch_first]).flatten(-2)
        return mha.out_proj(o), None


def swap_multihead_attention(model, step=None, *, attention_fn=None, library=None):
    """Replaces every nn.MultiheadAttention inside `model` with StepMultiheadAttention running
    `step` (or attention_fn; None: the step the library chooses for each call on its GPU), in
    place; returns how many."""
    if step is None and attention_fn is None and torch.cuda.is_available():
        for device_index in range(torch.cuda.device_count()):  # before any torch.compile traces
            choice.prepare(device_index, library)
    found = [(parent, name, child) for parent in model.modules()
             for name, child in parent.named_children() if isinstance(child, nn.MultiheadAttention)]
    for parent, name, child in found:
        replacement = StepMultiheadAttention(child, step, attention_fn, library)
        replacement.train(child.training)  # eval stays eval: no dropout, so the step serves it
        setattr(parent, name, replacement)
    return len(found)


def restore_multihead_attention(model):
    """Puts the original modules back; returns how many."""
    found = [(parent, name, child) for parent in model.modules()
             for name, child in parent.named_children() if isinstance(child, StepMultiheadAttention)]
    for parent, name, child in found:
        setattr(parent, name, child._original[0])
    return len(found)
