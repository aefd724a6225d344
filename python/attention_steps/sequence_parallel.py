"""Attention over a sequence split across GPUs, on torch.distributed (NCCL), with the steps'
kernels inside: ring attention, and all-to-all over heads.

Each GPU holds some rows of Q, K and V ([B, H, n, D], its rows of a SequenceLayout: any N, tails
included; for causal attention, balanced). Two ways to get every query's attention over all keys:

  ring_attention          K and V travel around the ring of GPUs: at each of W turns a GPU
                          attends its queries to the block of keys it holds, sends that block to
                          the next GPU and receives the previous GPU's. Each turn gives a partial
                          O and L over some keys; merge_partials makes them one (below). The
                          backward goes round the ring again with the merged O and L, and the dK
                          and dV of each block travel with it until they reach their owner.
  all_to_all_attention    (Ulysses) one all-to-all turns "my rows, all heads" into "all rows, my
                          heads" (H divisible by W), each GPU runs one plain call over the whole
                          sequence for its heads, and a second all-to-all turns the output back.

Merging. Attention over keys split into disjoint sets, from attention over each set i (its output
O_i and each row's log-sum-exp L_i, which the steps return): L = log sum_i e^{L_i} and
O = sum_i e^{L_i - L} O_i, in fp32. A row that sees no key of set i has L_i = -inf and weight 0;
a row that sees no key at all gets O = 0 and L = -inf, never NaN.

Why not PyTorch's context parallelism: torch.distributed.tensor.experimental.context_parallel
routes only aten's own SDPA kernels (flash, efficient, cuDNN) to its ring; its generic ring
(_templated_ring_attention) is private, gathers all K/V at once by default, and takes neither a
key-padding mask nor a causal block of two different lengths. This module is the ring written
out, with the operator's forward and backward as its attention op.

    layout = SequenceLayout(tokens=16385, world_size=dist.get_world_size(), balanced=True)
    q, k, v = (split_sequence(t, layout, dist.get_rank()) for t in (q_full, k_full, v_full))
    o = ring_attention(q, k, v, layout, causal=True)   # this GPU's rows of O; autograd works
"""
import torch
import torch.distributed as dist

from . import choice, torch_op
from .sequence_layout import SequenceLayout, block_calls

__all__ = ["SequenceLayout", "split_sequence", "merge_partials", "ring_attention",
           "all_to_all_attention"]


def split_sequence(x, layout, rank, dim=2):
    """GPU `rank`'s rows of a whole-sequence tensor x (its chunks along `dim`, in order)."""
    if x.shape[dim] != layout.tokens:
        raise ValueError(f"x has {x.shape[dim]} rows along dim {dim}; the layout {layout.tokens}")
    return torch.cat([x.narrow(dim, start, stop - start) for start, stop in layout.chunks(rank)],
                     dim=dim)


def merge_partials(outputs, log_sum_exps):
    """(O, L) of attention over the union of disjoint key sets, from (O_i, L_i) over each: O_i
    [B, H, N, D], L_i fp32 [B, H, N]. Returns O in fp32 and L; rows no set has a key for get
    O = 0 and L = -inf."""
    merged = _Merged(outputs[0])
    for o, l in zip(outputs, log_sum_exps):
        merged.add(slice(None), o, l.float())
    return merged.o, merged.lse


class _Merged:
    """O (fp32) and L of a GPU's queries, merged block by block (as the ring turns). Two passes
    over O per partial result (scale what is there, add the new part scaled): the weights are
    computed on L, which is D times smaller."""

    def __init__(self, q):
        self.o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        self.lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)

    def add(self, rows, o_part, lse_part):
        lse_old = self.lse[:, :, rows]
        lse_new = torch.logaddexp(lse_old, lse_part)  # -inf where both are
        base = torch.where(torch.isfinite(lse_new), lse_new, torch.zeros_like(lse_new))
        o = self.o[:, :, rows]  # a view: the updates below land in self.o
        o.mul_((lse_old - base).exp().unsqueeze(-1))
        o.addcmul_(o_part, (lse_part - base).exp().unsqueeze(-1))
        lse_old.copy_(lse_new)


