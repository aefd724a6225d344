"""Which rows of a sequence each GPU holds when attention is split over the sequence
(attention_steps.sequence_parallel). Plain arithmetic, no torch: the same answer on every rank,
with no communication.

The N rows are cut into chunks whose sizes differ by at most one (the first N % chunks get one
row more), so any N splits, not only multiples of the GPU count. Unbalanced, there is one chunk per
GPU, in order: GPU r holds rows [r N / W, (r + 1) N / W). Balanced (for causal attention), there
are two chunks per GPU and GPU r holds chunks r and 2W - 1 - r: under a causal mask a late chunk
sees many keys and an early one few, so each GPU gets one of each and all have about the same
work. A GPU's tensors hold its chunks one after the other, in that order.

    layout = SequenceLayout(tokens=4097, world_size=2, balanced=True)
    layout.chunks(0)        # ((0, 1025), (3073, 4097)): rows of chunk 0 and chunk 3
    layout.local_tokens(0)  # 2049
"""


class SequenceLayout:
    def __init__(self, tokens, world_size, balanced=False):
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, not {world_size}")
        self.tokens, self.world_size, self.balanced = int(tokens), int(world_size), bool(balanced)
        count = self.world_size * (2 if self.balanced else 1)
        if self.tokens < count:
            raise ValueError(f"{self.tokens} tokens cannot give each of {count} chunks a row "
                             f"({self.world_size} GPUs{', balanced' if self.balanced else ''})")
        size, longer = divmod(self.tokens, count)
        starts = [c * size + min(c, longer) for c in range(count + 1)]
        self._bounds = [(starts[c], starts[c + 1]) for c in range(count)]

    def chunk_ids(self, rank):
        """The chunks GPU `rank` holds, in the order its tensors hold them."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not in 0..{self.world_size - 1}")
        if self.balanced:
            return (rank, 2 * self.world_size - 1 - rank)
        return (rank,)

    def chunks(self, rank):
        """((start, stop), ...): the rows of each chunk GPU `rank` holds, in its tensors' order."""
        return tuple(self._bounds[c] for c in self.chunk_ids(rank))

    def local_tokens(self, rank):
        """How many rows GPU `rank` holds."""
        return sum(stop - start for start, stop in self.chunks(rank))

    def local_offsets(self, rank):
        """((local_start, local_stop, start, stop), ...): where each chunk of GPU `rank` lies in
        its tensors (local) and in the sequence."""
        found, local = [], 0
        for start, stop in self.chunks(rank):
            found.append((local, local + stop - start, start, stop))
            local += stop - start
        return tuple(found)

    def __repr__(self):
        return (f"SequenceLayout(tokens={self.tokens}, world_size={self.world_size}, "
                f"balanced={self.balanced})")


def causal_visibility(query_rows, key_rows):
    """Under a causal mask (query i sees key j where j <= i, both counted in the whole
    sequence), what a block of queries sees of a block of keys: "all", "none", or "diagonal"
    (the same rows, where the top-left causal mask of the block itself applies). Blocks are
    (start, stop) chunks of one SequenceLayout: two different chunks never overlap, so no other
    case arises."""
    (q_start, q_stop), (k_start, k_stop) = query_rows, key_rows
    if (q_start, q_stop) == (k_start, k_stop):
        return "diagonal"
    if k_stop <= q_start:
        return "all"
    if k_start >= q_stop:
        return "none"
    raise ValueError(f"rows {query_rows} and {key_rows} overlap without being the same chunk")


def block_calls(layout, rank, source, causal):
    """The attention calls that give GPU `rank`'s queries what they see of the keys GPU `source`
    holds: ((query_local_start, query_local_stop), (key_local_start, key_local_stop), alignment),
    rows counted in the two GPUs' own tensors, alignment "top-left" for a diagonal block under a
    causal mask, else None. Without a mask, one call; under it, per query chunk one call over the
    key chunks it sees whole (merged where they touch) and one for its own chunk."""
    queries, keys = layout.local_offsets(rank), layout.local_offsets(source)
    if not causal:
        return [((0, queries[-1][1]), (0, keys[-1][1]), None)]
    calls = []
    for q_local0, q_local1, q_start, q_stop in queries:
        seen = []
        for k_local0, k_local1, k_start, k_stop in keys:
            visible = causal_visibility((q_start, q_stop), (k_start, k_stop))
            if visible == "diagonal":
                calls.append(((q_local0, q_local1), (k_local0, k_local1), "top-left"))
            elif visible == "all":
                if seen and seen[-1][1] == k_local0:
                    seen[-1] = (seen[-1][0], k_local1)
                else:
                    seen.append((k_local0, k_local1))
        calls += [((q_local0, q_local1), keys_seen, None) for keys_seen in seen]
    return calls
