"""scaled_dot_product_attention with the steps inside, for models that call PyTorch's.

    import attention_steps
    attention_steps.use_steps()   # F.scaled_dot_product_attention now runs the steps
    model = timm.create_model("vit_base_patch16_224").cuda().half().eval()

scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
scale=None, enable_gqa=False) takes PyTorch's arguments and returns what PyTorch's returns. It
runs the fastest step that serves the call on the tensors' GPU and dtype (v8 on an H100 and v6
elsewhere, in float16 and in bfloat16: chapters 07, 10 and 16) and hands every other call to
PyTorch's own function: the calls FALLBACKS lists (README's list is made from it). Served:

  - self-attention, query, key and value [B, H, N, D];
  - cross-attention: key and value [B, H, N_k, D] beside query [B, H, N, D] (the same B, H and
    D; grouped-query attention, H_k != H, goes to PyTorch), where the library serves N_k != N
    (DETR's decoder: 100 queries against an image's positions);
  - a key-padding mask: a boolean attn_mask (SDPA's convention, True: the key takes part) that
    broadcasts to [B, H, N, N_k] with one row of keys per batch element, that is of size 1 or of
    stride 0 in its head and query dimensions: [B, 1, 1, N_k], [N_k] (one row for every batch
    element), or such rows expand()ed to [B, 1, N, N_k]. The operator takes it as
    key_padding_mask [B, N_k], True where a key is padding, the inverse. Whether a mask is one
    is read from its shape and strides alone, never from its values, so the decision costs no
    device sync and torch.compile and CUDA graphs take it. A mask whose rows are only equal in
    value (a [B, 1, N, N_k] tensor materialised row by row, as transformers' sdpa_mask makes
    them) cannot be told from a general mask that way and goes to PyTorch, as do float
    (additive) masks: one of 0 and -inf (or torch.finfo(dtype).min, as transformers writes
    padding) is a padding mask, any other value a bias, and telling them apart needs the values
    on the host, a sync that torch.compile would break the graph on and a CUDA graph cannot
    capture;
  - is_causal=True: the steps take a causal mask with the diagonal at the top left, as PyTorch
    puts it also when N != N_k (query i sees keys j <= i).

Every one of these is served with its gradient where a backward step serves the call (v10 on an
H100, v9 elsewhere, chosen by the library for its head dim, N_k, mask and causal alignment:
autograd runs them). A batch element whose keys are all padding gets O = 0 and zero gradients
from the steps (the library's definition), never NaN. use_steps(verbose=True) says once per
reason when a call goes to PyTorch; never while torch.compile traces, where printing would break
the graph.

Which step serves a call is the library's answer (attn_choose_step, asked through
attention_steps.choice once per kind of call and GPU, kept in a table), so torch.compile traces
the decision and the operator with no graph break.
"""
import torch
import torch.nn.functional as F

from . import choice, torch_op

# Every kind of call that goes to PyTorch's own function, by the key _why_not names it with.
# README's list between the "sdpa fallbacks" markers is these values, in this order (a CPU
# test, tests/check_doc_lists.py, reads this table and checks both).
FALLBACKS = {
    "operator": "no operator built",
    "arguments": "arguments that are not tensors",
    "mask": "an attention mask other than a key-padding mask (boolean, one row of keys for each batch "
            "element: size 1 or stride 0 over heads and queries), or a mask with is_causal",
    "float_mask": "a float (additive) attention mask: telling one of 0 and -inf, a padding mask, from a bias "
                  "needs its values, a device sync",
    "causal": "causal attention where no step takes a causal mask (at that head dim and dtype, or in the backward)",
    "dropout": "attention dropout",
    "dtype": "a dtype other than float16 and bfloat16, or mixed dtypes",
    "device": "tensors not all on one CUDA device (CPU tensors among them)",
    "rank": "tensors that are not 4-D, [B, H, N, D]",
    "shape": "keys and values that are not [B, H, N_k, D] beside queries [B, H, N, D] (grouped-query "
             "attention, values of another head dim, no keys)",
    "compiling": "a GPU first seen while torch.compile traces",
    "head_dim": "a head dim no step serves in that dtype",
    "gradient": "a gradient at a head dim no backward step serves",
    "cross": "keys of another count than the queries where no step serves them (at that head dim and "
             "dtype, or in the backward)",
    "padding": "a key-padding mask where no step takes one (at that head dim and dtype, or in the backward)",
    "tokens": "more tokens (queries or keys) than the step serves at that head dim",
}

