#!/usr/bin/env python3
"""The lists the docs copy from the code, checked against the code (README's GPU table has a
test of its own, readme_gpu_table.cmake):

  - the Hopper steps: every "Hopper steps (...)" or "Hopper step (...)" in README.md and docs/
    that names step numbers names exactly the steps `bench --list` reports for compute
    capability 9.0 alone, and the step folders whose step.cmake says ARCH 90a are that set too;
  - gpu-check's stages: the stages of scripts/gpu-check.sh (its all_stages) are each described
    in its --help comment and have a row in chapter 08's table, whose count is written as
    "It runs N stages";
  - README's chapter map: each chapter row that names a step (`stepN`) gives, as the GPUs it runs
    on, the compute capability range `bench --list` reports for vN;
  - the SDPA entry's fallbacks: README's list between the "sdpa fallbacks" markers is the values
    of FALLBACKS in python/attention_steps/sdpa.py, in order, and _why_not names every key of
    FALLBACKS and no other (read with ast: torch need not be installed).

  check_doc_lists.py BENCH REPO_ROOT      exit 0 when all hold, 1 with every mismatch listed
"""
import ast
import glob
import os
import re
import subprocess
import sys

def hopper_mentions(text):
    """(line, the step numbers) of each "Hopper step(s)" followed by step numbers, bare or in
    parentheses: "the Hopper steps (7, 8 and 10, sm_90a code)", "the Hopper steps 7, 8 and 10"."""
    found = []
    for match in re.finditer(r"Hopper steps?\s+\(?((?:steps?\s+)?\d+(?:(?:,\s*|\s+and\s+)\d+)*)", text):
        if text[match.end():match.end() + 1] == ".":  # "the Hopper steps 9.0 exactly": a version
            continue
        numbers = {int(n) for n in re.findall(r"\d+", match.group(1))}
        line = text.count("\n", 0, match.start()) + 1
        found.append((line, numbers))
    return found


def check_chapter_gpus(bench, root, problems):
    listing = subprocess.run([bench, "--list"], capture_output=True, text=True).stdout
    ranges = {f[0]: f[3] for f in (row.split("\t") for row in listing.splitlines()) if len(f) >= 4}
    text = open(os.path.join(root, "README.md")).read()
    rows = re.findall(r"^\| \[[^\n]*?\]\(docs/[^)]*\)[^|\n]* \| `step(\d+)` \| ([^|\n]*) \|", text, re.M)
    if not rows:
        problems.append("README.md: no chapter row names a step (the chapter map's format changed?)")
    for number, gpus in rows:
        want = ranges.get(f"v{number}")
        if gpus.strip() != want:
            problems.append(f"README.md chapter map: step{number} runs on '{gpus.strip()}', "
                            f"bench --list says '{want}'")


def check_hopper_steps(bench, root, problems):
    listing = subprocess.run([bench, "--list"], capture_output=True, text=True)
    if listing.returncode != 0:
        problems.append(f"bench --list failed: {listing.stderr.strip()}")
        return
    hopper = set()
    for row in listing.stdout.splitlines():
        fields = row.split("\t")
        if len(fields) >= 4 and fields[3] == "9.0" and re.fullmatch(r"v\d+", fields[0]):
            hopper.add(int(fields[0][1:]))
    if not hopper:
        problems.append("bench --list names no step of compute capability 9.0")
        return
    declared = set()
    for folder in glob.glob(os.path.join(root, "steps", "v*_*")):
        facts = subprocess.run([os.path.join(root, "scripts", "step-facts.sh"), folder],
                               capture_output=True, text=True).stdout.split()
        if facts[:1] == ["90a"]:
            declared.add(int(re.match(r"v(\d+)_", os.path.basename(folder)).group(1)))
    if declared != hopper:
        problems.append(f"steps/*/step.cmake: ARCH 90a is declared for steps {sorted(declared)}, "
                        f"but bench --list puts {sorted(hopper)} on compute capability 9.0 alone")
    paths = [os.path.join(root, "README.md")] + sorted(
        os.path.join(root, "docs", name) for name in os.listdir(os.path.join(root, "docs"))
        if name.endswith(".md"))
    for path in paths:
        for line, numbers in hopper_mentions(open(path).read()):
            if numbers != hopper:
                problems.append(f"{os.path.relpath(path, root)}:{line}: names the Hopper steps "
                                f"{sorted(numbers)}; they are {sorted(hopper)} (bench --list)")


def check_gpu_check_stages(root, problems):
    script = open(os.path.join(root, "scripts", "gpu-check.sh")).read()
    stages = re.search(r"^all_stages=\(([^)]*)\)", script, re.M)
    if not stages:
        problems.append("scripts/gpu-check.sh: no all_stages=(...)")
        return
    stages = stages.group(1).split()
    header = script.split("set -euo pipefail")[0]
    for stage in stages:
        if not re.search(rf"^#   {re.escape(stage)} +\S", header, re.M):
            problems.append(f"scripts/gpu-check.sh: its --help comment does not describe stage '{stage}'")
    chapter = open(os.path.join(root, "docs", "08-roofline-and-profiling.md")).read()
    table = re.findall(r"^\| `([a-z]+)` \|", chapter, re.M)
    counted = re.search(r"It runs (\d+) stages", chapter)
    if not counted or int(counted.group(1)) != len(stages):
        problems.append(f"docs/08: 'It runs N stages' should say {len(stages)}")
    for stage in stages:
        if stage not in table:
            problems.append(f"docs/08: the stage table has no row for '{stage}'")


def check_sdpa_fallbacks(root, problems):
    path = os.path.join(root, "python", "attention_steps", "sdpa.py")
    tree = ast.parse(open(path).read())
    fallbacks, used = None, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FALLBACKS" for t in node.targets):
            fallbacks = ast.literal_eval(node.value)
        if isinstance(node, ast.FunctionDef) and node.name == "_why_not":
            for inner in ast.walk(node):
                if (isinstance(inner, ast.Subscript) and getattr(inner.value, "id", None) == "FALLBACKS"
                        and isinstance(inner.slice, ast.Constant)):
                    used.add(inner.slice.value)
    if not isinstance(fallbacks, dict):
        problems.append("sdpa.py: no FALLBACKS = {...} dict")
        return
    for key in sorted(set(fallbacks) - used):
        problems.append(f"sdpa.py: FALLBACKS['{key}'] is never given by _why_not")
    for key in sorted(used - set(fallbacks)):
        problems.append(f"sdpa.py: _why_not names FALLBACKS['{key}'], which does not exist")
    readme = open(os.path.join(root, "README.md")).read()
    block = re.search(r"<!-- begin: sdpa fallbacks -->\n(.*?)<!-- end: sdpa fallbacks -->", readme, re.S)
    if not block:
        problems.append("README.md: no 'sdpa fallbacks' block")
        return
    items = [line[2:] for line in block.group(1).splitlines() if line.startswith("- ")]
    if items != list(fallbacks.values()):
        problems.append("README.md: the 'sdpa fallbacks' list is not sdpa.py's FALLBACKS; it should read:\n" +
                        "\n".join(f"- {value}" for value in fallbacks.values()))


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    bench, root = sys.argv[1], sys.argv[2]
    problems = []
    check_hopper_steps(bench, root, problems)
    check_chapter_gpus(bench, root, problems)
    check_gpu_check_stages(root, problems)
    check_sdpa_fallbacks(root, problems)
    for problem in problems:
        print(f"check_doc_lists.py: {problem}")
    if not problems:
        print("check_doc_lists.py: the Hopper steps, the chapter map's GPUs, gpu-check's stages and the SDPA fallbacks "
              "match their code")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
