// The online softmax of step v6 (steps/v6_flash/flash.cu), modelled on the CPU and proven
// against the plain softmax before the kernel is (docs/07-flash.md derives it).
//
// The model takes one row of raw scores s_j = q . k_j (unscaled, as the kernel's fp32 MMA
// accumulators hold them) and the rows v_j of V, and walks the row in blocks of b keys, keeping
// what flash.cu keeps per query row:
//   m    the running maximum, in raw score units (row_max)
//   l    the running sum of the weights (row_sum)
//   acc  the running weighted sum of V rows, unnormalised (o_acc)
// For each block: m' = max(m, max_j s_j); l and acc are multiplied by exp(scale (m - m')); then
// every key adds p_j = exp(scale (s_j - m')) to l and p_j v_j to acc. After the last block
// O = acc / l. Two forms of the exponential:
//   natural  exp(scale (s - m')), rescale factor exp(scale (m - m'))
//   exp2     the arithmetic of flash.cu: c = log2(e) / sqrt(D) folded into one constant
//            (float(M_LOG2E * scale), scale = 1/sqrt(D), as launch_flash_for computes it), M = fl(m' c),
//            p_j = exp2(fma(s_j, c, -M)) and rescale factor exp2(fma(m, c, -M)). The source
//            writes the factor as exp2(m * c - M); nvcc 13.0 emits mul, mul, sub in PTX and
//            ptxas contracts it into one FFMA (seen in the sm_90 SASS of the D = 64 kernel:
//            FFMA R15, R16, UR4, -R185 feeds the MUFU.EX2 whose result scales o_acc), so the
//            model uses the FMA too.
// The model runs in fp64 (the maths) and in fp32 (the kernel's precision); the kernel's
// ex2.approx.ftz.f32 is replaced by the library's exp2f, and its summation order within a
// block (four lanes of a quad, then a shuffle) by a plain left-to-right sum.
//
// The reference is the plain stable softmax in fp64 over the same fp32 scores:
// x_j = s_j / sqrt(D), p_j = exp(x_j - max x), O = sum_j p_j v_j / sum_j p_j.
//
// Tolerance, the same formula for both precisions with their unit roundoff u (2^-53, 2^-24),
// on max_c |O_model[c] - O_ref[c]| / max|V| (O is a convex combination of the rows of V, so
// |O| <= max|V| and this is the error relative to the output's scale):
//     4 u ((N + 8) + T (1 + max_j |x_j|)),   T = ceil(N / b) blocks.
// Where it comes from: an error of relative size e on the weights moves O by at most
// 2 e max|V|. Each weight picks up rounding from its exponential, at most T rescales and N
// additions: (N + T + a few) u. And the exponent itself is rounded where it is large: in the
// exp2 form M = fl(m' c) is off by up to u |m' c|, and because the rescale factor uses the
// exact m c inside the FMA, each block can shift everything accumulated so far by a factor
// 2^delta with |delta| <= u |m' c|, that is a relative u |m' c| ln 2 = u |m' scale| <= u max|x|,
// even when the maximum did not change. Over T blocks: T u max|x|. The factor 4 is 2 for the
// step from weights to O and 2 for margin. With scores in the hundreds this term dominates in
// fp32 (it is why the bound grows with the logits), and it is a worst case: the measured
// errors, which the test prints, are far inside it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "check.hpp"
#include "inputs.hpp"

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kLog2e = 1.4426950408889634;  // M_LOG2E

enum class ExpForm { natural, exp2_folded };

// One query row: raw scores (fp32, as the kernel's accumulators) and V, N x D, row-major.
struct Row {
  std::string kind;
  int head_dim = 64;
  std::vector<float> scores;
  std::vector<double> v;  // fp32-representable values, so every model reads the same inputs
  int tokens() const { return int(scores.size()); }
};

struct ModelOptions {
  ExpForm form = ExpForm::exp2_folded;
  bool round_p_to_half = false;  // P rounded to fp16 before P V, as flash.cu packs it
  bool rescale_acc = true;       // false: the classic bug, kept to prove the tests catch it
  bool subtract_first = false;   // exp2 form: factor exp2((m - m') c), exactly 1 when m' = m
};

