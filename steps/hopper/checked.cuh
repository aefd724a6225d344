// The checked build of the asynchronous pipeline (cmake -DATTN_CHECKED_PIPELINE=ON).
//
// compute-sanitizer's racecheck does not see the copy engine or the tensor cores, so the races a
// Hopper kernel can have (a stage read before its copy landed, a stage refilled while wgmma still
// reads it, a staging buffer rewritten under a TMA store) pass it, and usually pass the result
// check too: they need unlucky timing to show. In the checked build the pieces of pipeline.cuh
// keep the state the protocol implies and test every rule where it can be broken, on every run:
//
//   read-before-full         a consumer reads a stage it has not acquired by a wait on the
//                            stage's full barrier in this use (or reads it after releasing it)
//   release-before-wgmma     a consumer releases a stage while a committed wgmma group that reads
//                            it has not been waited for
//   arrive-without-wait      a thread releases a stage it has not waited for in this use, or
//                            passes the ping-pong turn it has not waited for: an arrival the
//                            other side counts for a use this thread never saw (the paths where
//                            a warp has no work, which only keep the barrier counts, are where
//                            such waits go missing)
//   unfenced-async-read      a buffer that threads wrote with ordinary stores is handed to an
//                            asynchronous reader (a TMA store, a bulk reduce, wgmma) while one of
//                            those threads has not run fence.proxy.async since its writes
//   write-during-async-read  a thread writes a buffer (O's or dQ's staging tile, v10's dS^T)
//                            before the asynchronous reads of its last contents are known to be
//                            complete: their reader waited for them, then met this thread at a
//                            barrier. Judged on what the protocol guarantees, not on timing: a
//                            write that happens to come late enough still breaks it
//   refill-before-release    the producer arms a stage for a new use before the consumers
//                            released it (no wait on its empty barrier for this use)
//   excluded-tile-loaded     the producer loads a K/V tile that no row of its work tile sees
//                            under the mask policy (policies/mask.cuh): the result is right,
//                            the tile fully masked, but the work is wasted. Judged element by
//                            element (does the work tile's last row see the tile's first key?),
//                            not by the tile arithmetic the producer used
//   watchdog                 a wait that does not complete within 2 s (a wrong parity, a wrong
//                            byte count, a missing arrive): named instead of hanging
//
// The first violation of a launch is kept in a record on the device and read back by the harness
// after the run (StepInfo::pipeline_report): the test or the step's check fails with one line
// that names the rule, the step, the block and the thread. A violation does not change what
// the kernel does; a watchdog's does: from then on every wait gives up at once, so the kernel
// ends (with a wrong result) instead of hanging. Normal builds compile all of it away.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>

#include "cuda_check.hpp"
#include "hopper/ptx.cuh"
#include "step.hpp"

#ifndef ATTN_CHECKED_PIPELINE
#define ATTN_CHECKED_PIPELINE 0
#endif
#ifndef ATTN_STEP_ID
#define ATTN_STEP_ID "step"
#endif

