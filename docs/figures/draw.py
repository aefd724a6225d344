#!/usr/bin/env python3
"""Draws the chapters' figures of data movement as SVG, from the steps' own constants: the tile
sizes, thread counts and fragment shapes are read from the step files each figure shows, so a
figure changes when the code does, and a CPU test (ctest cpu.figures) fails while a committed
figure is older than its code.

  docs/figures/draw.py            writes docs/figures/*.svg
  docs/figures/draw.py --check    exit 1, naming them, when a committed figure differs from what
                                the code draws now

The standard library only: each figure is a few rectangles, lines and labels.
"""
import argparse
import math
import os
import re
import sys

OUT_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(OUT_DIR))
FONT = "font-family='Helvetica, Arial, sans-serif'"
COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]
VIT_TOKENS = 197  # ViT-B/16 at 224 px: 14 x 14 patches and the class token


def step_constants(folder):
    """{name: int} of a step file's `constexpr int kName = <integer or product>;` lines (a template
    parameter's default, `int kName_ = 2`, counted as kName_), and of its
    `#define ATTN_..._TILES_D64 a, b, c` (as a tuple)."""
    path = next(os.path.join(REPO, "steps", folder, name)
                for name in os.listdir(os.path.join(REPO, "steps", folder)) if name.endswith(".cu"))
    text = open(path).read()
    values = {name: int(default) for name, default in re.findall(r"int (k\w+_) = (\d+)[,>]", text)}
    for name, expression in re.findall(r"constexpr int (k\w+) = ([\w\s*/+]+);", text):
        try:
            # integers and earlier constants, with C++'s integer division
            values[name] = eval(expression.replace("/", "//"), {}, dict(values))
        except (NameError, SyntaxError):
            continue
    for name, numbers in re.findall(r"#define (ATTN_\w+_TILES_D64) ([\d, ]+)\n", text):
        values[name] = tuple(int(n) for n in numbers.split(","))
    return values


class Svg:
    def __init__(self, width, height, title):
        self.parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
                      f"viewBox='0 0 {width} {height}' {FONT} font-size='12'>",
                      f"<title>{title}</title>",
                      "<defs><marker id='arrow' markerWidth='8' markerHeight='8' refX='7' refY='4' "
                      "orient='auto'><path d='M0,0 L8,4 L0,8 z' fill='#333'/></marker></defs>",
                      f"<rect width='{width}' height='{height}' fill='white'/>"]

    def rect(self, x, y, w, h, fill="none", stroke="#333", opacity=1.0, width=1.0):
        self.parts.append(f"<rect x='{x:.1f}' y='{y:.1f}' width='{w:.1f}' height='{h:.1f}' fill='{fill}' "
                          f"fill-opacity='{opacity}' stroke='{stroke}' stroke-width='{width}'/>")

    def text(self, x, y, label, size=12, anchor="start", weight="normal", color="#222"):
        label = label.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        self.parts.append(f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' text-anchor='{anchor}' "
                          f"font-weight='{weight}' fill='{color}'>{label}</text>")

    def arrow(self, x1, y1, x2, y2, dashed=False):
        dash = " stroke-dasharray='4,3'" if dashed else ""
        self.parts.append(f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' stroke='#333' "
                          f"stroke-width='1.2' marker-end='url(#arrow)'{dash}/>")

    def grid(self, x, y, rows, columns, cell_w, cell_h, stroke="#bbb"):
        for r in range(1, rows):
            self.parts.append(f"<line x1='{x:.1f}' y1='{y + r * cell_h:.1f}' x2='{x + columns * cell_w:.1f}' "
                              f"y2='{y + r * cell_h:.1f}' stroke='{stroke}' stroke-width='0.5'/>")
        for c in range(1, columns):
            self.parts.append(f"<line x1='{x + c * cell_w:.1f}' y1='{y:.1f}' x2='{x + c * cell_w:.1f}' "
                              f"y2='{y + rows * cell_h:.1f}' stroke='{stroke}' stroke-width='0.5'/>")

    def done(self):
        return "\n".join(self.parts + ["</svg>"]) + "\n"


