#!/usr/bin/env python3
"""Proves that the tests can fail: the bugs students make, planted into copies of the flash steps
(v6, v7, v8, and the backward steps v9 and v10; step 0's key-padding mask too), each run through
the GPU suite, in a normal build and, for the Hopper steps, in the checked build of the
asynchronous pipeline. Every copy must be caught by one of the two; the report says which caught
which, and the checked build's line names the rule.

CMake builds the copies (configure with -DATTN_PLANTED_TESTS=ON: tests/CMakeLists.txt compiles
each as its step is compiled, into gpu_tests_planted and gpu_tests_planted_checked) and CTest
runs them (`ctest -L planted`); this file holds the bugs and what CMake and CTest call:

  tests/planted_bugs.py --check-edits             every edit still applies (no GPU, no compiler)
  tests/planted_bugs.py --write-sources DIR       DIR/<id>.cu (and DIR/<id>/ the library headers a
                                                  bug edits, found first by that copy alone); prints
                                                  "id folder hopper" per bug, for CMake
  tests/planted_bugs.py --run-one ID --binaries DIR --out DIR
                                                  one copy through both builds (and its targeted
                                                  test): OUT/rows/ID.csv; exit 0 when caught as
                                                  designed, 1 when not
  tests/planted_bugs.py --report --out DIR [--only ID,...]
                                                  OUT/planted.csv and planted.txt from the rows;
                                                  exit 1 when a bug run was not caught as designed

A copy that hangs by design is not run in the normal build (it would wait for the harness's
two-minute limit on every test); the checked build's watchdog must end it. Exit status 2 is a
usage error, 3 a file or build that is not there.
"""
import argparse
import csv
import functools
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def is_hopper_step(folder):
    """Whether steps/<folder>/step.cmake says ARCH 90a (scripts/step-facts.sh reads it): the
    checked build of the pipeline has copies of its bugs too."""
    facts = subprocess.run([os.path.join(REPO, "scripts", "step-facts.sh"), os.path.join(REPO, "steps", folder)],
                           capture_output=True, text=True, check=True).stdout.split()
    return facts[0] == "90a"


@dataclass
class Bug:
    id: str
    folder: str           # steps/<folder>/
    what: str             # what a student got wrong, in a few words
    edits: list           # (the text as shipped, the text with the bug, which occurrence: 1 = first
                          #  [, the file under steps/ when not the step's own: a library header])
    hangs: bool = False   # waits forever in a normal build
    rule: str = ""        # the checked build's rule this bug breaks, when it is a protocol bug
    target: str = ""      # a test case built to catch this bug, run on its own as well

    @property
    def hopper(self):
        return is_hopper_step(self.folder)


