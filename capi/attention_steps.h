/* attention_steps.h: the registered attention steps of this repository behind a plain C ABI.
 *
 * libattention_steps.so holds every step the build registers (v0, v1, ... and the cuBLAS
 * "eager" baseline), the same object files the step executables and the bench link. A caller
 * (a C program, Python through ctypes, a framework) lists the steps, asks whether one serves a
 * shape on the current GPU, and runs it on its own device memory on its own stream:
 *
 *     O = softmax(Q K^T / sqrt(D)) V     for every (b, h)
 *
 * with Q, K, V, O fp16 (IEEE binary16), laid out [B, H, N, D], contiguous, row-major.
 *
 * Rules every function keeps:
 *   - It returns a status: ATTN_OK (0), ATTN_REFUSED (2: a shape the step does not serve on
 *     this GPU, an unknown step, a bad argument) or ATTN_CUDA_ERROR (3: no CUDA device or
 *     driver, out of memory, a failed launch). The numbers are the step executables' exit codes.
 *   - When `message` is not NULL it receives one line (NUL-terminated, cut to message_size
 *     bytes) saying why, or "ok".
 *   - It never aborts the process and lets no C++ exception out; a refused call launches
 *     nothing, so a refusal can never leave a wrong answer behind.
 *   - It uses the calling thread's current CUDA device (cudaGetDevice) and never changes it;
 *     the pointers and the stream must belong to that device.
 *   - It needs no GPU for listing the steps; everything that asks about "this GPU" answers
 *     ATTN_CUDA_ERROR with "no CUDA device found (...)" on a machine without one.
 *
 * Thread safety: any function may be called from several threads at once.
 */
#ifndef ATTENTION_STEPS_H
#define ATTENTION_STEPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a signature or a struct below changes. */
#define ATTN_ABI_VERSION 10

#define ATTN_OK 0
#define ATTN_REFUSED 2
#define ATTN_CUDA_ERROR 3

#define ATTN_MAX_HEAD_DIMS 8

/* The element type of the 16-bit tensors (attn_launch_args, attn_backward_args). */
#define ATTN_DTYPE_FP16 0
#define ATTN_DTYPE_BF16 1

/* The causal mask (attn_launch_args::causal, attn_backward_args::causal): query i sees key j only
 * where j <= i (top left, as PyTorch's is_causal) or j <= i + N_k - N (bottom right, as
 * FlashAttention). They agree when N_k = N. A query that sees no key gets O = 0 and L = -inf. */
#define ATTN_CAUSAL_NONE 0
#define ATTN_CAUSAL_TOP_LEFT 1
#define ATTN_CAUSAL_BOTTOM_RIGHT 2

/* What a step states about itself, the same on every GPU. The strings live as long as the
 * library stays loaded. */
typedef struct attn_step_info {
  const char* id;              /* "v6"; the name attn_run takes */
  const char* title;           /* one line: the idea of the step */
  int is_baseline;             /* 1 for a baseline ("eager"), 0 for a numbered step */
  int head_dim_count;          /* entries used in head_dims */
  int head_dims[ATTN_MAX_HEAD_DIMS];
  int min_compute_capability;  /* 10 * major + minor: 80 needs an A100 or newer */
  int max_compute_capability;  /* 0: every newer GPU too; 90: Hopper alone */
  int uses_shared_memory;      /* 1 when its shared memory per block depends on the shape */
  int uses_workspace;          /* 1 when it needs scratch device memory (attn_workspace_bytes) */
  int takes_strides;           /* 1 when it reads and writes views (attn_run_strided) */
  int writes_log_sum_exp;      /* 1 when it writes L (attn_run_with_log_sum_exp) */
  int is_backward;             /* 1 for a backward step (dQ, dK, dV): run by attn_launch_backward */
  int takes_bf16;              /* 1 when it takes dtype ATTN_DTYPE_BF16 as well as fp16 */
  int takes_kv_tokens;         /* 1 when it serves kv_tokens != tokens (cross-attention), in
                                  attn_launch_args or, for a backward step, attn_backward_args */
  int takes_key_padding_mask;  /* 1 when it honours key_padding_mask (the forward's or the
                                  backward's) */
  int takes_causal;            /* 1 when it honours attn_launch_args::causal (or the backward's) */
  int takes_packed_sequences;  /* 1 when it honours attn_launch_args::cu_seqlens_q (varlen), or
                                  for a backward step attn_backward_args::cu_seqlens_q */
} attn_step_info;

/* The strides, in elements, of a [B, H, N, D] view whose rows of D values are contiguous:
 * between batches, between heads, between tokens. Q, K and V cut from one packed projection
 * [B, N, 3, H, D] have {N*3*H*D, D, 3*H*D}; O written as [B, N, H, D] has {N*H*D, D, H*D}. */
