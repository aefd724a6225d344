#!/usr/bin/env python3
"""Judges the raw results scripts/grade.sh collected and writes the grading report.

grade.sh runs things and records what happened in its work folder, one set of files per part:
  build.failed, build.log            the build of the graded sources failed
  stepN.source                       the student's file, empty for the shipped solution
  stepN.tests.json                   ctest --show-only=json-v1 -L stepN: the tests and labels
  stepN.junit.xml, stepN.ctest.log   ctest -L stepN --output-junit
  stepN.<tool>.rc, .log              compute-sanitizer --tool <tool> (memcheck, racecheck)
  stepN.speed.rc, .log, .csv         bench --steps vN,vN_ref --tokens 577
  stepN.hopper                       the step is a Hopper step (it includes steps/hopper/)
  stepN.checked.rc, .log             its GPU suite in the checked build of the asynchronous
                                     pipeline
  stepN.<part>.skipped               the part did not run; the file says why
This script turns them into a table on stdout and a JSON report in Gradescope's results.json
form (schema: scripts/grade_results.schema.json, described in docs/grading.md), and exits
0 (all passed), 1 (something failed) or 4 (nothing failed, something skipped).

Scoring: each ctest test of the step, each sanitizer tool and, for a Hopper step, the checked
pipeline build's suite is worth one point; the speed comparison is reported with no points (a
course that grades speed reads speed_vs_shipped).
A skipped part scores 0 of its points: skipped is never passed.
"""
import argparse
import csv
import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

SANITIZER_TOOLS = ("memcheck", "racecheck")
SANITIZER_ERROR_EXIT = 86  # grade.sh passes --error-exitcode 86
TIMEOUT_EXIT = 124  # coreutils timeout
OUTPUT_LIMIT = 6000  # characters of a test's output kept in the JSON


def clip(text, limit=OUTPUT_LIMIT):
    """The end of a long output, where the failure messages are."""
    text = text.strip()
    return text if len(text) <= limit else "[... cut ...]\n" + text[-limit:]


def read(path):
    return path.read_text(errors="replace") if path.exists() else ""


def build_failure_excerpt(work_dir):
    lines = read(work_dir / "build.log").splitlines()
    errors = [line for line in lines if "error" in line.lower()]
    return "\n".join((errors or lines)[-40:])


def make_test(name, max_score, status, output, tags):
    return {"name": name, "score": float(max_score) if status == "passed" else 0.0,
            "max_score": float(max_score), "status": status, "output": output, "tags": tags}


def ctest_failure_reason(case, ctest_log):
    """ctest's JUnit leaves the failure message empty; its log says Failed, Timeout, ..."""
    skipped = case.find("skipped")
    if skipped is not None:
        return "not run: " + skipped.get("message", "")
    for line in ctest_log.splitlines():
        if f" {case.get('name')} " in line and "***" in line:
            return line.split("***", 1)[1].split()[0].rstrip(":").lower()  # failed, timeout, ...
    return "failed"


def ctest_tests(work_dir, step, build_failed):
    """One entry per ctest test labelled stepN, from ctest's listing and its JUnit results."""
    listing = json.loads(read(work_dir / f"step{step}.tests.json") or '{"tests": []}')
    labels = {}
    for test in listing.get("tests", []):
        labels[test["name"]] = next((p["value"] for p in test.get("properties", [])
                                     if p["name"] == "LABELS"), [])
    results = {}
    junit = work_dir / f"step{step}.junit.xml"
    if junit.exists():
        for case in ElementTree.parse(junit).getroot().iter("testcase"):
            results[case.get("name")] = case

    ctest_log = read(work_dir / f"step{step}.ctest.log")
    tests = []
    for name in sorted(labels, key=lambda n: (("gpu" in labels[n]), n)):
        case = results.get(name)
        if build_failed:
            status, output = "failed", "not run: the build failed\n" + build_failure_excerpt(work_dir)
        elif case is None:
            status = "failed"
            output = "not run; ctest said:\n" + clip(ctest_log)
        else:
            output = case.findtext("system-out") or ""
            skipped = case.find("skipped")
            if case.get("status") == "run":
                status = "passed"
            elif skipped is not None and skipped.get("message", "").startswith("SKIP_"):
                status = "skipped"  # the test's own verdict (SKIP_RETURN_CODE): no GPU
            else:
                status = "failed"
                output = f"ctest: {ctest_failure_reason(case, ctest_log)}\n{output}"
        tests.append(make_test(f"step{step} test {name}", 1, status, clip(output),
                               sorted(set(labels[name]) | {f"step{step}"})))
    if not tests:
        tests.append(make_test(f"step{step} tests", 1, "failed",
                               f"no ctest test is labelled step{step}; reconfigure the build",
                               [f"step{step}"]))
    return tests