// The blocked recurrence of flash.cu, in precision Real, with blocks of `block` keys.
template <typename Real>
std::vector<double> online_softmax(const Row& row, int block, const ModelOptions& options) {
  const int n = row.tokens(), d = row.head_dim;
  const Real scale = Real(1.0 / std::sqrt(double(d)));
  const Real scale_log2 = Real(kLog2e / std::sqrt(double(d)));  // launch_flash_for's constant
  Real row_max = -std::numeric_limits<Real>::infinity();
  Real row_sum = 0;
  std::vector<Real> acc(d, Real(0));
  for (int start = 0; start < n; start += block) {
    const int count = std::min(block, n - start);
    Real tile_max = row_max;
    for (int j = 0; j < count; ++j) tile_max = std::max(tile_max, Real(row.scores[start + j]));

    Real correction;
    const Real max_scaled = tile_max * scale_log2;
    if (options.form == ExpForm::exp2_folded && options.subtract_first) {
      correction = std::exp2((row_max - tile_max) * scale_log2);  // exp2(-inf) = 0 at first
    } else if (options.form == ExpForm::exp2_folded) {
      correction = std::exp2(std::fma(row_max, scale_log2, -max_scaled));  // 0 the first time
    } else {
      correction = std::exp(scale * (row_max - tile_max));
    }
    row_max = tile_max;
    row_sum *= correction;
    if (options.rescale_acc) {
      for (Real& a : acc) a *= correction;
    }
    for (int j = 0; j < count; ++j) {
      const Real s = Real(row.scores[start + j]);
      const Real p = options.form == ExpForm::exp2_folded
                         ? std::exp2(std::fma(s, scale_log2, -max_scaled))
                         : std::exp(scale * (s - tile_max));
      row_sum += p;  // flash.cu sums the fp32 weights, before rounding them for P V
      const Real weight =
          options.round_p_to_half ? Real(__half2float(__float2half_rn(float(p)))) : p;
      const double* v_row = &row.v[std::size_t(start + j) * d];
      for (int c = 0; c < d; ++c) acc[c] += weight * Real(v_row[c]);
    }
  }
  std::vector<double> out(d);
  for (int c = 0; c < d; ++c) out[c] = double(acc[c] / row_sum);
  return out;
}

// The plain stable softmax, fp64, over the whole row at once.
std::vector<double> plain_softmax(const Row& row) {
  const int n = row.tokens(), d = row.head_dim;
  const double scale = 1.0 / std::sqrt(double(d));
  double m = -kInf;
  for (float s : row.scores) m = std::max(m, scale * double(s));
  double l = 0;
  std::vector<double> acc(d, 0.0);
  for (int j = 0; j < n; ++j) {
    const double p = std::exp(scale * double(row.scores[j]) - m);
    l += p;
    for (int c = 0; c < d; ++c) acc[c] += p * row.v[std::size_t(j) * d + c];
  }
  for (double& a : acc) a /= l;
  return acc;
}

double max_abs_v(const Row& row) {
  double m = 0;
  for (double x : row.v) m = std::max(m, std::abs(x));
  return m;
}

double max_abs_scaled_score(const Row& row) {
  double m = 0;
  for (float s : row.scores) {
    if (std::isfinite(s)) m = std::max(m, std::abs(double(s)) / std::sqrt(double(row.head_dim)));
  }
  return m;
}

// max_c |a[c] - b[c]| / max|V|; infinity when a value is not finite.
double scaled_error(const std::vector<double>& a, const std::vector<double>& b, double v_scale) {
  double worst = 0;
  for (std::size_t c = 0; c < a.size(); ++c) {
    if (!std::isfinite(a[c])) return kInf;
    worst = std::max(worst, std::abs(a[c] - b[c]) / v_scale);
  }
  return worst;
}

// Row kinds. "scaled score" x = s / sqrt(D) is what the softmax sees.
//   normal  x ~ N(0, 1)
//   large   x ~ N(0, 256^2): the GPU stress case's spread (Q, K scaled by 16), scores in the
//           hundreds, so exp without subtracting the maximum overflows
//   rising  the large row sorted ascending: the maximum grows in every block, so every block
//           rescales (the worst case for the recurrence)
//   late    normal scores, and the last key 300 above them: the maximum appears at the end
Row make_row(const std::string& kind, int tokens, int head_dim, uint64_t seed) {
  Row row;
  row.kind = kind;
  row.head_dim = head_dim;
  row.scores.resize(tokens);
  row.v.resize(std::size_t(tokens) * head_dim);
  const double root_d = std::sqrt(double(head_dim));
  const double spread = (kind == "large" || kind == "rising") ? 256.0 : 1.0;
  for (int j = 0; j < tokens; ++j) {
    row.scores[j] = float(spread * root_d * attn::normal_sample(seed, 11, uint64_t(j)));
  }
  if (kind == "rising") std::sort(row.scores.begin(), row.scores.end());
  if (kind == "late") row.scores[tokens - 1] = float(300.0 * root_d);
  for (std::size_t i = 0; i < row.v.size(); ++i) row.v[i] = attn::normal_sample(seed, 12, i);
  return row;
}

