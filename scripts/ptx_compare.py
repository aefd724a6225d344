#!/usr/bin/env python3
"""Whether a change left steps' kernels as they were, without a GPU: each step's kernel file now
and at COMMIT compiled to PTX with the same flags, and every kernel's PTX compared.

  scripts/ptx_compare.py [--nvcc PATH] COMMIT STEP...     e.g. scripts/ptx_compare.py 7e7920c v6 v8 v10

The step file at COMMIT is compiled against that commit's steps/ folder (its library headers:
steps/ampere/, steps/hopper/, or the headers beside its kernel then) and today's harness headers,
as scripts/bench-against.sh does; today's file against today's steps/. Both get the same step id,
so the string constants agree. A step whose step.cmake says ARCH 90a (or, at a commit before
step.cmake, that uses wgmma or setmaxnreg) is compiled for compute_90a, the others for compute_90. Before comparing, what does not reach the machine code
is left out: the debug sections, .loc and .file lines, the hash nvcc gives an anonymous
namespace (it changes from compile to compile), and the function's number in branch labels
($L__BB7_3 is in the file's eighth function: kernels instantiated in another order are
renumbered). PTX the same up to those names gives the same SASS: ptxas is deterministic.
scripts/sass_compare.py compares the SASS itself, on a machine with cuobjdump.

Prints, per step, each kernel's line count and how many of its lines changed (difflib), and
the kernels only one side has. Exit status: 0 when every kernel of every step is the same, 1 when one is not, 2 on a
usage error, 3 when a compile failed.
"""
import argparse
import difflib
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANONYMOUS = re.compile(r"_ZN\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]{8}_\d+")
# The same namespace named inside a kernel's template arguments (a type of the step's own).
ANONYMOUS_INSIDE = re.compile(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]{8}_\d+")
LABEL = re.compile(r"\$L__BB\d+_(\d+)")  # a label's first number is its function's place in the file
ENTRY = re.compile(r"^(?:\.visible |\.weak )?\.entry (\S+?)\(")


def compile_ptx(nvcc, source, steps_root, step, arch, out):
    command = [nvcc, "-std=c++17", "-O3", "-lineinfo", "--expt-relaxed-constexpr",
               f"-arch=compute_{arch}", "-ptx", f"-I{REPO}/contract",
               f"-I{steps_root}", f'-DATTN_STEP_ID="{step}"', source, "-o", out]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"ptx_compare.py: nvcc failed on {source}:\n{result.stderr[-3000:]}")


def kernels(ptx_path):
    """{kernel name (anonymous-namespace hash left out): [PTX line, ...]}, and the module's other lines."""
    text = open(ptx_path).read()
    text = text.split("\t.section\t.debug", 1)[0]
    text = ANONYMOUS.sub("_ZN_anonymous_", text)
    text = ANONYMOUS_INSIDE.sub("_anonymous_", text)
    text = LABEL.sub(r"$L__BB_\1", text)
    code, current, module, depth = {}, None, [], 0
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith((".loc", ".file", "//")) or not stripped:
            continue
        entry = ENTRY.match(stripped)
        if entry:
            current, depth = entry.group(1), 0
            code[current] = []
        (code[current] if current else module).append(stripped)
        if current:  # the body ends where its braces balance (inline asm opens blocks of its own)
            opened = depth > 0 or "{" in stripped
            depth += stripped.count("{") - stripped.count("}")
            if opened and depth == 0:
                current = None
    return code, module


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvcc", default="nvcc", help="the nvcc to use (default: nvcc on PATH)")
    parser.add_argument("commit")
    parser.add_argument("steps", nargs="+")
    args = parser.parse_args()
    if shutil.which(args.nvcc) is None:
        print(f"ptx_compare.py: {args.nvcc} not found (the CUDA toolkit is needed, no GPU)", file=sys.stderr)
        return 2
    if subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", "--quiet", f"{args.commit}^{{commit}}"],
                      capture_output=True).returncode != 0:
        print(f"ptx_compare.py: no commit '{args.commit}' in this repository", file=sys.stderr)
        return 2
    all_same = True
    with tempfile.TemporaryDirectory() as work:
        archive = subprocess.run(["git", "-C", REPO, "archive", args.commit, "steps"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", work], input=archive.stdout, check=True)
        for step in args.steps:
            if not re.fullmatch(r"v\d+", step):
                print(f"ptx_compare.py: '{step}' is not a step id (v7, say)", file=sys.stderr)
                return 2
            now = glob.glob(f"{REPO}/steps/{step}_*/*.cu")
            then = glob.glob(f"{work}/steps/{step}_*/*.cu")
            if len(now) != 1 or len(then) != 1:
                print(f"ptx_compare.py: {step}: no single kernel file now ({len(now)}) or at "
                      f"{args.commit} ({len(then)})", file=sys.stderr)
                return 2
            # sm_90a where the step folder's step.cmake says so (scripts/step-facts.sh), now or
            # then; at a commit before step.cmake, where the file uses wgmma or setmaxnreg.
            archs = [subprocess.run([f"{REPO}/scripts/step-facts.sh", os.path.dirname(path)],
                                    capture_output=True, text=True).stdout.split()[:1] for path in now + then]
            hopper = ["90a"] in archs or (not all(archs) and any(
                re.search(r"wgmma|setmaxnreg", open(path).read()) for path in now + then))
            arch = "90a" if hopper else "90"
            compile_ptx(args.nvcc, then[0], f"{work}/steps", step, arch, f"{work}/{step}_then.ptx")
            compile_ptx(args.nvcc, now[0], f"{REPO}/steps", step, arch, f"{work}/{step}_now.ptx")
            old, old_module = kernels(f"{work}/{step}_then.ptx")
            new, new_module = kernels(f"{work}/{step}_now.ptx")
            print(f"{step} (compute_{arch}): {len(new)} kernels now, {len(old)} at {args.commit}")
            if not new or not old:
                print(f"ptx_compare.py: {step}: no kernel found in the PTX", file=sys.stderr)
                return 3
            if old_module != new_module:
                all_same = False
                print("  the module's declarations differ")
            for name in sorted(set(old) | set(new)):
                if name not in old or name not in new:
                    all_same = False
                    print(f"  only {'now' if name in new else 'at ' + args.commit}: {name}")
                    continue
                matcher = difflib.SequenceMatcher(None, old[name], new[name], autojunk=False)
                differing = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal")
                all_same &= differing == 0
                verdict = "same" if differing == 0 else f"{differing} lines differ"
                print(f"  {verdict:>18}  {len(new[name]):6d} lines  {name}")
    print("every kernel the same" if all_same else "some kernels differ")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