def _chosen_step(q, backward, causal, masked, cross):
    step, why = choice.serving(q.device.index, q.dtype, q.shape[-1], backward=backward,
                               causal=causal, masked=masked, cross=cross)
    if step is None:
        raise NotImplementedError(f"no {'backward ' if backward else ''}step serves a block of "
                                  f"this sequence-parallel call here: {why}")
    return step


def _turn_calls(q, block, layout, rank, source, causal, backward):
    """The calls of one ring turn (block_calls), each as (query rows, key rows, causal alignment,
    the keys' padding mask or None, the step that serves it), rows as slices."""
    masked = len(block) == 3
    for (q0, q1), (k0, k1), alignment in block_calls(layout, rank, source, causal):
        step = _chosen_step(q, backward, alignment, masked, q1 - q0 != k1 - k0)
        yield (slice(q0, q1), slice(k0, k1), alignment,
               block[2][:, k0:k1].contiguous() if masked else None, step)


def _own_block(k, v, mask):
    """This GPU's K, V (and key-padding mask), contiguous, as they travel around the ring."""
    return [k.contiguous(), v.contiguous()] + ([mask.contiguous()] if mask is not None else [])


def _peers(group):
    """(this GPU's rank in the group, the next GPU's global rank, the previous GPU's)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    return (rank, dist.get_global_rank(group, (rank + 1) % size),
            dist.get_global_rank(group, (rank - 1) % size))


def _pass_on(tensors, shapes, group, next_rank, previous_rank):
    """Sends `tensors` to the next GPU and receives tensors of `shapes` (dtype and device of
    the sent ones) from the previous one; returns (works, received). The received ones are
    ready once every work has been waited on (NCCL: the current stream waits; the host not)."""
    received = [torch.empty(shape, dtype=t.dtype, device=t.device) for t, shape in zip(tensors, shapes)]
    ops = [dist.P2POp(dist.isend, t, next_rank, group) for t in tensors] + \
          [dist.P2POp(dist.irecv, t, previous_rank, group) for t in received]
    return dist.batch_isend_irecv(ops), received


def _block_shapes(like, layout, owner, mask):
    """Shapes of K, V (and the mask) of the block GPU `owner` holds."""
    rows = layout.local_tokens(owner)
    shape = (*like.shape[:2], rows, like.shape[3])
    return [shape, shape] + ([(mask.shape[0], rows)] if mask is not None else [])


def _ring_forward(q, k, v, mask, layout, group, causal, scale):
    rank, next_rank, previous_rank = _peers(group)
    size = layout.world_size
    operator = torch.ops.attention_steps.attention
    merged = _Merged(q)
    block = _own_block(k, v, mask)
    for turn in range(size):
        source = (rank - turn) % size
        if turn + 1 < size:  # the next block travels while this one is attended to
            works, arriving = _pass_on(block, _block_shapes(k, layout, (source - 1) % size, mask),
                                       group, next_rank, previous_rank)
        keys, values = block[0], block[1]
        for q_rows, k_rows, alignment, part_mask, step in _turn_calls(q, block, layout, rank, source,
                                                                      causal, False):
            o_part, lse_part = operator(q[:, :, q_rows], keys[:, :, k_rows], values[:, :, k_rows],
                                        step, scale, part_mask, True, alignment)
            merged.add(q_rows, o_part, lse_part)
        if turn + 1 < size:
            for work in works:
                work.wait()
            block = arriving
    return merged.o.to(q.dtype), merged.lse


def _ring_backward(d_o, q, k, v, o, lse, mask, layout, group, causal, scale, deterministic):
    rank, next_rank, previous_rank = _peers(group)
    size = layout.world_size
    operator = torch.ops.attention_steps.attention_backward
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    block = _own_block(k, v, mask)
    grads = [torch.zeros(k.shape, dtype=torch.float32, device=k.device) for _ in range(2)]
    grad_works = []
    for turn in range(size):
        source = (rank - turn) % size
        following = (source - 1) % size
        if turn + 1 < size:
            works, arriving = _pass_on(block, _block_shapes(k, layout, following, mask), group,
                                       next_rank, previous_rank)
        keys, values = block[0], block[1]
        parts = []
        for q_rows, k_rows, alignment, part_mask, step in _turn_calls(q, block, layout, rank, source,
                                                                      causal, True):
            dq_part, dk_part, dv_part = operator(
                d_o[:, :, q_rows], q[:, :, q_rows], keys[:, :, k_rows], values[:, :, k_rows],
                o[:, :, q_rows], lse[:, :, q_rows].contiguous(), step, scale, deterministic,
                alignment, part_mask)
            dq[:, :, q_rows] += dq_part
            parts.append((k_rows, dk_part, dv_part))
        # `grads` holds what the GPUs before this one added to this block's dK and dV (it
        # arrived while the calls above ran: the stream waits for it, the host does not); this
        # GPU adds its part and passes them on with the block. After the last turn they reach
        # the block's owner, and this GPU receives its own block's.
        for work in grad_works:
            work.wait()
        for k_rows, dk_part, dv_part in parts:
            grads[0][:, :, k_rows] += dk_part
            grads[1][:, :, k_rows] += dv_part
        if size == 1:
            break  # (torch.distributed sends nothing to itself)
        if turn + 1 == size:  # the last hop, whose wait nothing hides: the owner only rounds them
            grads = [grads[0].to(k.dtype), grads[1].to(v.dtype)]  # to k's type, so send that
        grad_works, grads = _pass_on(grads, _block_shapes(k, layout, following, None), group,
                                     next_rank, previous_rank)
        if turn + 1 < size:
            for work in works:
                work.wait()
            block = arriving
    for work in grad_works:
        work.wait()
    return dq.to(q.dtype), grads[0].to(k.dtype), grads[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, layout, group, causal, scale, deterministic):
        o, lse = _ring_forward(q, k, v, mask, layout, group, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse, mask)
        ctx.settings = (layout, group, causal, scale, deterministic)
        return o

    @staticmethod
    def backward(ctx, d_o):
        q, k, v, o, lse, mask = ctx.saved_tensors
        dq, dk, dv = _ring_backward(d_o, q, k, v, o, lse, mask, *ctx.settings)
        return dq, dk, dv, None, None, None, None, None, None


def _checked(q, k, v, layout, group, key_padding_mask, scale):
    """The group, and the scale, after the checks every entry makes before anything is sent."""
    group = group or dist.group.WORLD
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if size != layout.world_size:
        raise ValueError(f"the layout is for {layout.world_size} GPUs; the group has {size}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4 or not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor [B, H, n, D]; got {tuple(t.shape)} on {t.device}")
        if t.dtype not in (torch.float16, torch.bfloat16) or t.dtype != q.dtype:
            raise TypeError(f"q, k and v must be float16 or bfloat16 alike; {name} is {t.dtype}")
    rows = layout.local_tokens(rank)
    if q.shape != k.shape or k.shape != v.shape or q.shape[2] != rows:
        raise ValueError(f"q, k and v must all be [B, H, {rows}, D], this GPU's {rows} rows of "
                         f"{layout}; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if key_padding_mask is not None and (key_padding_mask.dtype != torch.bool or
                                         tuple(key_padding_mask.shape) != (q.shape[0], rows) or
                                         key_padding_mask.device != q.device):
        raise ValueError(f"key_padding_mask must be bool [B, n] = [{q.shape[0]}, {rows}] on "
                         f"{q.device} (True where a key is padding); got {key_padding_mask.dtype} "
                         f"{tuple(key_padding_mask.shape)} on {key_padding_mask.device}")
    torch_op.load()  # ImportError saying how to build the operator
    return group, q.shape[-1] ** -0.5 if scale is None else float(scale)


def ring_attention(q, k, v, layout, group=None, *, causal=False, key_padding_mask=None,
                   scale=None, deterministic=None):
    """This GPU's rows of O = softmax(scale Q K^T) V over the whole sequence, by ring attention.
    q, k, v: CUDA float16 or bfloat16 [B, H, n, D], this GPU's n rows of `layout` (for causal,
    a balanced layout keeps the GPUs' work even). causal: query i sees keys j <= i of the whole
    sequence (PyTorch's is_causal). key_padding_mask: bool [B, n], True where this GPU's key is
    padding. deterministic (default: torch.are_deterministic_algorithms_enabled()) asks the
    backward step for the same bits on every run; the ring adds in a fixed order. Every GPU of
    `group` (default: the world) calls it with its own rows. Autograd: dQ, dK, dV of this GPU's
    rows."""
    group, scale = _checked(q, k, v, layout, group, key_padding_mask, scale)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    return _RingAttention.apply(q, k, v, key_padding_mask, layout, group, bool(causal), scale,
                                bool(deterministic))


def _rows_by_chunk(pieces, layout):
    """The whole sequence from each GPU's rows (pieces[j]: GPU j's, along dim 2), in order."""
    chunks = {}
    for rank, piece in enumerate(pieces):
        for (local0, local1, start, _), chunk in zip(layout.local_offsets(rank), layout.chunk_ids(rank)):
            chunks[chunk] = piece[:, :, local0:local1]
    return torch.cat([chunks[c] for c in sorted(chunks)], dim=2)


class _Regroup(torch.autograd.Function):
    """to_heads: [B, H, n_rank, D] (this GPU's rows, every head) -> [B, H / W, N, D] (every row,
    this GPU's heads); otherwise the way back. Each direction's backward is the other."""

    @staticmethod
    def forward(ctx, x, layout, group, to_heads):
        ctx.settings = (layout, group, to_heads)
        return (_sequence_to_heads if to_heads else _heads_to_sequence)(x, layout, group)

    @staticmethod
    def backward(ctx, grad):
        layout, group, to_heads = ctx.settings
        back = _heads_to_sequence if to_heads else _sequence_to_heads
        return back(grad, layout, group), None, None, None


def _sequence_to_heads(x, layout, group):
    size = layout.world_size
    heads = x.shape[1] // size
    sent = [x[:, j * heads:(j + 1) * heads].contiguous() for j in range(size)]
    received = [x.new_empty((x.shape[0], heads, layout.local_tokens(j), x.shape[3])) for j in range(size)]
    dist.all_to_all(received, sent, group=group)
    return _rows_by_chunk(received, layout)


def _heads_to_sequence(x, layout, group):
    size, rank = layout.world_size, dist.get_rank(group)
    sent = [torch.cat([x[:, :, start:stop] for start, stop in layout.chunks(j)], dim=2).contiguous()
            for j in range(size)]
    received = [x.new_empty((x.shape[0], x.shape[1], layout.local_tokens(rank), x.shape[3]))
                for _ in range(size)]
    dist.all_to_all(received, sent, group=group)
    return torch.cat(received, dim=1)


def _whole_mask(mask, layout, group):
    """Every GPU's key-padding mask rows, gathered into the whole sequence's [B, N]."""
    longest = max(layout.local_tokens(j) for j in range(layout.world_size))
    padded = torch.zeros((mask.shape[0], longest), dtype=torch.uint8, device=mask.device)
    padded[:, :mask.shape[1]] = mask
    gathered = [torch.empty_like(padded) for _ in range(layout.world_size)]
    dist.all_gather(gathered, padded, group=group)
    pieces = [g[:, :layout.local_tokens(j)].unsqueeze(1).unsqueeze(-1) for j, g in enumerate(gathered)]
    return _rows_by_chunk(pieces, layout)[:, 0, :, 0].bool()


def all_to_all_attention(q, k, v, layout, group=None, *, causal=False, key_padding_mask=None,
                         scale=None):
    """ring_attention's result by all-to-all over heads (Ulysses): the heads H must divide among
    the group's W GPUs (ValueError otherwise). Each GPU runs one call of the step the library
    chooses over the whole sequence for H / W heads, with autograd through the operator."""
    group, scale = _checked(q, k, v, layout, group, key_padding_mask, scale)
    size = layout.world_size
    if q.shape[1] % size:
        raise ValueError(f"all-to-all attention splits the {q.shape[1]} heads among {size} GPUs: "
                         "the heads must be a multiple of the GPU count (ring_attention has no "
                         "such limit)")
    mask = _whole_mask(key_padding_mask, layout, group) if key_padding_mask is not None else None
    q_heads, k_heads, v_heads = (_Regroup.apply(t, layout, group, True) for t in (q, k, v))
    alignment = "top-left" if causal else None
    step = _chosen_step(q_heads, False, alignment, mask is not None, False)
    o_heads = torch.ops.attention_steps.attention(
        q_heads, k_heads, v_heads, step, scale, mask, torch_op.needs_grad((q, k, v)), alignment)[0]
    return _Regroup.apply(o_heads, layout, group, False)
