#!/usr/bin/env python3
"""How scripts/grade_report.py judges what grade.sh recorded, GPU runs included, without a GPU:
each case writes the files grade.sh would have written (ctest's JUnit and listing, sanitizer
logs and exit codes, the bench CSV) and checks the verdicts, the scores, the exit code and the
schema of the report.

    test_grade_report.py REPO_ROOT
"""
import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

REPO_ROOT = Path(sys.argv.pop(1)).resolve() if len(sys.argv) > 1 else Path(__file__).parents[2]
REPORTER = REPO_ROOT / "scripts" / "grade_report.py"
SCHEMA = REPO_ROOT / "scripts" / "grade_results.schema.json"
CHECKER = Path(__file__).with_name("check_report.py")

# The columns of harness/report.cpp's csv_header(), as bench writes them.
CSV_HEADER = ("step,batch,heads,tokens,head_dim,median_us,min_us,max_us,iters,warmup,buffer_sets,"
              "tflops,gbps,fraction_tensor_peak,fraction_bandwidth,tensor_peak_tflops,copy_gbps,"
              "status,relative_error,max_abs_error,checked_slices,gpu,date")


def bench_row(step, median_us, status, relative_error="1.2e-04"):
    return (f"{step},32,12,577,64,{median_us},{median_us},{median_us},50,10,1,1,1,0.1,0.1,600,"
            f"3000,{status},{relative_error},1e-3,4,NVIDIA H100 80GB HBM3,2026-01-01")


def junit(cases):
    """ctest --output-junit, as ctest 3.25 writes it; cases: (name, status, inner XML)."""
    body = "".join(f'<testcase name="{name}" classname="{name}" time="0.1" status="{status}">'
                   f"{inner}</testcase>" for name, status, inner in cases)
    return f'<?xml version="1.0" encoding="UTF-8"?><testsuite name="Linux-c++">{body}</testsuite>'


def listing(tests):
    """ctest --show-only=json-v1; tests: (name, labels)."""
    return json.dumps({"kind": "ctestInfo", "tests": [
        {"name": name, "properties": [{"name": "LABELS", "value": labels}]}
        for name, labels in tests]})


STEP0_TESTS = [("cli.step0_tokens_zero", ["cpu", "step0"]), ("gpu.v0", ["gpu", "step0"])]
CLEAN = {"memcheck": (0, "========= ERROR SUMMARY: 0 errors\n"),
         "racecheck": (0, "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n")}