typedef struct attn_strides {
  int64_t batch, head, token;
} attn_strides;

/* ATTN_ABI_VERSION of the library actually loaded. */
int attn_abi_version(void);

/* How many steps and baselines are registered; their indices are 0 .. count - 1, in order
 * (v0, v1, ..., v10, then the baselines). */
int attn_step_count(void);

/* Fills *info for the step at `index`. ATTN_REFUSED for an index out of range. */
int attn_step_get(int index, attn_step_info* info);

/* The current GPU: its index, name (cut to name_size bytes), compute capability and opt-in
 * shared memory per block. The testing aids of the harness (ATTN_TEST_SHARED_MEMORY_BYTES,
 * ATTN_TEST_COMPUTE_CAPABILITY) lower these as they do for the step executables. Any output
 * pointer may be NULL. */
int attn_device(int* device, char* name, size_t name_size, int* compute_capability,
                size_t* shared_bytes_per_block, char* message, size_t message_size);

/* Dynamic shared memory per block that step `id` needs at this shape; needs no GPU. */
int attn_shared_bytes(const char* id, int64_t tokens, int64_t head_dim, size_t* bytes,
                      char* message, size_t message_size);

/* The largest N that step `id` serves at head dim `head_dim` on the current GPU: -1 when it
 * serves every N. ATTN_REFUSED (with the reason) when it serves no N at that head dim or
 * cannot run on this GPU at all. */
int attn_max_tokens(const char* id, int64_t head_dim, int64_t* max_tokens, char* message,
                    size_t message_size);

/* Whether step `id` serves [batch, heads, tokens, head_dim] on the current GPU: ATTN_OK, or
 * ATTN_REFUSED with the reason (the same line the step executables print for that shape). */
int attn_check(const char* id, int64_t batch, int64_t heads, int64_t tokens, int64_t head_dim,
               char* message, size_t message_size);

/* Scratch device memory that attn_run_with_workspace needs for this shape (0 for most steps);
 * needs no GPU. */
int attn_workspace_bytes(const char* id, int64_t batch, int64_t heads, int64_t tokens,
                         int64_t head_dim, size_t* bytes, char* message, size_t message_size);

/* Runs step `id`: O = softmax(Q K^T / sqrt(D)) V on the caller's device pointers, queued on
 * `stream` (a cudaStream_t; NULL is the legacy default stream). Returns when the work is
 * queued, not when it is done: synchronise the stream before reading O. The four pointers must
 * be device (or managed) memory of the current device, 16-byte aligned, each holding
 * batch*heads*tokens*head_dim fp16 values; O must not overlap Q, K or V. A step that needs a
 * workspace gets one allocated and freed stream-ordered (cudaMallocAsync / cudaFreeAsync). */
int attn_run(const char* id, const void* q, const void* k, const void* v, void* o,
             int64_t batch, int64_t heads, int64_t tokens, int64_t head_dim, void* stream,
             char* message, size_t message_size);

/* The same with the caller's scratch memory: `workspace` must hold at least the bytes
 * attn_workspace_bytes gives (it may be NULL when that is 0), on the current device, and must
 * not be used by anything else until the queued work is done. */
int attn_run_with_workspace(const char* id, const void* q, const void* k, const void* v, void* o,
                            int64_t batch, int64_t heads, int64_t tokens, int64_t head_dim,
                            void* workspace, size_t workspace_bytes, void* stream, char* message,
                            size_t message_size);

/* attn_run on views: Q, K and V share `qkv_strides`, O has `o_strides` (either NULL: contiguous
 * [B, H, N, D]). Only a step whose info has takes_strides accepts views (the others are
 * refused); every stride must be a multiple of 8 elements (16 bytes) and at least head_dim, and
 * the memory O spans must not overlap the memory Q, K or V span. No workspace. */
int attn_run_strided(const char* id, const void* q, const void* k, const void* v, void* o,
                     int64_t batch, int64_t heads, int64_t tokens, int64_t head_dim,
                     const attn_strides* qkv_strides, const attn_strides* o_strides, void* stream,
                     char* message, size_t message_size);

/* attn_run_strided that also writes L, each row's log-sum-exp, for a backward pass:
 * L = log(sum_j exp(s_j)) with s = q K^T / sqrt(D), so that P = exp(s - L) is rebuilt without O.
 * `log_sum_exp` is device memory of the current device, 16-byte aligned, holding
 * batch*heads*tokens fp32 values laid out [B, H, N] (contiguous, whatever the strides of Q, K,
 * V and O), and must not overlap them. Only a step whose info has writes_log_sum_exp accepts it;
 * NULL is refused (attn_run_strided runs without L). */
