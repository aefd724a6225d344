// Reports: one record per (step, shape), printed as text for people, JSON or CSV for scripts.
// The bench writes the same CSV columns, so every results file shares one schema.
#pragma once

#include <ostream>
#include <string>

#include "ceilings.hpp"
#include "check.hpp"
#include "problem.hpp"
#include "timing.hpp"

namespace attn {

struct Record {
  std::string step;   // "v0", "eager", ...
  std::string title;
  Shape shape;
  TimingStats timing;
  CheckResult check;
  GpuInfo gpu;
  Ceilings ceilings;
  std::string status;  // "passed", "failed", "unchecked", or "skipped: <why>"
  std::string date;    // UTC, ISO 8601
  bool backward = false;  // a backward step's record: dQ, dK, dV checked, the backward timed

  // The work the record's time is for. A backward is counted as FlashAttention counts it, 2.5
  // times the forward's FLOPs (five N x N x D products to the forward's two), and its fewest
  // bytes are Q, K, V, O, dO read and dQ, dK, dV written, fp16, plus L.
  double flops() const;
  double min_bytes() const;

  double tflops() const;            // achieved FLOP rate at the median time
  double gbps() const;              // the fewest bytes over the median time
  double fraction_of_tensor_peak() const;
  double fraction_of_bandwidth() const;
};

std::string today_utc();
std::string status_of(const CheckResult& check);

void print_text(std::ostream& out, const Record& record);
void print_json(std::ostream& out, const Record& record);
std::string csv_header();
std::string csv_row(const Record& record);

}  // namespace attn
