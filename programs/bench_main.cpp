// bench: every registered step and baseline over a list of token counts, in one process, on
// the same inputs, against the same reference. Writes one CSV row per (step, shape) in the
// schema of report.hpp, and a table for people. A new step joins by being linked in.
#include <cstdio>
#include <iterator>
#include <optional>
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
  bool gpu_table = false;
  bool csv_header = false;
  bool log_sum_exp = false;
  bool causal = false;
};

const char* kUsage =
    "usage: bench [--steps all|ID,ID,...] [--tokens N,N,...] [--head-dim D,D,...] [--batch B]\n"
    "             [--heads H] [--iters I] [--warmup W] [--seed S] [--check sample|full|none]\n"
    "             [--csv FILE] [--device K] [--log-sum-exp] [--causal] [--list]\n"
    "             [--gpu-table] [--csv-header]\n"
    "--list prints one tab-separated line per step and baseline: id, the largest N it serves on\n"
    "  this GPU at its first head dim (a number, 'any', or 'none' when this GPU cannot run it),\n"
    "  head dims, compute capability ('8.0+': 8.0 or newer; '9.0': that one alone), title.\n"
    "  The GPU whose limits it used is named on stderr; with no GPU, an H100's.\n"
    "--gpu-table prints, as a Markdown table, each step's compute capability and the largest N\n"
    "  at D = 64 for the shared memory per block of common GPUs (README: Which GPU do I need).\n"
    "--csv-header prints the CSV's header line, the schema every results CSV shares.\n"
    "--log-sum-exp times the forward a training step runs: each step also writes L, each row's\n"
    "  log-sum-exp, for the backward pass. Its rows are named ID+lse; a step that does not\n"
    "  write L is a row 'skipped: <why>'.\n"
    "--causal runs every shape under the causal mask (query i sees keys j <= i; N_k = N here, so\n"
    "  both alignments agree), FLOPs counted on the pairs it keeps. Its rows are named ID+causal;\n"
    "  a step that takes no causal mask is a row 'skipped: <why>'.\n"
    "Runs every registered forward step (or the ones named) and the baselines over each token\n"
    "count and head dim, checks each against the fp64 reference, and writes one CSV row per run\n"
    "(to FILE, or to stdout when no --csv is given). A backward step (v9, v10) runs when named:\n"
    "its forward step writes O and L, and the backward alone is timed (its FLOPs counted as 2.5\n"
    "forwards). Defaults: all forward steps, tokens 197,577,1025,\n"
    "head dim 64, batch 32, heads 12; iters as in the step executables. A shape a step refuses\n"
    "on this GPU (head dim, shared memory, compute capability) is a row 'skipped: <why>'.\n"
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
    } else if (name == "--gpu-table") {
      options.gpu_table = true;
    } else if (name == "--csv-header") {
      options.csv_header = true;
    } else if (name == "--log-sum-exp") {
      options.log_sum_exp = true;
    } else if (name == "--causal") {
      options.causal = true;
    } else if (name == "--steps") {
      const std::string list = value();
      if (list != "all") {
        std::stringstream stream(list);
        for (std::string id; std::getline(stream, id, ',');) {
          const StepInfo* found = find_step(id);
          if (found == nullptr) throw UsageError("--steps: no step or baseline '" + id + "' (see --list)");
          if (is_backward(found->kind) && options.log_sum_exp) {
            throw UsageError("--steps: " + id + " is a backward step; --log-sum-exp times forward steps");
          }
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
    for (const StepInfo& step : registered_steps()) {
      if (!is_backward(step.kind)) options.steps.push_back(step.id);
    }
  }
  return options;
}

void print_table_row(const Record& r) {
  std::printf("%-8s %6lld %4lld %11.2f %9.2f %8.1f %10.2e  %s\n", r.step.c_str(),
              (long long)r.shape.tokens, (long long)r.shape.head_dim, r.timing.median_us,
              r.tflops(), r.gbps(), r.check.relative_error, r.status.c_str());
}

// The limits --list reports: this GPU's, or an H100's when there is none; stderr says which.
DeviceLimits list_limits(int device) {
  DeviceLimits limits;
  std::string whose;
  try {
    limits = open_device(device).limits();
    whose = "limits of this GPU, ";
  } catch (const CudaError& error) {
    limits = with_testing_aids(h100_limits());
    whose = std::string(error.what()) + "; limits of an ";
  }
  std::cerr << "bench: " << whose << limits.name << " (compute capability "
            << compute_capability_text(limits.compute_capability) << ", "
            << limits.shared_bytes_per_block << " bytes of shared memory per block)\n";
  return limits;
}

// The largest N a step serves at head dim D within these limits: a number, "any", or "none"
// (the GPU's compute capability is outside the step's range, or no N fits).
std::string largest_tokens(const StepInfo& step, int64_t head_dim, const DeviceLimits& limits) {
  if (step.refuses_device(limits)) return "none";
  const std::optional<int64_t> largest = step.max_tokens(head_dim, limits.shared_bytes_per_block);
  if (!largest) return "any";
  return *largest > 0 ? std::to_string(*largest) : "none";
}

void print_list(const DeviceLimits& limits) {
  for (const StepInfo& step : registered_steps()) {
    std::cout << step.id << "\t" << largest_tokens(step, step.head_dims.front(), limits) << "\t"
              << join_numbers(step.head_dims, ",") << "\t" << step.compute_capability_range() << "\t"
              << step.title << "\n";
  }
}

// README's "Which GPU do I need": per step, its compute capability and the largest N at D = 64
// for each common shared-memory budget; "-" where no GPU of that column can run the step.
void print_gpu_table() {
  constexpr int64_t kHeadDim = 64;
  std::cout << "| step | compute capability |";
  for (const SharedBudget& budget : kSharedBudgets) std::cout << " " << budget.label << " (" << budget.gpus << ") |";
  std::cout << "\n|---|---|";
  for (std::size_t i = 0; i < std::size(kSharedBudgets); ++i) std::cout << "---:|";
  std::cout << "\n";
  for (const StepInfo& step : registered_steps()) {
    std::cout << "| " << step.id
              << (step.kind == StepKind::baseline            ? " (baseline)"
                  : step.kind == StepKind::backward          ? " (backward)"
                  : step.kind == StepKind::backward_baseline ? " (backward baseline)"
                                                             : "")
              << " | "
              << step.compute_capability_range() << " |";
    for (const SharedBudget& budget : kSharedBudgets) {
      bool runs = false;
      for (int capability : budget.capabilities) {
        if (capability == 0) break;
        runs = runs || !step.refuses_device({"", capability, budget.bytes});
      }
      const bool serves_d = !step.refuses({1, 1, 1, kHeadDim});
      const std::string cell =
          runs && serves_d ? largest_tokens(step, kHeadDim, {"", step.min_compute_capability, budget.bytes}) : "-";
      std::cout << " " << cell << " |";
    }
    std::cout << "\n";
  }
}

int run(const BenchOptions& options) {
  if (options.csv_header) {
    std::cout << csv_header() << "\n";
    return kExitPassed;
  }
  if (options.gpu_table) {
    print_gpu_table();
    return kExitPassed;
  }
  if (options.list) {
    print_list(list_limits(options.device));
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
  const int max_persistent_blocks = persistent_blocks_testing_aid();
  for (int64_t head_dim : options.head_dims) {
    for (int64_t tokens : options.tokens) {
      Shape shape{options.batch, options.heads, tokens, head_dim};
      if (options.causal) shape.causal = Causal::top_left;
      validate_shape(shape);
      const HostTensors inputs = make_inputs(shape, options.seed);
      const std::vector<int64_t> slices = slices_to_check(shape, options.check, options.seed);
      const Reference reference = compute_reference(inputs, slices);
      // A backward step's dO and reference, made once per shape when one is named.
      std::vector<__half> d_o;
      BackwardReference backward_reference;
      for (const std::string& id : options.steps) {
        const StepInfo& step = *find_step(id);
        Record record;
        record.step = step.id + (options.log_sum_exp ? "+lse" : "") + (options.causal ? "+causal" : "");
        record.title = step.title;
        record.shape = shape;
        record.gpu = gpu;
        record.ceilings = ceilings;
        record.date = today_utc();
        if (auto reason = step.refuses(shape, gpu.limits())) {
          record.status = "skipped: " + *reason;
        } else if (options.log_sum_exp && !step.writes_log_sum_exp) {
          record.status = "skipped: " + step.id + " does not write L (--log-sum-exp)";
        } else {
          try {
            RunConfig config;
            config.warmup = options.warmup;
            config.iters = options.iters;
            config.max_persistent_blocks = max_persistent_blocks;
            config.timed_log_sum_exp = options.log_sum_exp;
            if (is_backward(step.kind)) {
              if (d_o.empty()) {
                d_o = make_output_gradient(shape, options.seed);
                backward_reference = compute_backward_reference(inputs, d_o, slices);
              }
              const BackwardRunResult result = run_backward_step(
                  step, inputs, d_o, options.check == CheckMode::none ? nullptr : &backward_reference,
                  config);
              record.backward = true;
              record.timing = result.timing;
              record.check = result.check;
            } else {
              const RunResult result = run_step(
                  step, inputs, options.check == CheckMode::none ? nullptr : &reference, config);
              record.timing = result.timing;
              record.check = result.check;
            }
            record.status = status_of(record.check);
            any_failed = any_failed || (record.check.checked && !record.check.passed);
          } catch (const GpuHang&) {
            throw;  // the kernel still runs: waiting for the device below would never return
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
    exit_if_gpu_hung(kExitRuntime);
    return kExitRuntime;
  }
}