def sanitizer_excerpt(log, step):
    """The sanitizer's own report lines and the step's one-line errors."""
    lines = [line for line in log.splitlines()
             if line.startswith("=========") or line.startswith(f"step{step}:")]
    return "\n".join(lines[:60]) if lines else clip(log, 3000)


def part_not_run(part, name, points, tags, build_failed):
    """The test of a part that did not run (the build failed, or PART.skipped says why), or None."""
    if build_failed:
        return make_test(name, points, "failed", "not run: the build failed", tags)
    skipped = Path(f"{part}.skipped")
    if skipped.exists():
        return make_test(name, points, "skipped", "SKIPPED: " + read(skipped).strip(), tags)
    return None


def exit_code(part):
    return int(read(Path(f"{part}.rc")).strip())


def sanitizer_test(work_dir, step, tool, build_failed, command):
    name = f"step{step} compute-sanitizer {tool}"
    tags = ["gpu", f"step{step}", "sanitizer"]
    part = work_dir / f"step{step}.{tool}"
    not_run = part_not_run(part, name, 1, tags, build_failed)
    if not_run:
        return not_run
    code = exit_code(part)
    log = read(Path(f"{part}.log"))
    excerpt = sanitizer_excerpt(log, step)
    if code == 0:
        return make_test(name, 1, "passed", f"{command}\n{excerpt}", tags)
    if code == SANITIZER_ERROR_EXIT:
        verdict = f"{tool} found errors"
    elif code == 1:
        verdict = "no memory errors reported, but the result check failed"
    elif code == TIMEOUT_EXIT and "did not finish within" in log:
        verdict = ("timed out: the step's kernel never finishes at this shape (the harness gave up "
                   "on it), so the sanitizer was not run")
    elif code == TIMEOUT_EXIT:
        verdict = "timed out"
    else:
        verdict = f"step{step} exited with code {code}"
    return make_test(name, 1, "failed", f"{command}\n{verdict}\n{excerpt}", tags)


def checked_test(work_dir, step, build_failed):
    """A Hopper step's GPU suite in the checked build: the protocol rule broken, if any."""
    if not (work_dir / f"step{step}.hopper").exists():
        return None  # not a Hopper step: it has no checked build
    part = work_dir / f"step{step}.checked"
    name = f"step{step} checked pipeline"
    tags = ["gpu", f"step{step}", "checked"]
    not_run = part_not_run(part, name, 1, tags, build_failed)
    if not_run:
        return not_run
    code = exit_code(part)
    log = read(Path(f"{part}.log"))
    command = f"gpu_tests --step=v{step} in the checked build (-DATTN_CHECKED_PIPELINE=ON)"
    if code == 0:
        return make_test(name, 1, "passed", f"{command}: no protocol rule broken", tags)
    rules = [line for line in log.splitlines() if "pipeline rule" in line]
    verdict = "timed out" if code == TIMEOUT_EXIT else f"exited with code {code}"
    details = "\n".join(dict.fromkeys(rules)) if rules else clip(log, 3000)
    return make_test(name, 1, "failed", f"{command} {verdict}\n{details}", tags)


def speed_test(work_dir, step, tokens, build_failed):
    """The student's step against the shipped one (vN_ref): no points, a measurement."""
    name = f"step{step} speed vs shipped at N={tokens}"
    tags = ["gpu", f"step{step}", "speed"]
    part = work_dir / f"step{step}.speed"
    not_run = part_not_run(part, name, 0, tags, build_failed)
    if not_run:
        return not_run, None
    code = exit_code(part)
    rows = {}
    csv_path = Path(f"{part}.csv")
    if csv_path.exists():
        with csv_path.open(newline="") as handle:
            rows = {row["step"]: row for row in csv.DictReader(handle)}
    student, shipped = rows.get(f"v{step}"), rows.get(f"v{step}_ref")
    if code not in (0, 1) or not student or not shipped:
        output = f"bench exited with code {code}\n" + clip(read(Path(f"{part}.log")), 3000)
        return make_test(name, 0, "failed", output, tags), None
    if student["status"] != "passed" or not student["median_us"] or not shipped["median_us"]:
        # The bench's relative error counts finite outputs only: NaN or inf (an untouched
        # skeleton's) shows in the suite's message, not here.
        output = (f"v{step} at N={tokens}: check {student['status']} "
                  f"(relative error {student['relative_error']} over the finite outputs); no speed "
                  "is reported for a wrong answer")
        return make_test(name, 0, "failed", output, tags), None
    ratio = float(shipped["median_us"]) / float(student["median_us"])
    output = (f"median {float(student['median_us']):.1f} us (student) vs "
              f"{float(shipped['median_us']):.1f} us (shipped) at B={student['batch']} "
              f"H={student['heads']} N={tokens} D={student['head_dim']} on {student['gpu']}: "
              f"{ratio:.2f}x the shipped solution's speed (above 1: faster)")
    return make_test(name, 0, "passed", output, tags), ratio


