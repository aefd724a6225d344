// bench: every registered step and baseline over a list of token counts, in one process, on
// the same inputs, against the same reference. Writes one CSV row per (step, shape) in the
// schema of report.hpp, and a table for people. A new step joins by being linked in.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "ceilings.hpp"
#include "cpu_reference.hpp"
#include "cuda_check.hpp"
#include "options.hpp"
#include "report.hpp"
#include "runner.hpp"
#include "step_program.hpp"

namespace {

using namespace attn;

struct BenchOptions {
  std::vector<std::string> steps;  // empty: all
  std::vector<int64_t> tokens{197, 577, 1025};
  std::vector<int64_t> head_dims{64};
  int64_t batch = 32, heads = 12;
  int warmup = 10, iters = 0;
  uint64_t seed = 1234;
  CheckMode check = CheckMode::sample;
  std::string csv_path;
  int device = 0;
  bool list = false;
};

const char* kUsage =
    "usage: bench [--steps all|ID,ID,...] [--tokens N,N,...] [--head-dim D,D,...] [--batch B]\n"
    "             [--heads H] [--iters I] [--warmup W] [--seed S] [--check sample|full|none]\n"
    "             [--csv FILE] [--device K] [--list]\n"
    "--list prints one line per step: id, largest N (or any), head dims, title.\n"
    "Runs every registered step (or the ones named) and the baselines over each token count\n"
    "and head dim, checks each against the fp64 reference, and writes one CSV row per run\n"
    "(to FILE, or to stdout when no --csv is given). Defaults: all steps, tokens 197,577,1025,\n"
    "head dim 64, batch 32, heads 12; iters as in the step executables.\n"
    "Exit codes: 0 all checks passed, 1 a check failed, 2 usage error, 3 CUDA error.\n";

BenchOptions parse(int argc, char** argv) {
  BenchOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(name + ": missing value");
      return argv[++i];
    };
    if (name == "-h" || name == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (name == "--list") {
      options.list = true;
    } else if (name == "--steps") {
      const std::string list = value();
      if (list != "all") {
        std::stringstream stream(list);
        for (std::string id; std::getline(stream, id, ',');) {
          if (find_step(id) == nullptr) throw UsageError("--steps: no step or baseline '" + id + "' (see --list)");
          options.steps.push_back(id);
        }
      }
    } else if (name == "--tokens") {
      options.tokens = parse_integer_list(name, value(), 1, kMaxDimension);
    } else if (name == "--head-dim") {
      options.head_dims = parse_integer_list(name, value(), 1, kMaxDimension);
    } else if (name == "--batch") {
      options.batch = parse_integer(name, value(), 1, kMaxDimension);
    } else if (name == "--heads") {
      options.heads = parse_integer(name, value(), 1, kMaxDimension);
    } else if (name == "--iters") {
      options.iters = int(parse_integer(name, value(), 1, 1000000));
    } else if (name == "--warmup") {
      options.warmup = int(parse_integer(name, value(), 0, 1000000));
    } else if (name == "--seed") {
      options.seed = uint64_t(parse_integer(name, value(), 0, INT64_MAX));
    } else if (name == "--check") {
      options.check = parse_check_mode(value());
    } else if (name == "--csv") {
      options.csv_path = value();
    } else if (name == "--device") {
      options.device = int(parse_integer(name, value(), 0, 1023));
    } else {
      throw UsageError("unknown option '" + name + "' (see --help)");
    }
  }
  if (options.steps.empty()) {
    for (const StepInfo& step : registered_steps()) options.steps.push_back(step.id);
  }
  return options;
}

void print_table_row(const Record& r) {
  std::printf("%-8s %6lld %4lld %11.2f %9.2f %8.1f %10.2e  %s\n", r.step.c_str(),
              (long long)r.shape.tokens, (long long)r.shape.head_dim, r.timing.median_us,
              r.tflops(), r.gbps(), r.check.relative_error, r.status.c_str());
}