V0, V6, V7, V8, V9 = "v0_naive", "v6_flash", "v7_tma_wgmma", "v8_warp_specialized", "v9_flash_backward"
V10 = "v10_hopper_backward"
KEY_MASK_TEST = "key mask*"  # tests/test_steps_gpu.cpp: real scores strongly negative
TILE_MULTIPLES_TEST = "tile multiples*"  # N = k x tile and k x tile +- 1 of the step's own tiles
LARGE_SCORES_TEST = "large scores*"  # scores at std 16 over a few keys and at tile edges
CAUSAL_TEST = "causal mask*"  # both alignments, tails, N_q != N_k (forward and backward suites)
DETERMINISTIC_TEST = "deterministic mode*"  # tests/test_backward_gpu.cpp: tails, a ViT shape
KEY_PADDING_TEST = "*padding*"  # tests/test_backward_gpu.cpp: every backward case with key padding
CROSS_TEST = "cross-attention*"  # tests/test_backward_gpu.cpp: N_q and N_k apart, their tails
DETERMINISTIC_CROSS_TEST = "deterministic mode on cross*"  # whole Q tiles that see no key
PACKED_TEST = "packed sequences*"  # sequences of many lengths, packed (forward and backward suites)
BUGS = [
    # The arithmetic of the online softmax: the result check catches these.
    Bug("v6nomask", V6, "keys past N keep their scores", [("if (tile_keys < kBlockN) {", "if (false) {", 1)]),
    Bug("v6norescale", V6, "O not rescaled when the row max grows",
        [("o_acc[g][d][2 * half] *= correction;", ";", 1)]),
    Bug("v6maskignored", V6, "keys the key-padding mask marks keep their scores",
        [("if (key < tile_keys && padding[key] != 0) {", "if (false) {", 1)]),
    Bug("v8maskignored", V8, "keys the key-padding mask marks keep their scores",
        [("if ((mine >> column) & 1) {", "if (false) {", 1)]),
    Bug("v8maskwrongkeys", V8, "every lane of a quad applies the first lane's mask bits",
        [("padded.words[i / 4] >> (8 * (i % 4) + 2 * quad_lane)", "padded.words[i / 4] >> (8 * (i % 4))", 1)]),
    Bug("v8maskfirsttile", V8, "the mask of the block's first work tile used for every tile it walks",
        [("key_padding + int64_t(tile.batch) * mask.kv_tokens,",
          "key_padding + int64_t(scheduler.at(scheduler.first()).batch) * mask.kv_tokens,", 1)]),
    Bug("v0maskignored", V0, "keys the key-padding mask marks keep their weight",
        [("if (padded(j)) continue;  // no weight at all, not a small one", "", 1)]),
    Bug("v6nonorm", V6, "O not divided by the row sum",
        [("const float inverse = no_key ? 0.0f : 1.0f / total;",
          "const float inverse = no_key ? 0.0f : 1.0f;", 1)]),
    Bug("v7nomask", V7, "keys past N keep their scores", [("if (tile_keys < T::kBlockN) {", "if (false) {", 1)]),
    Bug("v7norescale", V7, "O not rescaled when the row max grows",
        [("o_acc[4 * d + 2 * half] *= correction[half];", ";", 1, "policies/online_softmax.cuh")]),
    Bug("v7nonorm", V7, "O not divided by the row sum",
        [("inverse[half] = no_key ? 0.0f : 1.0f / total;", "inverse[half] = no_key ? 0.0f : 1.0f;", 1, "hopper/epilogue.cuh")]),
    Bug("v7maskoffbyone", V7, "the mask admits one key past N",
        [("e % 2 >= tile_keys)", "e % 2 > tile_keys)", 1)], target=KEY_MASK_TEST),
    Bug("v8nomask", V8, "keys past N keep their scores", [("if (last_tile_keys < kBlockN) {", "if (false) {", 1)]),
    Bug("v8norescale", V8, "O not rescaled when the row max grows",
        [("o_acc[4 * d + 2 * half] *= correction[half];", ";", 1, "policies/online_softmax.cuh")]),
    Bug("v8nonorm", V8, "O not divided by the row sum",
        [("inverse[half] = no_key ? 0.0f : 1.0f / total;", "inverse[half] = no_key ? 0.0f : 1.0f;", 1, "hopper/epilogue.cuh")]),
    Bug("v8maskoffbyone", V8, "the mask admits one key past N",
        [("e % 2 >= last_tile_keys)", "e % 2 > last_tile_keys)", 1)], target=KEY_MASK_TEST),
    # L for the backward pass, from the lane's share of the row sum instead of the quad's.
    Bug("v6lsepartial", V6, "L from one lane's share of the row sum",
        [("log_sum_exp(row_max[r], total, scale_log2)", "log_sum_exp(row_max[r], row_sum[r], scale_log2)", 1)]),
    Bug("v8lsepartial", V8, "L from one lane's share of the row sum",
        [("log_sum_exp(row_max[half], total, scale_log2)",
          "log_sum_exp(row_max[half], row_sum[half], scale_log2)", 1, "hopper/epilogue.cuh")]),
    # The backward (v9): the maths of dS, an operand's layout, dQ's sum across blocks, the mask.
    Bug("v9nodterm", V9, "dS without the D term (P o dP instead of P o (dP - D))",
        [("p * (dp_acc[n][e] - dot[column])", "p * dp_acc[n][e]", 1)]),
    Bug("v9transposed", V9, "dK from Q read untransposed (the product's operand in the wrong layout)",
        [("ldmatrix_x4_trans(q_fragment, q_tile + b_offset);", "ldmatrix_x4(q_fragment, q_tile + b_offset);", 1)]),
    Bug("v9noatomic", V9, "dQ added into the shared fp32 sum without atomics",
        [("#if __CUDA_ARCH__ >= 900  // one vector atomic", "#if 0  // one vector atomic", 1),
         ("atomicAdd(dq_row + d * 8 + 2 * quad_lane, dq_acc[d][2 * half]);",
          "dq_row[d * 8 + 2 * quad_lane] += dq_acc[d][2 * half];", 1),
         ("atomicAdd(dq_row + d * 8 + 2 * quad_lane + 1, dq_acc[d][2 * half + 1]);",
          "dq_row[d * 8 + 2 * quad_lane + 1] += dq_acc[d][2 * half + 1];", 1)]),
    Bug("v9nodkscale", V9, "dK without the softmax's scale (dS^T Q, not scale dS^T Q)",
        [("pack_pair<Element>(dk_acc[d][2 * half] * scale, dk_acc[d][2 * half + 1] * scale)",
          "pack_pair<Element>(dk_acc[d][2 * half], dk_acc[d][2 * half + 1])", 1)]),
    # The Hopper backward (v10): the maths, the scale, and (below) its pipeline.
    Bug("v10nodterm", V10, "dS without the D term (P o dP instead of P o (dP - D))",
        [("(dp_acc[4 * i + e] - (e % 2 ? row_dots.y : row_dots.x))", "dp_acc[4 * i + e]", 1)]),
    Bug("v10nodkscale", V10, "dK without the softmax's scale (dS^T Q, not scale dS^T Q)",
        [("pack_pair<Element>(dk_acc[4 * d + 2 * half] * scale, dk_acc[4 * d + 2 * half + 1] * scale)",
          "pack_pair<Element>(dk_acc[4 * d + 2 * half], dk_acc[4 * d + 2 * half + 1])", 1)]),
    # Keys past N in the backward's last K/V tile (zero K rows, score 0) keep P = exp(-L): where a
    # few keys all score far below 0, their dS overflows fp16 and dQ = dS K turns NaN.
    Bug("v9nokeymask", V9, "the dS of keys past N reaches dQ in the backward",
        [("          if (key_kept[e / 2]) {\n            ds_tile", "          if (true) {\n            ds_tile", 1)],
        target=LARGE_SCORES_TEST),
    Bug("v10nokeymask", V10, "the dS of keys past N reaches dQ in the backward",
        [(" & key_bits[pair % 2];", ";", 1),
         ("key_in_range[pair % 2] ? hopper::pack_pair<Element>(dp_acc[8 * s + 2 * pair], dp_acc[8 * s + 2 * pair + 1]) : 0u;",
          "hopper::pack_pair<Element>(dp_acc[8 * s + 2 * pair], dp_acc[8 * s + 2 * pair + 1]);", 1)],
        target=LARGE_SCORES_TEST),
    # A padded key's dK and dV written as 0, but its dS let into dQ: the key-padding mask
    # remembered for the block's own rows, forgotten for the rows of dQ they add to.
    Bug("v9paddingunmasked", V9, "the dS of padded keys reaches dQ in the backward (their dK and dV still 0)",
        [("          if (key_kept[e / 2]) {\n            ds_tile", "          if (key_inside[e / 2]) {\n            ds_tile", 1)],
        target=KEY_PADDING_TEST),
    # The Hopper backward's masks and cross-attention (#31): padded keys, keys counted from N_k,
    # rows that no block visits, the padding columns of D = 80.
    Bug("v10paddeddvkept", V10, "a padded key's dV written from its P (its dS is zeroed, its P is not)",
        [("key_in_range[half] ? hopper::pack_pair<Element>(dv_acc[4 * d + 2 * half], dv_acc[4 * d + 2 * half + 1]) : 0u;",
          "hopper::pack_pair<Element>(dv_acc[4 * d + 2 * half], dv_acc[4 * d + 2 * half + 1]);", 1)],
        target=KEY_PADDING_TEST),
    Bug("v10paddingignored", V10, "the key-padding mask not read: padded keys' dS reaches dQ and dK",
        [("(key_padding == nullptr || key_padding[int64_t(work.batch) * mask.kv_tokens + key] == 0)", "true", 1)],
        target=KEY_PADDING_TEST),
    Bug("v10keytilesfromn", V10, "the K/V tiles counted from N instead of N_k",
        [("const int key_tiles = (args.kv_tokens + T::kBlockN - 1) / T::kBlockN;",
          "const int key_tiles = (args.tokens + T::kBlockN - 1) / T::kBlockN;", 1)],
        target=CROSS_TEST),
    Bug("v10unseenrowsleft", V10, "rows above a bottom-right diagonal left unwritten in the deterministic mode",
        [("if (token < unseen_rows && column < kHeadDim)", "if (token < 0 && column < kHeadDim)", 1)],
        target=DETERMINISTIC_CROSS_TEST),
    # The last kernel starts before the main kernel ends (programmatic dependent launch): it must
    # still wait for the main kernel's adds before it reads the sum.
    Bug("v10convertnowait", V10, "the last kernel reads the dQ sum without waiting for the main kernel's adds",
        [("  hopper::wait_for_previous_grid();  // the main kernel's adds\n", "", 1)]),
    Bug("v10dqpastd", V10, "dQ's padding columns past D (D = 80 and 96 in tiles of 128) written into the next row",
        [("if (T::kTileColumns != T::kHeadDim && place.column >= T::kHeadDim) return;", "", 1)]),
    # bf16: the element type mixed up in one place, which the fp16 suite cannot see.
    Bug("v6bf16pashalf", V6, "P packed as fp16 pairs in the bf16 kernel (the wrong type for the MMA)",
        [("p_fragments[g][0] = pack_pair<Element>(", "p_fragments[g][0] = pack_pair<__half>(", 1)]),
    Bug("v8bf16mmahalf", V8, "P V issued as an fp16 wgmma on bf16 operands",
        [("hopper::wgmma_rs<Element>(o_acc", "hopper::wgmma_rs<__half>(o_acc", 1)]),
    Bug("v9bf16dvhalf", V9, "dV packed as fp16 pairs in the bf16 kernel",
        [("pack_pair<Element>(dv_acc[d][2 * half], dv_acc[d][2 * half + 1])",
          "pack_pair<__half>(dv_acc[d][2 * half], dv_acc[d][2 * half + 1])", 1)]),
    Bug("v10bf16mmahalf", V10, "dK += dS^T Q issued as an fp16 wgmma on bf16 operands",
        [("hopper::wgmma_rs<Element>(dk_acc", "hopper::wgmma_rs<__half>(dk_acc", 1)]),
    # The asynchronous protocol: races that need unlucky timing to corrupt a result.
    Bug("v7fullwaitonce", V7, "waits for a stage's copy only the first time round the ring",
        [("kv_ring.wait_full(tile);", "if (tile < T::kStages) kv_ring.wait_full(tile);", 1)],
        rule="read-before-full"),
    Bug("v7nowgmmawait", V7, "releases a stage before the P V reading it has completed",
        [("groups.wait<0>();", ";", 2)], rule="release-before-wgmma"),
    Bug("v7nobarrier", V7, "refills a stage without the block's barrier",
        [("kv_ring.release_block(tile, groups);", ";", 1)], rule="refill-before-release"),
    Bug("v8nofullwait", V8, "reads a K stage without waiting for its full barrier",
        [("k_ring.wait_full(kv_use + i);", ";", 2)], rule="read-before-full"),
    Bug("v8earlyrelease", V8, "releases a K stage before the S = Q K^T reading it has completed",
        [("k_ring.release(kv_use + i, lane, groups);", ";", 2),
         ("groups.wait<1>();", "k_ring.release(kv_use + i, lane, groups);\n      groups.wait<1>();", 1)],
        rule="release-before-wgmma"),
    Bug("v8nostorewait", V8, "rewrites the O staging buffer before the last store has read it",
        [("if (thread_in_group == 0) o_staging.wait_read();", ";", 1, "hopper/epilogue.cuh")], rule="write-during-async-read"),
    Bug("v8noemptywait", V8, "the producer refills K/V stages without waiting for them to be free",
        [("ring.wait_empty(use);", ";", 1)], rule="refill-before-release"),
    Bug("v8hang", V8, "the producer announces more bytes than its copies deliver",
        [("ring.arm(use, T::kKVBytes)", "ring.arm(use, T::kKVBytes + 1024)", 1)], hangs=True,
        rule="watchdog"),
    Bug("v10nofullwait", V10, "reads a dO stage without waiting for its full barrier",
        [("d_o_ring.wait_full(step);", ";", 1)], rule="read-before-full"),
    Bug("v10earlyrelease", V10, "releases a Q stage while the dK += dS^T Q reading it still runs",
        [("    groups.wait<1>();  // dV and dQ are done; dK may still run",
          "    q_ring.release_thread(step, groups);\n    groups.wait<1>();", 1),
         ("    q_ring.release_thread(step, groups);\n    d_o_ring.release", "    d_o_ring.release", 1)],
        rule="release-before-wgmma"),
    Bug("v10nostagingwait", V10, "rewrites the dQ staging buffer before the last reduce has read it",
        [("if (thread_in_group == 0) dq_staging.wait_read();", ";", 1)], rule="write-during-async-read"),
    # The causal mask (steps/policies/mask.cuh): the diagonal off by one, the wrong alignment, and
    # a K/V tile past the diagonal loaded (the result stays right: only the checked build sees it).
    Bug("v6causaloffbyone", V6, "the causal mask admits one key past the diagonal",
        [("if (key < kv_tokens && !mask.sees(row, key))", "if (key < kv_tokens && !mask.sees(row + 1, key))", 1)],
        target=CAUSAL_TEST),
    Bug("v8causaloffbyone", V8, "the causal mask admits one key past the diagonal",
        [("mask.key_end(row0 + 8, 1) - first_key}", "mask.key_end(row0 + 9, 1) - first_key}", 1)],
        target=CAUSAL_TEST),
    Bug("v8causalpartial", V8, "a warp's element mask skips the first K/V tile its diagonal crosses",
        [("mask.first_partial_tile(my_row0 + warp * 16, kBlockN)",
          "mask.first_partial_tile(my_row0 + warp * 16, kBlockN) - 1", 1)],
        target=CAUSAL_TEST),
    Bug("v8causalalign", V8, "the diagonal put at the top left whatever the alignment asked",
        [("attn::causal_diagonal(args.causal, args.tokens, args.kv_tokens)",
          "attn::causal_diagonal(attn::Causal::top_left, args.tokens, args.kv_tokens)", 1)],
        target=CAUSAL_TEST),
    Bug("v8causalextratile", V8, "each work tile walks one K/V tile past the diagonal (fully masked)",
        [("  return mask.kv_tiles(tile.row0, T::kBlockM, T::kBlockN);",
          "  return min(mask.kv_tiles(tile.row0, T::kBlockM, T::kBlockN) + 1, whole_kv_tiles);", 1)],
        rule="excluded-tile-loaded"),
    Bug("v9causaloffbyone", V9, "P and dS kept for one key past the diagonal in the backward",
        [("if (!mask.sees(query, key0 + warp_key0 + group + 8 * (e / 2)))",
          "if (!mask.sees(query + 1, key0 + warp_key0 + group + 8 * (e / 2)))", 1)],
        target=CAUSAL_TEST),
    Bug("v10dqsumhalfzeroed", V10, "the first kernel zeroes half of each row's share of the dQ sum",
        [("for (int k = 0; k < 2; ++k) {\n      if (holds_head_dim<T>(piece + k))", "for (int k = 0; k < 1; ++k) {\n      if (holds_head_dim<T>(piece + k))", 1)]),
    Bug("v10dqpieceshort", V10, "the dQ sum's last 8 real columns taken for padding (D = 80 and 96): never zeroed, never converted",
        [("+ 8 * int(piece % kSharePieces / 128) < T::kHeadDim;", "+ 8 * int(piece % kSharePieces / 128) < T::kHeadDim - 8;", 1)]),
    Bug("v10causaloffbyone", V10, "P kept for one key past the diagonal in the backward",
        [("if (!mask.sees(query, my_key0 + 8 * (e / 2)))", "if (!mask.sees(query + 1, my_key0 + 8 * (e / 2)))", 1)],
        target=CAUSAL_TEST),
    # In the deterministic mode a Q tile's last turn writes dQ: which turn is last.
    Bug("v10dqwriteearly", V10, "the deterministic mode writes dQ at the turn before the last",
        [("const bool last = key_tile == adds - 1;", "const bool last = key_tile == adds - 2;", 1)],
        target=DETERMINISTIC_TEST),
    Bug("v10dqaddsunmasked", V10, "the deterministic mode's last turn counted over every K/V tile under the causal mask",
        [("const int adds = mask.kv_tiles(row_tile * kBlockM, kBlockM, kBlockN);", "const int adds = key_tiles;", 1)],
        target=CAUSAL_TEST),
    # The four classes of bug a grading run once missed (the checked build's rules for the first
    # three, the suite's sizes from the steps' tiles for the fourth). 1: ordinary stores read by
    # the async proxy with no proxy fence.
    Bug("v8nostagingfence", V8, "O staged with ordinary stores and stored by TMA with no proxy fence",
        [("o_staging.fence();  // these ordinary stores are read next by the copy engine", ";", 1, "hopper/epilogue.cuh")],
        rule="unfenced-async-read"),
    Bug("v10nodsfence", V10, "dS^T written with ordinary stores and read by wgmma with no proxy fence",
        [("ds.fence(step);  // read next by wgmma, the other consumer's too", ";", 1)],
        rule="unfenced-async-read"),
    # 2: a buffer rewritten while an asynchronous read of its old contents may be in flight.
    Bug("v8nowritersbarrier", V8, "one thread waits for the last O store's reads, the others write without the barrier after it",
        [("o_staging.sync();\n  o_staging.begin_writes();", "o_staging.begin_writes();", 1, "hopper/epilogue.cuh")],
        rule="write-during-async-read"),
    Bug("v10onedsbuffer", V10, "one dS^T buffer: a consumer rewrites it while the other's dQ wgmma may still read it",
        [("static constexpr int kDsBuffers = 2;", "static constexpr int kDsBuffers = 1;", 1)],
        rule="write-during-async-read"),
    # 3: an arrive or a release without the matching wait, on the path where a warp has no work.
    Bug("v8idlenofullwait", V8, "a consumer with no rows releases K stages without waiting for them",
        [("    k_ring.wait_full(kv_use + i);\n    k_ring.release(kv_use + i, lane, groups);",
          "    k_ring.release(kv_use + i, lane, groups);", 1)],
        rule="arrive-without-wait"),
    Bug("v8idlenoturnwait", V8, "a consumer with no rows passes the ping-pong turn without waiting for it",
        [("      turns.wait_for_turn();\n      turns.pass_turn();", "      turns.pass_turn();", 1)],
        rule="arrive-without-wait"),
    # 4: sizes that are exact multiples of a tile.
    # Packed sequences (policies/sequences.cuh): a sequence's own keys, and its own rows of O.
    Bug("v8packedlongestkeys", V8, "every packed sequence walks the keys of the longest, into the next sequence's",
        [("const policies::Mask<kCausal> mask = sequences.mask(span, launch_mask);",
          "const policies::Mask<kCausal> mask = launch_mask;", 1),
         ("const policies::Mask<kCausal> mask = sequences.mask(span, launch_mask);",
          "const policies::Mask<kCausal> mask = launch_mask;", 1)], target=PACKED_TEST),
    Bug("v8packedrowsunbounded", V8, "a packed sequence's O rows copied past its end, over the next sequence's",
        [("if (first_row + row >= tokens) break;", "if (first_row + row >= T::kBlockM) break;", 1,
          "hopper/epilogue.cuh")], target=PACKED_TEST),
    Bug("v10packedrowsseen", V10, "rows past a packed sequence's end (the next sequence's, which a Q tile's copy brings in) keep L = 0: their P reaches dK and dV",
        [("      lse_log2[padded_row] = INFINITY;\n", "      lse_log2[padded_row] = 0.0f;\n", 1)], target=PACKED_TEST),
    Bug("v10packedlongestkeys", V10, "every packed sequence's keys counted to the longest's, into the next sequence's",
        [("const policies::Mask<kCausal> mask = sequences.mask(span, launch_mask);",
          "const policies::Mask<kCausal> mask = launch_mask;", 1)], target=PACKED_TEST),
    Bug("v8lasttilemod", V8, "the last K/V tile's keys counted as N_k % tile (0 when N_k fills its tiles exactly)",
        [("const int last_tile_keys = kv_tokens - (kv_tiles - 1) * kBlockN;",
          "const int last_tile_keys = kv_tokens % kBlockN;", 1)], target=TILE_MULTIPLES_TEST),
]

