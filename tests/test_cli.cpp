// The command line of the step executables: defaults, --image, and every bad input README.md's
// "Command line" names (zero or negative sizes, non-numbers, unknown flags, sizes whose bytes
// overflow) gets exit code 2 and one line that names the flag.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "options.hpp"
#include "step_program.hpp"

namespace {

// 32 bytes of shared memory per token: on a GPU with 64 KB per block, N <= 2048 fits.
std::size_t fake_shared_bytes(const attn::Shape& shape) { return std::size_t(shape.tokens) * 32; }

// Steps that are never launched: every case here stops before the GPU, or has none.
const attn::StepInfo kFakeStep =
    attn::step_info("v9", "test step", nullptr).serving({32, 64, 80, 128}).with_shared_bytes(fake_shared_bytes);
const attn::StepInfo kFakeAmpereStep =
    attn::step_info("v8", "test step for 8.0+", nullptr).serving({64}).built_for(80, 0, "");

// A GPU that is not there, for the refusals the harness makes after reading the device:
// compute capability 7.5 and 64 KB of shared memory per block (a T4's limits).
attn::GpuInfo small_gpu(int) { return {"Test GPU (7.5, 64 KB)", 40, 4 << 20, 75, 65536}; }

struct Outcome {
  int code;
  std::string out, err;
};

Outcome run(std::vector<const char*> args, const attn::StepInfo& step = kFakeStep,
            attn::GpuInfo (*open)(int) = attn::open_device) {
  args.insert(args.begin(), "step9");
  std::ostringstream out, err;
  const int code = attn::run_step_program(step, int(args.size()), args.data(), out, err, open);
  return {code, out.str(), err.str()};
}

int lines(const std::string& text) { return int(std::count(text.begin(), text.end(), '\n')); }

attn::StepOptions parse(std::vector<const char*> args) {
  args.insert(args.begin(), "step9");
  return attn::parse_step_options(int(args.size()), args.data());
}

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("defaults are batch 32, heads 12, head dim 64, tokens 197") {
    const attn::StepOptions options = parse({});
    CHECK(options.shape.batch == 32);
    CHECK(options.shape.heads == 12);
    CHECK(options.shape.head_dim == 64);
    CHECK(options.shape.tokens == 197);
    CHECK(options.check == attn::CheckMode::sample);
    CHECK(options.format == attn::Format::text);
  }

  TEST_CASE("--image gives ViT token counts") {
    CHECK(parse({"--image", "224"}).shape.tokens == 197);
    CHECK(parse({"--image", "384"}).shape.tokens == 577);
    CHECK(parse({"--image", "512"}).shape.tokens == 1025);
    CHECK(parse({"--image", "384", "--patch", "32"}).shape.tokens == 145);
    CHECK(parse({"--image=384"}).shape.tokens == 577);
  }

  TEST_CASE("every flag is read") {
    const attn::StepOptions o = parse({"--tokens", "65", "--batch", "2", "--heads", "3",
                                       "--head-dim", "32", "--iters", "7", "--warmup", "0",
                                       "--seed", "99", "--check", "full", "--format", "csv",
                                       "--device", "1", "--no-ceilings"});
    CHECK(o.shape.tokens == 65);
    CHECK(o.shape.batch == 2);
    CHECK(o.shape.heads == 3);
    CHECK(o.shape.head_dim == 32);
    CHECK(o.iters == 7);
    CHECK(o.warmup == 0);
    CHECK(o.seed == 99);
    CHECK(o.check == attn::CheckMode::full);
    CHECK(o.format == attn::Format::csv);
    CHECK(o.device == 1);
    CHECK_FALSE(o.measure_ceilings);
    CHECK(parse({}).measure_ceilings);
    CHECK(parse({}).shape.dtype == attn::DType::fp16);
    CHECK(parse({"--dtype", "bf16"}).shape.dtype == attn::DType::bf16);
    CHECK(parse({"--dtype=fp16"}).shape.dtype == attn::DType::fp16);
    CHECK(parse({}).shape.keys() == 197);  // self-attention unless --kv-tokens
    CHECK(parse({"--tokens", "100", "--kv-tokens", "1050"}).shape.keys() == 1050);
    CHECK(parse({"--tokens", "100", "--kv-tokens", "1050"}).shape.cross());
    CHECK_FALSE(parse({}).shape.key_padding);
    CHECK(parse({"--key-padding"}).shape.key_padding);
    CHECK(parse({}).shape.causal == attn::Causal::none);
    CHECK(parse({"--causal"}).shape.causal == attn::Causal::top_left);
    CHECK(parse({"--causal", "--causal-align", "bottom-right"}).shape.causal == attn::Causal::bottom_right);
    CHECK(parse({"--causal-align=top-left", "--causal"}).shape.causal == attn::Causal::top_left);
  }

