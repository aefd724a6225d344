#!/usr/bin/env python3
"""How evenly step 8's persistent blocks share a causal forward: the K/V tiles each block visits
under the two walks of policies/tile_scheduler.cuh, counted (no GPU), and the busiest block's
count over the mean. The launch takes as long as its busiest block, so that ratio predicts how
much of the time is waiting.

  slice by slice   work tile i is row tile i % R of slice i / R (R row tiles a slice), every
                   other full round of `blocks` tiles handed out in reverse (the walk before)
  longest first    work tile i is row tile R - 1 - i / S of slice i % S (S slices), the rounds
                   alternating the same way (the walk now)

A row tile of rows [r0, r0 + M) walks ceil(min(r0 + M, N) / K) K/V tiles of K keys (the
top-left diagonal, N_k = N).

Packed sequences of different lengths (--lengths, no causal mask; chapter 21) are walked the same
two ways over the row tiles of the longest (a row tile past a shorter sequence's end is empty),
and a third way, the one step 8 takes: the row tiles that exist, sequence by sequence, head by
head, in order (PackedScheduler; its at most one empty tile a sequence and head costs nothing
here). Every row tile of a sequence of n tokens walks ceil(n / K) K/V tiles (plus one, for what a
tile costs besides its visits).

  scripts/causal_walk.py [--blocks 132] B,H,N,M,K [B,H,N,M,K ...]
  scripts/causal_walk.py --lengths 197,577,1025,... H,M,K [H,M,K ...]
  e.g. scripts/causal_walk.py 1,16,16384,128,160 8,12,4097,192,128
"""
import argparse
import math


def visits(batch, heads, tokens, rows, keys, blocks, longest_first):
    row_tiles, slices = math.ceil(tokens / rows), batch * heads
    work_tiles = row_tiles * slices
    per_block = [0] * blocks
    for index in range(work_tiles):
        block, round_start = index % blocks, index // blocks * blocks
        if (index // blocks) % 2 == 1 and round_start + blocks <= work_tiles:
            index = round_start + blocks - 1 - (index - round_start)
        tile = row_tiles - 1 - index // slices if longest_first else index % row_tiles
        per_block[block] += math.ceil(min(rows * (tile + 1), tokens) / keys)
    return per_block


def packed_visits(lengths, heads, rows, keys, blocks, longest_first):
    """Over the longest sequence's row tiles: slice by slice, or longest first."""
    row_tiles, slices = math.ceil(max(lengths) / rows), len(lengths) * heads
    work_tiles = row_tiles * slices
    per_block = [0] * blocks
    for index in range(work_tiles):
        block, round_start = index % blocks, index // blocks * blocks
        if longest_first and (index // blocks) % 2 == 1 and round_start + blocks <= work_tiles:
            index = round_start + blocks - 1 - (index - round_start)
        if longest_first:
            slice_, tile = index % slices, row_tiles - 1 - index // slices
        else:
            slice_, tile = index // row_tiles, index % row_tiles
        length = lengths[slice_ // heads]
        if tile * rows < length:
            per_block[block] += math.ceil(length / keys) + 1
    return per_block


def packed_in_order(lengths, heads, rows, keys, blocks):
    """The row tiles that exist, sequence by sequence, head by head, in order."""
    costs = [math.ceil(n / keys) + 1 for n in lengths for _ in range(heads) for _ in range(math.ceil(n / rows))]
    per_block = [0] * blocks
    for index, cost in enumerate(costs):
        per_block[index % blocks] += cost
    return per_block


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=132, help="persistent blocks (an H100's SMs)")
    parser.add_argument("--lengths", help="packed sequences' lengths: the shapes are then H,M,K")
    parser.add_argument("shapes", nargs="+", help="B,H,N,M,K: batch, heads, tokens, rows and keys a tile")
    args = parser.parse_args()
    if args.lengths:
        lengths = [int(v) for v in args.lengths.split(",")]
        print(f"{len(lengths)} packed sequences, {sum(lengths)} tokens: busiest block / mean, "
              "slice by slice, longest first, in order")
        for text in args.shapes:
            heads, rows, keys = (int(v) for v in text.split(","))
            walks = [packed_visits(lengths, heads, rows, keys, args.blocks, False),
                     packed_visits(lengths, heads, rows, keys, args.blocks, True),
                     packed_in_order(lengths, heads, rows, keys, args.blocks)]
            ratios = [max(p) / (sum(p) / len(p)) for p in walks]
            print(f"H = {heads}, {rows} x {keys}: " + ", ".join(f"{r:.3f}" for r in ratios))
        return
    print("shape (B, H, N), tile M x K: busiest block / mean, slice by slice -> longest first")
    for text in args.shapes:
        batch, heads, tokens, rows, keys = (int(v) for v in text.split(","))
        ratios = []
        for longest_first in (False, True):
            per_block = visits(batch, heads, tokens, rows, keys, args.blocks, longest_first)
            ratios.append(max(per_block) / (sum(per_block) / len(per_block)))
        print(f"({batch}, {heads}, {tokens}), {rows} x {keys}: {ratios[0]:.3f} -> {ratios[1]:.3f}")


if __name__ == "__main__":
    main()
