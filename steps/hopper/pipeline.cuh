// The asynchronous pipeline of the Hopper steps, as small typed pieces:
//
//   NamedBarrier   the ids of the bar.sync barriers a step uses, by what they are for
//   WgmmaGroups    a warpgroup's committed wgmma groups: commit, wait for all but the newest N
//   Ring           kSlots buffers used in turn, each guarded by a "full" mbarrier (the copy has
//                  landed) and, where the consumers hand buffers back one by one (v8), an "empty"
//                  one (every consumer warp has finished with it)
//   StagingBuffer  a shared-memory tile that leaves through the copy engine: written by ordinary
//                  stores, read by an asynchronous TMA store (O) or bulk reduce-add (v10's dQ)
//
// In a normal build each method is the instruction it wraps and nothing else. In the checked
// build (checked.cuh) they also keep, per thread, what the protocol says that thread may do, and
// report the first rule a launch breaks.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "hopper/checked.cuh"
#include "hopper/ptx.cuh"

namespace hopper {

// ---- Named barriers (bar.sync; id 0 is __syncthreads) -------------------------------------------

enum class NamedBarrier : uint32_t {
  epilogue = 1,  // + warpgroup: one warpgroup's 128 threads, around its O epilogue (ids 1, 2)
  turn = 3,      // + consumer: consumer c may issue its GEMMs (v8's ping-pong; ids 3, 4)
  ds_ready = 5,  // both consumers: every row of a Q tile's dS^T is in shared memory (v10)
};
__device__ __forceinline__ void named_barrier_sync(NamedBarrier barrier, int index, uint32_t threads) {
  bar_sync(uint32_t(barrier) + index, threads);
}
__device__ __forceinline__ void named_barrier_arrive(NamedBarrier barrier, int index,
                                                     uint32_t threads) {
  bar_arrive(uint32_t(barrier) + index, threads);
}

// ---- wgmma groups ---------------------------------------------------------------------------------

// The wgmma groups this thread's warpgroup has committed. Every thread of the warpgroup keeps
// the same account (wgmma is issued by all of them together).
class WgmmaGroups {
 public:
  // The group issued next reads this stage of a ring (Ring::read says so).
  __device__ void reads(Buffer buffer, int slot) {
#if ATTN_CHECKED_PIPELINE
    open_ |= bit(buffer, slot);
#else
    (void)buffer, (void)slot;
#endif
  }
  __device__ void commit() {
    wgmma_commit();
#if ATTN_CHECKED_PIPELINE
    if (count_ == kMaxGroups) drop_oldest();
    for (int i = 0; i < kMaxGroups; ++i) {
      if (i == count_) pending_[i] = open_;
    }
    ++count_;
    open_ = 0;
#endif
  }
  // Until at most kPending of the committed groups are still running.
  template <int kPending>
  __device__ void wait() {
    wgmma_wait<kPending>();
#if ATTN_CHECKED_PIPELINE
    for (int i = 0; i < kMaxGroups; ++i) {
      if (count_ > kPending) drop_oldest();
    }
#endif
  }
  // Whether a group not yet waited for (or the one being issued) reads this stage.
  __device__ bool reading(Buffer buffer, int slot) const {
#if ATTN_CHECKED_PIPELINE
    uint32_t reads = open_;
    for (int i = 0; i < kMaxGroups; ++i) reads |= pending_[i];
    return (reads & bit(buffer, slot)) != 0;
#else
    (void)buffer, (void)slot;
    return false;
#endif
  }