// The limits --list reports: this GPU's, or an H100's (said on stderr) when there is none.
DeviceLimits list_limits(int device) {
  try {
    return open_device(device).limits();
  } catch (const CudaError& error) {
    const DeviceLimits h100{"NVIDIA H100", 90, 232448};
    std::cerr << "bench: " << error.what() << "; limits shown for an " << h100.name << " (compute capability 9.0, "
              << h100.shared_bytes_per_block << " bytes of shared memory per block)\n";
    return h100;
  }
}

int run(const BenchOptions& options) {
  if (options.list) {
    const DeviceLimits device = list_limits(options.device);
    for (const StepInfo& step : registered_steps()) {
      std::string head_dims;
      for (int d : step.head_dims) head_dims += (head_dims.empty() ? "" : ",") + std::to_string(d);
      const std::optional<int64_t> largest =
          step.max_tokens(step.head_dims.front(), device.shared_bytes_per_block);
      std::cout << step.id << "\t" << (largest ? std::to_string(*largest) : "any") << "\t"
                << head_dims << "\t" << step.title << "\n";
    }
    return kExitPassed;
  }
  const GpuInfo gpu = open_device(options.device);
  const Ceilings ceilings = measure_ceilings();
  std::printf("# %s: measured %.0f TFLOP/s fp16 tensor (cuBLAS), %.0f GB/s copy bandwidth\n",
              gpu.name.c_str(), ceilings.tensor_tflops, ceilings.copy_gbps);
  std::printf("%-8s %6s %4s %11s %9s %8s %10s  %s\n", "step", "N", "D", "median_us", "TFLOP/s",
              "GB/s", "rel_err", "status");

  std::ofstream csv_file;
  if (!options.csv_path.empty()) {
    csv_file.open(options.csv_path);
    if (!csv_file) throw UsageError("--csv: cannot write '" + options.csv_path + "'");
  }
  std::ostream& csv = options.csv_path.empty() ? std::cout : csv_file;
  csv << csv_header() << "\n";

  bool any_failed = false;
  for (int64_t head_dim : options.head_dims) {
    for (int64_t tokens : options.tokens) {
      Shape shape{options.batch, options.heads, tokens, head_dim};
      validate_shape(shape);
      const HostTensors inputs = make_inputs(shape, options.seed);
      const Reference reference =
          compute_reference(inputs, slices_to_check(shape, options.check, options.seed));
      for (const std::string& id : options.steps) {
        const StepInfo& step = *find_step(id);
        Record record;
        record.step = step.id;
        record.title = step.title;
        record.shape = shape;
        record.gpu = gpu;
        record.ceilings = ceilings;
        record.date = today_utc();
        if (auto reason = step.refuses(shape, gpu.limits())) {
          record.status = "skipped: " + *reason;
        } else {
          try {
            RunConfig config;
            config.warmup = options.warmup;
            config.iters = options.iters;
            const RunResult result = run_step(
                step, inputs, options.check == CheckMode::none ? nullptr : &reference, config);
            record.timing = result.timing;
            record.check = result.check;
            record.status = status_of(result.check);
            any_failed = any_failed || (result.check.checked && !result.check.passed);
          } catch (const CudaError& error) {
            // Out of memory for this shape (the eager baseline's N x N scores, say): record
            // and go on, unless the device itself is broken.
            const cudaError_t sticky = cudaDeviceSynchronize();
            if (sticky != cudaSuccess) throw;
            record.status = std::string("skipped: ") + error.what();
          }
        }
        print_table_row(record);
        std::fflush(stdout);
        csv << csv_row(record) << "\n";
        csv.flush();
      }
    }
  }
  return any_failed ? kExitCheckFailed : kExitPassed;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const UsageError& error) {
    std::cerr << "bench: " << error.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& error) {
    std::cerr << "bench: " << error.what() << "\n";
    return kExitRuntime;
  }
}