_pytorch_sdpa = F.scaled_dot_product_attention  # PyTorch's own, whatever use_steps does later
_attention_op = torch_op.load_if_built()  # None: not built, and no call is served by a step
_said = set()        # the fallback reasons already printed
_settings = {"verbose": False}


def _attending_keys(attn_mask, batch, heads, tokens, kv_tokens):
    """attn_mask's one row of keys per batch element, a [B or 1, N_k or 1] bool view (True: the
    key takes part), when it is a key-padding mask as SDPA takes one: rank 4 at most, broadcast
    to [B, H, N, N_k], of size 1 or stride 0 in the head and query dimensions. None for any other
    mask, or one that does not broadcast (PyTorch's function then raises its error). Read from
    the shape and strides alone: no device sync."""
    if attn_mask.dim() > 4:
        return None
    mask = attn_mask[(None,) * (4 - attn_mask.dim())]  # [.., .., .., N_k] as 4-D, a view
    for size, full in zip(mask.shape, (batch, heads, tokens, kv_tokens)):
        if size != 1 and size != full:
            return None
    for dim in (1, 2):  # heads and queries: one value along each
        if mask.shape[dim] != 1 and mask.stride(dim) != 0:
            return None
    return mask[:, 0, 0, :]


def _why_not(query, key, value, attn_mask, dropout_p, is_causal):
    """(step, None) when a step serves the call, else (None, the reason in a few words): a value
    of FALLBACKS, with the call's own numbers where they help."""
    tensors = (query, key, value)
    if _attention_op is None:
        return None, f"{FALLBACKS['operator']} ({torch_op.BUILD_COMMAND})"
    if not all(isinstance(t, torch.Tensor) for t in tensors) or not (
            attn_mask is None or isinstance(attn_mask, torch.Tensor)):
        return None, FALLBACKS["arguments"]
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        # A float mask is added to the scores: a padding mask when every value is 0 or -inf (or
        # finfo.min, transformers' padding), a bias otherwise. Only its values tell, and reading
        # them here (mask.isinf().logical_or(mask == 0).all().item()) would sync the device on
        # every call, break torch.compile's graph there and fail inside a CUDA graph's capture.
        # So float masks stay PyTorch's; a model that means padding can pass the boolean mask.
        return None, (FALLBACKS["float_mask"] if attn_mask.is_floating_point() else
                      f"{FALLBACKS['mask']}: {attn_mask.dtype}")
    if attn_mask is not None and is_causal:  # PyTorch's function refuses the two together
        return None, FALLBACKS["mask"]
    if dropout_p != 0.0:
        return None, FALLBACKS["dropout"]
    if query.dtype not in choice.DTYPES or any(t.dtype != query.dtype for t in tensors):
        return None, f"{FALLBACKS['dtype']}: {query.dtype}"
    if any(t.device.type != "cuda" for t in tensors) or not (
            query.device == key.device == value.device) or (
            attn_mask is not None and attn_mask.device != query.device):
        return None, FALLBACKS["device"]
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return None, f"{FALLBACKS['rank']}: {query.dim()}-D"
    batch, heads, tokens, head_dim = query.shape
    kv_tokens = key.shape[2]
    if key.shape != value.shape or key.shape[0] != batch or key.shape[1] != heads or \
            key.shape[3] != head_dim or kv_tokens == 0:
        return None, FALLBACKS["shape"]
    masked = attn_mask is not None
    if masked and _attending_keys(attn_mask, batch, heads, tokens, kv_tokens) is None:
        return None, f"{FALLBACKS['mask']}: {list(attn_mask.shape)}"
    device_index, grad = query.device.index, torch_op.needs_grad(tensors)
    if not choice.prepared(device_index) and torch.compiler.is_compiling():
        return None, f"{FALLBACKS['compiling']} (call use_steps() first)"

    def served(**kind):  # the forward step for such a call, when its backward is served too
        step = choice.serving(device_index, query.dtype, head_dim, **kind)[0]
        if step is None or grad and choice.serving(device_index, query.dtype, head_dim,
                                                   backward=True, **kind)[0] is None:
            return None
        return step

    # is_causal=True puts the diagonal at the top left (query i sees keys j <= i), N_k != N too.
    cross, causal = kv_tokens != tokens, "top-left" if is_causal else None
    step = served(masked=masked, cross=cross, causal=causal)
    if step is None:  # which part of the call no step serves, for the reason
        if choice.serving(device_index, query.dtype, head_dim)[0] is None:
            return None, f"{FALLBACKS['head_dim']}: {head_dim} in {query.dtype}"
        if served() is None:
            return None, f"{FALLBACKS['gradient']}: {head_dim}"
        if cross and served(cross=True) is None:
            return None, f"{FALLBACKS['cross']}: N = {tokens}, N_k = {kv_tokens} at head dim {head_dim}"
        if masked and served(masked=True, cross=cross) is None:
            return None, f"{FALLBACKS['padding']}: head dim {head_dim}"
        return None, FALLBACKS["causal"]
    max_tokens = choice.max_tokens(step, head_dim)
    if max_tokens is not None and max(tokens, kv_tokens) > max_tokens:
        return None, f"{FALLBACKS['tokens']}: {max(tokens, kv_tokens)} (at most {max_tokens} for {step})"
    return step, None


