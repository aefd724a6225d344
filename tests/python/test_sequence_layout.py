"""attention_steps.sequence_layout: which rows each GPU holds when attention is split over the
sequence, and what a block of queries sees of a block of keys under a causal mask. Plain
Python: runs on any machine (ctest label cpu)."""
import itertools
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from attention_steps.sequence_layout import SequenceLayout, block_calls, causal_visibility  # noqa: E402


class Layout(unittest.TestCase):
    def test_every_row_once_sizes_within_one(self):
        for tokens, world, balanced in itertools.product((8, 9, 197, 4097, 16385), (1, 2, 3, 4, 8),
                                                         (False, True)):
            if tokens < world * (2 if balanced else 1):
                continue
            layout = SequenceLayout(tokens, world, balanced)
            rows = sorted(row for rank in range(world) for start, stop in layout.chunks(rank)
                          for row in range(start, stop))
            self.assertEqual(rows, list(range(tokens)), layout)
            sizes = [stop - start for rank in range(world) for start, stop in layout.chunks(rank)]
            self.assertLessEqual(max(sizes) - min(sizes), 1, layout)
            self.assertEqual(sum(layout.local_tokens(rank) for rank in range(world)), tokens)

    def test_balanced_pairs_an_early_chunk_with_a_late_one(self):
        layout = SequenceLayout(4097, 2, balanced=True)
        self.assertEqual(layout.chunks(0), ((0, 1025), (3073, 4097)))
        self.assertEqual(layout.chunks(1), ((1025, 2049), (2049, 3073)))
        self.assertEqual(layout.local_offsets(0), ((0, 1025, 0, 1025), (1025, 2049, 3073, 4097)))
        # Under a causal mask every GPU then has about the same number of (query, key) pairs.
        for world in (2, 4, 8):
            layout = SequenceLayout(16384, world, balanced=True)
            pairs = [sum((start + stop + 1) * (stop - start) // 2 for start, stop in layout.chunks(rank))
                     for rank in range(world)]
            self.assertLessEqual(max(pairs) / min(pairs), 1.001, (world, pairs))

    def test_unbalanced_is_in_order(self):
        layout = SequenceLayout(10, 3)
        self.assertEqual([layout.chunks(rank) for rank in range(3)],
                         [((0, 4),), ((4, 7),), ((7, 10),)])

    def test_refusals(self):
        with self.assertRaisesRegex(ValueError, "cannot give each of 4 chunks a row"):
            SequenceLayout(3, 2, balanced=True)
        with self.assertRaisesRegex(ValueError, "world_size must be at least 1"):
            SequenceLayout(8, 0)
        with self.assertRaisesRegex(ValueError, "rank 2 is not in 0..1"):
            SequenceLayout(8, 2).chunks(2)


class CausalVisibility(unittest.TestCase):
    def test_cases(self):
        self.assertEqual(causal_visibility((10, 20), (10, 20)), "diagonal")
        self.assertEqual(causal_visibility((10, 20), (0, 10)), "all")
        self.assertEqual(causal_visibility((0, 10), (10, 20)), "none")
        with self.assertRaisesRegex(ValueError, "overlap"):
            causal_visibility((0, 10), (5, 15))

    def test_against_every_pair_of_rows(self):
        # Brute force: a block sees all keys of another where every (i, j) has j <= i, none where
        # no pair does; the diagonal block is the top-left mask of itself.
        layout = SequenceLayout(23, 3, balanced=True)
        chunks = [c for rank in range(3) for c in layout.chunks(rank)]
        for queries, keys in itertools.product(chunks, chunks):
            seen = [[j <= i for j in range(*keys)] for i in range(*queries)]
            verdict = causal_visibility(queries, keys)
            if verdict == "all":
                self.assertTrue(all(map(all, seen)))
            elif verdict == "none":
                self.assertFalse(any(map(any, seen)))
            else:
                self.assertEqual(queries, keys)
                self.assertEqual(seen, [[b <= a for b in range(len(seen))] for a in range(len(seen))])


class BlockCalls(unittest.TestCase):
    def test_the_ring_sees_every_visible_pair_once(self):
        # Over the W turns of the ring, GPU r attends to every GPU's keys: the calls, their masks
        # applied, must cover each (query, key) pair of the whole sequence that the mask lets
        # through exactly once, and nothing else.
        for tokens, world, balanced, causal in itertools.product(
                (7, 8, 33, 130), (1, 2, 3, 4), (False, True), (False, True)):
            if tokens < world * (2 if balanced else 1):
                continue
            layout = SequenceLayout(tokens, world, balanced)
            covered = {}
            for rank, source in itertools.product(range(world), range(world)):
                q_rows = [row for start, stop in layout.chunks(rank) for row in range(start, stop)]
                k_rows = [row for start, stop in layout.chunks(source) for row in range(start, stop)]
                for (q0, q1), (k0, k1), alignment in block_calls(layout, rank, source, causal):
                    self.assertIn(alignment, (None, "top-left"))
                    if alignment:
                        self.assertEqual(q1 - q0, k1 - k0)
                    for a, b in itertools.product(range(q0, q1), range(k0, k1)):
                        if alignment and b - k0 > a - q0:
                            continue  # masked inside the call
                        pair = (q_rows[a], k_rows[b])
                        covered[pair] = covered.get(pair, 0) + 1
            wanted = {(i, j) for i in range(tokens) for j in range(tokens) if not causal or j <= i}
            self.assertEqual(set(covered), wanted, (tokens, world, balanced, causal))
            self.assertEqual(set(covered.values()), {1}, (tokens, world, balanced, causal))

    def test_a_balanced_turn_makes_few_calls(self):
        layout = SequenceLayout(16384, 4, balanced=True)
        # GPU 1 (chunks 1 and 6) against GPU 3's keys (chunks 3 and 4): chunk 1 sees neither,
        # chunk 6 sees both whole, in one call over GPU 3's whole block.
        self.assertEqual(block_calls(layout, 1, 3, True), [((2048, 4096), (0, 4096), None)])
        self.assertEqual(block_calls(layout, 1, 1, True),
                         [((0, 2048), (0, 2048), "top-left"), ((2048, 4096), (2048, 4096), "top-left"),
                          ((2048, 4096), (0, 2048), None)])


if __name__ == "__main__":
    unittest.main(verbosity=2)
