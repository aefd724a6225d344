#include "step_program.hpp"

#include <exception>
#include <new>
#include <string>

#include "ceilings.hpp"
#include "check.hpp"
#include "cpu_reference.hpp"
#include "cuda_check.hpp"
#include "options.hpp"
#include "report.hpp"
#include "runner.hpp"

namespace attn {

namespace {

// What the step takes of the options, from its registration (the usage above names none).
std::string takes_line(const StepInfo& step) {
  std::string line = "  head dims " + join_numbers(step.head_dims, ", ") + "; --dtype " +
                     dtype_names(step.dtypes);
  auto flag = [&](bool takes, const char* name) { line += std::string("; ") + name + (takes ? "" : " (refused)"); };
  flag(step.takes_kv_tokens, "--kv-tokens");
  flag(step.takes_key_padding_mask, "--key-padding");
  flag(step.takes_causal, "--causal");
  flag(step.has_deterministic_mode, "--deterministic");
  return line;
}

}  // namespace

int run_step_program(const StepInfo& step, int argc, const char* const* argv, std::ostream& out,
                     std::ostream& err, GpuInfo (*open)(int device)) {
  const std::string program = "step" + step.id.substr(1);
  try {
    const StepOptions options = parse_step_options(argc, argv);
    if (options.help) {
      out << step_usage(program) << "\nThis step (" << step.id << "): " << step.title << "\n"
          << takes_line(step) << "\n";
      return kExitPassed;
    }
    if (auto reason = step.refuses(options.shape)) throw UsageError(*reason);
    if (options.deterministic && !step.has_deterministic_mode) {
      throw UsageError("--deterministic: " + step.id +
                       (is_backward(step.kind) ? " has no deterministic mode"
                                               : " is a forward step, deterministic already (the "
                                                 "flag asks a backward step for its deterministic mode)"));
    }

    Record record;
    record.step = step.id;
    record.title = step.title;
    record.shape = options.shape;
    record.date = today_utc();
    record.gpu = open(options.device);
    if (auto reason = step.refuses(options.shape, record.gpu.limits())) throw UsageError(*reason);
    // Before drawing gigabytes of host inputs.
    ensure_fits(step, options.shape, options.check != CheckMode::none);
    if (options.measure_ceilings) record.ceilings = measure_ceilings();

    const HostTensors inputs = make_inputs(options.shape, options.seed);
    const std::vector<int64_t> slices = slices_to_check(options.shape, options.check, options.seed);
    RunConfig config;
    config.warmup = options.warmup;
    config.iters = options.iters;
    config.max_persistent_blocks = persistent_blocks_testing_aid();
    config.deterministic = options.deterministic;
    if (is_backward(step.kind)) {
      // dO too; the forward step it pairs with makes O and L; dQ, dK and dV are checked.
      const std::vector<__half> d_o = make_output_gradient(options.shape, options.seed);
      const BackwardReference reference = compute_backward_reference(inputs, d_o, slices);
      const BackwardRunResult result = run_backward_step(
          step, inputs, d_o, options.check == CheckMode::none ? nullptr : &reference, config);
      record.backward = true;
      record.timing = result.timing;
      record.check = result.check;
    } else {
      const Reference reference = compute_reference(inputs, slices);
      const RunResult result =
          run_step(step, inputs, options.check == CheckMode::none ? nullptr : &reference, config);
      record.timing = result.timing;
      record.check = result.check;
    }
    record.status = status_of(record.check);

    switch (options.format) {
      case Format::text: print_text(out, record); break;
      case Format::json: print_json(out, record); break;
      case Format::csv: out << csv_header() << "\n" << csv_row(record) << "\n"; break;
    }
    if (record.check.checked && !record.check.passed) {
      err << program << ": check failed: " << record.check.worst << "\n";
      return kExitCheckFailed;
    }
    return kExitPassed;
  } catch (const UsageError& error) {
    err << program << ": " << error.what() << "\n";
    return kExitUsage;
  } catch (const CudaError& error) {
    err << program << ": " << error.what() << "\n";
    return kExitRuntime;
  } catch (const std::bad_alloc&) {
    err << program << ": out of host memory for this shape\n";
    return kExitRuntime;
  } catch (const std::exception& error) {
    err << program << ": " << error.what() << "\n";
    return kExitRuntime;
  }
}

}  // namespace attn