int attn_run_with_log_sum_exp(const char* id, const void* q, const void* k, const void* v,
                              void* o, void* log_sum_exp, int64_t batch, int64_t heads,
                              int64_t tokens, int64_t head_dim, const attn_strides* qkv_strides,
                              const attn_strides* o_strides, void* stream, char* message,
                              size_t message_size);

/* Everything one launch takes, for attn_launch. Zero it first ({0} in C, {} in C++) and fill in
 * what the call has: every field left zero means what its comment says. */
typedef struct attn_launch_args {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  void* log_sum_exp;  /* NULL, or L as attn_run_with_log_sum_exp writes it: [B, H, N] fp32 */
  int64_t batch, heads, tokens, head_dim;
  /* Keys and values per (b, h), N_k; 0 means `tokens`. Another count is cross-attention: k and
   * v are then [B, H, N_k, D], for a step whose info has takes_kv_tokens: contiguous, or views
   * with qkv_strides, shared with q (as sequence-first [N, B, H*D] projections give them), for a
   * step that also takes_strides. */
  int64_t kv_tokens;
  /* NULL, or [B, N_k] bytes on the device, nonzero where a key is padding (PyTorch's bool
   * key_padding_mask): those keys get no weight, and a row with no key left is O = 0 (L = -inf).
   * For a step whose info has takes_key_padding_mask; the others refuse it. */
  const void* key_padding_mask;
  /* Strides of views, as attn_run_strided takes them; all zero (or the contiguous strides) means
   * contiguous [B, H, N, D], which every step takes. */
  attn_strides qkv_strides;
  attn_strides o_strides;
  /* The factor on the scores, s = scale * q K^T; 0 means 1/sqrt(head_dim). Finite, > 0. */
  double scale;
  /* Scratch memory as attn_run_with_workspace takes it; NULL: a step that needs some gets it
   * stream-ordered, as attn_run does. */
  void* workspace;
  size_t workspace_bytes;
  void* stream;  /* a cudaStream_t of the current device; NULL: the legacy default stream */
  /* 1: the caller vouches that q, k, v, o, log_sum_exp and the workspace are device memory of
   * the current device and that the stream belongs to it (a framework whose tensors carry their
   * device does). The library then skips the CUDA queries that would check it
   * (cudaPointerGetAttributes per pointer, cudaStreamGetDevice): the call makes no CUDA call but
   * the launch. Alignment, sizes and overlaps are still checked: that is arithmetic. */
  int pointers_checked_by_caller;
  /* ATTN_DTYPE_FP16 (0) or ATTN_DTYPE_BF16 for q, k, v and o; a step that does not take bf16
   * (takes_bf16 0) refuses it. */
  int dtype;
  /* ATTN_CAUSAL_NONE (0), ATTN_CAUSAL_TOP_LEFT or ATTN_CAUSAL_BOTTOM_RIGHT; a step whose info
   * has takes_causal 0 refuses a causal mask. Combines with key_padding_mask. */
  int causal;
  /* Packed sequences of different lengths (FlashAttention's varlen layout; since ABI version 9),
   * for a step whose info has takes_packed_sequences: NULL, or device int32 [batch + 1], the
   * prefix sums of the sequences' query lengths (0, n_0, n_0 + n_1, ..., total_tokens), and
   * cu_seqlens_k the same of their key lengths (NULL: the same as cu_seqlens_q). Then q and o
   * are [total_tokens, H, D], k and v [total_kv_tokens, H, D] (total_kv_tokens 0: total_tokens),
   * sequence b's rows one after another from row cu_seqlens[b], each sequence attending within
   * itself; `batch` is the number of sequences, `tokens` and `kv_tokens` the longest query and
   * key lengths (kv_tokens 0: tokens), the strides' token and head members those of these
   * tensors (the batch member unused), the causal diagonal each sequence's own, and L
   * [H, total_tokens]. Not with key_padding_mask. The library does not read the prefix sums
   * (that would synchronise): the caller vouches that they start at 0, never decrease, end at
   * the totals, and that no sequence is longer than `tokens` (`kv_tokens`). */
  const void* cu_seqlens_q;
  const void* cu_seqlens_k;
  int64_t total_tokens;
  int64_t total_kv_tokens;
} attn_launch_args;

/* The one general launch: attn_run, attn_run_with_workspace, attn_run_strided and
 * attn_run_with_log_sum_exp are each a case of it. Nothing in it synchronises or allocates
 * outside stream order, so a call may be captured into a CUDA graph (with a workspace given, or
 * on a GPU with memory pools). */
int attn_launch(const char* id, const attn_launch_args* args, char* message,
                size_t message_size);