# Every test case but the long sequences (their CPU reference takes most of a suite's time, and
# they catch nothing the tails do not); the first failed check ends the run.
SUITE_ARGUMENTS = ["--test-case-exclude=*long sequences*", "--abort-after=1"]
RUN_LIMIT_S = 240  # a copy's whole suite, per build


def fail(message, status=3):
    print(f"planted_bugs.py: {message}", file=sys.stderr)
    sys.exit(status)


def planted_sources(bug):
    """The planted files: {None: the step's .cu} and, for an edit in a library header (policies/,
    hopper/), {its path under steps/: its text}. The copy of a header is found before the
    shipped one (its folder comes first on the include path), by this copy of the step only."""
    folder = os.path.join(REPO, "steps", bug.folder)
    sources = [name for name in os.listdir(folder) if name.endswith(".cu")]
    if len(sources) != 1:
        fail(f"{folder} must hold one .cu file")
    paths = {None: os.path.join(folder, sources[0])}
    texts = {}
    for shipped, planted, occurrence, *header in bug.edits:
        key = header[0] if header else None
        path = paths[key] if key is None else paths.setdefault(key, os.path.join(REPO, "steps", key))
        text = texts.get(key) or open(path).read()
        at = -1
        for _ in range(occurrence):
            at = text.find(shipped, at + 1)
            if at < 0:
                fail(f"{bug.id}: {path} no longer has occurrence {occurrence} of '{shipped}'; update this script")
        texts[key] = text[:at] + planted + text[at + len(shipped):]
    texts.setdefault(None, open(paths[None]).read())
    return texts