 private:
#if ATTN_CHECKED_PIPELINE
  static constexpr int kMaxGroups = 4;
  __device__ static uint32_t bit(Buffer buffer, int slot) { return 1u << (4 * int(buffer) + slot); }
  __device__ void drop_oldest() {
    for (int i = 0; i + 1 < kMaxGroups; ++i) pending_[i] = pending_[i + 1];
    pending_[kMaxGroups - 1] = 0;
    --count_;
  }
  uint32_t open_ = 0;                  // stages read by the group being issued
  uint32_t pending_[kMaxGroups] = {};  // stages read by each committed group, oldest first
  int count_ = 0;
#endif
};

// ---- Rings of stages ------------------------------------------------------------------------------

// kSlots buffers used in turn. Use number u (counted over the whole kernel, the same way by the
// producer and the consumers) goes to slot u % kSlots, and the phase parity to wait for flips
// each time round the ring. Which buffers a slot holds is the step's business (v8: one K tile;
// v7: a K and a V tile under one barrier): the ring hands out slot numbers.
template <int kSlots>
class Ring {
  static_assert(kSlots >= 1 && kSlots <= 4, "the checked build tracks up to 4 slots per ring");

 public:
  // `empty` is nullptr when the consumers hand stages back at a barrier of the whole block (v7).
  __device__ Ring(Buffer name, uint64_t* full, uint64_t* empty)
      : name_(name), full_(full), empty_(empty) {
#if ATTN_CHECKED_PIPELINE
    for (int i = 0; i < kSlots; ++i) {
      acquired_[i] = -1;  // nothing waited for yet
      armable_[i] = i;    // the first round is free
    }
#endif
  }

  __device__ static int slot(int use) { return use % kSlots; }
  __device__ static uint32_t parity(int use) { return (use / kSlots) % 2; }

  // One thread, before the block's first barrier: the full barriers expect the producer's one
  // arrival (plus the bytes), the empty barriers one arrival per consumer warp.
  __device__ void init(uint32_t consumer_arrivals) const {
    for (int i = 0; i < kSlots; ++i) {
      mbarrier_init(&full_[i], 1);
      mbarrier_init(&empty_[i], consumer_arrivals);
    }
  }
  // The same for a ring without empty barriers (v7).
  __device__ void init_full() const {
    for (int i = 0; i < kSlots; ++i) mbarrier_init(&full_[i], 1);
  }

  // ---- The producer ----
  // Until the consumers have released the slot of this use. The first time round, the phase
  // before the first (parity 1) counts as complete: free.
  __device__ void wait_empty(int use) {
    wait_phase(&empty_[slot(use)], parity(use) ^ 1, name_, Barrier::empty, slot(use), use);
#if ATTN_CHECKED_PIPELINE
    set(armable_, slot(use), use);
#endif
  }
  // Announces the bytes the copies of this use will deliver (the producer's one arrival on the
  // full barrier); returns that barrier, which the copies complete.
  __device__ uint64_t* arm(int use, uint32_t bytes) {
#if ATTN_CHECKED_PIPELINE
    check(get(armable_, slot(use)) == use, Rule::refill_before_release, name_, slot(use), use);
#endif
    mbarrier_arrive_expect_bytes(&full_[slot(use)], bytes);
    return &full_[slot(use)];
  }

  // ---- The consumers ----
  // Until the copies of this use have landed: the stage is acquired.
  __device__ void wait_full(int use) {
    wait_phase(&full_[slot(use)], parity(use), name_, Barrier::full, slot(use), use);
#if ATTN_CHECKED_PIPELINE
    set(acquired_, slot(use), use);
#endif
  }
  // The slot to read for this use; the wgmma group issued next reads it.
  __device__ int read(int use, WgmmaGroups& groups) const {
#if ATTN_CHECKED_PIPELINE
    check(get(acquired_, slot(use)) == use, Rule::read_before_full, name_, slot(use), use);
#endif
    groups.reads(name_, slot(use));
    return slot(use);
  }
  // This warp is done with the stage: its lane 0 arrives on the empty barrier.
  __device__ void release(int use, int lane, const WgmmaGroups& groups) {
    check_release(use, groups);
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&empty_[slot(use)]);
  }
  // This thread is done with the stage, and arrives on the empty barrier itself (the ring was
  // initialised with one arrival per consumer thread). v10's stages hold the rows of L and D
  // that a 1-D bulk copy writes, a copy compute-sanitizer's racecheck sees; racecheck orders a
  // thread's reads before the producer's next copy through that thread's own arrival, not
  // through a __syncwarp and its lane 0's (release), so these stages are released this way.
  __device__ void release_thread(int use, const WgmmaGroups& groups) {
    check_release(use, groups);
    mbarrier_arrive(&empty_[slot(use)]);
  }
  // Every thread of the block is done with the stage (v7): one __syncthreads, after which the
  // producer may refill it for use + kSlots.
  __device__ void release_block(int use, const WgmmaGroups& groups) {
    check_release(use, groups);
    __syncthreads();
#if ATTN_CHECKED_PIPELINE
    set(armable_, slot(use), use + kSlots);
#endif
  }