def _as_autocast_casts(*tensors):
    """q, k and v as PyTorch's SDPA receives them: it is on autocast's lower-precision list, so
    under autocast its float32 arguments reach its kernels in autocast's dtype (a float32 model
    trained under autocast(bfloat16) whose attention inputs come from a LayerNorm, say). This
    function replaces PyTorch's before autocast's cast, so it casts them alike."""
    if not all(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors) or \
            not torch.is_autocast_enabled("cuda"):
        return tensors  # (the steps run CUDA tensors only; the rest is PyTorch's, uncast)
    dtype = torch.get_autocast_dtype("cuda")
    return tuple(t.to(dtype) if t.dtype == torch.float32 else t for t in tensors)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, by a step where one serves the call
    (see the module's docstring), by PyTorch's otherwise."""
    query, key, value = _as_autocast_casts(query, key, value)
    step, reason = _why_not(query, key, value, attn_mask, dropout_p, is_causal)
    if step is not None:
        padding = None
        if attn_mask is not None:  # SDPA's True takes part; the operator's True is padding
            batch, _, tokens, _ = query.shape
            attending = _attending_keys(attn_mask, batch, query.shape[1], tokens, key.shape[2])
            padding = torch.logical_not(attending).expand(batch, key.shape[2])
        return _attention_op(query, key, value, step, scale, padding,
                             torch_op.needs_grad((query, key, value)),
                             "top-left" if is_causal else None)[0]
    if _settings["verbose"] and reason not in _said and not torch.compiler.is_compiling():
        _said.add(reason)
        print(f"attention_steps: PyTorch's scaled_dot_product_attention runs calls with {reason}")
    return _pytorch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                         is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def use_steps(enable=True, *, verbose=False):
    """Puts scaled_dot_product_attention in place of torch.nn.functional's (enable=False puts
    PyTorch's back), so models that call F.scaled_dot_product_attention run the steps. Loads the
    operator and makes the table of every visible GPU now, before any torch.compile."""
    _settings["verbose"] = verbose
    if not enable:
        F.scaled_dot_product_attention = _pytorch_sdpa
        return
    torch_op.load()  # ImportError saying how to build it, rather than a silent fallback
    for device_index in range(torch.cuda.device_count()):
        choice.prepare(device_index)
    F.scaled_dot_product_attention = scaled_dot_product_attention
