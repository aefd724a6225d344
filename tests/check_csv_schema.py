#!/usr/bin/env python3
"""The CSV schema is the bench's: scripts/compare_pytorch.py (which writes PyTorch's rows beside
the bench's) and tests/grading/test_grade_report.py (which fakes the bench's output) must use
the header `bench --csv-header` prints, column for column. compare_pytorch.py also copies the
bench's timing counts and the checker's tolerances (it runs without the bench): each copy must
equal the constant in the C++ source it names.

    check_csv_schema.py BENCH REPO_ROOT
"""
import ast
import re
import subprocess
import sys
from pathlib import Path


def string_constant(path, name):
    """The string of a module-level NAME = "..." (or NAME = ("...").split(","))."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "attr", None) == "split":
                value = value.func.value
            return ast.literal_eval(value)
    raise SystemExit(f"check_csv_schema.py: {path} has no {name}")


def module_constants(path):
    """Every module-level NAME = <literal or arithmetic on earlier names>, evaluated."""
    values = {}
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.Assign):
            continue
        try:
            value = eval(compile(ast.Expression(node.value), str(path), "eval"), {}, dict(values))
        except Exception:
            continue
        for target in node.targets:
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            parts = value if isinstance(target, ast.Tuple) else [value]
            for name, part in zip(names, parts):
                if isinstance(name, ast.Name):
                    values[name.id] = part
    return values


def cpp_number(root, relative, pattern):
    """The number PATTERN's one group captures in a C++ source (hex floats included)."""
    match = re.search(pattern, (root / relative).read_text())
    if not match:
        raise SystemExit(f"check_csv_schema.py: {relative} no longer matches {pattern!r}")
    text = match.group(1)
    return float.fromhex(text) if "0x" in text else float(text)


def constant_mismatches(root):
    """compare_pytorch.py's copies of the C++ constants, each against its source."""
    python = module_constants(root / "scripts/compare_pytorch.py")
    roundoff = cpp_number(root, "harness/check.hpp", r"kUnitRoundoff = ([0-9a-fx.p+-]+);")
    relative_factor = cpp_number(root, "harness/check.hpp", r"kRelativeTolerance = ([0-9.]+) \* kUnitRoundoff")
    absolute_factor = cpp_number(root, "harness/check.hpp", r"kAbsoluteFactor = ([0-9.]+) \* kUnitRoundoff")
    sources = {
        "WARMUP": cpp_number(root, "harness/options.hpp", r"int warmup = ([0-9]+);"),
        "AUTO_ITERS": cpp_number(root, "harness/options.hpp", r"kAutoIters = ([0-9]+);"),
        "AUTO_SECONDS": cpp_number(root, "harness/options.hpp", r"kAutoSeconds = ([0-9.]+);"),
        "MIN_ITERS": cpp_number(root, "harness/timing.cu", r"kAutoSeconds \* 1e6 / std::max\(probe_us, 1.0\)\), ([0-9.]+),"),
        "MAX_BUFFER_SETS": cpp_number(root, "harness/runner.cu", r"kMaxBufferSets = ([0-9]+);"),
        "UNIT_ROUNDOFF": roundoff,
        "RELATIVE_TOLERANCE": relative_factor * roundoff,
        "ABSOLUTE_FACTOR": absolute_factor * roundoff,
    }
    wrong = []
    for name, expected in sources.items():
        if name not in python:
            wrong.append(f"scripts/compare_pytorch.py has no {name} (the C++ value is {expected})")
        elif float(python[name]) != expected:
            wrong.append(f"scripts/compare_pytorch.py {name} = {python[name]}, the C++ source says {expected}")
    return len(sources), wrong


def main():
    bench, root = sys.argv[1], Path(sys.argv[2])
    header = subprocess.run([bench, "--csv-header"], capture_output=True, text=True,
                            check=True).stdout.strip()
    copies = {
        "scripts/compare_pytorch.py CSV_COLUMNS": string_constant(root / "scripts/compare_pytorch.py", "CSV_COLUMNS"),
        "tests/grading/test_grade_report.py CSV_HEADER": string_constant(root / "tests/grading/test_grade_report.py", "CSV_HEADER"),
    }
    wrong = [name for name, value in copies.items() if value != header]
    for name in wrong:
        print(f"{name} is not the bench's header:\n  bench: {header}\n  {name}: {copies[name]}")
    print(f"check_csv_schema.py: {len(copies) - len(wrong)} of {len(copies)} copies match `bench --csv-header`")
    count, wrong_constants = constant_mismatches(root)
    for line in wrong_constants:
        print(line)
    print(f"check_csv_schema.py: {count - len(wrong_constants)} of {count} constants of "
          "compare_pytorch.py match the C++ sources")
    return 1 if wrong or wrong_constants else 0


if __name__ == "__main__":
    sys.exit(main())
