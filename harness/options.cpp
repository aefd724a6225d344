#include "options.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "inputs.hpp"  // normal_sample: --random-lengths draws from the inputs' generator

namespace attn {

int64_t parse_integer(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  if (text.empty()) throw UsageError(flag + ": expected an integer, got an empty value");
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0') {
    throw UsageError(flag + ": '" + text + "' is not an integer");
  }
  if (errno == ERANGE || value > hi) {
    throw UsageError(flag + ": " + text + " is too large (at most " + std::to_string(hi) + ")");
  }
  if (value < lo) {
    throw UsageError(flag + ": " + text + " is too small (at least " + std::to_string(lo) + ")");
  }
  return value;
}

std::vector<int64_t> parse_integer_list(const std::string& flag, const std::string& text,
                                        int64_t lo, int64_t hi) {
  std::vector<int64_t> values;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    values.push_back(parse_integer(flag, text.substr(start, comma - start), lo, hi));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return values;
}

CheckMode parse_check_mode(const std::string& text) {
  if (text == "sample") return CheckMode::sample;
  if (text == "full") return CheckMode::full;
  if (text == "none") return CheckMode::none;
  throw UsageError("--check: '" + text + "' is not one of sample, full, none");
}

std::string to_string(CheckMode mode) {
  switch (mode) {
    case CheckMode::sample: return "sample";
    case CheckMode::full: return "full";
    case CheckMode::none: return "none";
  }
  return "?";
}

void validate_shape(const Shape& shape) {
  // Four tensors of B*H*max(N, N_k)*D 16-bit values must have a byte count that fits in 64 bits.
  constexpr int64_t kMaxBytes = std::numeric_limits<int64_t>::max();
  int64_t bytes = 4 * 2;  // four tensors, two bytes per element
  for (int64_t factor : {shape.batch, shape.heads, std::max(shape.tokens, shape.keys()), shape.head_dim}) {
    if (bytes > kMaxBytes / factor) {
      throw UsageError("shape " + shape.str() +
                       ": its buffers' byte count overflows 64 bits; choose smaller sizes");
    }
    bytes *= factor;
  }
}

std::string step_usage(const std::string& program) {
  return "usage: " + program +
         " [--tokens N | --image PX [--patch P]] [--batch B] [--heads H] [--head-dim D]\n"
         "       [--kv-tokens N_k] [--key-padding] [--dtype fp16|bf16] [--iters I] [--warmup W]\n"
         "       [--seed S] [--check sample|full|none] [--format text|json|csv] [--device K]\n"
         "       [--no-ceilings] [--deterministic] [--causal [--causal-align top-left|bottom-right]]\n"
         "       [--lengths L1,L2,... | --random-lengths COUNT]\n"
         "\n"
         "Runs one attention step, O = softmax(Q K^T / sqrt(D)) V on [B, H, N, D] tensors, checks\n"
         "it against the fp64 CPU reference and reports its time. What this step takes of the\n"
         "options below (head dims, dtypes, N_k, masks) is listed at the end.\n"
         "  --tokens N       sequence length (default 197, ViT-B/16 at 224 px)\n"
         "  --image PX       ViT image size; N = (PX / P)^2 + 1 (384 -> 577, 512 -> 1025)\n"
         "  --patch P        ViT patch size (default 16)\n"
         "  --batch B        batch size (default 32)\n"
         "  --heads H        attention heads (default 12)\n"
         "  --head-dim D     head dimension (default 64)\n"
         "  --kv-tokens N_k  keys and values per (b, h), for cross-attention (default: N, as\n"
         "                   many as the queries)\n"
         "  --key-padding    a [B, N_k] key-padding mask with the inputs (keys it marks get no\n"
         "                   weight; drawn as a DETR batch pads its images)\n"
         "  --lengths L,...  a batch of sequences of these lengths (images of several sizes),\n"
         "                   packed one after another, [total, H, D], each attending within\n"
         "                   itself (FlashAttention's varlen); instead of --tokens and --batch\n"
         "  --random-lengths C  C ViT images of random sizes (224 to 1024 px, patch 16, drawn\n"
         "                   from --seed), packed as --lengths packs them\n"
         "  --causal         a causal mask: query i sees key j only where j <= i\n"
         "  --causal-align A where the diagonal starts when N_k != N: top-left (default, as\n"
         "                   PyTorch's is_causal) or bottom-right (j <= i + N_k - N, as\n"
         "                   FlashAttention); with --causal\n"
         "  --dtype T        element type of Q, K, V and O: fp16 (default) or bf16\n"
         "  --iters I        timed runs (default: up to 50 within about 2 s)\n"
         "  --warmup W       untimed runs first (default 10)\n"
         "  --seed S         seed of the random inputs (default 1234)\n"
         "  --check MODE     the fp64 CPU reference on: sample (default: the first, the last\n"
         "                   and two random (b, h) slices) or full (every slice); with either,\n"
         "                   every slice against the GPU reference too. none: no check\n"
         "  --format F       text (default), json or csv\n"
         "  --device K       CUDA device index (default 0)\n"
         "  --no-ceilings    do not measure the GPU's copy bandwidth and tensor-core rate\n"
         "                   (for compute-sanitizer and ncu runs: only the step's kernel runs)\n"
         "  --deterministic  a backward step's deterministic mode: dQ without atomics, the same\n"
         "                   bits on every run (slower); refused by the forward steps\n"
         "Exit codes: 0 passed, 1 check failed, 2 usage error, 3 CUDA or runtime error.\n";
}

