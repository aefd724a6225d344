"""Any nn.MultiheadAttention with a step's kernel inside: self-attention and cross-attention,
sequence-first or batch-first, with a key-padding mask.

swap_multihead_attention(model, step) replaces every nn.MultiheadAttention of `model` with
StepMultiheadAttention, which keeps the module's own projections and runs

    q = query W_q^T + b_q,  k = key W_k^T + b_k,  v = value W_v^T + b_v     (the module's weights)
    o = step(q, k, v, key_padding_mask)        [B, H, N_q, D] against N_k keys
    y = o W_out^T + b_out

so a DETR decoder's cross-attention (100 queries against the 1050 positions of an image, keys
and values from the encoder's memory, with positional embeddings added to queries and keys but
not values) runs through the same kernel as a ViT's self-attention. A call the step cannot take
goes to the original module, unchanged: attention weights asked for (need_weights=True), an
attn_mask or is_causal, dropout while training, bias_k/bias_v or add_zero_attn, a dtype other
than float16 and bfloat16, a head dim the step does not serve. These are decided from the
module and the call's arguments alone, never from tensor values, so torch.compile traces the
swapped module whole and a CUDA graph captures it.

A row whose keys are all padding gets O = 0 from the steps (the library's definition), where
PyTorch's module gives NaN; no model here pads every key of an image.
restore_multihead_attention(model) puts the original modules back.
"""
import torch
import torch.nn.functional as F
from torch import nn

from . import torch_op
from ._capi import load_library

_attention_op = torch_op.load_if_built()


class StepMultiheadAttention(nn.Module):
    """nn.MultiheadAttention's forward with the step's kernel between the module's own in- and
    out-projections (the same Parameter objects). `attention_fn(q, k, v, key_padding_mask)`
    replaces the library call, to test the wiring without a GPU."""

    def __init__(self, mha, step="v8", attention_fn=None, library=None):
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
        served = attention_fn is not None or \
            mha.head_dim in (library or load_library()).step(step).head_dims
        self.always_original = (mha.bias_k is not None or mha.bias_v is not None or
                                mha.add_zero_attn or not served)

    def extra_repr(self):
        kernel = "attention_fn" if self.attention_fn else f"step={self.step}"
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, {kernel}"

    def _projections(self):
        mha = self._original[0]
        if mha._qkv_same_embed_dim:
            weights = mha.in_proj_weight.chunk(3)
        else:
            weights = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
        biases = mha.in_proj_bias.chunk(3) if mha.in_proj_bias is not None else (None,) * 3
        return weights, biases

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        mha = self._original[0]
        if (self.always_original or need_weights or attn_mask is not None or is_causal or
                (self.training and mha.dropout > 0) or query.dim() != 3 or
                (self.attention_fn is None and query.dtype not in (torch.float16, torch.bfloat16))):
            return mha(query, key, value, key_padding_mask=key_padding_mask,
                       need_weights=need_weights, attn_mask=attn_mask,
                       average_attn_weights=average_attn_weights, is_causal=is_causal)
        if not self.batch_first:  # [N, B, E] -> [B, N, E]
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        batch, queries, _ = query.shape
        keys = key.shape[1]
        (w_q, w_k, w_v), (b_q, b_k, b_v) = self._projections()
        heads, head_dim = self.num_heads, self.head_dim
        q = F.linear(query, w_q, b_q).view(batch, queries, heads, head_dim).transpose(1, 2)
        k = F.linear(key, w_k, b_k).view(batch, keys, heads, head_dim).transpose(1, 2)
        v = F.linear(value, w_v, b_v).view(batch, keys, heads, head_dim).transpose(1, 2)
        if key_padding_mask is not None and key_padding_mask.dtype != torch.bool:
            key_padding_mask = key_padding_mask.to(torch.bool)  # a float mask: nonzero is padding
        if self.attention_fn is not None:
            o = self.attention_fn(q, k, v, key_padding_mask)
        else:
            operator = _attention_op if _attention_op is not None else torch_op.load()
            o = operator(q, k, v, self.step, None, key_padding_mask,
                         torch_op.needs_grad((q, k, v)))[0]
        o = o.transpose(1, 2).reshape(batch, queries, self.embed_dim)
        out = mha.out_proj(o)
        return (out if self.batch_first else out.transpose(0, 1)), None


def swap_multihead_attention(model, step="v8", *, attention_fn=None, library=None):
    """Replaces every nn.MultiheadAttention inside `model` with StepMultiheadAttention running
    `step` (or attention_fn), in place; returns how many."""
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
