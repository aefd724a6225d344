"""ctypes over libattention_steps.so, the C ABI of capi/attention_steps.h.

Needs the Python standard library only: listing the steps, asking whether one serves a shape,
and running one on raw device pointers all work without PyTorch (the torch layer is
attention_steps.torch_bridge).

Where the library is found:
  1. the path given to load_library(path) (a file, or a folder holding libattention_steps.so);
  2. else the environment variable ATTENTION_STEPS_LIBRARY (a file or a folder);
  3. else the copy `pip install ./python` puts beside this module (the one the operator
     attention_steps._operator links), then the build folder of this checkout,
     <repository>/build/libattention_steps.so, then the system's loader (LD_LIBRARY_PATH,
     ldconfig).
A path given in 1 or 2 is the only place looked at: if it holds no library, that is an error,
not a reason to load another one.
"""
import ctypes
import operator
import os
import pathlib
import threading
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

LIBRARY_NAME = "libattention_steps.so"
ENVIRONMENT_VARIABLE = "ATTENTION_STEPS_LIBRARY"
ABI_VERSION = 10         # capi/attention_steps.h: ATTN_ABI_VERSION
OK, REFUSED, CUDA_ERROR = 0, 2, 3
MAX_HEAD_DIMS = 8        # ATTN_MAX_HEAD_DIMS
MESSAGE_BYTES = 1024

PACKAGE = pathlib.Path(__file__).resolve().parent
REPOSITORY = PACKAGE.parents[1]


