"""What the notebooks share: where the measured CSVs live, their columns, which rows count, and
how a figure names its GPU and date.

The CSVs come from one run of scripts/gpu-check.sh, copied to docs/results/<gpu>/:
  bench_vit.csv   the steps and the cuBLAS eager baseline at N = 197, 577, 1025 (bench)
  bench_long.csv  the steps with no N limit at N = 2049 ... 16385 (bench)
  pytorch.csv     PyTorch eager and the SDPA backends, and beside them steps (v6, v7, v8) timed
                  through the library in the same process (scripts/compare_pytorch.py), at the
                  ViT shapes and at longer ones of another B, H or D; the bench's columns, then
                  the timing windows (WINDOW_COLUMNS)
  profile.csv     ncu per step at N = 577 (scripts/ncu_profile.py)
  vit_end_to_end.csv, vit_end_to_end_kernels.csv
                  the steps inside torchvision's ViTs (scripts/vit_end_to_end.py)
The plots of one configuration (the ViT one, VIT_SHAPE) take the steps' times from the bench
files and PyTorch's from pytorch.csv (pytorch_only, at_vit_shape), so no step is drawn twice.
RESULTS_GPU picks the folder (default h100). A missing file is a note, not an error: the
notebook skips what needs it. A file that is there but malformed is an error.
"""
import os
import pathlib
import re

import pandas as pd

# harness/report.cpp, csv_header(); compare_pytorch.py writes the same columns.
BENCH_COLUMNS = (
    "step,batch,heads,tokens,head_dim,median_us,min_us,max_us,iters,warmup,buffer_sets,"
    "tflops,gbps,fraction_tensor_peak,fraction_bandwidth,tensor_peak_tflops,copy_gbps,"
    "status,relative_error,max_abs_error,checked_slices,gpu,date"
).split(",")
# scripts/compare_pytorch.py appends these after the bench's columns: how many interleaved timing
# windows, and the smallest and largest window median (the row's median is the median of them).
WINDOW_COLUMNS = ["windows", "window_median_min_us", "window_median_max_us"]
# The headline ViT configuration (ViT-B/16's attention at batch 32, README): the plots' shapes.
VIT_SHAPE = {"batch": 32, "heads": 12, "head_dim": 64}
# The columns of scripts/ncu_profile.py the notebooks read.
PROFILE_COLUMNS = ["step", "batch", "heads", "tokens", "head_dim", "duration_us", "dram_bytes",
                   "min_bytes", "status", "gpu", "date"]
# The columns of scripts/vit_end_to_end.py the notebooks read (rows, then kernel categories).
VIT_COLUMNS = ["gpu", "date", "model", "image_size", "tokens", "batch", "implementation", "status",
               "images_per_s", "median_ms", "speedup_vs_stock", "attention_share", "attention_ms"]
VIT_KERNEL_COLUMNS = ["gpu", "date", "model", "image_size", "implementation", "category", "gpu_ms",
                      "share"]

LABELS = {
    "eager": "cuBLAS eager (GEMM, softmax, GEMM)",
    "torch_eager": "PyTorch eager",
    "sdpa_flash": "PyTorch SDPA flash (FA2)",
    "sdpa_efficient": "PyTorch SDPA efficient",
    "sdpa_cudnn": "PyTorch SDPA cuDNN",
    "sdpa_math": "PyTorch SDPA math",
}


def repo_root():
    """The repository root: REPO_ROOT, else the first folder upward holding harness/report.cpp."""
    if os.environ.get("REPO_ROOT"):
        return pathlib.Path(os.environ["REPO_ROOT"]).resolve()
    here = pathlib.Path.cwd().resolve()
    for folder in [here, *here.parents]:
        if (folder / "harness" / "report.cpp").is_file():
            return folder
    raise FileNotFoundError(f"no repository root above {here} (set REPO_ROOT)")


GPU_FOLDER = os.environ.get("RESULTS_GPU", "h100")
RESULTS = repo_root() / "docs" / "results" / GPU_FOLDER
IMAGES = repo_root() / "docs" / "images"


def _read(name, columns):
    path = RESULTS / name
    if not path.is_file():
        print(f"note: {path.relative_to(repo_root())} is absent; skipping what needs it")
        return None
    frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}; is it the right file?")
    frame["source"] = name
    return frame


def load_bench(name):
    """A CSV in the bench schema (bench_vit.csv, bench_long.csv, pytorch.csv), or None."""
    frame = _read(name, BENCH_COLUMNS)
    if frame is not None and list(frame.columns[: len(BENCH_COLUMNS)]) != BENCH_COLUMNS:
        raise ValueError(f"{RESULTS / name}: columns differ from the bench schema")
    return frame


