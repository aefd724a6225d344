// The asynchronous pipeline of the Hopper steps, as small typed pieces:
//
//   NamedBarrier   the ids of the bar.sync barriers a step uses, by what they are for
//   WgmmaGroups    a warpgroup's committed wgmma groups: commit, wait for all but the newest N
//   Ring           kSlots buffers used in turn, each guarded by a "full" mbarrier (the copy has
//                  landed) and, where the consumers hand buffers back one by one (v8), an "empty"
//                  one (every consumer warp has finished with it)
//   PingPong       v8's consumers taking turns on the tensor cores
//   StagingBuffer  a shared-memory tile that leaves through the copy engine: written by ordinary
//                  stores, read by an asynchronous TMA store (O) or bulk reduce-add (v10's dQ)
//   ThreadOperand  kSlots shared-memory tiles that threads write and wgmma reads (v10's dS^T)
//
// A buffer that threads write and an asynchronous reader reads goes through the same four
// hooks in both of the last two: begin_writes (the reads of its last contents are complete),
// the writes, fence (fence.proxy.async: the writes become visible to the async proxy), and a
// barrier of the writers that hands it over; the reader's completion is awaited before the
// next begin_writes.
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

// Room for three consumer warpgroups (v8's 192-row tiles); the hardware has 16 ids.
enum class NamedBarrier : uint32_t {
  epilogue = 1,  // + warpgroup: one warpgroup's 128 threads, around its O epilogue (ids 1-3)
  turn = 4,      // + consumer: consumer c may issue its GEMMs (v8's ping-pong; ids 4-6)
  ds_ready = 7,  // both consumers: every row of a Q tile's dS^T is in shared memory (v10)
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
    const bool released = get(armable_, slot(use)) == use;
    check(released, Rule::refill_before_release, name_, slot(use), use);
    // Reported, the skipped wait is then done, so the run goes on by the protocol and ends with
    // its results and this report: a producer running a whole ring ahead would arrive twice on
    // one phase of a full barrier, and the kernel could die before the host reads which rule
    // broke. (v7's ring has no empty barriers: nothing to wait on.)
    if (!released && empty_ != nullptr) wait_empty(use);
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
    check(get(acquired_, slot(use)) == use, Rule::arrive_without_wait, name_, slot(use), use);
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

// ---- The ping-pong turn -------------------------------------------------------------------------

// v8's consumers take turns issuing their GEMMs, round the ring 0, 1, ..., consumers - 1, 0:
// consumer c waits at barrier turn + c, then hands the turn on by arriving at the next one's.
// The last consumer hands consumer 0 the first turn.
class PingPong {
 public:
  __device__ PingPong(int consumer, int consumers)
      : consumer_(consumer), next_((consumer + 1) % consumers) {}

  // The last consumer, once, at the start: consumer 0 goes first.
  __device__ void hand_over_first_turn() {
    named_barrier_arrive(NamedBarrier::turn, next_, 256);
  }
  // Barrier turn + c counts 256 threads: c's own 128 waiting and the 128 of the one before it
  // arriving.
  __device__ void wait_for_turn() {
    named_barrier_sync(NamedBarrier::turn, consumer_, 256);
#if ATTN_CHECKED_PIPELINE
    held_ = true;
#endif
  }
  // Only a consumer that holds the turn may pass it: an arrival without the wait before it lets
  // the next consumer's next wait through for a turn this one never took.
  __device__ void pass_turn() {
#if ATTN_CHECKED_PIPELINE
    check(held_, Rule::arrive_without_wait, Buffer::turn, consumer_, turns_);
    held_ = false;
    ++turns_;
#endif
    named_barrier_arrive(NamedBarrier::turn, next_, 256);
  }

