#!/usr/bin/env python3
"""Checks a scripts/grade.sh report against scripts/grade_results.schema.json and the rules a
schema cannot express: the scores add up, a skipped or failed part scores nothing, and without
a GPU no GPU part passes.

    check_report.py SCHEMA REPORT [--expect-gpu-skipped]

Standard library only: it understands the schema keywords the grading schema uses (type,
required, properties, items, enum, minimum) and refuses any other, so the schema cannot
silently ask for a check this file does not make. Exits 0 when the report is valid, 1 with
one line per problem when it is not.
"""
import argparse
import json
import math
import sys

TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
ANNOTATIONS = {"$schema", "title", "description"}
KEYWORDS = ANNOTATIONS | {"type", "required", "properties", "items", "enum", "minimum"}


def validate(value, schema, where, problems):
    unknown = set(schema) - KEYWORDS
    if unknown:
        raise SystemExit(f"check_report.py: schema keyword(s) {sorted(unknown)} at {where} "
                         "are not understood here")
    if "type" in schema:
        allowed = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(TYPES[name](value) for name in allowed):
            problems.append(f"{where}: {json.dumps(value)[:60]} is not {' or '.join(allowed)}")
            return
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: {json.dumps(value)} is not one of {schema['enum']}")
    if "minimum" in schema and TYPES["number"](value) and value < schema["minimum"]:
        problems.append(f"{where}: {value} is below {schema['minimum']}")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                problems.append(f"{where}: missing '{key}'")
        for key, subschema in schema.get("properties", {}).items():
            if key in value:
                validate(value[key], subschema, f"{where}.{key}", problems)
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            validate(item, schema["items"], f"{where}[{index}]", problems)


def check_rules(report, expect_gpu_skipped, problems):
    tests = report["tests"]
    for test in tests:
        expected = test["max_score"] if test["status"] == "passed" else 0
        if not math.isclose(test["score"], expected):
            problems.append(f"test '{test['name']}': {test['status']} but scores {test['score']} "
                            f"of {test['max_score']}")
    for total, field in (("score", "score"), ("max_score", "max_score")):
        if not math.isclose(report[total], sum(t[field] for t in tests)):
            problems.append(f"{total} {report[total]} is not the sum over tests")
    skipped = [t["name"] for t in tests if t["status"] == "skipped"]
    if report["gpu"]["skipped_tests"] != skipped:
        problems.append("gpu.skipped_tests does not list exactly the skipped tests")
    if report["gpu"]["available"] is False:
        for test in tests:
            if "gpu" in test["tags"] and test["status"] == "passed":
                problems.append(f"test '{test['name']}' is a GPU part and passed without a GPU")
    if expect_gpu_skipped:
        if report["gpu"]["available"] is not False or not report["gpu"]["skipped_reason"]:
            problems.append("expected gpu.available false with a reason")
        gpu_tests = [t for t in tests if "gpu" in t["tags"]]
        if not gpu_tests or any(t["status"] != "skipped" for t in gpu_tests):
            problems.append("expected every GPU part to be reported as skipped")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("schema")
    parser.add_argument("report")
    parser.add_argument("--expect-gpu-skipped", action="store_true",
                        help="also require that no GPU was used and every GPU part is skipped")
    args = parser.parse_args()
    with open(args.schema) as handle:
        schema = json.load(handle)
    with open(args.report) as handle:
        report = json.load(handle)
    problems = []
    validate(report, schema, "report", problems)
    if not problems:  # the rules read fields the schema has just vouched for
        check_rules(report, args.expect_gpu_skipped, problems)
    for problem in problems:
        print(f"check_report.py: {args.report}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