def naive_thread():
    """Chapter 01 (step 0): one thread per element of O. Thread `index` = ((slice N) + i) D + c
    computes O[i][c]; it loads row i of Q and every row of K once per score, twice per key (the
    max, then the exp), and column c of V; the other threads load the same values again."""
    c = step_constants("v0_naive")
    threads = c["kThreadsPerBlock"]
    source = open(os.path.join(REPO, "steps", "v0_naive", "naive.cu")).read()
    served = [int(d) for d in re.search(r"\.serving\(\{([\d, ]+)\}\)", source).group(1).split(",")]
    head_dim, tokens, warp_size = 64, VIT_TOKENS, 32  # ViT-B's head dim, which step 0 serves
    assert head_dim in served and threads % head_dim == 0 and head_dim % warp_size == 0
    row, column = 61, 28  # the thread drawn: slice 0
    index = row * head_dim + column
    block, tid = divmod(index, threads)
    rows_per_block = threads // head_dim
    first_row = block * threads // head_dim
    s = 1.1
    svg = Svg(820, 536, "Step 0: one thread per output element")
    svg.text(20, 24, f"Step 0: one thread computes one element of O ({threads} threads per block; "
             f"N = {tokens}, D = {head_dim})", 14, weight="bold")
    svg.text(20, 42, f"thread index = ((slice · N) + i) · D + c computes O[i][c]; drawn: slice 0, i = {row}, "
             f"c = {column}, index {index} = thread {tid} of block {block}", 12)
    top, w, h = 84, head_dim * s, tokens * s
    band = 3.0  # a row or column of one element is drawn this thick
    panels = [(20, "Q", COLORS[0]), (215, "K", COLORS[1]), (410, "V", COLORS[2]), (605, "O", COLORS[3])]
    for x, name, _ in panels:
        svg.text(x, top - 8, f"{name} ({tokens} x {head_dim})", 12, weight="bold")
        svg.rect(x, top, w, h, "#eee")
    x = panels[0][0]
    svg.rect(x, top + row * s - band / 2, w, band, COLORS[0], stroke=COLORS[0])
    svg.text(x + w + 6, top + row * s + 4, f"row i = {row}", 10)
    x = panels[1][0]
    svg.rect(x, top, w, h, COLORS[1], opacity=0.8)
    svg.text(x + w + 6, top + 12, f"all {tokens} rows", 10)
    x = panels[2][0]
    svg.rect(x + column * s - band / 2, top, band, h, COLORS[2], stroke=COLORS[2])
    svg.text(x + w + 6, top + 12, f"column c = {column}", 10)
    x = panels[3][0]
    svg.rect(x, top + first_row * s, w, rows_per_block * s, "#bbb", stroke="#888", width=0.5)
    svg.rect(x + column * s - 2.5, top + row * s - 2.5, 5, 5, COLORS[3], stroke=COLORS[3])
    svg.text(x + w + 6, top + row * s + 4, f"O[{row}][{column}]", 10)
    notes = [["q_i, D halves, loaded again", f"for every score: {2 * tokens} times.",
              f"The {head_dim} threads of row i", "load the same row."],
             ["every k_j, once per score:", "pass 1 (max), pass 2 (exp).",
              "Every thread of the slice", "loads all of K, twice."],
             [f"v_j[c] of every key: {tokens} halves,", "once each (pass 2).",
              f"The {tokens} threads of column c", "load the same column."],
             ["the one element it writes;", f"grey: its block's {rows_per_block} rows"]]
    for (x, _, _), lines in zip(panels, notes):
        for n, line in enumerate(lines):
            svg.text(x, top + h + 18 + 14 * n, line, 11)
    # The block, zoomed: its threads by index, warp by warp.
    zy, cell_w, cell_h = top + h + 112, 7.0, 14
    zx = 70
    svg.text(20, zy - 10, f"Block {block} of the grid: {threads} threads = {rows_per_block} rows of O x "
             f"{head_dim} columns; warp w = {warp_size} consecutive threads", 12, weight="bold")
    for t in range(threads):
        r, col = divmod(block * threads + t, head_dim)
        warp = t // warp_size
        svg.rect(zx + col * cell_w, zy + (r - first_row) * cell_h, cell_w, cell_h, COLORS[warp % 8],
                 opacity=0.75, stroke="white", width=0.3)
    for r in range(rows_per_block):
        svg.text(zx - 6, zy + r * cell_h + 11, f"row {first_row + r}", 10, anchor="end")
        for half in range(head_dim // warp_size):
            warp = (r * head_dim) // warp_size + half
            svg.text(zx + (half + 0.5) * warp_size * cell_w, zy + r * cell_h + 11, f"warp {warp}", 10,
                     anchor="middle", color="white")
    svg.rect(zx + column * cell_w, zy + (row - first_row) * cell_h, cell_w, cell_h, stroke="#000", width=2)
    svg.text(zx + column * cell_w + cell_w / 2, zy + rows_per_block * cell_h + 13,
             f"thread {tid}", 10, anchor="middle")
    nx = zx + head_dim * cell_w + 16
    for n, line in enumerate(["A warp's 32 lanes, one row: at each", "step of a score all load the same",
                              "q and k element (one address), then", "32 consecutive halves of V."]):
        svg.text(nx, zy + 10 + 14 * n, line, 11)
    svg.text(20, zy + rows_per_block * cell_h + 40, f"Nothing is shared: every thread loads 4·N·D + N = "
             f"{4 * tokens * head_dim + tokens:,} halves for its one element, each from global memory;", 12)
    svg.text(20, zy + rows_per_block * cell_h + 56, "the repeats are answered by the L1 and L2 caches, "
             "so the cost is load instructions, not DRAM bytes (chapter 01).", 12)
    return svg.done()


def tiling():
    """Chapter 02 (step 1): a block's query rows stay in shared memory while K streams past them
    in tiles; every staged K element serves all of the block's rows."""
    c = step_constants("v1_smem_tiling")
    rows, key_tile, head_dim, threads = c["kQueryRows"], c["kKeyTile"], c["kHeadDim"], c["kThreads"]
    scale = 1.3
    svg = Svg(780, 380, "Step 1: shared-memory tiling")
    svg.text(20, 24, f"Step 1: one block of {threads} threads owns {rows} query rows of one (b, h) slice "
             f"(N = {VIT_TOKENS}, D = {head_dim})", 14, weight="bold")
    top = 60
    # Q in global memory, the block's rows marked.
    svg.text(20, top - 8, "Q in global memory")
    svg.rect(20, top, head_dim * scale, VIT_TOKENS * scale, "#eee")
    svg.rect(20, top + 2 * rows * scale, head_dim * scale, rows * scale, COLORS[0], opacity=0.8)
    svg.text(20 + head_dim * scale + 6, top + 2.5 * rows * scale + 4, f"this block: {rows} rows", 11)
    # K in global memory, cut into key tiles (the last one partial).
    kx = 250
    svg.text(kx, top - 8, f"K in global memory: tiles of {key_tile} keys")
    tiles = math.ceil(VIT_TOKENS / key_tile)
    for t in range(tiles):
        keys = min(key_tile, VIT_TOKENS - t * key_tile)
        svg.rect(kx, top + t * key_tile * scale, head_dim * scale, keys * scale,
                 COLORS[1] if t == 1 else "#eee", opacity=0.8 if t == 1 else 1.0)
        svg.text(kx + head_dim * scale + 6, top + (t * key_tile + keys / 2) * scale + 4,
                 f"tile {t}: keys {t * key_tile}-{t * key_tile + keys - 1}" + (" (the tail)" if keys < key_tile else ""), 11)
    # Shared memory: Q tile, the current K tile, the scores of the whole rows.
    sx, sy = 520, top
    svg.text(sx, sy - 8, "shared memory of the block", weight="bold")
    svg.rect(sx - 8, sy, 236, 270, "#f7f7f7")
    svg.rect(sx, sy + 10, head_dim * scale, rows * scale, COLORS[0], opacity=0.8)
    svg.text(sx + head_dim * scale + 6, sy + 10 + rows * scale / 2 + 4, f"Q tile {rows} x {head_dim}", 11)
    svg.rect(sx, sy + 50, head_dim * scale, key_tile * scale, COLORS[1], opacity=0.8)
    svg.text(sx + head_dim * scale + 6, sy + 50 + key_tile * scale / 2, f"K tile {key_tile} x {head_dim}", 11)
    svg.text(sx + head_dim * scale + 6, sy + 50 + key_tile * scale / 2 + 14, "(then V, the same way)", 11)
    svg.rect(sx, sy + 150, 200, rows * scale * 2, "#ddd")
    svg.text(sx + 4, sy + 150 + rows * scale + 4, f"scores: {rows} rows x N keys, fp32", 11)
    svg.text(sx, sy + 215, "the softmax of whole rows needs all N:", 11)
    svg.text(sx, sy + 229, "why step 1 has an N limit (chapter 02)", 11)
    svg.arrow(kx + head_dim * scale + 110, top + 1.5 * key_tile * scale - 4, sx - 10, sy + 50 + key_tile * scale / 2)
    svg.text(sx, sy + 10 + rows * scale + 14, "(this block's rows, staged once)", 10)
    svg.text(20, 350, f"Each K element crosses from global memory once per block and serves its {rows} query rows,", 12)
    svg.text(20, 366, "where step 0 fetched it again for every output element that needs it.", 12)
    return svg.done()


def coalescing():
    """Chapter 03 (steps 1 and 2): the bytes one warp's load instruction touches when staging a
    tile, one half per lane from 32 rows against one 16-byte chunk per lane from 4 rows."""
    c1, c2 = step_constants("v1_smem_tiling"), step_constants("v2_coalesced")
    head_dim, chunk_halves = c2["kHeadDim"], c2["kChunkHalves"]
    chunks_per_row = c2["kChunksPerRow"]
    row_bytes = head_dim * 2
    lanes = 32
    svg = Svg(780, 440, "Steps 1 and 2: one warp's load")
    svg.text(20, 20, "What one warp instruction of the tile copy touches", 14, weight="bold")
    svg.text(20, 36, f"(rows of D = {head_dim} halves, {row_bytes} bytes, each drawn as {chunks_per_row} chunks "
             "of 16 bytes)", 12)
    cell_w, cell_h = 30, 9
    for panel, (x, title, note) in enumerate([
            (20, "step 1: lane t copies row t, one half at a time",
             f"32 rows touched for {lanes * 2} useful bytes: 32 sectors of 32 B"),
            (410, f"step 2: lane t copies chunk t ({chunk_halves} halves, 16 B)",
             f"{lanes * 16 // row_bytes} whole rows, {lanes * 16} contiguous bytes: 16 sectors, all used")]):
        top = 70
        svg.text(x, top - 10, title, 12, weight="bold")
        svg.rect(x, top, chunks_per_row * cell_w, lanes * cell_h, "#f4f4f4")
        svg.grid(x, top, lanes, chunks_per_row, cell_w, cell_h)
        for lane in range(lanes):
            if panel == 0:  # the first half of chunk 0 of row `lane`
                svg.rect(x, top + lane * cell_h, cell_w / chunk_halves, cell_h, COLORS[lane % 8], opacity=0.9, width=0.3)
            else:
                row, chunk = divmod(lane, chunks_per_row)
                svg.rect(x + chunk * cell_w, top + row * cell_h, cell_w, cell_h, COLORS[lane % 8], opacity=0.9, width=0.3)
        for row in range(0, lanes, 8):
            svg.text(x - 4, top + row * cell_h + 8, f"{row}", 9, anchor="end")
        svg.text(x + chunks_per_row * cell_w + 8, top + 12, "row 0", 10)
        svg.text(x + chunks_per_row * cell_w + 8, top + lanes * cell_h, f"row {lanes - 1}", 10)
        svg.text(x, top + lanes * cell_h + 20, note, 11)
    svg.text(20, 408, f"Step 1's {c1['kThreads']} threads each copy a whole row; step 2's take consecutive "
             "16-byte chunks,", 12)
    svg.text(20, 424, "so a warp's 32 addresses are contiguous and every byte of every sector it fetches is "
             "used (chapter 03).", 12)
    return svg.done()


def wmma_fragment():
    """Chapter 04 (step 3): S = Q K^T as 16 x 16 x 16 fragment products, one warp."""
    c = step_constants("v3_wmma")
    f, rows, keys, head_dim = c["kFragment"], c["kQueryRows"], c["kKeyTile"], c["kHeadDim"]
    k_steps, n_fragments = head_dim // f, keys // f
    s = 3.2
    svg = Svg(800, 420, "Step 3: WMMA fragments")
    svg.text(20, 24, f"Step 3: one warp computes a {rows} x {keys} score tile as {n_fragments} x {k_steps} products "
             f"of {f} x {f} x {f} fragments", 14, weight="bold")
    top = 90
    # A: the Q tile, split along D into k-steps.
    ax = 20
    svg.text(ax, top - 12, f"Q tile ({rows} x {head_dim}): A fragments")
    for k in range(k_steps):
        svg.rect(ax + k * f * s, top, f * s, rows * s, COLORS[0] if k == 1 else "#eee", opacity=0.85)
        svg.text(ax + (k + 0.5) * f * s, top + rows * s + 14, f"k = {k}", 10, anchor="middle")
    # B: K^T, D x keys.
    bx, by = 320, top - 12
    svg.text(bx, by - 12, f"K tile transposed ({head_dim} x {keys}): B fragments")
    for k in range(k_steps):
        for n in range(n_fragments):
            svg.rect(bx + n * f * s, by + k * f * s, f * s, f * s,
                     COLORS[1] if (k == 1 and n == 2) else ("#fde2c4" if n == 2 else "#eee"), opacity=0.9)
    # C: the score tile.
    cx, cy = 320, by + head_dim * s + 30
    svg.text(cx, cy - 8, f"S tile ({rows} x {keys}): C fragments, fp32 accumulators")
    for n in range(n_fragments):
        svg.rect(cx + n * f * s, cy, f * s, rows * s, COLORS[2] if n == 2 else "#eee", opacity=0.85)
    svg.text(610, by + 20, "one mma_sync:", 12, weight="bold")
    svg.text(610, by + 38, "C[:, n=2] += A[k] x B[k, n=2]", 11)
    svg.text(610, by + 56, f"for k = 0..{k_steps - 1} ({head_dim} / {f})", 11)
    svg.text(610, by + 84, "the 32 lanes hold the", 11)
    svg.text(610, by + 98, f"fragments together: {f * f // 32} elements", 11)
    svg.text(610, by + 112, "of each per lane, in a layout", 11)
    svg.text(610, by + 126, "the tensor cores choose", 11)
    svg.arrow(ax + 1.5 * f * s, top + rows * s + 20, cx + 2.5 * f * s - 30, cy + rows * s / 2)
    svg.text(20, 400, f"{k_steps} k-steps x {n_fragments} output fragments = {k_steps * n_fragments} mma_sync "
             f"per key tile; P V the same way with P as A and V as B (chapter 04).", 12)
    return svg.done()


def warps_over_a_tile():
    """Chapter 05 (step 4): the block's warps split the score tile by keys and O by columns."""
    c = step_constants("v4_multi_warp")
    warps, f, rows, keys, head_dim = c["kWarps"], c["kFragment"], c["kQueryRows"], c["kKeyTile"], c["kHeadDim"]
    s = 4.0
    svg = Svg(760, 240, "Step 4: warps over a tile")
    svg.text(20, 24, f"Step 4: {warps} warps share the staged tiles of one block ({rows} query rows)",
             14, weight="bold")
    panels = [(20, f"S = Q K^T ({rows} x {keys}): warp w takes keys {f}w..{f}w+{f - 1}", keys, "keys"),
              (390, f"O = P V ({rows} x {head_dim}): warp w owns columns {f}w..{f}w+{f - 1}", head_dim, "columns")]
    for x, title, width, unit in panels:
        top = 70
        svg.text(x, top - 12, title, 12)
        per_warp = width // warps
        for w in range(warps):
            svg.rect(x + w * per_warp * s, top, per_warp * s, rows * s, COLORS[w], opacity=0.8)
            svg.text(x + (w + 0.5) * per_warp * s, top + rows * s / 2 + 4, f"warp {w}", 11, anchor="middle", color="white")
            svg.text(x + (w + 0.5) * per_warp * s, top + rows * s + 14,
                     f"{w * per_warp}-{(w + 1) * per_warp - 1}", 10, anchor="middle")
        svg.text(x + width * s + 6, top + rows * s + 14, unit, 10)
    svg.text(20, 180, f"The softmax between them is spread by rows: warp w takes rows w, w + {warps}, w + {2 * warps}, ...", 12)
    svg.text(20, 200, f"Each warp keeps one accumulator fragment of O instead of {head_dim // f}; a block brings "
             f"{warps} warps ({c['kThreads']} threads),", 12)
    svg.text(20, 218, "so while one waits on shared memory or a barrier, the others keep the tensor cores busy "
             "(chapter 05).", 12)
    return svg.done()


def padded_rows():
    """Chapter 06 (step 5): the banks one 8 x 8 matrix of a fragment load (ldmatrix) reads: 8
    tile rows, 16 bytes each at the same column. Rows of kHeadDim halves (steps 3 and 4) all
    start on bank 0; rows of kTileStride halves start 4 banks further on each."""
    c4, c5 = step_constants("v4_multi_warp"), step_constants("v5_large_tile")
    banks, bank_bytes, half_bytes = 32, 4, 2
    chunk_bytes = c5["kChunkHalves"] * half_bytes  # the 16 bytes of one row of an 8 x 8 matrix
    rows = c5["kChunkHalves"]                      # an 8 x 8 matrix of halves: 8 rows
    line_bytes = banks * bank_bytes
    cell_w, line_h = 11, 20
    tallest = math.ceil(rows * c5["kTileStride"] * half_bytes / line_bytes)  # lines of the padded rows
    svg = Svg(820, 450, "Step 5: padded rows")
    svg.text(20, 22, f"Step 5: rows of the Q, K and V tiles padded from {c4['kHeadDim']} to {c5['kTileStride']} "
             f"halves, against bank conflicts", 14, weight="bold")
    svg.text(20, 40, f"One 8 x 8 matrix of a fragment load (ldmatrix): {rows} rows, {chunk_bytes} bytes of each at the "
             f"same column, from {banks} banks of {bank_bytes} bytes", 12)
    for x, title, stride in [(60, f"steps 3 and 4: rows {c4['kHeadDim']} halves apart", c4["kHeadDim"]),
                             (450, f"step 5: rows kTileStride = {c5['kTileStride']} halves apart", c5["kTileStride"])]:
        row_bytes, data_bytes = stride * half_bytes, c5["kHeadDim"] * half_bytes
        lines = math.ceil(rows * row_bytes / line_bytes)
        top = 100
        svg.text(x - 40, top - 26, title + f" ({row_bytes} B)", 12, weight="bold")
        svg.text(x - 4, top - 6, "bank", 9, anchor="end")
        for b in range(0, banks, 4):
            svg.text(x + (b + 0.5) * cell_w, top - 6, f"{b}", 9, anchor="middle")
        svg.rect(x, top, banks * cell_w, lines * line_h, "#f4f4f4")
        hits = [0] * banks
        for r in range(rows):
            # row r's bytes, drawn 4-byte word by word into the lines of 32 banks; its first
            # chunk (column 0) is what the ldmatrix reads
            for word in range(row_bytes // bank_bytes):
                address = r * row_bytes + word * bank_bytes
                line, bank = divmod(address // bank_bytes, banks)
                byte = word * bank_bytes
                read = byte < chunk_bytes
                fill = COLORS[r] if byte < data_bytes else "#c8c8c8"
                svg.rect(x + bank * cell_w, top + line * line_h, cell_w, line_h, fill,
                         opacity=0.95 if read else (0.3 if byte < data_bytes else 1.0), stroke="white", width=0.5)
                if read:
                    hits[bank] += 1
            first_line, first_bank = divmod(r * row_bytes // bank_bytes, banks)
            svg.text(x + (first_bank + chunk_bytes / bank_bytes / 2) * cell_w, top + first_line * line_h + 14,
                     f"row {r}", 9, anchor="middle", color="white", weight="bold")
        for line in range(lines):
            svg.text(x - 4, top + line * line_h + 14, f"{line * line_bytes}", 9, anchor="end")
        # The banks the 8 addresses hit, and the passes that takes.
        hy = top + tallest * line_h + 30
        svg.text(x - 40, hy - 8, "reads per bank:", 11)
        for bank, count in enumerate(hits):
            fill = "white" if count == 0 else COLORS[2] if count == 1 else COLORS[3]
            svg.rect(x + bank * cell_w, hy, cell_w, 18, fill, opacity=0.85, stroke="#999", width=0.5)
            if count:
                svg.text(x + (bank + 0.5) * cell_w, hy + 13, f"{count}", 10, anchor="middle", color="white")
        passes = max(hits)
        used = [bank for bank, count in enumerate(hits) if count]
        each = "once" if passes == 1 else f"{passes} times" + (" each" if min(hits[b] for b in used) == passes
                                                              else " at most")
        where = f"all {banks} banks" if len(used) == banks else f"banks {used[0]}-{used[-1]}" \
            if used == list(range(used[0], used[-1] + 1)) else f"{len(used)} banks"
        svg.text(x - 40, hy + 38, f"{where} read {each}: {passes} pass{'es' if passes > 1 else ''}", 12,
                 weight="bold", color=COLORS[3] if passes > 1 else COLORS[2])
    shift = c5["kTileStride"] * half_bytes // bank_bytes % banks
    svg.text(20, 386, "Left: byte offsets from the tile's start (128-byte aligned). Grey: the padding, never read. "
             f"Drawn at halves 0-{c5['kChunkHalves'] - 1};", 12)
    svg.text(20, 402, f"another column shifts every row's banks alike. Row r starts at bank (r x "
             f"{c5['kTileStride'] * half_bytes} / {bank_bytes}) mod {banks} = {shift}r mod {banks} in step 5,", 12)
    svg.text(20, 418, f"at bank 0 in steps 3 and 4. The fp32 score rows (+{c5['kScorePad']} floats) and the O staging "
             f"tile ({c5['kStagingStride']} floats a row) are padded", 12)
    svg.text(20, 434, f"by {c5['kScorePad'] * 4} bytes the same way (chapter 06).", 12)
    return svg.done()


def online_softmax():
    """Chapter 07 (step 6): the tile loop of the online softmax, with the running max m, sum l
    and output O carried from one K/V tile to the next and rescaled when m grows."""
    c = step_constants("v6_flash")
    warps, row_groups, key_tile = c["ATTN_V6_TILES_D64"]
    block_rows = 16 * row_groups * warps
    tiles = math.ceil(VIT_TOKENS / key_tile)
    svg = Svg(820, 360, "Step 6: the online softmax")
    svg.text(20, 24, f"Step 6 at D = 64: a block's {block_rows} query rows ({warps} warps x {16 * row_groups} rows)",
             14, weight="bold")
    svg.text(20, 42, f"walk N = {VIT_TOKENS} keys in {tiles} K/V tiles of {key_tile}, carrying each row's m, l "
             "and O from tile to tile", 14, weight="bold")
    box_w, gap, top = 174, 28, 76
    for t in range(tiles):
        keys = min(key_tile, VIT_TOKENS - t * key_tile)
        x = 20 + t * (box_w + gap)
        svg.rect(x, top, box_w, 36, COLORS[1], opacity=0.25)
        svg.text(x + box_w / 2, top + 15, f"K, V tile {t}", 12, anchor="middle", weight="bold")
        svg.text(x + box_w / 2, top + 30, f"keys {t * key_tile}-{t * key_tile + keys - 1}"
                 + (" (masked tail)" if keys < key_tile else ""), 10, anchor="middle")
        lines = ["S = s Q K_j^T (registers)", "m' = max(m, rowmax S)", "P = exp(S - m')",
                 "l = l e^(m - m') + rowsum P", "O = O e^(m - m') + P V_j", "m = m'"]
        svg.rect(x, top + 48, box_w, 16 * len(lines) + 10, "#f4f4f4")
        for i, line in enumerate(lines):
            svg.text(x + 6, top + 66 + 16 * i, line, 11)
        if t + 1 < tiles:
            svg.arrow(x + box_w + 2, top + 48 + 52, x + box_w + gap - 2, top + 48 + 52)
            svg.text(x + box_w + gap / 2, top + 48 + 44, "m, l, O", 10, anchor="middle")
    end_x = 20 + tiles * (box_w + gap) - gap
    svg.text(20, top + 190, "After the last tile: O = O / l, written once; L = m + log l kept for the backward pass.", 12)
    svg.text(20, top + 210, "Only one K/V tile and the block's Q tile are on chip at a time (shared memory), "
             "and S and P never leave registers:", 12)
    svg.text(20, top + 228, "N x N scores are never stored, so memory traffic grows with N, not N^2 (chapter 07).", 12)
    svg.rect(20, top + 250, end_x - 20, 22, COLORS[0], opacity=0.2)
    svg.text(20 + (end_x - 20) / 2, top + 265, f"Q tile ({block_rows} x 64) stays for the whole walk", 11, anchor="middle")
    return svg.done()


def mask_tiles():
    """Chapter 12 (step 8): which K/V tiles each work tile of queries loads under the causal mask,
    and which of them need the element mask; classified element by element from the mask's
    definition (query i sees key j where j < N_k and j <= i + diagonal), at step 8's causal D = 64
    tiles (keys, stages, Q buffers, consumers of 64 rows)."""
    c = step_constants("v8_warp_specialized")
    block_n, _, _, consumers = c["ATTN_V8_CAUSAL_TILES_D64"]
    block_m = 64 * consumers
    svg = Svg(820, 425, "Step 8: the causal mask's tile ranges")
    svg.text(20, 22, f"Step 8 at D = 64: work tiles of {block_m} queries, K/V tiles of {block_n} keys, "
             "under the causal mask", 14, weight="bold")
    kinds = {"whole": ("#59a14f", "loaded, no element mask"), "partial": ("#edc948", "loaded, element mask"),
             "skipped": ("#eeeeee", "never loaded")}
    panels = [(20, "top left (is_causal=True): N = N_k = 577", 577, 577, 0),
              (430, "bottom right, N = 130 queries, N_k = 577 keys", 130, 577, 577 - 130)]
    scale = 0.5
    for x, title, tokens, keys, diagonal in panels:
        top = 70
        svg.text(x, top - 14, title, 12, weight="bold")
        q_tiles, k_tiles = math.ceil(tokens / block_m), math.ceil(keys / block_n)
        for qt in range(q_tiles):
            rows = range(qt * block_m, min(tokens, (qt + 1) * block_m))
            for kt in range(k_tiles):
                tile_keys = range(kt * block_n, (kt + 1) * block_n)
                seen = [j < keys and j <= i + diagonal for i in rows for j in tile_keys]
                kind = "whole" if all(seen) else "partial" if any(seen) else "skipped"
                width = min(block_n, keys - kt * block_n)  # the last tile's tail: zero rows, not drawn
                svg.rect(x + kt * block_n * scale, top + qt * block_m * scale, width * scale,
                         len(rows) * scale, kinds[kind][0], opacity=0.85)
        # The diagonal: key = row + diagonal, drawn over the tiles.
        x0, y0 = x + max(0, diagonal) * scale, top + max(0, -diagonal) * scale
        last = min(tokens, keys - diagonal)
        svg.parts.append(f"<line x1='{x0:.1f}' y1='{y0:.1f}' x2='{x + (last + diagonal) * scale:.1f}' "
                         f"y2='{top + last * scale:.1f}' stroke='#c00' stroke-width='1.5'/>")
        svg.rect(x, top, keys * scale, tokens * scale, width=1.2)
        svg.text(x, top + tokens * scale + 16, f"{q_tiles} work tile(s) x {k_tiles} K/V tiles; "
                 f"keys {keys - (k_tiles - 1) * block_n} in the last (a tail)", 11)
    for i, (kind, (color, label)) in enumerate(kinds.items()):
        svg.rect(20 + 200 * i, 400, 14, 14, color, opacity=0.85)
        svg.text(40 + 200 * i, 412, label, 11)
    svg.parts.append("<line x1='620' y1='407' x2='650' y2='407' stroke='#c00' stroke-width='1.5'/>")
    svg.text(656, 412, "the diagonal", 11)
    return svg.done()


def buffer_timeline(svg, uses, slots, copy_lane, read_lane, copy, read, copy_note, full, free):
    """What the figures of steps 7 and 8 share: use u of a ring of `slots` buffers, its copy
    into slot u % slots on the upper lane and its read on the lower, an arrow from each copy to
    its read (the full barrier) and a dashed one from each read to the copy that refills its
    slot. copy(u) gives the copy box's two lines, read(u) the read box's first line, its size
    and its second line, copy_note(u) a line above the copy (or None); full and free the
    legend's words (free with the x it starts at). Order, not time to scale."""
    x0, step_w = 100, 110
    for use in range(uses):
        slot, parity = use % slots, (use // slots) % 2
        color = COLORS[slot]
        px = x0 + use * step_w
        first, second = copy(use)
        svg.rect(px, copy_lane, 96, 34, color, opacity=0.8)
        svg.text(px + 48, copy_lane + 14, first, 11, anchor="middle", color="white")
        svg.text(px + 48, copy_lane + 28, second, 10, anchor="middle", color="white")
        if copy_note:
            svg.text(px + 48, copy_lane - 6, copy_note(use), 9, anchor="middle")
        rx = px + step_w * 0.45
        first, size, second = read(use)
        svg.rect(rx, read_lane, 96, 34, color, opacity=0.45)
        svg.text(rx + 48, read_lane + 14, first, size, anchor="middle")
        svg.text(rx + 48, read_lane + 28, second, 9, anchor="middle")
        svg.text(rx + 48, read_lane + 48, f"wait full, parity {parity}", 9, anchor="middle")
        svg.arrow(px + 60, copy_lane + 36, rx + 30, read_lane - 2)  # full: the bytes landed
        if use + slots < uses:  # the slot is free again for use + slots
            nx = x0 + (use + slots) * step_w
            svg.arrow(rx + 90, read_lane - 2, nx + 20, copy_lane + 36, dashed=True)
    legend_y = read_lane + 78
    svg.parts.append(f"<line x1='20' y1='{legend_y}' x2='50' y2='{legend_y}' "
                     "stroke='#333' stroke-width='1.2' marker-end='url(#arrow)'/>")
    svg.text(56, legend_y + 4, full, 10)
    free_x, free_words = free
    svg.parts.append(f"<line x1='{free_x}' y1='{legend_y}' x2='{free_x + 30}' y2='{legend_y}' "
                     "stroke='#333' stroke-width='1.2' stroke-dasharray='4,3' marker-end='url(#arrow)'/>")
    svg.text(free_x + 36, legend_y + 4, free_words, 10)
    svg.text(660, legend_y + 4, "(order, not time to scale)", 10)


def ring():
    """Chapter 10 (step 8): a ring of K buffers between the producer and the consumers, use by
    use: the full barrier hands a slot to the consumers, the empty barrier hands it back. Order,
    not time to scale."""
    c = step_constants("v8_warp_specialized")
    block_n, slots, _ = c["ATTN_V8_TILES_D64"]
    consumers = c["kConsumers"]
    uses = 3 * slots
    svg = Svg(840, 345, "Step 8: the K ring")
    svg.text(20, 22, f"Step 8's K ring at D = 64: {slots} slots of {block_n} keys, one producer, "
             f"{consumers} consumer warpgroups", 14, weight="bold")
    lane_producer, lane_consumer = 70, 180
    svg.text(20, lane_producer + 20, "producer", 12, weight="bold")
    svg.text(20, lane_consumer + 20, "consumers", 12, weight="bold")
    svg.text(20, lane_consumer + 36, f"({consumers} warpgroups)", 10)
    buffer_timeline(svg, uses, slots, lane_producer, lane_consumer,
                    copy=lambda use: (f"TMA K tile {use}", f"into slot {use % slots}"),
                    read=lambda use: (f"S = Q K{use}^T", 11, "wgmma reads it"),
                    copy_note=lambda use: f"wait empty, parity {(use // slots) % 2 ^ 1}",
                    full="full barrier: arrive.expect_tx, completed by the copy's bytes",
                    free=(370, f"empty barrier: the {4 * consumers} consumer warps release"))
    svg.text(20, 300, f"Use u goes to slot u % {slots} and waits for parity (u / {slots}) % 2: the producer's first "
             f"trip round the ring passes its empty waits at once", 12)
    svg.text(20, 318, "(the buffers start empty); from then on it refills a slot only after every consumer warp has "
             "released it. V has a ring of its own.", 12)
    return svg.done()


def roofline():
    """Chapter 00: the roofline of the H100 the chapter quotes (its measured ceilings, from the
    committed bench CSV), with attention's own intensity, N / 2 FLOP/byte, against eager's with
    the N x N scores stored and read back, N D / (2 (N + D)), at D = 64."""
    import csv
    path = os.path.join(REPO, "docs", "results", "h100", "bench_smoke_2026-11-22.csv")
    row = next(csv.DictReader(open(path)))
    peak, bandwidth = float(row["tensor_peak_tflops"]), float(row["copy_gbps"])  # TFLOP/s, GB/s
    ridge = peak * 1e12 / (bandwidth * 1e9)
    head_dim = 64
    svg = Svg(760, 470, "The memory wall: the roofline")
    svg.text(20, 22, f"The roofline of an {row['gpu']}, as measured: {peak:.0f} TFLOP/s, "
             f"{bandwidth:.0f} GB/s", 14, weight="bold")
    left, top, width, height = 80, 50, 620, 340
    x_low, x_high, y_low, y_high = 0.0, 4.0, 0.0, 3.2  # log10 of FLOP/byte and TFLOP/s

    def at(intensity, tflops):
        x = left + (math.log10(intensity) - x_low) / (x_high - x_low) * width
        y = top + height - (math.log10(tflops) - y_low) / (y_high - y_low) * height
        return x, y

    svg.rect(left, top, width, height)
    for decade in range(int(x_low), int(x_high) + 1):
        x, _ = at(10 ** decade, 1)
        svg.text(x, top + height + 16, f"{10 ** decade:g}", 10, anchor="middle")
    for decade in range(int(y_low), int(y_high) + 1):
        _, y = at(1, 10 ** decade)
        svg.text(left - 6, y + 4, f"{10 ** decade:g}", 10, anchor="end")
    svg.text(left + width / 2, top + height + 34, "arithmetic intensity (FLOP per byte of DRAM traffic)", 12, anchor="middle")
    svg.text(left, top - 8, "TFLOP/s", 12, anchor="middle")
    # The two roofs.
    x1, y1 = at(10 ** x_low, bandwidth * 1e9 * 10 ** x_low / 1e12)
    x2, y2 = at(ridge, peak)
    x3, _ = at(10 ** x_high, peak)
    svg.parts.append(f"<polyline points='{x1:.1f},{y1:.1f} {x2:.1f},{y2:.1f} {x3:.1f},{y2:.1f}' fill='none' "
                     "stroke='#222' stroke-width='2'/>")
    svg.text(x2 - 12, y2 - 6, f"ridge: {ridge:.0f} FLOP/byte", 11, anchor="end")
    svg.text(at(3, 1)[0], at(3, bandwidth * 3e-3)[1] + 26, f"{bandwidth:.0f} GB/s x intensity", 11)
    for n, color in zip((197, 577, 1025, 4097), COLORS):
        for intensity, filled, in ((n / 2, True), (n * head_dim / (2 * (n + head_dim)), False)):
            attainable = min(peak, bandwidth * 1e9 * intensity / 1e12)
            x, y = at(intensity, attainable)
            fill = color if filled else "white"
            svg.parts.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='5' fill='{fill}' stroke='{color}' stroke-width='2'/>")
        x, y = at(n / 2, min(peak, bandwidth * 1e9 * (n / 2) / 1e12))
        svg.text(x, y + (18 if n != 1025 else -10), f"N = {n}", 10, anchor="middle", color=color)
    svg.parts.append(f"<circle cx='{left + 10}' cy='{top + height + 56}' r='5' fill='#555' stroke='#555'/>")
    svg.text(left + 20, top + height + 60, "attention's own intensity, N / 2: reads Q, K, V, writes O", 11)
    svg.parts.append(f"<circle cx='{left + 10}' cy='{top + height + 74}' r='5' fill='white' stroke='#555' stroke-width='2'/>")
    svg.text(left + 20, top + height + 78, f"with the N x N scores stored and read back (eager), D = {head_dim}: "
             f"under D / 2 = {head_dim // 2}", 11)
    return svg.done()


def backward_block():
    """Chapter 17 (step 10): what one block of the Hopper backward holds and does: its K/V tile
    stays, the Q and dO tiles stream through two rings, five products per Q tile in wgmma
    groups, and dQ leaves through the copy engine to be added in L2. Order, not time to scale."""
    c = step_constants("v10_hopper_backward")
    block_m, stages = c["ATTN_V10_TILES_D64"]
    consumers = c["kConsumers"]
    keys = 64 * consumers
    svg = Svg(860, 440, "Step 10: one block of the backward")
    svg.text(20, 22, f"Step 10 at D = 64: one block owns {keys} keys ({consumers} consumers x 64) and walks "
             f"Q tiles of {block_m} rows", 14, weight="bold")
    # Left: what stays and what streams.
    svg.rect(20, 50, 200, 44, COLORS[1], opacity=0.8)
    svg.text(120, 68, f"K, V tile ({keys} keys)", 12, anchor="middle", color="white", weight="bold")
    svg.text(120, 84, "loaded once, stays", 10, anchor="middle", color="white")
    for t in range(3):
        y = 120 + t * 58
        svg.rect(20, y, 95, 40, COLORS[0], opacity=0.75)
        svg.text(67, y + 17, f"Q tile {t}, L", 11, anchor="middle", color="white")
        svg.text(67, y + 31, f"slot {t % stages}", 9, anchor="middle", color="white")
        svg.rect(125, y, 95, 40, COLORS[4], opacity=0.85)
        svg.text(172, y + 17, f"dO tile {t}, D", 11, anchor="middle", color="white")
        svg.text(172, y + 31, f"slot {t % stages}", 9, anchor="middle", color="white")
    svg.text(20, 305, f"producer: TMA into rings of {stages} slots", 11)
    svg.text(20, 320, "(full / empty barriers, as in step 8)", 11)
    svg.arrow(222, 140, 268, 140)
    # Middle: one step of the walk, per Q tile.
    x, y = 272, 50
    svg.text(x, y - 6 + 0, "each consumer, for each Q tile t (its 64 keys)", 12, weight="bold")
    steps = [(COLORS[2], "wgmma, 2 groups", "S^T = K Q_t^T,   dP^T = V dO_t^T"),
             ("#dddddd", "registers", "P^T = exp2(S^T scale log2e - L log2e)"),
             ("#dddddd", "registers", "dS^T = P^T o (dP^T - D), into a dS buffer"),
             (COLORS[2], "wgmma group 1", "dV += P^T dO_t"),
             ("#ffffff", "bar.sync", "both consumers' dS^T written"),
             (COLORS[3], "wgmma group 2", "dQ share = dS K  -> staging"),
             (COLORS[2], "wgmma group 3", "dK += dS^T Q_t"),
             ("#ffffff", "release", "Q and dO slots back to the producer")]
    for i, (color, kind, what) in enumerate(steps):
        yy = y + 8 + i * 36
        svg.rect(x, yy, 350, 28, color, opacity=0.35 if color not in ("#ffffff", "#dddddd") else 1.0)
        svg.text(x + 8, yy + 18, kind, 10, weight="bold")
        svg.text(x + 104, yy + 18, what, 11)
    # Right: dQ through the copy engine; dK, dV at the end.
    rx = 650
    svg.rect(rx, 230, 190, 50, COLORS[3], opacity=0.3)
    svg.text(rx + 95, 250, "fp32 dQ sum in L2", 12, anchor="middle", weight="bold")
    svg.text(rx + 95, 266, "every block adds its share", 10, anchor="middle")
    svg.arrow(x + 352, y + 8 + 5 * 36 + 14, rx - 2, 250)
    svg.text(rx + 95, 296, "(one thread: a bulk reduce-add", 10, anchor="middle")
    svg.text(rx + 95, 309, "from the staging buffer)", 10, anchor="middle")
    svg.rect(rx, 60, 190, 50, COLORS[2], opacity=0.3)
    svg.text(rx + 95, 80, "dK, dV of the block's keys", 11, anchor="middle", weight="bold")
    svg.text(rx + 95, 96, "in registers until the walk ends", 10, anchor="middle")
    svg.arrow(x + 352, y + 8 + 6 * 36 + 14, rx + 40, 112, dashed=True)
    svg.text(20, 380, "Before the walk a small kernel writes D = rowsum(dO o O) and L log2e and zeroes the dQ sum; "
             "after it, another", 12)
    svg.text(20, 398, "turns the sum into dQ (scaled, in row order). dK and dV are written once, by the block that "
             "owns the keys (chapter 17).", 12)
    svg.text(660, 430, "(order, not time to scale)", 10)
    return svg.done()


def stage_ring():
    """Chapter 09 (step 7): K/V stages refilled by one copier thread after the whole block has
    passed a barrier; every thread waits on the stage's full barrier. Order, not time to scale."""
    c = step_constants("v7_tma_wgmma")
    stages, block_n, block_m, warpgroups = c["kStages"], c["kBlockN"], c["kBlockM"], c["kWarpGroups"]
    tiles = 3 * stages
    svg = Svg(840, 330, "Step 7: the K/V stages")
    svg.text(20, 22, f"Step 7: {stages} K/V stages of {block_n} keys, one copier thread, {warpgroups} warpgroups "
             f"({block_m} query rows) computing", 14, weight="bold")
    lane_copier, lane_block = 70, 180
    svg.text(20, lane_copier + 20, "copier", 12, weight="bold")
    svg.text(20, lane_copier + 36, "(thread 0)", 10)
    svg.text(20, lane_block + 20, f"all {c['kThreads']}", 12, weight="bold")
    svg.text(20, lane_block + 36, "threads", 12, weight="bold")
    buffer_timeline(svg, tiles, stages, lane_copier, lane_block,
                    copy=lambda tile: (f"TMA K, V {tile}", f"into stage {tile % stages}"),
                    read=lambda tile: (f"S, softmax, PV {tile}", 10, "then __syncthreads"),
                    copy_note=None,
                    full="full barrier: arrive.expect_tx, completed by the copies' bytes",
                    free=(380, "the block's __syncthreads frees the stage"))
    svg.text(20, 300, "The copy of tile t + 2 runs while the block computes tile t + 1; but every thread waits at "
             "each barrier,", 12)
    svg.text(20, 318, "so the copier cannot refill early and no warpgroup runs ahead: what step 8's roles and "
             "empty barriers remove.", 12)
    return svg.done()


def sequence_layout_module():
    """python/attention_steps/sequence_layout.py, loaded from its file (plain arithmetic: the
    package's __init__, which wants the library, is not needed)."""
    import importlib.util
    path = os.path.join(REPO, "python", "attention_steps", "sequence_layout.py")
    spec = importlib.util.spec_from_file_location("sequence_layout", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ring_turns():
    """Chapter 19: causal attention over a sequence split across 4 GPUs, balanced. Each cell is
    a (query chunk, key chunk) block of the whole sequence, in the rows and columns of the
    sequence; its colour is the ring turn at which the query chunk's GPU attends to that key
    chunk (turn t: the keys of GPU rank - t). Drawn from SequenceLayout and causal_visibility
    themselves, so it changes when they do."""
    layout_module = sequence_layout_module()
    world, tokens = 4, 128
    layout = layout_module.SequenceLayout(tokens, world, balanced=True)
    owner = {}
    for rank in range(world):
        for chunk in layout.chunks(rank):
            owner[chunk] = rank
    chunks = sorted(owner)
    svg = Svg(840, 480, "Ring attention: the turns of a balanced causal split")
    svg.text(20, 22, f"Causal attention split over {world} GPUs, balanced: {2 * world} chunks, GPU r "
             f"holds chunks r and {2 * world - 1} - r", 14, weight="bold")
    cell, left, top = 40, 80, 70
    svg.text(left + len(chunks) * cell / 2, top - 26, "key chunk (its GPU)", 11, anchor="middle")
    svg.text(20, top - 26, "query chunk (its GPU)", 11)
    pairs = [0] * world
    for row, query_rows in enumerate(chunks):
        rank = owner[query_rows]
        svg.text(left - 8, top + row * cell + cell / 2 + 4, f"{row} (GPU {rank})", 11, anchor="end")
        for column, key_rows in enumerate(chunks):
            source = owner[key_rows]
            visible = layout_module.causal_visibility(query_rows, key_rows)
            x, y = left + column * cell, top + row * cell
            if row == 0:
                svg.text(x + cell / 2, top - 8, f"{column} ({source})", 10, anchor="middle")
            if visible == "none":
                svg.rect(x, y, cell, cell, "#f4f4f4", stroke="#ccc")
                continue
            turn = (rank - source) % world
            svg.rect(x, y, cell, cell, COLORS[turn], opacity=0.8 if visible == "all" else 0.35)
            svg.text(x + cell / 2, y + cell / 2 + 4, f"t{turn}", 11, anchor="middle")
            size = query_rows[1] - query_rows[0]
            pairs[rank] += size * (key_rows[1] - key_rows[0]) if visible == "all" else size * (size + 1) // 2
    x = left + len(chunks) * cell + 30
    svg.text(x, top + 4, "Each GPU's queries, the pairs they see:", 12, weight="bold")
    for rank in range(world):
        svg.text(x, top + 26 + 20 * rank, f"GPU {rank}: {pairs[rank]} of {sum(pairs)} "
                 f"({100 * pairs[rank] / sum(pairs):.1f}%)", 12)
    svg.text(x, top + 120, "Colour: the ring turn t that computes the block", 12, weight="bold")
    for turn in range(world):
        svg.rect(x + 90 * turn, top + 132, 14, 14, COLORS[turn], opacity=0.8)
        svg.text(x + 18 + 90 * turn, top + 144, f"turn {turn}", 11)
    svg.text(x, top + 176, "(at turn t, GPU r attends to the keys of GPU r - t)", 11)
    svg.rect(x, top + 196, 14, 14, COLORS[0], opacity=0.35)
    svg.text(x + 20, top + 208, "a diagonal block: one top-left causal call", 11)
    svg.rect(x, top + 220, 14, 14, "#f4f4f4", stroke="#ccc")
    svg.text(x + 20, top + 232, "above the diagonal: no call", 11)
    svg.text(20, top + len(chunks) * cell + 28, f"N = {tokens}: chunks of {tokens // (2 * world)} rows. "
             "Unbalanced (GPU r holding chunk r alone), the last GPU's queries would see", 12)
    svg.text(20, top + len(chunks) * cell + 46, f"{2 * world - 1} / {world * world} of all the pairs and "
             f"the first GPU's 1 / {world * world}: the ring would wait for the slowest.", 12)
    return svg.done()


FIGURES = {
    "00-roofline.svg": roofline,
    "01-naive-thread.svg": naive_thread,
    "02-tiling.svg": tiling,
    "03-coalescing.svg": coalescing,
    "04-wmma-fragment.svg": wmma_fragment,
    "05-warps-over-a-tile.svg": warps_over_a_tile,
    "06-padded-rows.svg": padded_rows,
    "07-online-softmax.svg": online_softmax,
    "09-stages.svg": stage_ring,
    "12-mask-tiles.svg": mask_tiles,
    "10-ring.svg": ring,
    "17-backward-block.svg": backward_block,
    "19-ring-turns.svg": ring_turns,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compare the committed figures with what the code draws now")
    args = parser.parse_args()
    stale = []
    for name, draw in FIGURES.items():
        path = os.path.join(OUT_DIR, name)
        text = draw()
        if args.check:
            if not os.path.isfile(path) or open(path).read() != text:
                stale.append(name)
            continue
        os.makedirs(OUT_DIR, exist_ok=True)
        with open(path, "w") as out:
            out.write(text)
        print(f"wrote {os.path.relpath(path, REPO)}")
    if stale:
        print("draw.py: these figures differ from what the code draws now (run docs/figures/draw.py "
              "and commit them): " + ", ".join(stale))
        return 1
    if args.check:
        print(f"draw.py: all {len(FIGURES)} figures match the code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
