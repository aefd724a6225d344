#!/usr/bin/env python3
"""Whether a change left a kernel's machine code (SASS) as it was: each kernel of NEW against the
kernel of the same name in OLD, instruction by instruction.

  scripts/sass_compare.py [--drop-template-arg TEXT] OLD_BINARY NEW_BINARY

Both binaries are read with `cuobjdump -sass` (CUDA toolkit; it needs nvdisasm beside it) and
their kernels matched by demangled name, template arguments included, parameter list left out.
--drop-template-arg removes a last template argument from NEW's names before matching, for a
kernel that gained one: with `false`, NEW's flash_attention_kernel<64, 4, 2, 64, false> is
compared with OLD's flash_attention_kernel<64, 4, 2, 64>. Per kernel it prints the instruction
counts and how many instructions differ, then how many differ in more than a parameter's offset
in the constant bank (c[0x0][...]): a kernel that gained a parameter reads the later ones from
new offsets and nothing else need change. 0 there means the same code. Exit status: 0 when every
matched kernel is the same code, 1 when one is not or a kernel of NEW has no match, 2 on a usage
error.
"""
import argparse
import re
import shutil
import subprocess
import sys

FUNCTION = re.compile(r"^\s+Function : (\S+)")
INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
PARAMETER = re.compile(r"c\[0x0\]\[0x[0-9a-f]+\]")


def kernels(binary):
    """{demangled name without its parameter list: [instruction, ...]}"""
    sass = subprocess.run(["cuobjdump", "-sass", binary], capture_output=True, text=True)
    if sass.returncode != 0:
        sys.exit(f"sass_compare.py: cuobjdump -sass {binary} failed: {sass.stderr.strip()}")
    code, current = {}, None
    for line in sass.stdout.splitlines():
        function = FUNCTION.match(line)
        if function:
            current = function.group(1)
            code[current] = []
        elif current and (instruction := INSTRUCTION.match(line)):
            code[current].append(instruction.group(1))
    names = subprocess.run(["c++filt"], input="\n".join(code), capture_output=True, text=True,
                           check=True).stdout.splitlines()
    # "> >" and ">>" are the same closing brackets, however c++filt spaced them
    return {re.sub(r"\s+>", ">", without_parameters(name)): code[mangled]
            for mangled, name in zip(code, names)}


def without_parameters(name):
    """'void f<A, B>(int, float)' -> 'void f<A, B>': the name without its final parameter list."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            return name[:i]
    return name


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drop-template-arg", default=None)
    parser.add_argument("old")
    parser.add_argument("new")
    args = parser.parse_args()
    if shutil.which("cuobjdump") is None:
        sys.exit("sass_compare.py: cuobjdump not found on PATH (CUDA toolkit)")
    old, new = kernels(args.old), kernels(args.new)
    same = True
    for name, code in sorted(new.items()):
        key = name
        if args.drop_template_arg is not None:
            dropped = f", {args.drop_template_arg}>"
            if not name.endswith(dropped):
                continue  # not a kernel that gained the argument: another instantiation
            key = name[: -len(dropped)] + ">"
        if key not in old:
            print(f"{name}: no kernel {key} in {args.old}")
            same = False
            continue
        before = old[key]
        differ = sum(a != b for a, b in zip(code, before)) + abs(len(code) - len(before))
        beyond = sum(PARAMETER.sub("c[param]", a) != PARAMETER.sub("c[param]", b)
                     for a, b in zip(code, before)) + abs(len(code) - len(before))
        print(f"{name}: {len(before)} -> {len(code)} instructions, {differ} differ, "
              f"{beyond} in more than a parameter offset")
        same = same and beyond == 0
    print("sass_compare.py: " + ("the same code" if same else "the code differs"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
