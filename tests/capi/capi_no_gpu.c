/* The C ABI from a plain C program that includes attention_steps.h and nothing of the harness:
 * the library loads, lists its steps, refuses bad calls with status 2 and a message, and, on a
 * machine without a GPU, answers every question about "this GPU" with status 3 and "no CUDA
 * device found (...)" instead of aborting. With a GPU, the no-device checks are replaced by
 * checks of the device's answers (the GPU suite, capi_gpu_tests, runs the steps).
 * Exit 0 when every check passed, 1 otherwise; each check prints one line. */
#include <stdio.h>
#include <string.h>

#include "attention_steps.h"

static int passed = 0, failed = 0;

static void expect(int condition, const char* what, const char* detail) {
  if (condition) {
    ++passed;
    printf("ok      %s\n", what);
  } else {
    ++failed;
    printf("FAILED  %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  }
}

/* status == expected and the message holds `fragment` */
static void expect_answer(int status, int expected, const char* message, const char* fragment,
                          const char* what) {
  char detail[1400];
  snprintf(detail, sizeof detail, "status %d (expected %d), message '%s' (expected to hold '%s')",
           status, expected, message, fragment);
  expect(status == expected && strstr(message, fragment) != NULL, what, detail);
}

/* A call of step `info` on 3 packed sequences of 100 query tokens (64 the longest, one head of
 * 64): through attn_launch or, for a backward step, attn_launch_backward; every pointer NULL but
 * the prefix sums and the mask given. FILL_PACKED_CALL sets the fields the two structs share. */
#define FILL_PACKED_CALL(call)                 \
  do {                                         \
    memset(&(call), 0, sizeof(call));          \
    (call).batch = 3;                          \
    (call).heads = 1;                          \
    (call).tokens = (call).head_dim = 64;      \
    (call).total_tokens = 100;                 \
    (call).total_kv_tokens = total_kv_tokens;  \
    (call).cu_seqlens_q = cu_seqlens_q;        \
    (call).key_padding_mask = mask;            \
  } while (0)

static int launch_packed(const attn_step_info* info, const void* cu_seqlens_q, const void* mask,
                         int64_t total_kv_tokens, char* message, size_t message_size) {
  if (info->is_backward) {
    attn_backward_args call;
    FILL_PACKED_CALL(call);
    return attn_launch_backward(info->id, &call, message, message_size);
  } else {
    attn_launch_args call;
    FILL_PACKED_CALL(call);
    return attn_launch(info->id, &call, message, message_size);
  }
}

/* With a GPU: the backward's pointer and overlap checks in cross-attention with a mask, by the
 * backward step this GPU would run for it. The caller vouches for the pointers
 * (pointers_checked_by_caller), so host memory of this program stands in for the tensors: only
 * alignment and overlaps are judged, and every call here is refused before anything launches.
 * K, V, dK and dV are N_k = 64 rows long, Q, O, dO and dQ N = 16: an overlap within K's N_k rows
 * but past N rows must be seen. */
static void backward_pointer_checks(void) {
  enum { N = 16, KEYS = 64, D = 64 };
  static char memory[98304] __attribute__((aligned(16)));
  char message[1024], id[32] = "";
  attn_call call;
  attn_backward_args args;
  memset(&call, 0, sizeof call);
  call.backward = 1;
  call.batch = call.heads = 1;
  call.tokens = N;
  call.kv_tokens = KEYS;
  call.head_dim = D;
  call.key_padding_mask = 1;
  if (attn_choose_step(&call, id, sizeof id, message, sizeof message) != ATTN_OK) {
    printf("        skipped: the backward's pointer checks in cross-attention with a mask (%s)\n",
           message);
    return;
  }
  printf("        the backward's pointer checks, by %s\n", id);
  memset(&args, 0, sizeof args);
  args.batch = args.heads = 1;
  args.tokens = N;
  args.kv_tokens = KEYS;
  args.head_dim = D;
  args.pointers_checked_by_caller = 1;
  /* q 2 KB, k and v 8 KB each, o and d_o 2 KB, L 64 bytes, the mask 64 bytes; dq, dk, dv. */
  args.q = memory;
  args.k = memory + 4096;
  args.v = memory + 16384;
  args.o = memory + 28672;
  args.d_o = memory + 32768;
  args.log_sum_exp = memory + 36864;
  args.key_padding_mask = memory + 40960;
  args.dq = memory + 45056;
  args.dk = memory + 49152;
  args.dv = memory + 61440;
  {
    attn_backward_args bad = args;
    bad.dk = memory + 4096 + 4096; /* inside K's 64 rows, past what 16 rows would span */
    expect_answer(attn_launch_backward(id, &bad, message, sizeof message), ATTN_REFUSED, message,
                  "dk overlaps k", "dk overlapping K's N_k rows is refused");
  }
  {
    attn_backward_args bad = args;
    bad.dv = memory + 49152 + 4096;
    expect_answer(attn_launch_backward(id, &bad, message, sizeof message), ATTN_REFUSED, message,
                  "dv overlaps dk", "dv overlapping dk is refused");
  }
  {
    attn_backward_args bad = args;
    bad.key_padding_mask = memory + 40960 + 1;
    expect_answer(attn_launch_backward(id, &bad, message, sizeof message), ATTN_REFUSED, message,
                  "key_padding_mask", "a misaligned key-padding mask is refused, naming it");
    expect(strstr(message, "16-byte aligned") != NULL, "... as not 16-byte aligned", message);
  }
  {
    attn_backward_args bad = args;
    bad.dq = memory + 40960;
    expect_answer(attn_launch_backward(id, &bad, message, sizeof message), ATTN_REFUSED, message,
                  "dq overlaps key_padding_mask", "dq overlapping the mask is refused");
  }
  {
    attn_backward_args bad = args;
    bad.log_sum_exp = NULL;
    expect_answer(attn_launch_backward(id, &bad, message, sizeof message), ATTN_REFUSED, message,
                  "log_sum_exp is NULL", "a NULL L is refused");
  }
  {
    /* O as a view of 2 rows a token (3968 bytes from its first element to its last, 2 KB
     * contiguous): dq right after O's contiguous 2 KB lies inside the view, and is refused by a
     * step that takes views; one that does not refuses the view itself. */
    attn_backward_args bad = args;
    attn_step_info info;
    int i, takes_strides = 0;
    for (i = 0; i < attn_step_count(); ++i) {
      if (attn_step_get(i, &info) == ATTN_OK && strcmp(info.id, id) == 0) takes_strides = info.takes_strides;
    }
    bad.o_strides.batch = bad.o_strides.head = 2 * N * D;
    bad.o_strides.token = 2 * D;
    bad.dq = memory + 28672 + 2048;
    if (takes_strides) {
      expect_answer(attn_launch_backward(id, &bad, message, sizeof message), ATTN_REFUSED, message,
                    "dq overlaps o", "dq inside the memory a strided O spans is refused");
      /* Q likewise: 2 rows a token, dq in the 2 KB between Q's contiguous end and K. */
      bad = args;
      bad.qkv_strides.batch = bad.qkv_strides.head = 2 * KEYS * D;
      bad.qkv_strides.token = 2 * D;
      bad.dq = memory + 2048;
      expect_answer(attn_launch_backward(id, &bad, message, sizeof message), ATTN_REFUSED, message,
                    "dq overlaps q", "dq inside the memory a strided Q spans is refused");
    } else {
      expect_answer(attn_launch_backward(id, &bad, message, sizeof message), ATTN_REFUSED, message,
                    "reads contiguous", "a step without takes_strides refuses a strided O");
    }
  }
}

int main(void) {
  char message[1024];
  int i, count, index_v0 = -1, index_eager = -1, last_step = -1, first_baseline = -1;
  attn_step_info info;

  expect(attn_abi_version() == ATTN_ABI_VERSION, "the library speaks this header's ABI version",
         NULL);

  /* Listing: needs no GPU. */
  count = attn_step_count();
  expect(count >= 2, "at least one step and the eager baseline are registered", NULL);
  for (i = 0; i < count; ++i) {
    char what[160];
    int status = attn_step_get(i, &info), sane;
    sane = status == ATTN_OK && info.id != NULL && info.id[0] != '\0' && info.title != NULL &&
           info.title[0] != '\0' && info.head_dim_count >= 1 &&
           info.head_dim_count <= ATTN_MAX_HEAD_DIMS && info.min_compute_capability >= 75 &&
           (info.max_compute_capability == 0 ||
            info.max_compute_capability >= info.min_compute_capability);
    snprintf(what, sizeof what, "step %d (%s) states an id, a title, head dims, a GPU range", i,
             status == ATTN_OK && info.id ? info.id : "?");
    expect(sane, what, NULL);
    if (status != ATTN_OK) continue;
    printf("        %-6s %d head dims (%d..%d), compute capability %d to %d (0: any newer), %s\n",
           info.id, info.head_dim_count, info.head_dims[0],
           info.head_dims[info.head_dim_count - 1], info.min_compute_capability,
           info.max_compute_capability, info.title);
    if (strcmp(info.id, "v0") == 0) index_v0 = i;
    if (strcmp(info.id, "eager") == 0) index_eager = i;
    if (!info.is_baseline) last_step = i;
    if (info.is_baseline && first_baseline < 0) first_baseline = i;
  }
  expect(index_v0 == 0, "v0 is listed first", NULL);
  expect(index_eager >= 0 && first_baseline > last_step,
         "the eager baselines (forward and backward) come after the steps", NULL);
  expect(attn_step_get(count, &info) == ATTN_REFUSED && attn_step_get(-1, &info) == ATTN_REFUSED &&
             attn_step_get(0, NULL) == ATTN_REFUSED,
         "an index out of range or a NULL info is refused (2)", NULL);

  /* Refusals that need no GPU. */
  expect_answer(attn_check("v99_nope", 1, 1, 64, 64, message, sizeof message), ATTN_REFUSED,
                message, "unknown step 'v99_nope'", "an unknown step id is refused");
  expect_answer(attn_check(NULL, 1, 1, 64, 64, message, sizeof message), ATTN_REFUSED, message,
                "no step id", "a NULL step id is refused");
  expect_answer(attn_check("v0", 1, 1, 0, 64, message, sizeof message), ATTN_REFUSED, message,
                "tokens 0", "tokens 0 is refused, naming the size");
  expect_answer(attn_check("v0", -3, 1, 5, 64, message, sizeof message), ATTN_REFUSED, message,
                "batch -3", "a negative batch is refused");
  expect_answer(attn_check("v0", 1, 1, 64, 48, message, sizeof message), ATTN_REFUSED, message,
                "--head-dim 48", "head dim 48 is refused with the step's own reason");
  expect_answer(attn_check("v0", (int64_t)1 << 40, 1, 1, 64, message, sizeof message),
                ATTN_REFUSED, message, "larger than", "a batch past the int range is refused");
  expect_answer(attn_run("v0", NULL, NULL, NULL, NULL, 1, 1, 64, 48, NULL, message, sizeof message),
                ATTN_REFUSED, message, "--head-dim 48", "attn_run refuses head dim 48 too");
  expect_answer(attn_launch("v0", NULL, message, sizeof message), ATTN_REFUSED, message,
                "args is NULL", "attn_launch refuses NULL arguments");
  expect_answer(attn_launch_backward("v0", NULL, message, sizeof message), ATTN_REFUSED, message,
                "args is NULL", "attn_launch_backward refuses NULL arguments");
  for (i = 0; i < count; ++i) {  /* a backward step and a forward one, each refused by the other's entry */
    attn_launch_args call = {0};
    attn_backward_args backward = {0};
    if (attn_step_get(i, &info) != ATTN_OK || !info.is_backward) continue;
    call.batch = call.heads = 1;
    call.tokens = call.head_dim = 64;
    expect_answer(attn_launch(info.id, &call, message, sizeof message), ATTN_REFUSED, message,
                  "backward step", "attn_launch refuses a backward step");
    backward.batch = backward.heads = 1;
    backward.tokens = backward.head_dim = 64;
    expect_answer(attn_launch_backward("v0", &backward, message, sizeof message), ATTN_REFUSED,
                  message, "forward step", "attn_launch_backward refuses a forward step");
    break;
  }
  {
    attn_launch_args call = {0};
    call.batch = 1;
    call.heads = 1;
    call.tokens = 64;
    call.head_dim = 64;
    call.kv_tokens = 32;
    expect_answer(attn_launch("v1", &call, message, sizeof message), ATTN_REFUSED, message,
                  "does not serve --kv-tokens 32",
                  "keys and values of another count are refused by a step that takes N_k = N");
    call.kv_tokens = 0;
    call.scale = -1.0;
    expect_answer(attn_launch("v0", &call, message, sizeof message), ATTN_REFUSED, message,
                  "scale", "a negative scale is refused");
    call.scale = 0.0;
    call.dtype = 7;
    expect_answer(attn_launch("v0", &call, message, sizeof message), ATTN_REFUSED, message,
                  "dtype 7", "an unknown dtype is refused");
    call.dtype = ATTN_DTYPE_BF16;
    expect_answer(attn_launch("v0", &call, message, sizeof message), ATTN_REFUSED, message,
                  "does not serve --dtype bf16", "a step that takes fp16 only refuses bf16");
  }
  /* Packed sequences (attn_launch_args::cu_seqlens_q, ABI version 9; the backward's
   * attn_backward_args::cu_seqlens_q, version 10), judged before the GPU is asked anything: a step
   * without takes_packed_sequences refuses them, naming them; one with it refuses them beside a
   * key-padding mask, and every step refuses the totals or cu_seqlens_k without cu_seqlens_q. */
  for (i = 0; i < count; ++i) {
    static int fake_sums[4] __attribute__((aligned(16)));
    static char fake_mask[64] __attribute__((aligned(16)));
    char what[200];
    if (attn_step_get(i, &info) != ATTN_OK) continue;
    if (!info.takes_packed_sequences) {
      snprintf(what, sizeof what, "%s (takes_packed_sequences 0) refuses packed sequences", info.id);
      expect_answer(launch_packed(&info, fake_sums, NULL, 0, message, sizeof message), ATTN_REFUSED,
                    message, "does not serve packed sequences", what);
    } else {
      snprintf(what, sizeof what, "%s refuses a key-padding mask with packed sequences", info.id);
      expect_answer(launch_packed(&info, fake_sums, fake_mask, 0, message, sizeof message), ATTN_REFUSED,
                    message, "packed sequences take no key-padding mask", what);
      snprintf(what, sizeof what, "%s refuses other key totals without cu_seqlens_k", info.id);
      expect_answer(launch_packed(&info, fake_sums, NULL, 50, message, sizeof message), ATTN_REFUSED,
                    message, "give cu_seqlens_k too", what);
    }
    snprintf(what, sizeof what, "%s refuses packed totals without cu_seqlens_q", info.id);
    expect_answer(launch_packed(&info, NULL, NULL, 50, message, sizeof message), ATTN_REFUSED, message,
                  "without cu_seqlens_q", what);
  }
  /* The backward's N_k and key-padding mask (attn_backward_args, ABI version 8): a backward step
   * that does not take them refuses them before anything else, naming the flag; one that does
   * goes on to the next check (no CUDA device here, or the NULL pointers on a GPU). */
  for (i = 0; i < count; ++i) {
    static char fake_mask[64] __attribute__((aligned(16)));
    attn_backward_args backward = {0};
    char what[200];
    int status;
    if (attn_step_get(i, &info) != ATTN_OK || !info.is_backward) continue;
    backward.batch = backward.heads = 1;
    backward.tokens = backward.head_dim = 64;
    backward.kv_tokens = 32;
    status = attn_launch_backward(info.id, &backward, message, sizeof message);
    if (!info.takes_kv_tokens) {
      snprintf(what, sizeof what, "%s (takes_kv_tokens 0) refuses the backward's kv_tokens", info.id);
      expect_answer(status, ATTN_REFUSED, message, "does not serve --kv-tokens 32", what);
    } else {
      snprintf(what, sizeof what, "%s (takes_kv_tokens 1) takes the backward's kv_tokens", info.id);
      expect(status != ATTN_OK && strstr(message, "--kv-tokens") == NULL, what, message);
    }
    backward.kv_tokens = 0;
    backward.key_padding_mask = fake_mask;
    status = attn_launch_backward(info.id, &backward, message, sizeof message);
    if (!info.takes_key_padding_mask) {
      snprintf(what, sizeof what, "%s (takes_key_padding_mask 0) refuses the backward's mask", info.id);
      expect_answer(status, ATTN_REFUSED, message, "does not serve --key-padding", what);
    } else {
      snprintf(what, sizeof what, "%s (takes_key_padding_mask 1) takes the backward's mask", info.id);
      expect(status != ATTN_OK && strstr(message, "--key-padding") == NULL, what, message);
    }
    backward.key_padding_mask = NULL;
    backward.kv_tokens = -3;
    snprintf(what, sizeof what, "%s: a negative kv_tokens is refused, naming it", info.id);
    expect_answer(attn_launch_backward(info.id, &backward, message, sizeof message), ATTN_REFUSED,
                  message, "kv_tokens -3", what);
    backward.kv_tokens = 0;
  }
  /* The backward's views (attn_backward_args' strides, ABI version 8), judged as the forward's
   * before anything asks the GPU: a backward step without takes_strides refuses them, naming
   * itself and the views; one with it goes on to the next check (no CUDA device here, the NULL
   * pointers on a GPU); a stride that breaks 16-byte alignment is refused by every step. Q, K, V
   * from a packed [B, N, 3, H, D] projection, O and dO as [B, N, H, D]. */
  for (i = 0; i < count; ++i) {
    enum { H = 2, N = 64, D = 64 };
    const attn_strides packed = {N * 3 * H * D, D, 3 * H * D}, sequence = {N * H * D, D, H * D},
                       contiguous = {H * N * D, N * D, D}, odd = {N * 3 * H * D, D, 3 * H * D + 4};
    attn_backward_args backward = {0};
    char what[200];
    int status;
    if (attn_step_get(i, &info) != ATTN_OK || !info.is_backward) continue;
    backward.batch = 2;
    backward.heads = H;
    backward.tokens = N;
    backward.head_dim = D;
    backward.qkv_strides = packed;
    backward.o_strides = sequence;
    status = attn_launch_backward(info.id, &backward, message, sizeof message);
    if (!info.takes_strides) {
      snprintf(what, sizeof what, "%s (takes_strides 0) refuses the backward's views, naming itself "
               "and them", info.id);
      expect_answer(status, ATTN_REFUSED, message, "reads contiguous", what);
      expect(strstr(message, info.id) != NULL && strstr(message, "qkv_strides, o_strides") != NULL,
             what, message);
    } else {
      snprintf(what, sizeof what, "%s (takes_strides 1) takes the backward's views", info.id);
      expect(status != ATTN_OK && strstr(message, "contiguous") == NULL &&
                 strstr(message, "strides") == NULL,
             what, message);
    }
    backward.qkv_strides = contiguous; /* the contiguous strides given explicitly: no view */
    backward.o_strides = contiguous;
    backward.d_o_strides = sequence;
    status = attn_launch_backward(info.id, &backward, message, sizeof message);
    snprintf(what, sizeof what, "%s: dO alone as a view is %s", info.id,
             info.takes_strides ? "taken" : "refused, naming d_o_strides");
    if (!info.takes_strides) {
      expect_answer(status, ATTN_REFUSED, message, "(d_o_strides describe views)", what);
    } else {
      expect(status != ATTN_OK && strstr(message, "strides") == NULL, what, message);
    }
    backward.d_o_strides = contiguous;
    status = attn_launch_backward(info.id, &backward, message, sizeof message);
    snprintf(what, sizeof what, "%s: the contiguous strides given explicitly are no views", info.id);
    expect(status != ATTN_OK && strstr(message, "strides") == NULL, what, message);
    backward.qkv_strides = odd;
    snprintf(what, sizeof what, "%s: a qkv stride that breaks 16-byte alignment is refused", info.id);
    expect_answer(attn_launch_backward(info.id, &backward, message, sizeof message), ATTN_REFUSED,
                  message, "qkv strides", what);
    expect(strstr(message, "multiple of 8") != NULL, what, message);
    backward.qkv_strides = contiguous;
    backward.d_o_strides = odd;
    snprintf(what, sizeof what, "%s: so is a dO stride, naming d_o", info.id);
    expect_answer(attn_launch_backward(info.id, &backward, message, sizeof message), ATTN_REFUSED,
                  message, "d_o strides", what);
    backward.d_o_strides = contiguous;
    backward.o_strides.token = (int64_t)1 << 60;
    snprintf(what, sizeof what, "%s: strides whose view spans more than 2^63 bytes are refused", info.id);
    expect_answer(attn_launch_backward(info.id, &backward, message, sizeof message), ATTN_REFUSED,
                  message, "2^63 bytes", what);
  }
  for (i = 0; i < count; ++i) { /* step 6 says it takes bf16; v0 says it does not */
    if (attn_step_get(i, &info) != ATTN_OK) continue;
    if (strcmp(info.id, "v6") == 0) expect(info.takes_bf16 == 1, "v6 takes bf16 (takes_bf16)", NULL);
    if (strcmp(info.id, "v0") == 0) expect(info.takes_bf16 == 0, "v0 takes fp16 only", NULL);
    if (strcmp(info.id, "v6") == 0) expect(info.takes_kv_tokens == 1, "v6 serves cross-attention", NULL);
    if (strcmp(info.id, "v1") == 0) expect(info.takes_kv_tokens == 0, "v1 does not", NULL);
  }
  {
    const attn_strides packed = {197 * 3 * 12 * 64, 64, 3 * 12 * 64};
    expect_answer(attn_run_strided("v0", NULL, NULL, NULL, NULL, 2, 12, 197, 64, &packed, NULL,
                                   NULL, message, sizeof message),
                  ATTN_REFUSED, message, "contiguous", "a step that reads contiguous tensors only refuses views");
    for (i = 0; i < count; ++i) {
      if (attn_step_get(i, &info) != ATTN_OK || !info.takes_strides) continue;
      const attn_strides odd = {197 * 3 * 12 * 64, 64, 3 * 12 * 64 + 4};
      expect_answer(attn_run_strided(info.id, NULL, NULL, NULL, NULL, 2, 12, 197, 64, &odd, NULL,
                                     NULL, message, sizeof message),
                    ATTN_REFUSED, message, "multiple of 8", "a stride that breaks 16-byte alignment is refused");
      break;
    }
  }

  {
    /* L (the log-sum-exp): steps 6, 7 and 8 write it, the earlier ones do not. */
    static char fake_rows[64] __attribute__((aligned(16)));
    int writers = 0;
    for (i = 0; i < count; ++i) {
      if (attn_step_get(i, &info) != ATTN_OK) continue;
      const int expected = strcmp(info.id, "v6") == 0 || strcmp(info.id, "v7") == 0 ||
                           strcmp(info.id, "v8") == 0;
      writers += info.writes_log_sum_exp;
      expect(info.writes_log_sum_exp == expected, "writes_log_sum_exp is set for v6, v7 and v8 alone",
             info.id);
    }
    expect(writers == 3, "three steps write L", NULL);
    expect_answer(attn_run_with_log_sum_exp("v0", NULL, NULL, NULL, NULL, fake_rows, 1, 1, 64, 64,
                                            NULL, NULL, NULL, message, sizeof message),
                  ATTN_REFUSED, message, "does not write L", "a step that writes no L is refused L");
    expect_answer(attn_run_with_log_sum_exp("v6", NULL, NULL, NULL, NULL, NULL, 1, 1, 64, 64, NULL,
                                            NULL, NULL, message, sizeof message),
                  ATTN_REFUSED, message, "log_sum_exp is NULL", "a NULL L is refused");
  }

  {
    size_t bytes = 1;
    int status = attn_shared_bytes("v0", 197, 64, &bytes, message, sizeof message);
    expect(status == ATTN_OK && bytes == 0, "v0 needs no shared memory (attn_shared_bytes)", message);
    bytes = 0;
    status = attn_workspace_bytes("eager", 32, 12, 197, 64, &bytes, message, sizeof message);
    expect(status == ATTN_OK && bytes == (size_t)32 * 12 * 197 * 197 * 2,
           "eager's workspace is the B*H*N*N fp16 scores (attn_workspace_bytes)", message);
    for (i = 0; i < count; ++i) {
      if (attn_step_get(i, &info) != ATTN_OK || !info.uses_shared_memory) continue;
      status = attn_shared_bytes(info.id, 197, info.head_dims[0], &bytes, message, sizeof message);
      expect(status == ATTN_OK && bytes > 0, "a step that uses shared memory states how much", info.id);
      break;
    }
  }

  /* The message buffer: cut to its size, always terminated; size 0 leaves it alone. */
  {
    char small[8];
    memset(small, 'x', sizeof small);
    attn_check("v99_nope", 1, 1, 1, 64, small, sizeof small);
    expect(small[7] == '\0' && strlen(small) == 7, "a long message is cut to the buffer, terminated",
           NULL);
    memset(small, 'x', sizeof small);
    attn_check("v99_nope", 1, 1, 1, 64, small, 0);
    expect(small[0] == 'x', "message_size 0 writes nothing", NULL);
    expect(attn_check("v99_nope", 1, 1, 1, 64, NULL, 100) == ATTN_REFUSED,
           "a NULL message buffer is allowed", NULL);
  }

  /* The current GPU, or the lack of one. */
  {
    char name[256] = "";
    int capability = 0, device = -1, status;
    size_t shared = 0;
    int64_t largest = 0;
    status = attn_device(&device, name, sizeof name, &capability, &shared, message, sizeof message);
    if (status == ATTN_CUDA_ERROR && strstr(message, "no CUDA device") != NULL) {
      static char fake[64] __attribute__((aligned(16)));
      printf("        no CUDA device here: %s\n", message);
      expect(1, "attn_device answers 3, 'no CUDA device found (...)'", NULL);
      expect_answer(attn_check("v0", 2, 3, 65, 64, message, sizeof message), ATTN_CUDA_ERROR,
                    message, "no CUDA device", "attn_check answers 'no CUDA device' (3)");
      expect_answer(attn_max_tokens("v0", 64, &largest, message, sizeof message), ATTN_CUDA_ERROR,
                    message, "no CUDA device", "attn_max_tokens answers 'no CUDA device' (3)");
      expect_answer(attn_run("v0", fake, fake, fake, fake + 32, 1, 1, 1, 64, NULL, message,
                             sizeof message),
                    ATTN_CUDA_ERROR, message, "no CUDA device",
                    "attn_run answers 'no CUDA device' (3), launching nothing");
      expect_answer(attn_run("eager", fake, fake, fake, fake + 32, 1, 1, 1, 64, NULL, message,
                             sizeof message),
                    ATTN_CUDA_ERROR, message, "no CUDA device",
                    "so does the baseline that needs a workspace");
    } else {
      char detail[1400];
      snprintf(detail, sizeof detail, "status %d, message '%s'", status, message);
      expect(status == ATTN_OK && name[0] != '\0' && capability >= 30 && shared > 0 && device >= 0,
             "with a GPU, attn_device names it and its limits", detail);
      printf("        GPU %d: %s, compute capability %d, %zu bytes of shared memory per block\n",
             device, name, capability, shared);
      expect_answer(attn_run("v0", NULL, NULL, NULL, NULL, 1, 1, 1, 64, NULL, message,
                             sizeof message),
                    ATTN_REFUSED, message, "q is NULL", "attn_run refuses NULL pointers (2)");
      backward_pointer_checks();
    }
  }

  /* Which step serves a call: asked for a GPU by its compute capability, no GPU needed. The
   * expected answer is found here the slow way, from the listing: the highest-numbered step
   * (id vN) of the right direction whose head dims, GPU range and shared memory admit the call
   * (the opt-in shared memory per block of a T4, an A100, an RTX 30xx, an H100). */
  {
    static const int capabilities[] = {75, 80, 86, 90};
    static const size_t shared_budgets[] = {65536, 166912, 101376, 232448};
    static const int head_dims[] = {64, 128, 48};
    int c, h, backward;
    for (backward = 0; backward <= 1; ++backward) {
      for (c = 0; c < 4; ++c) {
        for (h = 0; h < 3; ++h) {
          attn_call call;
          char chosen[32] = "", expected[32] = "", what[200];
          int status, d, serves_d;
          memset(&call, 0, sizeof call);
          call.backward = backward;
          call.batch = 1;
          call.heads = 1;
          call.tokens = 197;
          call.head_dim = head_dims[h];
          call.compute_capability = capabilities[c];
          for (i = 0; i < count; ++i) {
            if (attn_step_get(i, &info) != ATTN_OK || info.is_baseline || info.id[0] != 'v' ||
                strspn(info.id + 1, "0123456789") != strlen(info.id + 1) ||
                info.is_backward != backward || (!backward && !info.writes_log_sum_exp)) {
              continue;
            }
            size_t shared = 0;
            serves_d = 0;
            for (d = 0; d < info.head_dim_count; ++d) serves_d |= info.head_dims[d] == head_dims[h];
            if (serves_d && (attn_shared_bytes(info.id, 197, head_dims[h], &shared, message, sizeof message) != ATTN_OK ||
                             shared > shared_budgets[c])) {
              serves_d = 0;
            }
            if (serves_d && capabilities[c] >= info.min_compute_capability &&
                (info.max_compute_capability == 0 || capabilities[c] <= info.max_compute_capability)) {
              snprintf(expected, sizeof expected, "%s", info.id);  /* listed in order: the last wins */
            }
          }
          status = attn_choose_step(&call, chosen, sizeof chosen, message, sizeof message);
          snprintf(what, sizeof what, "attn_choose_step: the %s at D = %d on compute capability %d is %s",
                   backward ? "backward" : "forward", head_dims[h], capabilities[c],
                   expected[0] ? expected : "refused");
          if (expected[0]) {
            expect(status == ATTN_OK && strcmp(chosen, expected) == 0, what, message);
          } else {
            expect_answer(status, ATTN_REFUSED, message, "serves this call", what);
          }
        }
      }
    }
    {
      attn_call call;
      char chosen[32];
      memset(&call, 0, sizeof call);
      call.batch = call.heads = 1;
      call.tokens = 197;
      call.head_dim = 64;
      call.compute_capability = 61;
      expect_answer(attn_choose_step(&call, chosen, sizeof chosen, message, sizeof message),
                    ATTN_REFUSED, message, "not a GPU this library knows",
                    "attn_choose_step refuses a compute capability it has no shared memory for");
      call.compute_capability = 90;
      call.causal = 7;
      expect_answer(attn_choose_step(&call, chosen, sizeof chosen, message, sizeof message),
                    ATTN_REFUSED, message, "causal 7", "attn_choose_step refuses a causal value");
    }
  }

  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