def run_suite(binary, bug_id, log_path, arguments=SUITE_ARGUMENTS):
    start = time.time()
    with open(log_path, "w") as log:
        try:
            status = subprocess.run([binary, f"--step={bug_id}"] + arguments, stdout=log,
                                    stderr=subprocess.STDOUT, timeout=RUN_LIMIT_S).returncode
        except subprocess.TimeoutExpired:
            status = "timeout"
    text = open(log_path, errors="replace").read()
    rule = re.search(r"pipeline rule (\S+) broken in block \d+, thread \d+", text)
    return status, (rule.group(1) if rule else ""), time.time() - start, text


def failing_shapes(log_text):
    """The shapes a doctest log's failed checks name (CAPTURE(shape.str())), in order."""
    shapes = re.findall(r"shape\.str\(\) := (B=\d+ H=\d+ N=\d+ D=\d+)", log_text)
    return list(dict.fromkeys(shapes)) or ["(no shape logged)"]


def verdict(status):
    if status == 0:
        return "passed"
    if status == "timeout":
        return "caught (timed out)"
    if status == 77:
        return "skipped"
    return "caught"


COLUMNS = ["id", "step", "bug", "normal_suite", "checked_build", "checked_rule", "expected_rule",
           "targeted_test", "caught_by"]


