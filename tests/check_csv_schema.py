#!/usr/bin/env python3
"""The CSV schema is the bench's: scripts/compare_pytorch.py (which writes PyTorch's rows beside
the bench's) and tests/grading/test_grade_report.py (which fakes the bench's output) must use
the header `bench --csv-header` prints, column for column.

    check_csv_schema.py BENCH REPO_ROOT
"""
import ast
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
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