  TEST_CASE("--lengths packs sequences: the batch is their count, N the longest, FLOPs their own") {
    const attn::Shape shape = parse({"--lengths", "197,577,0,50", "--heads", "16"}).shape;
    CHECK(shape.packed());
    CHECK(shape.lengths == std::vector<int64_t>{197, 577, 0, 50});
    CHECK(shape.batch == 4);
    CHECK(shape.tokens == 577);
    CHECK(shape.total_tokens() == 824);
    CHECK(shape.length(1) == 577);
    // Each sequence's own pairs, never the padding's: 4 H D (197^2 + 577^2 + 50^2) at D = 64.
    CHECK(shape.flops() == doctest::Approx(4.0 * 16 * 64 * (197.0 * 197 + 577.0 * 577 + 50.0 * 50)));
    CHECK(shape.min_bytes() == doctest::Approx(2.0 * 4 * 824 * 16 * 64));
    CHECK(shape.str().find("lengths 197,577,0,50") != std::string::npos);
    // Under a causal mask a sequence of n counts n (n + 1) / 2 pairs.
    const attn::Shape causal = parse({"--lengths", "3,4", "--causal"}).shape;
    CHECK(causal.flops() == doctest::Approx(4.0 * 12 * 64 * (6 + 10)));
    // --random-lengths: ViT images of 224 to 1024 px, the same for the same seed.
    const attn::Shape drawn = parse({"--random-lengths", "40", "--seed", "5"}).shape;
    REQUIRE(drawn.lengths.size() == 40);
    for (int64_t length : drawn.lengths) {
      const int64_t side = int64_t(std::lround(std::sqrt(double(length - 1))));
      CHECK(side * side + 1 == length);
      CHECK(side >= 14);
      CHECK(side <= 64);
    }
    CHECK(parse({"--seed", "5", "--random-lengths", "40"}).shape.lengths == drawn.lengths);
    CHECK(parse({"--random-lengths", "40"}).shape.lengths != drawn.lengths);
    CHECK_FALSE(parse({}).shape.packed());
    CHECK(parse({}).shape.total_tokens() == 32 * 197);
  }

  TEST_CASE("bad input: exit 2, one line on stderr naming the flag") {
    struct Case {
      std::vector<const char*> args;
      const char* message;
    };
    const Case cases[] = {
        {{"--tokens", "0"}, "--tokens: 0 is too small"},
        {{"--tokens", "-1"}, "--tokens: -1 is too small"},
        {{"--tokens", "abc"}, "--tokens: 'abc' is not an integer"},
        {{"--tokens", "1e12"}, "--tokens: '1e12' is not an integer"},
        {{"--tokens", "12abc"}, "--tokens: '12abc' is not an integer"},
        {{"--tokens", ""}, "--tokens: expected an integer"},
        {{"--tokens", "99999999999"}, "--tokens: 99999999999 is too large"},
        {{"--tokens", "99999999999999999999999"}, "--tokens: 99999999999999999999999 is too large"},
        {{"--batch", "0"}, "--batch: 0 is too small"},
        {{"--heads", "0"}, "--heads: 0 is too small"},
        {{"--head-dim", "0"}, "--head-dim: 0 is too small"},
        {{"--head-dim", "1000"}, "does not serve --head-dim 1000"},
        {{"--head-dim", "48"}, "does not serve --head-dim 48 (it serves head dims 32, 64, 80, 128)"},
        {{"--iters", "0"}, "--iters: 0 is too small"},
        {{"--warmup", "-3"}, "--warmup: -3 is too small"},
        {{"--frobnicate"}, "unknown option '--frobnicate'"},
        {{"--batch"}, "--batch: missing value"},
        {{"tokens"}, "unexpected argument 'tokens'"},
        {{"--image", "100", "--patch", "16"}, "--image 100 is not a multiple of --patch 16"},
        {{"--image", "224", "--tokens", "197"}, "give one, not both"},
        {{"--patch", "16"}, "--patch: only meaningful with --image"},
        {{"--check", "most"}, "--check: 'most' is not one of sample, full, none"},
        {{"--format", "xml"}, "--format: 'xml' is not one of text, json, csv"},
        {{"--device", "-1"}, "--device: -1 is too small"},
        {{"--dtype", "fp8"}, "--dtype: 'fp8' is not one of fp16, bf16"},
        {{"--kv-tokens", "0"}, "--kv-tokens: 0 is too small"},
        {{"--key-padding"}, "does not serve --key-padding (it takes no key-padding mask)"},
        {{"--kv-tokens", "65"}, "does not serve --kv-tokens 65 (it serves self-attention"},
        {{"--dtype", "bf16"}, "does not serve --dtype bf16 (it takes fp16)"},
        {{"--dtype", "bf16", "--format", "csv"}, "has no dtype column"},
        {{"--causal"}, "does not serve --causal (it takes no causal mask)"},
        {{"--causal", "--causal-align", "middle"}, "--causal-align: 'middle' is not one of top-left, bottom-right"},
        {{"--causal-align", "bottom-right"}, "--causal-align: only meaningful with --causal"},
        {{"--causal", "--format", "csv"}, "has no mask column"},
        {{"--lengths", "17,65"}, "does not serve --lengths (it takes no packed sequences"},
        {{"--lengths", "17,-1"}, "--lengths: -1 is too small"},
        {{"--lengths", "0,0"}, "--lengths: every sequence is empty"},
        {{"--lengths", "17,65", "--tokens", "65"}, "--lengths: the lengths give the batch"},
        {{"--lengths", "17,65", "--batch", "2"}, "--lengths: the lengths give the batch"},
        {{"--lengths", "17,65", "--key-padding"}, "--lengths: the lengths give the batch"},
        {{"--lengths", "17,65", "--format", "csv"}, "has no lengths column"},
        {{"--lengths", "2147483647,2"}, "--lengths: more than 2^31 - 1 tokens in all"},
        {{"--lengths", "17,65", "--random-lengths", "3"}, "give one, not both"},
        {{"--random-lengths", "0"}, "--random-lengths: 0 is too small"},
        {{"--tokens", "2000", "--batch", "2147483647", "--heads", "2147483647", "--head-dim", "64"},
         "overflows 64 bits"},
    };
    for (const Case& c : cases) {
      std::string joined;
      for (const char* a : c.args) joined += std::string(a) + " ";
      CAPTURE(joined);
      const Outcome outcome = run(c.args);
      CHECK(outcome.code == attn::kExitUsage);
      CHECK(outcome.err.find(c.message) != std::string::npos);
      CHECK(lines(outcome.err) == 1);
      CHECK(outcome.out.empty());
    }
  }

