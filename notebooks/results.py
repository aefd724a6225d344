"""What the notebooks share: where the measured CSVs live, their columns, which rows count, and
how a figure names its GPU and date.

The CSVs come from one run of scripts/gpu-check.sh, copied to docs/results/<gpu>/:
  bench_vit.csv   the steps and the cuBLAS eager baseline at N = 197, 577, 1025 (bench)
  bench_long.csv  the steps with no N limit at N = 2049 ... 16385 (bench)
  pytorch.csv     PyTorch eager and the SDPA backends (scripts/compare_pytorch.py)
  profile.csv     ncu per step at N = 577 (scripts/ncu_profile.py)
RESULTS_GPU picks the folder (default h100). A missing file is a note, not an error: the
notebook skips what needs it. A file that is there but malformed is an error.
"""
import os
import pathlib
import re

import pandas as pd

# common/report.cpp, csv_header(); compare_pytorch.py writes the same columns.
BENCH_COLUMNS = (
    "step,batch,heads,tokens,head_dim,median_us,min_us,max_us,iters,warmup,buffer_sets,"
    "tflops,gbps,fraction_tensor_peak,fraction_bandwidth,tensor_peak_tflops,copy_gbps,"
    "status,relative_error,max_abs_error,checked_slices,gpu,date"
).split(",")
# The columns of scripts/ncu_profile.py the notebooks read.
PROFILE_COLUMNS = ["step", "batch", "heads", "tokens", "head_dim", "duration_us", "dram_bytes",
                   "min_bytes", "status", "gpu", "date"]

LABELS = {
    "eager": "cuBLAS eager (GEMM, softmax, GEMM)",
    "torch_eager": "PyTorch eager",
    "sdpa_flash": "PyTorch SDPA flash (FA2)",
    "sdpa_efficient": "PyTorch SDPA efficient",
    "sdpa_cudnn": "PyTorch SDPA cuDNN",
    "sdpa_math": "PyTorch SDPA math",
}


def repo_root():
    """The repository root: REPO_ROOT, else the first folder upward holding common/report.cpp."""
    if os.environ.get("REPO_ROOT"):
        return pathlib.Path(os.environ["REPO_ROOT"]).resolve()
    here = pathlib.Path.cwd().resolve()
    for folder in [here, *here.parents]:
        if (folder / "common" / "report.cpp").is_file():
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


def load_profile():
    return _read("profile.csv", PROFILE_COLUMNS)


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