class GradeReportTest(unittest.TestCase):
    def grade(self, files, gpu_skipped_reason="", step="0"):
        """Writes the work folder, runs the reporter; returns (exit code, report, stdout)."""
        with tempfile.TemporaryDirectory() as folder:
            work_dir = Path(folder) / "grading"
            work_dir.mkdir()
            for name, text in files.items():
                (work_dir / name).write_text(text)
            report_path = Path(folder) / "results.json"
            run = subprocess.run(
                [sys.executable, str(REPORTER), "--work-dir", str(work_dir), "--json",
                 str(report_path), "--gpu-skipped-reason", gpu_skipped_reason,
                 "--sanitizer-arguments", "--tokens 65", "--speed-tokens", "577", step],
                capture_output=True, text=True)
            self.assertIn(run.returncode, (0, 1, 4), run.stderr)
            check = subprocess.run([sys.executable, str(CHECKER), str(SCHEMA), str(report_path)],
                                   capture_output=True, text=True)
            self.assertEqual(check.returncode, 0, check.stderr)
            return run.returncode, json.loads(report_path.read_text()), run.stdout

    @staticmethod
    def gpu_run(source, test_cases, sanitizers, speed=None):
        files = {"step0.source": source, "step0.tests.json": listing(STEP0_TESTS),
                 "step0.junit.xml": junit(test_cases), "step0.ctest.log": ""}
        for tool, (code, log) in sanitizers.items():
            files[f"step0.{tool}.rc"] = str(code)
            files[f"step0.{tool}.log"] = log
        if speed is not None:
            code, rows = speed
            files["step0.speed.rc"] = str(code)
            files["step0.speed.log"] = ""
            files["step0.speed.csv"] = "\n".join([CSV_HEADER] + rows) + "\n"
        return files

    @staticmethod
    def by_name(report):
        return {test["name"]: test for test in report["tests"]}

    def test_shipped_solution_on_a_gpu_gets_full_marks(self):
        passed = [(name, "run", "<system-out></system-out>") for name, _ in STEP0_TESTS]
        code, report, stdout = self.grade(self.gpu_run("", passed, CLEAN))
        self.assertEqual(code, 0)
        self.assertEqual((report["score"], report["max_score"]), (4.0, 4.0))
        self.assertIs(report["gpu"]["available"], True)
        self.assertEqual(report["steps"][0]["speed_status"], "not applicable")
        self.assertRegex(stdout, r"v0\s+SHIPPED\s+2/2\s+0\s+clean\s+clean\s+-")
        self.assertIn("NOTE: v0 graded from the shipped solution, not a student's file", stdout)

    def test_skeleton_fails_with_the_messages_of_its_tests(self):
        doctest_output = ("test_steps_gpu.cpp:40: ERROR: CHECK( result.passed ) is NOT correct!\n"
                          "  logged: 1x1x1x64 ... 64 non-finite; first non-finite at o[0,0,0,0]\n")
        cases = [("cli.step0_tokens_zero", "run", "<system-out></system-out>"),
                 ("gpu.v0", "fail", f'<failure message=""/><system-out>{doctest_output}</system-out>')]
        sanitizers = {"memcheck": (1, "step0: check failed: non-finite output at o[0,0,0,0]\n"
                                      "========= ERROR SUMMARY: 0 errors\n"),
                      "racecheck": (86, "========= Error: Race reported between Write access\n"
                                        "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n")}
        speed = (1, [bench_row("v0", 900.0, "failed", "nan"), bench_row("v0_ref", 1000.0, "passed")])
        files = self.gpu_run("/course/skeleton_v0.cu", cases, sanitizers, speed)
        files["step0.ctest.log"] = "2/2 Test #11: gpu.v0 ......................***Failed    0.10 sec\n"
        code, report, stdout = self.grade(files)
        self.assertEqual(code, 1)
        tests = self.by_name(report)
        gpu_test = tests["step0 test gpu.v0"]
        self.assertEqual((gpu_test["status"], gpu_test["score"]), ("failed", 0.0))
        self.assertIn("non-finite", gpu_test["output"])
        self.assertTrue(gpu_test["output"].startswith("ctest: failed"))
        memcheck = tests["step0 compute-sanitizer memcheck"]
        self.assertEqual(memcheck["status"], "failed")
        self.assertIn("result check failed", memcheck["output"])
        self.assertIn("step0: check failed", memcheck["output"])
        racecheck = tests["step0 compute-sanitizer racecheck"]
        self.assertIn("racecheck found errors", racecheck["output"])
        self.assertIn("Race reported", racecheck["output"])
        speed_test = tests["step0 speed vs shipped at N=577"]
        self.assertEqual((speed_test["status"], speed_test["max_score"]), ("failed", 0.0))
        self.assertIn("no speed is reported for a wrong answer", speed_test["output"])
        self.assertIsNone(report["steps"][0]["speed_vs_shipped"])
        self.assertEqual(report["score"], 1.0)
        self.assertRegex(stdout, r"v0\s+skeleton_v0.cu\s+1/2\s+0\s+FAILED\s+FAILED\s+-\s+FAILED")

    def test_correct_student_step_gets_its_speed_ratio(self):
        passed = [(name, "run", "<system-out></system-out>") for name, _ in STEP0_TESTS]
        speed = (0, [bench_row("v0", 50.0, "passed"), bench_row("v0_ref", 100.0, "passed")])
        code, report, stdout = self.grade(self.gpu_run("/course/fast_v0.cu", passed, CLEAN, speed))
        self.assertEqual(code, 0)
        self.assertAlmostEqual(report["steps"][0]["speed_vs_shipped"], 2.0)
        speed_test = self.by_name(report)["step0 speed vs shipped at N=577"]
        self.assertEqual((speed_test["status"], speed_test["score"]), ("passed", 0.0))
        self.assertIn("2.00x", speed_test["output"])
        self.assertEqual((report["score"], report["max_score"]), (4.0, 4.0))
        self.assertRegex(stdout, r"2\.00x")

    def test_a_hopper_step_that_breaks_a_pipeline_rule_fails_its_checked_part(self):
        step8_tests = [("gpu.v8", ["gpu", "step8"])]
        passed = junit([("gpu.v8", "run", "<system-out></system-out>")])
        rule = ("v8: pipeline rule write-during-async-read broken in block 3, thread 130: wrote the "
                "O staging buffer of warpgroup 1 (use 1) before the asynchronous reads of its last "
                "contents were known to be complete")
        files = {"step8.source": "/course/racy_v8.cu", "step8.hopper": "",
                 "step8.tests.json": listing(step8_tests), "step8.junit.xml": passed,
                 "step8.ctest.log": "", "step8.checked.rc": "1",
                 "step8.checked.log": f"{rule}\n{rule}\ntest_steps_gpu.cpp:70: ERROR: CHECK( result.passed )\n",
                 "step8.speed.rc": "0", "step8.speed.log": "",
                 "step8.speed.csv": "\n".join([CSV_HEADER, bench_row("v8", 100.0, "passed"),
                                               bench_row("v8_ref", 100.0, "passed")]) + "\n"}
        for tool, (code, log) in CLEAN.items():
            files[f"step8.{tool}.rc"] = str(code)
            files[f"step8.{tool}.log"] = log
        code, report, stdout = self.grade(files, step="8")
        self.assertEqual(code, 1)
        checked = self.by_name(report)["step8 checked pipeline"]
        self.assertEqual((checked["status"], checked["score"], checked["max_score"]), ("failed", 0.0, 1.0))
        self.assertEqual(checked["output"].count("pipeline rule write-during-async-read"), 1)  # each rule once
        self.assertEqual(report["steps"][0]["checked_pipeline"], "failed")
        self.assertEqual((report["score"], report["max_score"]), (3.0, 4.0))
        self.assertRegex(stdout, r"v8\s+racy_v8.cu\s+1/1\s+0\s+clean\s+clean\s+FAILED\s+1\.00x")
        # The shipped step breaks no rule: the part passes.
        files["step8.checked.rc"], files["step8.checked.log"] = "0", "[doctest] Status: SUCCESS!\n"
        code, report, _ = self.grade(files, step="8")
        self.assertEqual(code, 0)
        self.assertEqual(report["steps"][0]["checked_pipeline"], "passed")
        self.assertEqual((report["score"], report["max_score"]), (4.0, 4.0))

    def test_sanitizer_timeout_and_crash_fail(self):
        passed = [(name, "run", "<system-out></system-out>") for name, _ in STEP0_TESTS]
        sanitizers = {"memcheck": (3, "step0: CUDA error: an illegal memory access was encountered\n"),
                      "racecheck": (124, "")}
        code, report, _ = self.grade(self.gpu_run("", passed, sanitizers))
        self.assertEqual(code, 1)
        tests = self.by_name(report)
        self.assertIn("exited with code 3", tests["step0 compute-sanitizer memcheck"]["output"])
        self.assertIn("illegal memory access", tests["step0 compute-sanitizer memcheck"]["output"])
        self.assertIn("timed out", tests["step0 compute-sanitizer racecheck"]["output"])

    def test_a_step_that_never_finishes_fails_its_sanitizer_parts_with_the_harness_line(self):
        passed = [(name, "run", "<system-out></system-out>") for name, _ in STEP0_TESTS]
        hang = ("step0: the GPU work did not finish within 10 s: a kernel that never ends "
                "(a barrier no thread completes?)\n")
        code, report, _ = self.grade(self.gpu_run("", passed, {"memcheck": (124, hang),
                                                              "racecheck": (124, hang)}))
        self.assertEqual(code, 1)
        for tool in ("memcheck", "racecheck"):
            output = self.by_name(report)[f"step0 compute-sanitizer {tool}"]["output"]
            self.assertIn("never finishes", output)
            self.assertIn("did not finish within 10 s", output)

    def test_without_a_gpu_every_gpu_part_is_skipped_and_scores_nothing(self):
        reason = "no GPU: nvidia-smi not found"
        cases = [("cli.step0_tokens_zero", "run", "<system-out></system-out>"),
                 ("gpu.v0", "notrun", '<skipped message="SKIP_RETURN_CODE=77"/>'
                                      "<system-out>SKIPPED: no CUDA device</system-out>")]
        files = {"step0.source": "/course/v0.cu", "step0.tests.json": listing(STEP0_TESTS),
                 "step0.junit.xml": junit(cases), "step0.ctest.log": "",
                 "step0.memcheck.skipped": reason, "step0.racecheck.skipped": reason,
                 "step0.speed.skipped": reason}
        code, report, stdout = self.grade(files, gpu_skipped_reason=reason)
        self.assertEqual(code, 4)
        self.assertIs(report["gpu"]["available"], False)
        self.assertEqual(len(report["gpu"]["skipped_tests"]), 4)
        self.assertEqual((report["score"], report["max_score"]), (1.0, 4.0))
        self.assertIn("GPU parts skipped", stdout)

    def test_a_test_ctest_could_not_run_fails(self):
        cases = [("cli.step0_tokens_zero", "run", "<system-out></system-out>"),
                 ("gpu.v0", "notrun", '<skipped message="Unable to find executable"/>')]
        code, report, _ = self.grade(self.gpu_run("", cases, CLEAN))
        self.assertEqual(code, 1)
        gpu_test = self.by_name(report)["step0 test gpu.v0"]
        self.assertEqual(gpu_test["status"], "failed")
        self.assertIn("Unable to find executable", gpu_test["output"])

    def test_a_build_failure_fails_every_part_with_the_compiler_errors(self):
        files = {"build.failed": "", "step0.source": "/course/broken_v0.cu",
                 "step0.tests.json": listing(STEP0_TESTS),
                 "build.log": "[ 50%] Building CUDA object\n"
                              "/course/broken_v0.cu(12): error: identifier \"scroe\" is undefined\n"}
        code, report, stdout = self.grade(files)
        self.assertEqual(code, 1)
        self.assertIsNone(report["gpu"]["available"])
        self.assertTrue(all(t["status"] == "failed" for t in report["tests"]))
        self.assertEqual(len(report["tests"]), 5)  # two tests, two sanitizers, the speed
        self.assertIn("scroe", self.by_name(report)["step0 test gpu.v0"]["output"])
        self.assertIn("The build failed", stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