namespace hopper {

// What a rule names. A staging buffer's "slot" is the warpgroup that owns it (O's in the
// forward steps, dQ's in v10); the turn's, the consumer that passed it.
enum class Buffer : int { q, k, v, kv, o_staging, d_o, dq_staging, ds, turn };
enum class Barrier : int { full, empty };
enum class Rule : int {
  none = 0,
  read_before_full,
  release_before_wgmma,
  arrive_without_wait,
  unfenced_async_read,
  write_during_async_read,
  refill_before_release,
  watchdog,
  excluded_tile_loaded,
};
constexpr int kRules = 9;

constexpr uint64_t kWatchdogNanoseconds = 2'000'000'000;

// The first violation of a run: what, where, and who.
struct Violation {
  int rule = 0;  // Rule
  int buffer = 0, barrier = 0, slot = 0, use = 0;
  uint32_t parity = 0;
  int block = 0, thread = 0;
  int give_up = 0;  // set by the watchdog: every checked wait returns at once
};

// One line of text (a small builder that needs no allocation).
struct Line {
  char text[320] = {};
  int length = 0;
  void append(const char* piece) {
    while (*piece != '\0' && length < int(sizeof text) - 1) text[length++] = *piece++;
  }
  void append(long long value) {
    char digits[24];
    int count = 0;
    unsigned long long magnitude = value < 0 ? 0ull - (unsigned long long)value : value;
    do {
      digits[count++] = char('0' + magnitude % 10);
      magnitude /= 10;
    } while (magnitude != 0);
    if (value < 0) append("-");
    while (count > 0) {
      const char digit[2] = {digits[--count], '\0'};
      append(digit);
    }
  }
};

inline const char* buffer_name(int buffer) {
  switch (Buffer(buffer)) {
    case Buffer::q: return "Q";
    case Buffer::k: return "K";
    case Buffer::v: return "V";
    case Buffer::kv: return "K/V";
    case Buffer::o_staging: return "O staging";
    case Buffer::d_o: return "dO";
    case Buffer::dq_staging: return "dQ staging";
    case Buffer::ds: return "dS^T";
    case Buffer::turn: return "ping-pong turn";
  }
  return "?";
}

// "v8: pipeline rule release-before-wgmma broken in block 3, thread 130: released K slot 1
// (use 5) while a committed wgmma group that reads it had not been waited for"
inline void describe(const Violation& v, const char* step, Line& line) {
  static const char* const kNames[kRules] = {
      "none",          "read-before-full",        "release-before-wgmma",  "arrive-without-wait",
      "unfenced-async-read", "write-during-async-read", "refill-before-release", "watchdog",
      "excluded-tile-loaded"};
  line.append(step);
  line.append(": pipeline rule ");
  line.append(kNames[v.rule >= 0 && v.rule < kRules ? v.rule : 0]);
  line.append(" broken in block ");
  line.append((long long)v.block);
  line.append(", thread ");
  line.append((long long)v.thread);
  line.append(": ");
  // "K slot 1 (use 5)"; a staging buffer is named by its owner: "the O staging buffer of
  // warpgroup 0 (use 3)".
  auto named = [&](const char* before, const char* between) {
    line.append(before);
    line.append(buffer_name(v.buffer));
    line.append(between);
    line.append((long long)v.slot);
    line.append(" (use ");
    line.append((long long)v.use);
    line.append(")");
  };
  auto stage = [&] { named("", " slot "); };
  auto written_buffer = [&] {
    if (Buffer(v.buffer) == Buffer::ds) {
      stage();
    } else {
      named("the ", " buffer of warpgroup ");
    }
  };
  switch (Rule(v.rule)) {
    case Rule::read_before_full:
      line.append("read ");
      stage();
      line.append(" without a wait on its full barrier in this use");
      break;
    case Rule::release_before_wgmma:
      line.append("released ");
      stage();
      line.append(" while a committed wgmma group that reads it had not been waited for");
      break;
    case Rule::arrive_without_wait:
      if (Buffer(v.buffer) == Buffer::turn) {
        line.append("passed the ping-pong turn of consumer ");
        line.append((long long)v.slot);
        line.append(" (turn ");
        line.append((long long)v.use);
        line.append(") without having waited for it: the next consumer's next wait counts an "
                    "arrival for a turn this one never took");
      } else {
        line.append("released ");
        stage();
        line.append(" without a wait on its full barrier in this use: the producer counts the "
                    "arrival for a copy this thread never saw land");
      }
      break;
    case Rule::unfenced_async_read:
      line.append("handed ");
      written_buffer();
      line.append(" to an asynchronous reader while this thread had written it with ordinary "
                  "stores and run no fence.proxy.async since (fence after the writes, before the "
                  "barrier that hands the buffer over)");
      break;
    case Rule::write_during_async_read:
      line.append("wrote ");
      written_buffer();
      line.append(" before the asynchronous reads of its last contents were known to be complete "
                  "(their reader must wait for them, then meet the writers at a barrier, before "
                  "anyone writes)");
      break;
    case Rule::refill_before_release:
      line.append("armed ");
      stage();
      line.append(" for a new copy before the consumers released it (no wait on its empty "
                  "barrier for this use)");
      break;
    case Rule::watchdog:
      line.append("the ");
      line.append(v.barrier == int(Barrier::full) ? "full" : "empty");
      line.append(" barrier of ");
      stage();
      line.append(", parity ");
      line.append((long long)v.parity);
      line.append(", did not complete within 2 s: a wrong parity, a wrong byte count or a "
                  "missing arrive");
      break;
    case Rule::excluded_tile_loaded:
      line.append("loaded K/V tile ");
      line.append((long long)v.slot);
      line.append(" for the work tile from row ");
      line.append((long long)v.use);
      line.append(", whose rows see none of its keys under the mask policy");
      break;
    case Rule::none: break;
  }
}

#if ATTN_CHECKED_PIPELINE
namespace {  // one record per step file, so each step reports its own violations

__device__ Violation violation;

__device__ __forceinline__ uint64_t global_time_ns() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

// Keeps the first violation of the run; later ones are dropped. Inlined, and no printf: a call
// here would make ptxas serialize every wgmma of the kernel (C7510), and the checked build
// should run the pipeline as asynchronously as the normal one.
// `thread`: the thread that broke the rule, when another one finds out (a writer that did not
// fence, found by the thread that hands the buffer over); -1: this one.
__device__ __forceinline__ void report(Rule rule, Buffer buffer, Barrier barrier, int slot,
                                       int use, uint32_t parity, int thread = -1) {
  if (rule == Rule::watchdog) atomicExch(&violation.give_up, 1);
  if (atomicCAS(&violation.rule, 0, int(rule)) != 0) return;
  violation.buffer = int(buffer);
  violation.barrier = int(barrier);
  violation.slot = slot;
  violation.use = use;
  violation.parity = parity;
  violation.block = int(blockIdx.x);
  violation.thread = thread >= 0 ? thread : int(threadIdx.x);
  __threadfence();
}

__device__ __forceinline__ void check(bool holds, Rule rule, Buffer buffer, int slot, int use,
                                      int thread = -1) {
  if (!holds) report(rule, buffer, Barrier::full, slot, use, 0, thread);
}

// The host's half: the first violation since the last call, as one line, and a clean record.
std::optional<std::string> take_violation() {
  Violation found{};
  CUDA_CHECK(cudaMemcpyFromSymbol(&found, violation, sizeof found));
  if (found.rule == 0 && found.give_up == 0) return std::nullopt;
  const Violation cleared{};
  CUDA_CHECK(cudaMemcpyToSymbol(violation, &cleared, sizeof cleared));
  Line line;
  describe(found, ATTN_STEP_ID, line);
  return std::string(line.text);
}

}  // namespace
#endif

// Waits for the phase of `barrier` with this parity. The checked build bounds the wait.
__device__ __forceinline__ void wait_phase(uint64_t* barrier, uint32_t parity, Buffer buffer,
                                           Barrier which, int slot, int use) {
#if ATTN_CHECKED_PIPELINE
  const uint64_t start = global_time_ns();
  while (!mbarrier_try_wait(barrier, parity)) {
    if (*static_cast<volatile int*>(&violation.give_up) != 0) return;
    if (global_time_ns() - start > kWatchdogNanoseconds) {
      report(Rule::watchdog, buffer, which, slot, use, parity);
      return;
    }
  }
#else
  (void)buffer, (void)which, (void)slot, (void)use;
  mbarrier_wait(barrier, parity);
#endif
}

// The producer's load of K/V tile kv_tile (block_n keys) for the work tile of rows [row0, row0 +
// rows): some row of it must see the tile's first key (the last row sees the most keys).
template <typename Mask>
__device__ __forceinline__ void check_tile_seen(const Mask& mask, int kv_tile, int block_n,
                                                int row0, int rows) {
#if ATTN_CHECKED_PIPELINE
  if (!mask.sees(row0 + rows - 1, kv_tile * block_n)) {
    report(Rule::excluded_tile_loaded, Buffer::kv, Barrier::full, kv_tile, row0, 0);
  }
#else
  (void)mask, (void)kv_tile, (void)block_n, (void)row0, (void)rows;
#endif
}

// What a step puts in its StepInfo: the report in the checked build, none otherwise.
#if ATTN_CHECKED_PIPELINE
constexpr attn::PipelineReportFn kPipelineReport = take_violation;
#else
constexpr attn::PipelineReportFn kPipelineReport = nullptr;
#endif

}  // namespace hopper