class AttentionStepsError(RuntimeError):
    """A call the library answered with a status other than 0; `status` holds it."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


class StepRefused(AttentionStepsError):
    """Status 2: a shape the step does not serve on this GPU, an unknown step, a bad argument."""


class CudaError(AttentionStepsError):
    """Status 3: no CUDA device or driver, out of memory, a failed launch."""


class LibraryNotFoundError(OSError):
    """libattention_steps.so is not where it was looked for (the message says where)."""


@dataclass(frozen=True)
class StepInfo:
    id: str
    title: str
    is_baseline: bool
    head_dims: Tuple[int, ...]
    min_compute_capability: int
    max_compute_capability: int  # 0: every newer GPU too
    uses_shared_memory: bool
    uses_workspace: bool
    takes_strides: bool  # reads and writes views (Library.run with strides)
    writes_log_sum_exp: bool  # writes each row's log-sum-exp L (Library.run with log_sum_exp)
    is_backward: bool = False  # a backward step (dQ, dK, dV): listed, not run through the library
    takes_bf16: bool = False  # takes bf16 tensors as well as fp16 (the PyTorch operator's dtype)
    takes_kv_tokens: bool = False  # serves keys and values of another count (cross-attention)
    takes_key_padding_mask: bool = False  # honours a [B, N_k] key-padding mask
    takes_causal: bool = False  # honours a causal mask (either alignment)
    takes_packed_sequences: bool = False  # serves packed sequences of different lengths (varlen)


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    compute_capability: int
    shared_bytes_per_block: int


class _StepInfoStruct(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_char_p),
        ("title", ctypes.c_char_p),
        ("is_baseline", ctypes.c_int),
        ("head_dim_count", ctypes.c_int),
        ("head_dims", ctypes.c_int * MAX_HEAD_DIMS),
        ("min_compute_capability", ctypes.c_int),
        ("max_compute_capability", ctypes.c_int),
        ("uses_shared_memory", ctypes.c_int),
        ("uses_workspace", ctypes.c_int),
        ("takes_strides", ctypes.c_int),
        ("writes_log_sum_exp", ctypes.c_int),
        ("is_backward", ctypes.c_int),
        ("takes_bf16", ctypes.c_int),
        ("takes_kv_tokens", ctypes.c_int),
        ("takes_key_padding_mask", ctypes.c_int),
        ("takes_causal", ctypes.c_int),
        ("takes_packed_sequences", ctypes.c_int),
    ]


class _StridesStruct(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("head", ctypes.c_int64), ("token", ctypes.c_int64)]


class _LaunchArgsStruct(ctypes.Structure):  # attn_launch_args
    _fields_ = [
        ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p), ("log_sum_exp", ctypes.c_void_p),
        ("batch", ctypes.c_int64), ("heads", ctypes.c_int64), ("tokens", ctypes.c_int64),
        ("head_dim", ctypes.c_int64), ("kv_tokens", ctypes.c_int64),
        ("key_padding_mask", ctypes.c_void_p),
        ("qkv_strides", _StridesStruct), ("o_strides", _StridesStruct),
        ("scale", ctypes.c_double),
        ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
        ("stream", ctypes.c_void_p),
        ("pointers_checked_by_caller", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("causal", ctypes.c_int),
        ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
        ("total_tokens", ctypes.c_int64), ("total_kv_tokens", ctypes.c_int64),
    ]


class _CallStruct(ctypes.Structure):  # attn_call
    _fields_ = [
        ("backward", ctypes.c_int),
        ("batch", ctypes.c_int64), ("heads", ctypes.c_int64), ("tokens", ctypes.c_int64),
        ("head_dim", ctypes.c_int64), ("kv_tokens", ctypes.c_int64),
        ("dtype", ctypes.c_int), ("key_padding_mask", ctypes.c_int), ("causal", ctypes.c_int),
        ("deterministic", ctypes.c_int), ("compute_capability", ctypes.c_int),
    ]


# capi/attention_steps.h: ATTN_CAUSAL_NONE, ATTN_CAUSAL_TOP_LEFT, ATTN_CAUSAL_BOTTOM_RIGHT.
CAUSAL_ALIGNMENTS = {None: 0, "top-left": 1, "bottom-right": 2}

_i64, _size, _ptr, _char_p = ctypes.c_int64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
_SIGNATURES = {
    "attn_abi_version": [],
    "attn_step_count": [],
    "attn_step_get": [ctypes.c_int, ctypes.POINTER(_StepInfoStruct)],
    "attn_device": [ctypes.POINTER(ctypes.c_int), _char_p, _size, ctypes.POINTER(ctypes.c_int),
                    ctypes.POINTER(_size), _char_p, _size],
    "attn_shared_bytes": [_char_p, _i64, _i64, ctypes.POINTER(_size), _char_p, _size],
    "attn_max_tokens": [_char_p, _i64, ctypes.POINTER(_i64), _char_p, _size],
    "attn_check": [_char_p, _i64, _i64, _i64, _i64, _char_p, _size],
    "attn_workspace_bytes": [_char_p, _i64, _i64, _i64, _i64, ctypes.POINTER(_size), _char_p,
                             _size],
    "attn_launch": [_char_p, ctypes.POINTER(_LaunchArgsStruct), _char_p, _size],
    "attn_choose_step": [ctypes.POINTER(_CallStruct), _char_p, _size, _char_p, _size],
}


def _candidates(path):
    """(where, how it was chosen) in the order load_library tries them."""
    def expand(given, how):
        given = pathlib.Path(given).expanduser()
        return (given / LIBRARY_NAME if given.is_dir() else given), how

    if path is not None:
        return [expand(path, "given")]
    if os.environ.get(ENVIRONMENT_VARIABLE):
        return [expand(os.environ[ENVIRONMENT_VARIABLE], ENVIRONMENT_VARIABLE)]
    return [(PACKAGE / LIBRARY_NAME, "the copy pip installed beside this module"),
            (REPOSITORY / "build" / LIBRARY_NAME, "this checkout's build folder"),
            (LIBRARY_NAME, "the system loader")]


def _pointer(address):
    """An address (int) for ctypes; 0 and None are NULL."""
    return int(address) if address else None


def _shape(shape: Sequence[int]):
    if len(shape) != 4:
        raise ValueError(f"shape must be (batch, heads, tokens, head_dim); got {tuple(shape)}")
    try:  # integers only (int, numpy and torch integers): "197" or 197.5 is a mistake, not 197
        return tuple(operator.index(size) for size in shape)
    except TypeError:
        raise TypeError(f"shape must hold integers; got {tuple(shape)}") from None


class Library:
    """One loaded libattention_steps.so. Every method raises StepRefused or CudaError with the
    library's own one-line message when it answers with status 2 or 3."""

    def __init__(self, path=None):
        self._steps = None
        tried = []
        for candidate, how in _candidates(path):
            if isinstance(candidate, pathlib.Path) and not candidate.is_file():
                tried.append(f"{candidate} ({how}: no such file)")
                continue
            try:
                self._dll = ctypes.CDLL(str(candidate))
            except OSError as error:
                tried.append(f"{candidate} ({how}: {error})")
                continue
            self.path = str(candidate)
            break
        else:
            raise LibraryNotFoundError(
                f"{LIBRARY_NAME} not found; build it (cmake -B build && cmake --build build "
                f"--target attention_steps) or set {ENVIRONMENT_VARIABLE}=/path/to/{LIBRARY_NAME}."
                " Tried: " + "; ".join(tried))
        for name, arguments in _SIGNATURES.items():
            function = getattr(self._dll, name)
            function.argtypes = arguments
            function.restype = ctypes.c_int
        version = self._dll.attn_abi_version()
        if version != ABI_VERSION:
            raise LibraryNotFoundError(
                f"{self.path} speaks C ABI version {version}; this module speaks {ABI_VERSION}:"
                " rebuild the library from this checkout")

    def __repr__(self):
        return f"Library({self.path!r})"

    # -- calls --------------------------------------------------------------------------------

    def _call(self, name, *arguments):
        message = ctypes.create_string_buffer(MESSAGE_BYTES)
        status = getattr(self._dll, name)(*arguments, message, MESSAGE_BYTES)
        if status == OK:
            return
        text = message.value.decode("utf-8", "replace")
        if status == REFUSED:
            raise StepRefused(text, status)
        raise CudaError(text, status)

    @staticmethod
    def _id(step):
        if not isinstance(step, str):
            raise TypeError(f"step must be a step id such as 'v6', not {type(step).__name__}")
        return step.encode()

    def steps(self):
        """Every registered step and baseline, in the registry's order (read once)."""
        if self._steps is not None:
            return list(self._steps)
        found = []
        for index in range(self._dll.attn_step_count()):
            info = _StepInfoStruct()
            if self._dll.attn_step_get(index, ctypes.byref(info)) != OK:
                raise AttentionStepsError(f"attn_step_get({index}) failed", REFUSED)
            found.append(StepInfo(
                id=info.id.decode(), title=info.title.decode(), is_baseline=bool(info.is_baseline),
                head_dims=tuple(info.head_dims[:info.head_dim_count]),
                min_compute_capability=info.min_compute_capability,
                max_compute_capability=info.max_compute_capability,
                uses_shared_memory=bool(info.uses_shared_memory),
                uses_workspace=bool(info.uses_workspace),
                takes_strides=bool(info.takes_strides),
                writes_log_sum_exp=bool(info.writes_log_sum_exp),
                is_backward=bool(info.is_backward), takes_bf16=bool(info.takes_bf16),
                takes_kv_tokens=bool(info.takes_kv_tokens),
                takes_key_padding_mask=bool(info.takes_key_padding_mask),
                takes_causal=bool(info.takes_causal),
                takes_packed_sequences=bool(info.takes_packed_sequences)))
        self._steps = tuple(found)
        return found

    def step(self, step_id):
        for info in self.steps():
            if info.id == step_id:
                return info
        known = ", ".join(info.id for info in self.steps())
        raise StepRefused(f"unknown step '{step_id}' (registered: {known})", REFUSED)

    def device(self):
        """The current CUDA device as the library sees it; CudaError without one."""
        index, capability, shared = ctypes.c_int(), ctypes.c_int(), _size()
        name = ctypes.create_string_buffer(256)
        self._call("attn_device", ctypes.byref(index), name, 256, ctypes.byref(capability),
                   ctypes.byref(shared))
        return DeviceInfo(index.value, name.value.decode("utf-8", "replace"), capability.value,
                          shared.value)

    def shared_bytes(self, step, tokens, head_dim):
        """Dynamic shared memory per block the step needs at N = tokens; no GPU needed."""
        result = _size()
        self._call("attn_shared_bytes", self._id(step), int(tokens), int(head_dim),
                   ctypes.byref(result))
        return result.value

    def max_tokens(self, step, head_dim) -> Optional[int]:
        """The largest N the step serves at head_dim on the current GPU; None: any N."""
        result = _i64()
        self._call("attn_max_tokens", self._id(step), int(head_dim), ctypes.byref(result))
        return None if result.value < 0 else result.value

    def check(self, step, shape):
        """Raises StepRefused with the reason when the step does not serve shape here."""
        self._call("attn_check", self._id(step), *_shape(shape))

    def refusal(self, step, shape) -> Optional[str]:
        """Why the step does not serve shape (B, H, N, D) on the current GPU, or None. Without
        a usable GPU that is the library's own line ("no CUDA device found (...)")."""
        try:
            self.check(step, shape)
        except (StepRefused, CudaError) as refused:
            return str(refused)
        return None

    def choose_step(self, shape, *, backward=False, kv_tokens=None, dtype="fp16",
                    key_padding_mask=False, causal=None, deterministic=False,
                    compute_capability=None) -> str:
        """The step that serves the call on the current GPU (or on a GPU of compute_capability,
        which needs no GPU here): the highest-numbered that does, a forward step that writes L or
        a backward step. Raises StepRefused with each candidate's reason when none does."""
        if dtype not in ("fp16", "bf16"):
            raise ValueError(f"dtype must be 'fp16' or 'bf16', not {dtype!r}")
        if causal not in CAUSAL_ALIGNMENTS:
            raise ValueError(f"causal must be one of {sorted(map(str, CAUSAL_ALIGNMENTS))}, not {causal!r}")
        batch, heads, tokens, head_dim = _shape(shape)
        call = _CallStruct(int(bool(backward)), batch, heads, tokens, head_dim,
                           0 if kv_tokens is None else int(kv_tokens), int(dtype == "bf16"),
                           int(bool(key_padding_mask)), CAUSAL_ALIGNMENTS[causal],
                           int(bool(deterministic)), int(compute_capability or 0))
        chosen = ctypes.create_string_buffer(64)
        self._call("attn_choose_step", ctypes.byref(call), chosen, 64)
        return chosen.value.decode()

    def workspace_bytes(self, step, shape):
        result = _size()
        self._call("attn_workspace_bytes", self._id(step), *_shape(shape), ctypes.byref(result))
        return result.value

    def run(self, step, q, k, v, o, shape, stream=0, workspace=None, workspace_bytes=0,
            qkv_strides=None, o_strides=None, log_sum_exp=None, scale=None, causal=None):
        """Queues the step (attn_launch) on raw device pointers (ints) of fp16 [B, H, N, D]
        tensors, on the cudaStream_t `stream` (an int; 0 is the legacy default stream). Without
        a workspace, a step that needs one allocates it stream-ordered. qkv_strides and
        o_strides, element strides (batch, head, token) of views, go to a step that
        takes_strides (None: contiguous). log_sum_exp, a device pointer to B*H*N fp32 values,
        receives each row's L from a step that writes_log_sum_exp. scale multiplies the scores
        (None: 1/sqrt(D)). causal: None, "top-left" (query i sees keys j <= i, as PyTorch's
        is_causal) or "bottom-right" (j <= i + N_k - N, as FlashAttention), for a step that
        takes_causal."""
        batch, heads, tokens, head_dim = _shape(shape)
        call = _LaunchArgsStruct(
            q=_pointer(q), k=_pointer(k), v=_pointer(v), o=_pointer(o),
            log_sum_exp=_pointer(log_sum_exp),
            batch=batch, heads=heads, tokens=tokens, head_dim=head_dim,
            scale=0.0 if scale is None else float(scale),
            workspace=_pointer(workspace), workspace_bytes=int(workspace_bytes),
            stream=_pointer(stream), causal=CAUSAL_ALIGNMENTS[causal])
        if qkv_strides is not None:
            call.qkv_strides = _StridesStruct(*map(int, qkv_strides))
        if o_strides is not None:
            call.o_strides = _StridesStruct(*map(int, o_strides))
        self._call("attn_launch", self._id(step), ctypes.byref(call))


_default = None
_default_lock = threading.Lock()


def load_library(path=None) -> Library:
    """The library at `path`, or (path None) the one found as the module docstring says,
    loaded once and kept."""
    global _default
    if path is not None:
        return Library(path)
    with _default_lock:
        if _default is None:
            _default = Library()
        return _default