def write_sources(out_dir, bugs):
    for bug in bugs:
        for header, text in planted_sources(bug).items():
            path = os.path.join(out_dir, bug.id, header) if header else os.path.join(out_dir, f"{bug.id}.cu")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if not os.path.isfile(path) or open(path).read() != text:  # unchanged: no rebuild
                with open(path, "w") as out:
                    out.write(text)
        print(bug.id, bug.folder, int(bug.hopper))
    return 0


def run_one(args, bug):
    """Runs one copy through the normal build (unless it hangs by design), the checked build (a
    Hopper step) and its targeted test; writes OUT/rows/<id>.csv; 0 when caught as designed."""
    binaries = {False: os.path.join(args.binaries, "gpu_tests_planted"),
                True: os.path.join(args.binaries, "gpu_tests_planted_checked")}
    for build in (False, True):
        if (build or not bug.hangs) and (bug.hopper or not build) and not os.access(binaries[build], os.X_OK):
            fail(f"{binaries[build]} missing: configure with -DATTN_PLANTED_TESTS=ON and build it")
    log_dir = os.path.join(args.out, "logs")
    os.makedirs(log_dir, exist_ok=True)
    normal = None if bug.hangs else run_suite(binaries[False], bug.id, os.path.join(log_dir, f"{bug.id}.normal.log"))
    checked = run_suite(binaries[True], f"{bug.id}_checked", os.path.join(log_dir, f"{bug.id}.checked.log")) \
        if bug.hopper else None
    target = run_suite(binaries[False], bug.id, os.path.join(log_dir, f"{bug.id}.target.log"),
                       [f"--test-case={bug.target}"]) if bug.target else None
    if any(outcome and outcome[0] == 77 for outcome in (normal, checked, target)):
        print(f"{bug.id}: skipped (no GPU the copy runs on)")
        return 77
    caught_by = [name for name, outcome in (("normal suite", normal), ("checked build", checked))
                 if outcome and outcome[0] != 0]
    rule = checked[1] if checked else ""
    wrong = []
    if bug.rule and rule != bug.rule:
        wrong.append(f"expected rule {bug.rule}, got {rule or 'no rule'}")
    if target and target[0] == 0:
        wrong.append(f"its targeted test '{bug.target}' passed")
    row = {"id": bug.id, "step": bug.folder.split("_")[0], "bug": bug.what,
           "normal_suite": verdict(normal[0]) if normal else "not run (hangs by design)",
           "checked_build": verdict(checked[0]) if checked else "n/a (not a Hopper step)",
           "checked_rule": rule, "expected_rule": bug.rule,
           "targeted_test": (f"'{bug.target}': {verdict(target[0])}" +
                             (f" at {', '.join(failing_shapes(target[3]))}" if target[0] else "")
                             if target else ""),
           "caught_by": " and ".join(caught_by) or "NOT CAUGHT",
           "not_as_designed": "; ".join(wrong)}
    os.makedirs(os.path.join(args.out, "rows"), exist_ok=True)
    with open(os.path.join(args.out, "rows", f"{bug.id}.csv"), "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    print(f"{bug.id}: normal suite {row['normal_suite']}, checked build {row['checked_build']}"
          f"{' (rule ' + rule + ')' if rule else ''}; caught by {row['caught_by']}"
          f"{'; NOT AS DESIGNED: ' + row['not_as_designed'] if wrong else ''}")
    return 0 if caught_by and not wrong else 1