 private:
  __device__ void check_release(int use, const WgmmaGroups& groups) {
#if ATTN_CHECKED_PIPELINE
    check(!groups.reading(name_, slot(use)), Rule::release_before_wgmma, name_, slot(use), use);
    set(acquired_, slot(use), -1);
#else
    (void)use, (void)groups;
#endif
  }

  Buffer name_;
  uint64_t* full_;
  uint64_t* empty_;
#if ATTN_CHECKED_PIPELINE
  // Per slot, written and read with compile-time indices so the state stays in registers.
  __device__ static void set(int (&state)[kSlots], int slot, int value) {
    for (int i = 0; i < kSlots; ++i) {
      if (i == slot) state[i] = value;
    }
  }
  __device__ static int get(const int (&state)[kSlots], int slot) {
    int value = 0;
    for (int i = 0; i < kSlots; ++i) {
      if (i == slot) value = state[i];
    }
    return value;
  }
  int acquired_[kSlots];  // the use this thread waited for on the full barrier, or -1
  int armable_[kSlots];   // the use the producer may arm next
#endif
};

// ---- Staging buffers ---------------------------------------------------------------------------------

// One warpgroup's outgoing tile in shared memory (O, or v10's dQ): all its threads write it, one
// of them sends it with the copy engine, asynchronously. Before the next writes, that thread
// waits until the copy has read the buffer, and a barrier of the warpgroup tells the others.
class StagingBuffer {
 public:
  __device__ explicit StagingBuffer(int owner, Buffer name = Buffer::o_staging)
      : owner_(owner), name_(name) {
    (void)owner_, (void)name_;
  }

  // One thread, before the block's first barrier.
  __device__ void init() const {
#if ATTN_CHECKED_PIPELINE
    busy()[owner_] = 0;
#endif
  }
  // Every writing thread, before it writes.
  __device__ void check_writable() const {
#if ATTN_CHECKED_PIPELINE
    check(*static_cast<volatile uint32_t*>(&busy()[owner_]) == 0, Rule::staging_busy, name_,
          owner_, 0);
#endif
  }
  // The storing thread, after its tma_store calls.
  __device__ void commit() const {
    tma_store_commit();
#if ATTN_CHECKED_PIPELINE
    busy()[owner_] = 1;
#endif
  }
  // The storing thread: until the committed stores have read the buffer.
  __device__ void wait_read() const {
    tma_store_wait_read();
#if ATTN_CHECKED_PIPELINE
    busy()[owner_] = 0;
#endif
  }
  // The storing thread: until the committed stores are complete (shared memory must outlive them).
  __device__ void wait() const {
    tma_store_wait();
#if ATTN_CHECKED_PIPELINE
    busy()[owner_] = 0;
#endif
  }

 private:
#if ATTN_CHECKED_PIPELINE
  // A few bytes of static shared memory beside the step's own (the checked build's only).
  __device__ static uint32_t* busy() {
    __shared__ uint32_t flags[4];
    return flags;
  }
#endif
  int owner_;
  Buffer name_;
};

}  // namespace hopper