  TEST_CASE("a shape or a GPU the step cannot serve: exit 2, one line naming both numbers") {
    // The device is a stand-in: these refusals come from its limits, before any launch.
    const Outcome too_long = run({"--tokens", "4096"}, kFakeStep, small_gpu);
    CHECK(too_long.code == attn::kExitUsage);
    CHECK(too_long.err.find("step9: v9 does not serve --tokens 4096 on this GPU: it needs 131072 bytes "
                            "of shared memory per block, Test GPU (7.5, 64 KB) allows 65536 (the "
                            "largest N it serves here is 2048)") != std::string::npos);
    CHECK(lines(too_long.err) == 1);
    CHECK(too_long.out.empty());
    CHECK_FALSE(kFakeStep.refuses({32, 12, 2048, 64}, small_gpu(0).limits()));

    const Outcome too_old = run({"--tokens", "197"}, kFakeAmpereStep, small_gpu);
    CHECK(too_old.code == attn::kExitUsage);
    CHECK(too_old.err.find("step8: v8 needs a GPU of compute capability 8.0 or newer; this GPU, "
                           "Test GPU (7.5, 64 KB), is 7.5") != std::string::npos);
    CHECK(lines(too_old.err) == 1);
    CHECK(too_old.out.empty());

    // A head dim it does not serve is refused before the device is even opened.
    const Outcome head_dim = run({"--head-dim", "48"}, kFakeAmpereStep, small_gpu);
    CHECK(head_dim.code == attn::kExitUsage);
    CHECK(head_dim.err.find("does not serve --head-dim 48") != std::string::npos);
  }

  TEST_CASE("a runtime problem (no GPU here, or a shape beyond its memory) is exit 3, one line") {
    // On a CPU machine this is "no CUDA device found"; on a GPU machine the shape (about
    // 1 PB of buffers) does not fit. Either way: exit 3 and one line, never a crash.
    const Outcome outcome = run({"--tokens", "2000", "--batch", "1000000", "--heads", "1000"});
    CHECK(outcome.code == attn::kExitRuntime);
    CHECK(lines(outcome.err) == 1);
    const bool explained = outcome.err.find("no CUDA device") != std::string::npos ||
                           outcome.err.find("GPU memory") != std::string::npos;
    CHECK(explained);
  }

  TEST_CASE("--help prints the usage and exits 0") {
    const Outcome outcome = run({"--help"});
    CHECK(outcome.code == 0);
    CHECK(outcome.out.find("usage: step9") != std::string::npos);
    CHECK(outcome.err.empty());
  }
}