 private:
  int consumer_, next_;
#if ATTN_CHECKED_PIPELINE
  bool held_ = false;
  int turns_ = 0;
#endif
};

// ---- Buffers that threads write and an asynchronous reader reads ---------------------------------

#if ATTN_CHECKED_PIPELINE
// Per buffer (a staging buffer's owner, or a ThreadOperand's slot), in shared memory: how many
// threads have begun writing and not fenced (and the last of them, to name it), and how far the
// asynchronous reads of its past contents are known to be complete.
struct WrittenBufferState {
  int unfenced, unfenced_thread;
  int reads_done;        // uses whose asynchronous reads are complete (a staging buffer)
  int reads_done_epoch;  // the reader's barrier epoch when it found them complete
};
// The writers' side: the thread began writing and has not fenced. Counted once per thread.
__device__ __forceinline__ void note_writes(WrittenBufferState& state, bool& writing) {
  if (!writing) {
    writing = true;
    atomicAdd(&state.unfenced, 1);
    atomicExch(&state.unfenced_thread, int(threadIdx.x));
  }
}
__device__ __forceinline__ void note_fence(WrittenBufferState& state, bool& writing) {
  if (writing) {
    writing = false;
    atomicSub(&state.unfenced, 1);
  }
}
// Whoever hands the buffer to the asynchronous reader, after the writers' barrier: every writer
// has fenced (the barrier orders their notes before this read).
__device__ __forceinline__ void check_fenced(const WrittenBufferState& state, Buffer name, int slot,
                                             int use) {
  const volatile WrittenBufferState& seen = state;
  check(seen.unfenced == 0, Rule::unfenced_async_read, name, slot, use, seen.unfenced_thread);
}
#endif

// ---- Staging buffers ---------------------------------------------------------------------------------

// One warpgroup's outgoing tile in shared memory (O, or v10's dQ): all its threads write it, one
// of them sends it with the copy engine, asynchronously. Each use:
//
//   storing thread:  wait_read()       the last use's copy has read the buffer
//   every writer:    sync()            ... which every writer now knows
//                    begin_writes(), the stores, fence()
//                    sync()            the writes are done and fenced
//   storing thread:  the tma_store / bulk_reduce_add calls, commit()
//
// The checked build counts each thread's sync() calls (its epoch): a writer's begin_writes must
// find the last use's reads completed by a wait_read at an epoch before its own, that is, before
// a barrier it has since passed.
class StagingBuffer {
 public:
  __device__ explicit StagingBuffer(int owner, Buffer name = Buffer::o_staging)
      : owner_(owner), name_(name) {
    (void)owner_, (void)name_;
  }

  // One thread, before the block's first barrier.
  __device__ void init() const {
#if ATTN_CHECKED_PIPELINE
    states()[owner_] = {0, -1, 0, -1};
#endif
  }
  // Every writer: the barrier of the owning warpgroup (its 128 threads).
  __device__ void sync() {
    named_barrier_sync(NamedBarrier::epilogue, owner_, 128);
#if ATTN_CHECKED_PIPELINE
    ++epoch_;
#endif
  }
  // Every writer, before its first write of a use.
  __device__ void begin_writes() {
#if ATTN_CHECKED_PIPELINE
    const volatile WrittenBufferState& seen = states()[owner_];
    check(seen.reads_done >= uses_ && seen.reads_done_epoch < epoch_,
          Rule::write_during_async_read, name_, owner_, uses_);
    note_writes(states()[owner_], writing_);
    ++uses_;
#endif
  }
  // Every writer, after its last write of a use: its stores become visible to the copy engine.
  __device__ void fence() {
    fence_async_shared();
#if ATTN_CHECKED_PIPELINE
    note_fence(states()[owner_], writing_);
#endif
  }
  // The storing thread, after its copies of the buffer (every writer has fenced).
  __device__ void commit() {
#if ATTN_CHECKED_PIPELINE
    check_fenced(states()[owner_], name_, owner_, commits_);
    ++commits_;
#endif
    tma_store_commit();
  }
  // The storing thread: until the committed copies have read the buffer.
  __device__ void wait_read() {
    tma_store_wait_read();
    note_reads_done();
  }
  // The storing thread: until the committed copies are complete (shared memory must outlive them).
  __device__ void wait() {
    tma_store_wait();
    note_reads_done();
  }