def cell(test):
    if test is None:
        return "-"
    return {"passed": "clean", "failed": "FAILED", "skipped": "skipped"}[test["status"]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--gpu-skipped-reason", default="",
                        help="why the GPU parts did not run; empty when a GPU was used")
    parser.add_argument("--sanitizer-arguments", required=True)
    parser.add_argument("--speed-tokens", type=int, required=True)
    parser.add_argument("--elapsed-s", type=int, default=0)
    parser.add_argument("steps", nargs="+")
    args = parser.parse_args()

    work_dir = args.work_dir
    build_failed = (work_dir / "build.failed").exists()
    tests, summaries, rows = [], [], []
    for step in args.steps:
        source = read(work_dir / f"step{step}.source").strip()
        step_tests = ctest_tests(work_dir, step, build_failed)
        sanitizers = {tool: sanitizer_test(work_dir, step, tool, build_failed,
                                           f"compute-sanitizer --tool {tool} step{step} "
                                           f"{args.sanitizer_arguments}")
                      for tool in SANITIZER_TOOLS}
        checked = checked_test(work_dir, step, build_failed)
        speed, ratio = speed_test(work_dir, step, args.speed_tokens, build_failed) if source \
            else (None, None)
        tests += (step_tests + list(sanitizers.values()) + ([checked] if checked else []) +
                  ([speed] if speed else []))

        passed = sum(t["status"] == "passed" for t in step_tests)
        skipped = sum(t["status"] == "skipped" for t in step_tests)
        summaries.append({
            "step": f"v{step}", "source": source or "shipped",
            "tests_passed": passed, "tests_total": len(step_tests), "tests_skipped": skipped,
            **{tool: sanitizers[tool]["status"] for tool in SANITIZER_TOOLS},
            "checked_pipeline": checked["status"] if checked else "not applicable",
            "speed_vs_shipped": ratio,
            "speed_status": speed["status"] if speed else "not applicable",
        })
        speed_cell = f"{ratio:.2f}x" if ratio is not None else ("-" if speed is None else cell(speed))
        rows.append([f"v{step}", Path(source).name if source else "SHIPPED",
                     f"{passed}/{len(step_tests)}", str(skipped),
                     cell(sanitizers["memcheck"]), cell(sanitizers["racecheck"]), cell(checked),
                     speed_cell])

    header = ["step", "source", "tests", "skipped", "memcheck", "racecheck", "checked",
              f"speed vs shipped (N={args.speed_tokens})"]
    widths = [max(len(row[i]) for row in rows + [header]) for i in range(len(header))]
    table = "\n".join("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip()
                      for row in [header] + rows)
    gpu_skipped = [t["name"] for t in tests if t["status"] == "skipped"]
    notes = []
    shipped_steps = [summary["step"] for summary in summaries if summary["source"] == "shipped"]
    if shipped_steps:
        notes.append(f"NOTE: {', '.join(shipped_steps)} graded from the shipped solution, not a "
                     "student's file (SHIPPED above). To grade a file: scripts/grade.sh my_vN.cu "
                     "(a skeleton of scripts/make-exercise.sh names its step) or "
                     "scripts/grade.sh -DSTEP<N>_SOURCE=my_vN.cu N.")
    if build_failed:
        notes.append("The build failed:\n" + build_failure_excerpt(work_dir))
    elif args.gpu_skipped_reason:
        notes.append(f"GPU parts skipped ({args.gpu_skipped_reason}): they score nothing; "
                     "grade on a machine with an NVIDIA GPU.")
    output = "\n\n".join([table] + notes)

    report = {
        "score": sum(t["score"] for t in tests),
        "max_score": sum(t["max_score"] for t in tests),
        "execution_time": args.elapsed_s,
        "output": output,
        # available is null when the build failed: nothing was run, the GPU was not probed.
        "gpu": {"available": None if build_failed else not args.gpu_skipped_reason,
                "skipped_reason": args.gpu_skipped_reason or None,
                "skipped_tests": gpu_skipped},
        "steps": summaries,
        "tests": tests,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(output)
    print(f"\nscore {report['score']:g} / {report['max_score']:g}")

    statuses = {t["status"] for t in tests}
    if "failed" in statuses:
        return 1
    return 4 if "skipped" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
