"""Which step serves a call on a GPU, for every Python layer: the SDPA entry (sdpa.py) and the
module swaps (torch_bridge.py, mha.py) when no step is named.

The answer is the C ABI's (attn_choose_step: the highest-numbered forward step that writes L, or
backward step, that serves the call there), asked once per kind of call and GPU and kept in a
table: the kind is the direction, dtype, head dim, causal alignment, whether keys are padded and
whether there are as many keys as queries. A call's own N is judged against the chosen step's
largest N (`max_tokens`). Lookups make no library call once a GPU's table is made, so
torch.compile traces them; `prepare(device_index)` makes it, and is called before any tracing
(use_steps, the swaps).
"""
import itertools

import torch

from ._capi import CAUSAL_ALIGNMENTS, StepRefused, load_library

DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_tables = {}  # device index -> {(backward, dtype, head_dim, causal, masked, cross): step or reason}
_max_tokens = {}  # (step, head_dim) -> largest N the step serves there, None for any
_takes_strides = {}  # step -> whether it reads q, k, v as views (and writes O as one)


def prepare(device_index, library=None):
    """Makes the table of GPU `device_index` (once): attn_choose_step for every kind of call at
    every head dim some step registers."""
    if device_index in _tables:
        return
    library = library or load_library()
    steps = library.steps()
    _takes_strides.update((info.id, info.takes_strides) for info in steps)
    head_dims = sorted({d for info in steps if not info.is_baseline for d in info.head_dims})
    table = {}
    with torch.cuda.device(device_index):
        for backward, dtype, head_dim, causal, masked, cross in itertools.product(
                (False, True), DTYPES.values(), head_dims, CAUSAL_ALIGNMENTS, (False, True),
                (False, True)):
            try:
                step = library.choose_step((1, 1, 1, head_dim), backward=backward,
                                           kv_tokens=2 if cross else None, dtype=dtype,
                                           key_padding_mask=masked, causal=causal)
            except StepRefused as refused:
                table[backward, dtype, head_dim, causal, masked, cross] = refused
                continue
            table[backward, dtype, head_dim, causal, masked, cross] = step
            if (step, head_dim) not in _max_tokens:
                _max_tokens[step, head_dim] = library.max_tokens(step, head_dim)
    _tables[device_index] = table


def prepared(device_index):
    return device_index in _tables


def serving(device_index, dtype, head_dim, *, backward=False, causal=None, masked=False,
            cross=False):
    """(step, None) for the step that serves such a call on GPU `device_index`, or (None, why
    not): the library's reasons, or that no step serves the dtype or head dim at all."""
    prepare(device_index)
    if dtype not in DTYPES:
        return None, f"no step takes {dtype}"
    chosen = _tables[device_index].get((backward, DTYPES[dtype], head_dim, causal, masked, cross))
    if chosen is None:
        return None, f"no step registers head dim {head_dim}"
    if isinstance(chosen, StepRefused):
        return None, str(chosen)
    return chosen, None


def max_tokens(step, head_dim):
    """The largest N `step` serves at `head_dim` (None: any), for a step a table chose."""
    return _max_tokens.get((step, head_dim))


def takes_strides(step):
    """Whether `step` (one a table lists) reads q, k and v as views and writes O as one."""
    return _takes_strides[step]


def projected_dtype(x):
    """The dtype in which a projection of x reaches attention: CUDA autocast's lower precision
    where it is on and x is a float32 CUDA tensor (a Linear under autocast returns that), else
    x's own. A float32 model trained under autocast hands its blocks float32 activations, but
    their attention runs in bf16 or fp16, which the steps take."""
    if x.is_cuda and x.dtype == torch.float32 and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return x.dtype


def for_call(device_index, dtype, head_dim, tokens, *, kv_tokens=None, masked=False, causal=None,
             needs_grad=False):
    """The step that serves one call (its forward, and its backward when `needs_grad`), or None:
    for a module that hands what no step serves to PyTorch's own."""
    cross = kv_tokens is not None and kv_tokens != tokens
    step, _ = serving(device_index, dtype, head_dim, causal=causal, masked=masked, cross=cross)
    if step is None or needs_grad and serving(device_index, dtype, head_dim, backward=True,
                                              causal=causal, masked=masked, cross=cross)[0] is None:
        return None
    largest = max_tokens(step, head_dim)
    return step if largest is None or tokens <= largest else None
