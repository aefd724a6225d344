#include "report.hpp"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <sstream>

namespace attn {
namespace {

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

std::string json_string(const std::string& text) {
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    quoted += c;
  }
  return quoted + "\"";
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += (c == '"') ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

// JSON has no NaN: unmeasured numbers are written as null.
std::string json_number(double value) {
  return std::isfinite(value) ? format("%.6g", value) : "null";
}

}  // namespace

double Record::flops() const { return backward ? 2.5 * shape.flops() : shape.flops(); }

double Record::min_bytes() const {
  if (!backward) return shape.min_bytes();
  return 2.0 * shape.min_bytes() + 4.0 * double(shape.slices() * shape.tokens);
}

double Record::tflops() const {
  return timing.median_us > 0 ? flops() / (timing.median_us * 1e-6) / 1e12 : 0;
}
double Record::gbps() const {
  return timing.median_us > 0 ? min_bytes() / (timing.median_us * 1e-6) / 1e9 : 0;
}
double Record::fraction_of_tensor_peak() const {
  return ceilings.tensor_tflops > 0 ? tflops() / ceilings.tensor_tflops : 0;
}
double Record::fraction_of_bandwidth() const {
  return ceilings.copy_gbps > 0 ? gbps() / ceilings.copy_gbps : 0;
}

std::string today_utc() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string status_of(const CheckResult& check) {
  if (!check.checked) return "unchecked";
  return check.passed ? "passed" : "failed";
}

void print_text(std::ostream& out, const Record& r) {
  out << "step     " << r.step << "  " << r.title << "\n";
  out << "gpu      " << r.gpu.name << " (" << r.gpu.sm_count << " SMs)\n";
  out << "shape    " << r.shape.str() << "  (" << format("%.3g", r.flops() / 1e9)
      << " GFLOP, " << format("%.3g", r.min_bytes() / 1e6) << " MB at the fewest bytes)\n";
  if (r.status.rfind("skipped", 0) == 0) {
    out << "status   " << r.status << "\n";
    return;
  }
  if (r.timing.iters > 0) {
    out << "time     median " << format("%.2f", r.timing.median_us) << " us   min "
        << format("%.2f", r.timing.min_us) << "   max " << format("%.2f", r.timing.max_us) << "   ("
        << r.timing.iters << " timed runs after " << r.timing.warmup << " warm-up, "
        << r.timing.buffer_sets << " rotating buffer set" << (r.timing.buffer_sets > 1 ? "s" : "")
        << ")\n";
    if (r.ceilings.tensor_tflops > 0) {
      out << "rate     " << format("%.2f", r.tflops()) << " TFLOP/s = "
          << format("%.1f", 100 * r.fraction_of_tensor_peak())
          << "% of the measured fp16 tensor peak (" << format("%.0f", r.ceilings.tensor_tflops)
          << " TFLOP/s)\n";
      out << "traffic  " << format("%.1f", r.gbps()) << " GB/s on the fewest bytes = "
          << format("%.1f", 100 * r.fraction_of_bandwidth()) << "% of the measured copy bandwidth ("
          << format("%.0f", r.ceilings.copy_gbps) << " GB/s)\n";
    } else {
      out << "rate     " << format("%.2f", r.tflops()) << " TFLOP/s, " << format("%.1f", r.gbps())
          << " GB/s on the fewest bytes (ceilings not measured: --no-ceilings)\n";
    }
  }
  const CheckResult& c = r.check;
  if (!c.checked) {
    out << "check    none (--check none)\n";
    return;
  }
  if (c.elementwise) {  // a backward step: every element against its own error bound
    out << "check    " << (c.passed ? "PASSED" : "FAILED") << "  largest error "
        << format("%.2f", c.worst_bound_ratio) << " of its element's bound (allowed "
        << format("%.0f", kGradientBoundFactor) << "), relative error " << format("%.2e", c.relative_error)
        << ", " << c.checked_slices << " of " << c.total_slices << " (b, h) slices";
    if (c.nonfinite > 0) out << ", " << c.nonfinite << " non-finite outputs";
    out << "\n";
    if (c.all_checked_slices > 0) {
      out << "         every element of all " << c.all_checked_slices
          << " slices against the GPU reference: largest error "
          << format("%.2f", c.all_worst_bound_ratio) << " of its bound, relative error "
          << format("%.2e", c.all_relative_error) << "\n";
    }
    if (!c.passed) out << "         " << c.worst << "\n";
    return;
  }
  out << "check    " << (c.passed ? "PASSED" : "FAILED") << "  relative error "
      << format("%.2e", c.relative_error) << " (tolerance " << format("%.2e", c.relative_tolerance)
      << "), max abs error " << format("%.2e", c.max_abs_error) << " (tolerance "
      << format("%.2e", c.abs_tolerance) << "), " << c.checked_slices << " of " << c.total_slices
      << " (b, h) slices";
  if (c.nonfinite > 0) out << ", " << c.nonfinite << " non-finite outputs";
  out << "\n";
  if (c.all_checked_slices > 0) {
    out << "         every element of all " << c.all_checked_slices
        << " slices against the GPU reference: relative error "
        << format("%.2e", c.all_relative_error) << ", max abs error "
        << format("%.2e", c.all_max_abs_error) << " (tolerance "
        << format("%.2e", c.all_abs_tolerance) << ")\n";
  }
  if (c.log_sum_exp_rows > 0) {
    out << "         L (log-sum-exp) of " << c.log_sum_exp_rows << " rows: max abs error "
        << format("%.2e", c.log_sum_exp_max_error) << " (tolerance "
        << format("%.2e", kLogSumExpTolerance) << ")\n";
  }
  if (!c.passed) out << "         " << c.worst << "\n";
}

void print_json(std::ostream& out, const Record& r) {
  const CheckResult& c = r.check;
  out << "{\"step\": " << json_string(r.step) << ", \"title\": " << json_string(r.title)
      << ", \"gpu\": " << json_string(r.gpu.name) << ", \"date\": " << json_string(r.date)
      << ", \"batch\": " << r.shape.batch << ", \"heads\": " << r.shape.heads
      << ", \"tokens\": " << r.shape.tokens << ", \"head_dim\": " << r.shape.head_dim
      << ", \"dtype\": " << json_string(dtype_name(r.shape.dtype))
      << ", \"kv_tokens\": " << r.shape.keys()
      << ", \"key_padding\": " << (r.shape.key_padding ? "true" : "false")
      << ", \"causal\": " << json_string(causal_name(r.shape.causal))
      << ", \"lengths\": [" << [&] {  // packed sequences' lengths, or none
           std::string list;
           for (int64_t length : r.shape.lengths) list += (list.empty() ? "" : ", ") + std::to_string(length);
           return list;
         }() << "]"
      << ", \"flops\": " << json_number(r.flops())
      << ", \"min_bytes\": " << json_number(r.min_bytes())
      << ", \"median_us\": " << json_number(r.timing.median_us)
      << ", \"min_us\": " << json_number(r.timing.min_us)
      << ", \"max_us\": " << json_number(r.timing.max_us) << ", \"iters\": " << r.timing.iters
      << ", \"warmup\": " << r.timing.warmup << ", \"buffer_sets\": " << r.timing.buffer_sets
      << ", \"tflops\": " << json_number(r.tflops()) << ", \"gbps\": " << json_number(r.gbps())
      << ", \"tensor_peak_tflops\": " << json_number(r.ceilings.tensor_tflops)
      << ", \"copy_gbps\": " << json_number(r.ceilings.copy_gbps)
      << ", \"fraction_tensor_peak\": " << json_number(r.fraction_of_tensor_peak())
      << ", \"fraction_bandwidth\": " << json_number(r.fraction_of_bandwidth())
      << ", \"status\": " << json_string(r.status)
      << ", \"relative_error\": " << json_number(c.checked ? c.relative_error : NAN)
      << ", \"max_abs_error\": " << json_number(c.checked ? c.max_abs_error : NAN)
      << ", \"relative_tolerance\": " << json_number(c.relative_tolerance)
      << ", \"abs_tolerance\": " << json_number(c.checked ? c.abs_tolerance : NAN)
      << ", \"nonfinite\": " << c.nonfinite << ", \"checked_slices\": " << c.checked_slices
      << "}\n";
}

std::string csv_header() {
  return "step,batch,heads,tokens,head_dim,median_us,min_us,max_us,iters,warmup,buffer_sets,"
         "tflops,gbps,fraction_tensor_peak,fraction_bandwidth,tensor_peak_tflops,copy_gbps,"
         "status,relative_error,max_abs_error,checked_slices,gpu,date";
}

std::string csv_row(const Record& r) {
  const CheckResult& c = r.check;
  std::ostringstream row;
  auto number = [](double value) { return std::isfinite(value) ? format("%.6g", value) : ""; };
  const bool timed = r.timing.iters > 0;
  row << csv_field(r.step) << "," << r.shape.batch << "," << r.shape.heads << ","
      << r.shape.tokens << "," << r.shape.head_dim << ","
      << (timed ? number(r.timing.median_us) : "") << "," << (timed ? number(r.timing.min_us) : "")
      << "," << (timed ? number(r.timing.max_us) : "") << "," << r.timing.iters << ","
      << r.timing.warmup << "," << r.timing.buffer_sets << "," << (timed ? number(r.tflops()) : "")
      << "," << (timed ? number(r.gbps()) : "") << ","
      << (timed ? number(r.fraction_of_tensor_peak()) : "") << ","
      << (timed ? number(r.fraction_of_bandwidth()) : "") << ","
      << number(r.ceilings.tensor_tflops) << "," << number(r.ceilings.copy_gbps) << ","
      << csv_field(r.status) << "," << (c.checked ? number(c.relative_error) : "") << ","
      << (c.checked ? number(c.max_abs_error) : "") << "," << c.checked_slices << ","
      << csv_field(r.gpu.name) << "," << r.date;
  return row.str();
}

}  // namespace attn
