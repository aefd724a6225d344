"""scaled_dot_product_attention with the steps inside, for models that call PyTorch's.

    import attention_steps
    attention_steps.use_steps()   # F.scaled_dot_product_attention now runs the steps
    model = timm.create_model("vit_base_patch16_224").cuda().half().eval()

scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
scale=None, enable_gqa=False) takes PyTorch's arguments and returns what PyTorch's returns. It
runs the fastest step that serves the call on the tensors' GPU and dtype (v8 on an H100 and v6
elsewhere, in float16 and in bfloat16: chapters 07, 10 and 16) and hands every other call to
PyTorch's own function: the calls FALLBACKS lists (is_causal=True is served: the steps take a
causal mask with the diagonal at the top left, as PyTorch puts it) (README's list is made from it). A gradient
is served where a backward step serves the head dim (v10 on an H100 and v9 elsewhere serve 64
and 128: autograd runs them). use_steps(verbose=True) says once per reason when a call goes to
PyTorch; never while torch.compile traces, where printing would break the graph.

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
    "mask": "an attention mask",
    "causal": "causal attention where no step takes a causal mask (at that head dim and dtype, or in the backward)",
    "dropout": "attention dropout",
    "dtype": "a dtype other than float16 and bfloat16, or mixed dtypes",
    "device": "tensors not all on one CUDA device (CPU tensors among them)",
    "rank": "tensors that are not 4-D, [B, H, N, D]",
    "shape": "keys and values of another shape than the queries (cross-attention, grouped-query attention)",
    "compiling": "a GPU first seen while torch.compile traces",
    "head_dim": "a head dim no step serves in that dtype",
    "gradient": "a gradient at a head dim no backward step serves",
    "tokens": "more tokens than the step serves at that head dim",
}

_pytorch_sdpa = F.scaled_dot_product_attention  # PyTorch's own, whatever use_steps does later
_attention_op = torch_op.load_if_built()  # None: not built, and no call is served by a step
_said = set()        # the fallback reasons already printed
_settings = {"verbose": False}


def _why_not(query, key, value, attn_mask, dropout_p, is_causal):
    """(step, None) when a step serves the call, else (None, the reason in a few words): a value
    of FALLBACKS, with the call's own numbers where they help."""
    tensors = (query, key, value)
    if _attention_op is None:
        return None, f"{FALLBACKS['operator']} ({torch_op.BUILD_COMMAND})"
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None, FALLBACKS["arguments"]
    if attn_mask is not None:
        return None, FALLBACKS["mask"]
    if dropout_p != 0.0:
        return None, FALLBACKS["dropout"]
    if query.dtype not in choice.DTYPES or any(t.dtype != query.dtype for t in tensors):
        return None, f"{FALLBACKS['dtype']}: {query.dtype}"
    if any(t.device.type != "cuda" for t in tensors) or not (
            query.device == key.device == value.device):
        return None, FALLBACKS["device"]
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return None, f"{FALLBACKS['rank']}: {query.dim()}-D"
    if not query.shape == key.shape == value.shape:
        return None, FALLBACKS["shape"]
    device_index, head_dim, grad = query.device.index, query.shape[-1], torch_op.needs_grad(tensors)
    if not choice.prepared(device_index) and torch.compiler.is_compiling():
        return None, f"{FALLBACKS['compiling']} (call use_steps() first)"
    step, _ = choice.serving(device_index, query.dtype, head_dim)
    if step is None:
        return None, f"{FALLBACKS['head_dim']}: {head_dim} in {query.dtype}"
    if grad and choice.serving(device_index, query.dtype, head_dim, backward=True)[0] is None:
        return None, f"{FALLBACKS['gradient']}: {head_dim}"
    if is_causal:
        # is_causal=True puts the diagonal at the top left (query i sees keys j <= i).
        step, _ = choice.serving(device_index, query.dtype, head_dim, causal="top-left")
        if step is None or grad and choice.serving(device_index, query.dtype, head_dim, backward=True,
                                                   causal="top-left")[0] is None:
            return None, FALLBACKS["causal"]
    max_tokens = choice.max_tokens(step, head_dim)
    if max_tokens is not None and query.shape[-2] > max_tokens:
        return None, f"{FALLBACKS['tokens']}: {query.shape[-2]} (at most {max_tokens} for {step})"
    return step, None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, by a step where one serves the call
    (see the module's docstring), by PyTorch's otherwise."""
    step, reason = _why_not(query, key, value, attn_mask, dropout_p, is_causal)
    if step is not None:
        return _attention_op(query, key, value, step, scale, None,
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
