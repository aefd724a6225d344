// The command line of every step executable (README.md, "Command line"), and the number
// parsing the bench shares. Bad input throws UsageError with one line that names the flag.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "problem.hpp"

namespace attn {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class CheckMode { sample, full, none };
enum class Format { text, json, csv };

struct StepOptions {
  Shape shape;
  int iters = 0;     // 0: automatic, up to kAutoIters runs within about kAutoSeconds of timing
  int warmup = 10;
  uint64_t seed = 1234;
  CheckMode check = CheckMode::sample;
  Format format = Format::text;
  int device = 0;
  bool measure_ceilings = true;  // --no-ceilings: skip them (sanitizer and profiler runs)
  bool deterministic = false;    // --deterministic: a backward step's run-to-run exact mode
  bool help = false;
};

constexpr int kAutoIters = 50;
constexpr double kAutoSeconds = 2.0;

// Largest value any size flag takes: kernels index rows with 32-bit ints.
constexpr int64_t kMaxDimension = 2147483647;

StepOptions parse_step_options(int argc, const char* const* argv);
std::string step_usage(const std::string& program);

// Shared by the bench: strict integer parsing in [lo, hi], a comma-separated list of them,
// and the check of a whole shape (positive sizes, byte counts that fit 64 bits).
int64_t parse_integer(const std::string& flag, const std::string& text, int64_t lo, int64_t hi);
std::vector<int64_t> parse_integer_list(const std::string& flag, const std::string& text,
                                        int64_t lo, int64_t hi);
CheckMode parse_check_mode(const std::string& text);
void validate_shape(const Shape& shape);

std::string to_string(CheckMode mode);

}  // namespace attn