 private:
  __device__ void note_reads_done() {
#if ATTN_CHECKED_PIPELINE
    WrittenBufferState& state = states()[owner_];
    state.reads_done = commits_;
    state.reads_done_epoch = epoch_;
#endif
  }
#if ATTN_CHECKED_PIPELINE
  // A few bytes of static shared memory beside the step's own (the checked build's only).
  __device__ static WrittenBufferState* states() {
    __shared__ WrittenBufferState buffers[4];
    return buffers;
  }
  int epoch_ = 0, uses_ = 0, commits_ = 0;
  bool writing_ = false;
#endif
  int owner_;
  Buffer name_;
};

// ---- Operands that threads write and wgmma reads -------------------------------------------------

// kSlots shared-memory tiles used in turn (use u in slot u % kSlots), each written by the threads
// of kReaders warpgroups and read by the wgmma of all of them (v10's dS^T: each consumer writes
// its 64 keys' rows, both read all 128). Each use:
//
//   every writer:  begin_writes(use), the stores, fence()
//                  publish()           a barrier of all kReaders warpgroups: written and fenced
//   every reader:  read(use, groups)   before the wgmma that reads it
//                  release(use, groups) once that wgmma group has been waited for
//
// The checked build: begin_writes(use) must find the slot's last use, use - kSlots, released by
// every reader at an epoch (count of publish() calls) before the writer's own, so a publish()
// lies between each reader's wait and this write.
template <int kSlots, int kReaders>
class ThreadOperand {
  static_assert(kSlots >= 1 && kSlots <= 4 && kReaders >= 1 && kReaders <= 2, "tracked sizes");

 public:
  // `reader`: this warpgroup's index among the readers.
  __device__ ThreadOperand(Buffer name, int reader) : name_(name), reader_(reader) {
    (void)name_, (void)reader_;
  }
  __device__ static int slot(int use) { return use % kSlots; }

  // One thread, before the block's first barrier.
  __device__ static void init() {
#if ATTN_CHECKED_PIPELINE
    for (int s = 0; s < kSlots; ++s) {
      writes()[s] = {0, -1, 0, -1};
      for (int r = 0; r < kReaders; ++r) releases()[s][r] = {-1, -1};
    }
#endif
  }
  __device__ void begin_writes(int use) {
#if ATTN_CHECKED_PIPELINE
    if (use >= kSlots) {
      for (int r = 0; r < kReaders; ++r) {
        const volatile Release& seen = releases()[slot(use)][r];
        check(seen.use >= use - kSlots && seen.epoch < epoch_, Rule::write_during_async_read,
              name_, slot(use), use);
      }
    }
    note_writes(writes()[slot(use)], writing_);
#else
    (void)use;
#endif
  }
  __device__ void fence(int use) {
    fence_async_shared();
#if ATTN_CHECKED_PIPELINE
    note_fence(writes()[slot(use)], writing_);
#else
    (void)use;
#endif
  }
  // Every thread of the kReaders warpgroups.
  __device__ void publish() {
    named_barrier_sync(NamedBarrier::ds_ready, 0, 128 * kReaders);
#if ATTN_CHECKED_PIPELINE
    ++epoch_;
#endif
  }
  // The slot the wgmma group issued next reads.
  __device__ int read(int use, WgmmaGroups& groups) const {
#if ATTN_CHECKED_PIPELINE
    check_fenced(writes()[slot(use)], name_, slot(use), use);
#endif
    groups.reads(name_, slot(use));
    return slot(use);
  }
  // This warpgroup's wgmma reads of the use are complete (waited for).
  __device__ void release(int use, const WgmmaGroups& groups) const {
#if ATTN_CHECKED_PIPELINE
    check(!groups.reading(name_, slot(use)), Rule::release_before_wgmma, name_, slot(use), use);
    if (threadIdx.x % 128 == 0) releases()[slot(use)][reader_] = {use, epoch_};
#else
    (void)use, (void)groups;
#endif
  }

 private:
#if ATTN_CHECKED_PIPELINE
  struct Release {
    int use, epoch;
  };
  __device__ static WrittenBufferState* writes() {
    __shared__ WrittenBufferState slots[kSlots];
    return slots;
  }
  __device__ static Release (*releases())[kReaders] {
    __shared__ Release slots[kSlots][kReaders];
    return slots;
  }
  int epoch_ = 0;
  bool writing_ = false;
#endif
  Buffer name_;
  int reader_;
};

}  // namespace hopper
