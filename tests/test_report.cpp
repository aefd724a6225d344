// The report maths and formats.
#include <doctest/doctest.h>

#include <algorithm>
#include <sstream>

#include "report.hpp"

TEST_SUITE("report") {
  TEST_CASE("FLOP and byte counts are problem.hpp's: 4 B H N^2 D FLOPs, 8 B H N D bytes") {
    const attn::Shape shape{32, 12, 577, 64};
    CHECK(shape.flops() == doctest::Approx(4.0 * 32 * 12 * 577 * 577 * 64));
    CHECK(shape.min_bytes() == doctest::Approx(4.0 * 32 * 12 * 577 * 64 * 2));
    CHECK(attn::vit_tokens(224, 16) == 197);
    CHECK(attn::vit_tokens(512, 16) == 1025);
  }

  TEST_CASE("rates and fractions of the ceilings") {
    attn::Record r;
    r.shape = {32, 12, 1025, 64};
    r.timing.median_us = 500.0;
    r.timing.iters = 10;
    r.ceilings.tensor_tflops = 600.0;
    r.ceilings.copy_gbps = 3000.0;
    const double flops = 4.0 * 32 * 12 * 1025.0 * 1025 * 64;
    const double bytes = 4.0 * 32 * 12 * 1025.0 * 64 * 2;
    CHECK(r.tflops() == doctest::Approx(flops / 500e-6 / 1e12));
    CHECK(r.gbps() == doctest::Approx(bytes / 500e-6 / 1e9));
    CHECK(r.fraction_of_tensor_peak() == doctest::Approx(r.tflops() / 600.0));
    CHECK(r.fraction_of_bandwidth() == doctest::Approx(r.gbps() / 3000.0));
  }

  TEST_CASE("median, min and max of the timed runs") {
    CHECK(attn::median({3, 1, 2}) == 2);
    CHECK(attn::median({4, 1, 3, 2}) == 2.5);
    const attn::TimingStats stats = attn::summarize({5, 9, 1, 7}, 3);
    CHECK(stats.median_us == 6);
    CHECK(stats.min_us == 1);
    CHECK(stats.max_us == 9);
    CHECK(stats.iters == 4);
    CHECK(stats.warmup == 3);
  }

  TEST_CASE("CSV rows have as many fields as the header, also with a comma in a field") {
    attn::Record r;
    r.step = "v0";
    r.gpu.name = "GPU, with comma";
    r.status = "skipped: v0 does not serve --head-dim 48 (it serves head dims 32, 64)";
    const std::string header = attn::csv_header(), row = attn::csv_row(r);
    auto fields = [](const std::string& line) {
      int count = 1;
      bool quoted = false;
      for (char c : line) {
        if (c == '"') quoted = !quoted;
        if (c == ',' && !quoted) ++count;
      }
      return count;
    };
    CHECK(fields(row) == fields(header));
    CHECK(row.find("\"GPU, with comma\"") != std::string::npos);
  }

  TEST_CASE("text and JSON say whether the check passed") {
    attn::Record r;
    r.step = "v0";
    r.shape = {1, 1, 17, 64};
    r.check.checked = true;
    r.check.passed = false;
    r.check.worst = "largest error at slice 0, row 3, column 2";
    r.status = attn::status_of(r.check);
    std::ostringstream text, json;
    attn::print_text(text, r);
    attn::print_json(json, r);
    CHECK(text.str().find("FAILED") != std::string::npos);
    CHECK(text.str().find("row 3, column 2") != std::string::npos);
    CHECK(json.str().find("\"status\": \"failed\"") != std::string::npos);
    CHECK(json.str().find("\"median_us\": 0") != std::string::npos);
  }
}