/* A backward step (is_backward): dQ, dK and dV from dO, given the forward's O and L (as a step
 * that writes_log_sum_exp wrote them). Tensors of `dtype` (fp16 unless set): Q, O, dO and dQ
 * [B, H, N, D], K, V, dK and dV [B, H, N_k, D], L fp32 [B, H, N]. Q, K, V, O and dO contiguous, or
 * views (qkv_strides, o_strides, d_o_strides) for a step whose info has takes_strides; dQ, dK, dV
 * and L always contiguous. dQ, dK and dV must not overlap the memory the inputs span or each
 * other. Zero it first; fields left zero mean what the comments of attn_launch_args say
 * (kv_tokens 0: as many as tokens; scale 0: 1/sqrt(head_dim); workspace NULL: allocated
 * stream-ordered; strides zero: contiguous). The forward's masks come back here: kv_tokens,
 * key_padding_mask and causal must be those the forward ran with (kv_tokens, key_padding_mask
 * and the strides: since ABI version 8). */
typedef struct attn_backward_args {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* d_o;
  const void* log_sum_exp;
  void* dq;
  void* dk;
  void* dv;
  int64_t batch, heads, tokens, head_dim;
  /* Keys and values per (b, h), N_k, as in attn_launch_args; 0 means `tokens`. Another count is
   * cross-attention, for a step whose info has takes_kv_tokens; the others refuse it. */
  int64_t kv_tokens;
  /* NULL, or the forward's [B, N_k] bytes on the device, nonzero where a key is padding, for a
   * step whose info has takes_key_padding_mask (the others refuse it): a padded key gets
   * dK = dV = 0, and a row that saw no key (L = -inf) gets dQ = 0. */
  const void* key_padding_mask;
  /* Strides of views, as attn_launch_args takes them, for a step whose info has takes_strides
   * (the others refuse anything but contiguous tensors): Q, K and V share qkv_strides (as the
   * forward read them from one packed projection; K and V with N_k rows), O has o_strides (as
   * the forward wrote it), dO d_o_strides (as autograd hands it over). Each stride a multiple of
   * 8 elements (16 bytes) and at least head_dim; all zero (or the contiguous strides) means
   * contiguous [B, H, N, D]. */
  attn_strides qkv_strides;
  attn_strides o_strides;
  attn_strides d_o_strides;
  double scale;
  void* workspace;
  size_t workspace_bytes;
  void* stream;
  int pointers_checked_by_caller;
  int deterministic;  /* 1: no atomics, the same bits on every run (slower) */
  int dtype;          /* ATTN_DTYPE_FP16 (0) or ATTN_DTYPE_BF16, as in attn_launch_args */
  int causal;         /* the forward's causal mask, as in attn_launch_args */
  /* Packed sequences (since ABI version 10), for a step whose info has takes_packed_sequences:
   * the forward's cu_seqlens_q, cu_seqlens_k, total_tokens and total_kv_tokens, as in
   * attn_launch_args. Then Q, O, dO and dQ are [total_tokens, H, D], K, V, dK and dV
   * [total_kv_tokens, H, D] (dQ, dK and dV contiguous; the others may have token and head
   * strides, the batch member unused), L [H, total_tokens]; batch, tokens and kv_tokens as there.
   * Not with key_padding_mask. */
  const void* cu_seqlens_q;
  const void* cu_seqlens_k;
  int64_t total_tokens;
  int64_t total_kv_tokens;
} attn_backward_args;

/* Runs backward step `id`; refuses a forward step. Queued on the stream, like attn_launch. */
int attn_launch_backward(const char* id, const attn_backward_args* args, char* message,
                         size_t message_size);

/* A call to serve, for attn_choose_step: its direction, shape, dtype and masks, and the GPU. */
typedef struct attn_call {
  int backward;            /* 0: the forward, by a step that writes L (autograd needs it);
                              1: the backward (dQ, dK, dV) */
  int64_t batch, heads, tokens, head_dim;
  int64_t kv_tokens;       /* keys, N_k; 0: as many as tokens */
  int dtype;               /* ATTN_DTYPE_FP16 or ATTN_DTYPE_BF16 */
  int key_padding_mask;    /* 1: the call has a key-padding mask */
  int causal;              /* ATTN_CAUSAL_* */
  int deterministic;       /* 1: a backward in its deterministic mode */
  int compute_capability;  /* 0: the current GPU (its shared memory too); else a GPU of this
                              compute capability with its usual opt-in shared memory per block
                              (75, 80, 86, 89, 90, 120), which needs no GPU here */
} attn_call;

/* Which step serves `call` on the GPU, the one question every layer above asks (the operator,
 * the SDPA entry, the module swaps): the highest-numbered step that serves it, a forward step that
 * writes L or a backward step, never a baseline or a speed reference. Its id is written into
 * `id` (id_size bytes). ATTN_REFUSED when none does, with each candidate's reason. */
int attn_choose_step(const attn_call* call, char* id, size_t id_size, char* message,
                     size_t message_size);

#ifdef __cplusplus
}
#endif

#endif /* ATTENTION_STEPS_H */