StepOptions parse_step_options(int argc, const char* const* argv) {
  StepOptions options;
  int64_t tokens = -1, image = -1, patch = -1;
  bool batch_given = false;
  int64_t random_lengths = 0;  // --random-lengths: drawn once --seed is known
  Causal causal_align = Causal::none;  // --causal-align, applied once --causal is known
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      options.help = true;
      continue;
    }
    if (flag == "--no-ceilings") {
      options.measure_ceilings = false;
      continue;
    }
    if (flag == "--deterministic") {
      options.deterministic = true;
      continue;
    }
    if (flag == "--causal") {
      if (options.shape.causal == Causal::none) options.shape.causal = Causal::top_left;
      continue;
    }
    if (flag == "--key-padding") {
      options.shape.key_padding = true;
      continue;
    }
    if (flag.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + flag + "'");
    // --flag=value and --flag value are both accepted.
    std::string name = flag, value;
    const std::size_t equals = flag.find('=');
    if (equals != std::string::npos) {
      name = flag.substr(0, equals);
      value = flag.substr(equals + 1);
    }
    auto take_value = [&]() -> const std::string& {
      if (equals == std::string::npos) {
        if (i + 1 >= argc) throw UsageError(name + ": missing value");
        value = argv[++i];
      }
      return value;
    };
    if (name == "--tokens") {
      tokens = parse_integer(name, take_value(), 1, kMaxDimension);
    } else if (name == "--image") {
      image = parse_integer(name, take_value(), 1, kMaxDimension);
    } else if (name == "--patch") {
      patch = parse_integer(name, take_value(), 1, kMaxDimension);
    } else if (name == "--batch") {
      options.shape.batch = parse_integer(name, take_value(), 1, kMaxDimension);
      batch_given = true;
    } else if (name == "--lengths") {
      options.shape.lengths = parse_integer_list(name, take_value(), 0, kMaxDimension);
    } else if (name == "--random-lengths") {
      random_lengths = parse_integer(name, take_value(), 1, 100000);
    } else if (name == "--heads") {
      options.shape.heads = parse_integer(name, take_value(), 1, kMaxDimension);
    } else if (name == "--head-dim") {
      options.shape.head_dim = parse_integer(name, take_value(), 1, kMaxDimension);
    } else if (name == "--kv-tokens") {
      options.shape.kv_tokens = parse_integer(name, take_value(), 1, kMaxDimension);
    } else if (name == "--dtype") {
      const std::string& dtype = take_value();
      if (dtype == "fp16") options.shape.dtype = DType::fp16;
      else if (dtype == "bf16") options.shape.dtype = DType::bf16;
      else throw UsageError("--dtype: '" + dtype + "' is not one of fp16, bf16");
    } else if (name == "--causal-align") {
      const std::string& align = take_value();
      if (align == "top-left") causal_align = Causal::top_left;
      else if (align == "bottom-right") causal_align = Causal::bottom_right;
      else throw UsageError("--causal-align: '" + align + "' is not one of top-left, bottom-right");
    } else if (name == "--iters") {
      options.iters = static_cast<int>(parse_integer(name, take_value(), 1, 1000000));
    } else if (name == "--warmup") {
      options.warmup = static_cast<int>(parse_integer(name, take_value(), 0, 1000000));
    } else if (name == "--seed") {
      options.seed = static_cast<uint64_t>(
          parse_integer(name, take_value(), 0, std::numeric_limits<int64_t>::max()));
    } else if (name == "--check") {
      options.check = parse_check_mode(take_value());
    } else if (name == "--format") {
      const std::string& format = take_value();
      if (format == "text") options.format = Format::text;
      else if (format == "json") options.format = Format::json;
      else if (format == "csv") options.format = Format::csv;
      else throw UsageError("--format: '" + format + "' is not one of text, json, csv");
    } else if (name == "--device") {
      options.device = static_cast<int>(parse_integer(name, take_value(), 0, 1023));
    } else {
      throw UsageError("unknown option '" + name + "' (see --help)");
    }
  }

  if (patch != -1 && image == -1) throw UsageError("--patch: only meaningful with --image");
  if (causal_align != Causal::none) {
    if (options.shape.causal == Causal::none) throw UsageError("--causal-align: only meaningful with --causal");
    options.shape.causal = causal_align;
  }
  if (options.shape.causal != Causal::none && options.format == Format::csv) {
    throw UsageError("--format csv with --causal: the CSV schema (the bench's) has no mask "
                     "column; use text or json");
  }
  if (options.shape.dtype != DType::fp16 && options.format == Format::csv) {
    throw UsageError("--format csv with --dtype " + dtype_name(options.shape.dtype) +
                     ": the CSV schema (the bench's) has no dtype column; use text or json");
  }
  if (image != -1) {
    if (tokens != -1) throw UsageError("--tokens and --image: give one, not both");
    if (patch == -1) patch = 16;
    if (image % patch != 0) {
      throw UsageError("--image " + std::to_string(image) + " is not a multiple of --patch " +
                       std::to_string(patch));
    }
    const int64_t side = image / patch;
    if (side > 46340) throw UsageError("--image: (image / patch)^2 + 1 tokens is too large");
    tokens = vit_tokens(image, patch);
  }
  if (tokens != -1) options.shape.tokens = tokens;
  if (random_lengths > 0) {
    if (options.shape.packed()) throw UsageError("--random-lengths and --lengths: give one, not both");
    // Image sides 224, 240, ..., 1024 px, each drawn from the seed: (side / 16)^2 + 1 tokens.
    for (int64_t drawn = 0; drawn < random_lengths; ++drawn) {
      const float u = std::fabs(normal_sample(options.seed, 7, uint64_t(drawn)));
      const int64_t side = 16 * (14 + int64_t(u * 1e6) % 51);
      options.shape.lengths.push_back(vit_tokens(side, 16));
    }
  }
  if (options.shape.packed()) {
    Shape& shape = options.shape;
    if (tokens != -1 || batch_given || shape.kv_tokens != 0 || shape.key_padding) {
      throw UsageError("--lengths: the lengths give the batch and every sequence's tokens and keys; "
                       "drop --tokens, --image, --batch, --kv-tokens and --key-padding");
    }
    if (options.format == Format::csv) {
      throw UsageError("--format csv with --lengths: the CSV schema (the bench's) has no lengths "
                       "column; use text or json");
    }
    int64_t longest = 0, total = 0;
    for (int64_t length : shape.lengths) {
      longest = std::max(longest, length);
      total += length;
      if (total > kMaxDimension) throw UsageError("--lengths: more than 2^31 - 1 tokens in all");
    }
    if (longest == 0) throw UsageError("--lengths: every sequence is empty; give one token at least");
    shape.batch = int64_t(shape.lengths.size());
    shape.tokens = longest;
  }
  validate_shape(options.shape);
  return options;
}

}  // namespace attn