def load_pytorch():
    """pytorch.csv (the bench schema, then WINDOW_COLUMNS), or None."""
    frame = load_bench("pytorch.csv")
    if frame is not None:
        columns = [column for column in frame.columns if column != "source"]  # _read adds it
        after = columns[len(BENCH_COLUMNS): len(BENCH_COLUMNS) + len(WINDOW_COLUMNS)]
        if after != WINDOW_COLUMNS:
            raise ValueError(f"{RESULTS / 'pytorch.csv'}: after the bench's columns expected "
                             f"{WINDOW_COLUMNS}, found {after}; is it compare_pytorch.py's?")
    return frame


def load_profile():
    return _read("profile.csv", PROFILE_COLUMNS)


def load_vit(name="vit_end_to_end.csv"):
    """scripts/vit_end_to_end.py's rows (or, with its name, a repeat's file), or None."""
    return _read(name, VIT_COLUMNS)


def load_vit_kernels(name="vit_end_to_end_kernels.csv"):
    return _read(name, VIT_KERNEL_COLUMNS)


def timed(frame):
    """The rows that count for timing: check passed and a median measured. Says what it drops."""
    if frame is None:
        return None
    keep = (frame["status"] == "passed") & frame["median_us"].notna()
    dropped = frame[~keep].groupby(["source", "step", "status"], sort=False)["tokens"]
    for (source, step, status), tokens in dropped:
        listed = ",".join(str(n) for n in tokens)
        print(f"note: {source}: {step} at N={listed} left out: {status}")
    return frame[keep].copy()


def is_step(step):
    return re.fullmatch(r"v\d+", str(step)) is not None


def pytorch_only(frame):
    """PyTorch's rows of pytorch.csv (eager and the SDPA backends). Its step rows (v6, v7, v8
    timed through the library beside SDPA, for the chapters' same-process tables) are left out:
    the plots take every step's time from the bench files, one series per step."""
    if frame is None:
        return None
    return frame[~frame["step"].map(is_step)].copy()


def shape_name(row):
    return f"({row['batch']}, {row['heads']}, {row['tokens']}, {row['head_dim']})"


def at_vit_shape(frame):
    """The rows of the ViT configuration (VIT_SHAPE, any N); says which shapes it leaves out."""
    if frame is None:
        return None
    keep = (frame[list(VIT_SHAPE)] == pd.Series(VIT_SHAPE)).all(axis=1)
    if (~keep).any():
        for source, rows in frame[~keep].groupby("source", sort=False):
            shapes = ", ".join(dict.fromkeys(rows.apply(shape_name, axis=1)))
            print(f"note: {source}: {len(rows)} rows at (B, H, N, D) = {shapes} left out "
                  f"(not B={VIT_SHAPE['batch']}, H={VIT_SHAPE['heads']}, D={VIT_SHAPE['head_dim']})")
    return frame[keep].copy()


def order(steps):
    """Steps by number (v2 before v10), then the cuBLAS baseline, then PyTorch."""
    def key(step):
        if is_step(step):
            return (0, int(step[1:]), "")
        return (1 if step == "eager" else 2, list(LABELS).index(step) if step in LABELS else 99, step)
    return sorted(set(steps), key=key)


def label(step):
    return LABELS.get(step, step)


def caption(*frames):
    """'<GPU>, <date or date range>' from the frames' gpu and date columns."""
    frames = [frame for frame in frames if frame is not None and len(frame)]
    if not frames:
        return "no data"
    both = pd.concat([frame[["gpu", "date"]] for frame in frames])
    gpus = ", ".join(sorted(both["gpu"].dropna().astype(str).unique()))
    days = sorted(both["date"].dropna().astype(str).str[:10].unique())
    when = days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"
    return f"{gpus}, measured {when}"


def source_note(*frames):
    """The line under a figure: which files of docs/results/<gpu>/ it was drawn from, and how
    they were made."""
    names = sorted({name for frame in frames if frame is not None for name in frame["source"].unique()})
    return f"data: docs/results/{GPU_FOLDER}/ {', '.join(names)}, written by scripts/gpu-check.sh"


def ceilings(frame):
    """The measured fp16 tensor peak (TFLOP/s) and copy bandwidth (GB/s) of one run."""
    return float(frame["tensor_peak_tflops"].median()), float(frame["copy_gbps"].median())


def flops(row):
    return 4.0 * row["batch"] * row["heads"] * row["tokens"] ** 2 * row["head_dim"]


def min_bytes(row):
    return 4.0 * row["batch"] * row["heads"] * row["tokens"] * row["head_dim"] * 2


def floor_us(row, tensor_tflops, copy_gbps):
    """The time no implementation can beat: max(FLOPs / peak, fewest bytes / bandwidth)."""
    return max(flops(row) / (tensor_tflops * 1e12), min_bytes(row) / (copy_gbps * 1e9)) * 1e6


def save(figure, name):
    IMAGES.mkdir(parents=True, exist_ok=True)
    path = IMAGES / f"{name}_{GPU_FOLDER}.png"
    figure.savefig(path, dpi=150, bbox_inches="tight")
    print(f"saved {path.relative_to(repo_root())}")
    return path