// Every block size for short rows; for long ones a representative set: 1, 2, N - 1, N, the
// kernel's 16-key steps and 64-key tile, their neighbours, and sizes that do not divide N.
std::vector<int> block_sizes(int tokens) {
  std::vector<int> sizes;
  if (tokens <= 200) {
    for (int b = 1; b <= tokens; ++b) sizes.push_back(b);
    return sizes;
  }
  for (int b : {1, 2, 3, 5, 7, 8, 13, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 200,
                tokens / 2, tokens / 2 + 1, tokens - 1, tokens}) {
    if (b >= 1 && b <= tokens) sizes.push_back(b);
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

std::vector<int> row_lengths() {
  std::vector<int> lengths;
  for (int n = 1; n <= 64; ++n) lengths.push_back(n);
  for (int n : {65, 127, 128, 197, 577, 1000, 1025}) lengths.push_back(n);
  return lengths;
}

// The tolerance of the header: 4 u ((N + 8) + T (1 + max|x|)), T = ceil(N / b).
double tolerance_for(const Row& row, int block, double unit_roundoff) {
  const int n = row.tokens();
  const double blocks = double((n + block - 1) / block);
  return 4 * unit_roundoff * ((n + 8) + blocks * (1 + max_abs_scaled_score(row)));
}

const char* form_name(ExpForm form) { return form == ExpForm::natural ? "exp" : "exp2"; }

// Runs the model at every length, kind, block size and form; returns the largest error found
// as a fraction of the tolerance, and checks each case against it.
template <typename Real>
double sweep(double unit_roundoff) {
  double worst_fraction = 0, worst_error = 0, largest_error = 0;
  std::string worst_case, largest_case;
  int cases = 0;
  for (int tokens : row_lengths()) {
    for (const char* kind : {"normal", "large", "rising", "late"}) {
      const int head_dim = tokens % 3 == 0 ? 80 : 64;  // 1/sqrt(80) is not a power of two
      const Row row = make_row(kind, tokens, head_dim, 1000 + uint64_t(tokens));
      const std::vector<double> reference = plain_softmax(row);
      const double v_scale = max_abs_v(row);
      for (int block : block_sizes(tokens)) {
        const double tolerance = tolerance_for(row, block, unit_roundoff);
        for (ExpForm form : {ExpForm::natural, ExpForm::exp2_folded}) {
          ModelOptions options;
          options.form = form;
          const double error =
              scaled_error(online_softmax<Real>(row, block, options), reference, v_scale);
          ++cases;
          if (error > tolerance) {
            FAIL_CHECK(kind << " row, N = " << tokens << ", D = " << head_dim << ", blocks of "
                            << block << ", " << form_name(form) << ": error " << error
                            << " > tolerance " << tolerance);
          }
          if (error > largest_error) {
            largest_error = error;
            largest_case = std::string(kind) + " N=" + std::to_string(tokens) + " b=" +
                           std::to_string(block) + " " + form_name(form);
          }
          if (error / tolerance > worst_fraction) {
            worst_fraction = error / tolerance;
            worst_error = error;
            worst_case = std::string(kind) + " N=" + std::to_string(tokens) + " b=" +
                         std::to_string(block) + " " + form_name(form);
          }
        }
      }
    }
  }
  MESSAGE(cases << " cases; largest error " << largest_error << " at " << largest_case
                << "; closest to its tolerance: " << worst_error << " (" << worst_fraction
                << " of it) at " << worst_case);
  return worst_fraction;
}

}  // namespace

TEST_SUITE("online_softmax") {
  TEST_CASE("fp64 model: the blocked recurrence is the plain softmax, every block size") {
    // Lengths 1..64 and 65..1025, every block size up to N = 200 and a representative set
    // beyond (1, 2, N - 1, N and non-divisors), both exponential forms, four kinds of row.
    const double worst = sweep<double>(0x1.0p-53);
    CHECK(worst < 1.0);
  }

  TEST_CASE("fp32 model (the kernel's precision): within the documented tolerance") {
    const double worst = sweep<float>(0x1.0p-24);
    CHECK(worst < 1.0);
  }

  TEST_CASE("fp32 model with P rounded to fp16 for P V, as flash.cu: within the step check") {
    // The kernel rounds each weight to fp16 for the tensor cores but sums the fp32 weights:
    // each p_j carries a relative error <= u/2 (u = 2^-11), so O moves by at most u/2 max|V|
    // more than the fp32 model does. That is the term harness/check.hpp budgets for; the step
    // check allows 4u max|V|. Blocks of 64 keys are flash.cu's K/V tile at D = 64; 16 is one
    // k-step of its P V product, 128 a tile it measured and rejected (docs/07-flash.md).
    double worst = 0;
    for (int tokens : {1, 2, 17, 64, 65, 127, 128, 197, 577, 1025}) {
      for (const char* kind : {"normal", "large", "rising", "late"}) {
        const Row row = make_row(kind, tokens, 64, 77 + uint64_t(tokens));
        const std::vector<double> reference = plain_softmax(row);
        for (int block : {16, 64, 128}) {
          ModelOptions options;
          options.round_p_to_half = true;
          const double error =
              scaled_error(online_softmax<float>(row, block, options), reference, max_abs_v(row));
          const std::string kind_name = kind;
          CAPTURE(kind_name);
          CAPTURE(tokens);
          CAPTURE(block);
          CHECK(error <= attn::kUnitRoundoff / 2 + tolerance_for(row, block, 0x1.0p-24));
          CHECK(error <= attn::kAbsoluteFactor);  // the step check's bound
          worst = std::max(worst, error);
        }
      }
    }
    MESSAGE("largest error with P in fp16: " << worst << " (u/2 = " << attn::kUnitRoundoff / 2
                                             << "; the step check allows "
                                             << attn::kAbsoluteFactor << ")");
  }

  TEST_CASE("exp2 form as compiled: the rescale factor is 2^delta, |delta| <= u |m c|") {
    // When the maximum does not change, exp2(fma(m, c, -fl(m c))) is exp2 of the rounding
    // error of fl(m c), not exp2(0): the kernel (and the model) multiply l and acc by a factor
    // a little off 1 in every tile. It is bounded by the tolerance's T u max|x| term; with
    // normal scores (|x| ~ 4) it is ~1e-7 a tile, with scores in the hundreds ~1e-4.
    const float c = float(kLog2e / 8.0);  // D = 64
    for (float m : {6423.56934f, 31.0f, 8000.0f, -5.25f}) {
      CAPTURE(m);
      const float max_scaled = m * c;
      const float factor = std::exp2(std::fma(m, c, -max_scaled));
      const double delta = std::log2(double(factor));
      CHECK(std::abs(delta) <= 0x1.0p-24 * std::abs(double(m) * c) * 1.01);
      // Subtracting first, exp2((m - m') c), gives exactly 1 when m' = m.
      CHECK(std::exp2((m - m) * c) == 1.0f);
    }
    CHECK(std::exp2(std::fma(6423.56934f, c, -(6423.56934f * c))) != 1.0f);
  }

  TEST_CASE("exp2 form as compiled: the factor compounds over tiles, subtracting first does not") {
    // The factor above multiplies everything accumulated so far in every tile whose maximum
    // did not change, so its error compounds with the number of tiles. The row that shows it:
    // scores in the hundreds, the largest key first and a close second (one lower in x) last,
    // the rest below x = 600. O is ~0.73 v_0 + 0.27 v_{N-1}, and the drift of the factor
    // over the T - 1 tiles between them tilts that mix. The kernel's arithmetic (fp32, tiles of
    // 64 keys, P in fp16) against the variant that subtracts first. The printed numbers are
    // quoted in docs/07-flash.md; they are a CPU model's, not a GPU measurement.
    double compiled_at_longest = 0, subtract_first_at_longest = 0;
    for (int tokens : {577, 4097, 16385}) {
      Row row = make_row("large", tokens, 64, 42);
      for (float& score : row.scores) score = std::min(score, float(600 * 8));
      row.scores[0] = 6423.31f;                      // x = 802.9
      row.scores[tokens - 1] = row.scores[0] - 8.0f;  // x one lower
      const std::vector<double> reference = plain_softmax(row);
      ModelOptions options;
      options.round_p_to_half = true;
      const double compiled =
          scaled_error(online_softmax<float>(row, 64, options), reference, max_abs_v(row));
      options.subtract_first = true;
      const double subtract_first =
          scaled_error(online_softmax<float>(row, 64, options), reference, max_abs_v(row));
      CAPTURE(tokens);
      CHECK(subtract_first <= attn::kAbsoluteFactor / 16);
      MESSAGE("N = " << tokens << ", near-tie row with x ~ 800, tiles of 64: error "
                     << compiled << " as compiled, " << subtract_first
                     << " subtracting first (step check: " << attn::kAbsoluteFactor << ")");
      compiled_at_longest = compiled;
      subtract_first_at_longest = subtract_first;
    }
    CHECK(compiled_at_longest > 10 * subtract_first_at_longest);
  }

  TEST_CASE("the first rescale factor is 0, not NaN, and a masked key contributes 0") {
    const float c = float(kLog2e / 8.0);  // D = 64
    const float inf = std::numeric_limits<float>::infinity();
    // flash.cu computes both the rescale factor and every weight as exp2(fma(x, c, -m c)):
    // x = the old running maximum for the factor, x = a key's score for its weight.
    const auto exp2_form = [c](float x, float m) { return std::exp2(std::fma(x, c, -m * c)); };
    for (float m : {-300.0f, 0.0f, 1.5f, 8000.0f}) {
      CAPTURE(m);
      // Before the first block the running maximum is -inf: the factor that rescales the
      // (zero) sum and accumulator is exp(-inf - m) = 0, not NaN, and 0 * 0 stays 0.
      const float first = exp2_form(-inf, m);
      CHECK(first == 0.0f);
      CHECK_FALSE(std::isnan(first));
      CHECK(0.0f * first == 0.0f);
      CHECK(std::exp(-kInf - double(m)) == 0.0);  // the natural form, fp64
      CHECK(std::exp(0.125f * (-inf - m)) == 0.0f);  // the natural form, fp32
      // A key past N gets the score -inf in flash.cu: its weight is exp2(-inf) = 0.
      CHECK(exp2_form(-inf, m) == 0.0f);
    }

    // A row with masked keys (score -inf) gives the same output as the row without them,
    // wherever they sit, as long as every block holds at least one real key.
    const Row plain = make_row("normal", 100, 64, 5);
    Row masked = plain;
    const int extra = 28;  // 100 + 28 = 128: masked keys at the end, as in the last tile
    masked.scores.resize(plain.tokens() + extra, -std::numeric_limits<float>::infinity());
    masked.v.resize(std::size_t(masked.tokens()) * 64, 123.0);  // junk that must not leak in
    const std::vector<double> reference = plain_softmax(plain);
    for (int block : {1, 16, 64, 100, 127, 128}) {
      CAPTURE(block);
      for (ExpForm form : {ExpForm::natural, ExpForm::exp2_folded}) {
        ModelOptions options;
        options.form = form;
        CHECK(scaled_error(online_softmax<double>(masked, block, options), reference,
                           max_abs_v(plain)) < 1e-13);
        CHECK(scaled_error(online_softmax<float>(masked, block, options), reference,
                           max_abs_v(plain)) < 1e-5);
      }
    }

    // Why flash.cu masks only the last tile, which always holds at least one real key: a block
    // whose keys are all masked, met while the running maximum is still -inf, would compute
    // exp(-inf - (-inf)) = exp(NaN).
    CHECK(std::isnan(exp2_form(-inf, -inf)));
  }

  TEST_CASE("the comparison has teeth: forgetting to rescale the accumulator fails") {
    // The same sweep's tolerance, on a row whose maximum keeps growing: without the rescale,
    // weights summed under an old maximum stay too large by exp(scale (m' - m)).
    const Row row = make_row("rising", 197, 64, 3);
    const std::vector<double> reference = plain_softmax(row);
    ModelOptions broken;
    broken.rescale_acc = false;
    const double tolerance = tolerance_for(row, 16, 0x1.0p-24);
    CHECK(scaled_error(online_softmax<float>(row, 16, broken), reference, max_abs_v(row)) >
          tolerance);
    const Row late = make_row("late", 197, 64, 3);
    CHECK(scaled_error(online_softmax<double>(late, 64, broken), plain_softmax(late),
                       max_abs_v(late)) > 1e-3);
  }
}