def report(args, bugs):
    """OUT/planted.csv and planted.txt from the rows --run-one wrote (a bug with none was not run:
    listed, and its own test failed or was skipped); 1 when a bug run was not caught as designed."""
    rows, missing = [], []
    for bug in bugs:
        path = os.path.join(args.out, "rows", f"{bug.id}.csv")
        if not os.path.isfile(path):
            missing.append(bug.id)
            continue
        with open(path, newline="") as handle:
            rows.extend(csv.DictReader(handle))
    with open(os.path.join(args.out, "planted.csv"), "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = [f"{'id':<16} {'normal suite':<26} {'checked build':<24} {'rule (checked build)':<22} bug"]
    for row in rows:
        lines.append(f"{row['id']:<16} {row['normal_suite']:<26} {row['checked_build']:<24} "
                     f"{row['checked_rule'] or '-':<22} {row['bug']}")
    for row in rows:
        if row["targeted_test"]:
            lines.append(f"{row['id']}: the targeted test {row['targeted_test']}")
    caught = sum(row["caught_by"] != "NOT CAUGHT" for row in rows)
    lines.append(f"{caught} of {len(rows)} planted bugs run caught (all must be)")
    wrong = [f"{row['id']} ({row['not_as_designed']})" for row in rows if row["not_as_designed"]]
    if wrong:
        lines.append("not caught as designed: " + ", ".join(wrong))
    if missing:
        lines.append("not run (no row; skipped, or its test did not finish): " + ", ".join(missing))
    text = "\n".join(lines) + "\n"
    open(os.path.join(args.out, "planted.txt"), "w").write(text)
    print(text, end="")
    return 0 if caught == len(rows) and not wrong else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated ids (default: every bug)")
    parser.add_argument("--binaries", help="the build folder holding gpu_tests_planted[_checked]")
    parser.add_argument("--out", help="where logs, rows and the report go")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check-edits", action="store_true",
                      help="only plant every bug in memory: each edit must still apply (no GPU, "
                           "no compiler; ctest runs this on every build)")
    mode.add_argument("--write-sources", metavar="DIR")
    mode.add_argument("--run-one", metavar="ID")
    mode.add_argument("--report", action="store_true")
    args = parser.parse_args()
    bugs = BUGS
    wanted = args.only.split(",") if args.only else []
    if args.run_one:
        wanted = [args.run_one]
    unknown = [name for name in wanted if name not in {bug.id for bug in BUGS}]
    if unknown:
        parser.error(f"no planted bug {', '.join(unknown)} (bugs: {', '.join(b.id for b in BUGS)})")
    if wanted:
        bugs = [bug for bug in BUGS if bug.id in wanted]
    if args.check_edits:
        for bug in bugs:
            planted_sources(bug)  # exits 3 with the missing text when an edit no longer applies
        print(f"planted_bugs.py: all {len(bugs)} planted bugs still apply to steps/")
        return 0
    if args.write_sources:
        return write_sources(args.write_sources, bugs)
    if not args.out or (args.run_one and not args.binaries):
        parser.error("--run-one needs --binaries and --out; --report needs --out")
    os.makedirs(args.out, exist_ok=True)
    return run_one(args, bugs[0]) if args.run_one else report(args, bugs)


if __name__ == "__main__":
    sys.exit(main())
