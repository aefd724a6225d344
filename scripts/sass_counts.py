#!/usr/bin/env python3
"""Instruction counts of steps' machine code (SASS), per opcode, for one build or two side by side.

  scripts/sass_counts.py [--steps v7,v8] BUILD_DIR [OTHER_BUILD_DIR]

Reads each step's object file (BUILD_DIR/CMakeFiles/attn_<id>.dir/steps/*/*.cu.o) with
`cuobjdump -sass` (CUDA toolkit; cuobjdump needs nvdisasm beside it) and prints, per step, the
count of every opcode (modifiers kept: HGMMA.64x208x16.F32 and HGMMA.64x64x16.F32 are counted
apart) over all its kernels, then the total. With two builds, the columns are side by side with
their difference, and only the opcodes whose counts differ are listed, then the totals: what a
change did to the code the GPU runs, without a GPU.
"""
import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys

INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def counts(build_dir, step):
    objects = glob.glob(os.path.join(build_dir, "CMakeFiles", f"attn_{step}.dir", "steps", "*", "*.cu.o"))
    if len(objects) != 1:
        sys.exit(f"sass_counts.py: no object of step {step} in {build_dir} (build it first)")
    sass = subprocess.run(["cuobjdump", "-sass", objects[0]], capture_output=True, text=True)
    if sass.returncode != 0:
        sys.exit(f"sass_counts.py: cuobjdump failed: {sass.stderr.strip()}")
    tally = collections.Counter()
    for line in sass.stdout.splitlines():
        match = INSTRUCTION.match(line)
        if match:
            words = match.group(1).split()
            if words and re.fullmatch(r"@!?U?P[0-9T]", words[0]):  # a predicate guard
                words = words[1:]
            if words:
                tally[words[0]] += 1
    return tally


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="v7,v8")
    parser.add_argument("build_dirs", nargs="+", metavar="BUILD_DIR")
    args = parser.parse_args()
    if len(args.build_dirs) > 2:
        parser.error("one or two build folders")
    if shutil.which("cuobjdump") is None:
        sys.exit("sass_counts.py: cuobjdump not found (it comes with the CUDA toolkit)")
    for step in args.steps.split(","):
        tallies = [counts(build_dir, step) for build_dir in args.build_dirs]
        print(f"== {step}: " + " vs ".join(args.build_dirs))
        if len(tallies) == 1:
            for opcode, count in sorted(tallies[0].items()):
                print(f"{opcode:<40} {count:>7}")
            print(f"{'total':<40} {sum(tallies[0].values()):>7}")
            continue
        before, after = tallies
        print(f"{'opcode (differing counts only)':<40} {'first':>7} {'second':>7} {'diff':>6}")
        for opcode in sorted(set(before) | set(after)):
            if before[opcode] != after[opcode]:
                print(f"{opcode:<40} {before[opcode]:>7} {after[opcode]:>7} "
                      f"{after[opcode] - before[opcode]:>+6}")
        same = sum(1 for opcode in set(before) | set(after) if before[opcode] == after[opcode])
        print(f"{'(opcodes with equal counts)':<40} {same:>7}")
        total_before, total_after = sum(before.values()), sum(after.values())
        print(f"{'total':<40} {total_before:>7} {total_after:>7} {total_after - total_before:>+6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
