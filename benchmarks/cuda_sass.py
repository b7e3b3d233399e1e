"""Static instruction counts of the CUDA inference kernels for an H100 / H200 (sm_90), no GPU.

Each kernel of ``dasknn/kernels/cuda_inference.py`` is compiled for compute capability 9.0 with
numba-cuda (``compile_ptx``), assembled with ``ptxas`` (with the kernels' register cap) and
disassembled with ``nvdisasm``. For each the script prints the registers and the instructions
of the kernel, and its *hot block*: the straight-line block (between two labels or branches)
with the most fused multiply-adds, which is where the kept entries are added, with its
instructions per multiply-add (one multiply-add a kept entry and row: the instructions a kept
entry costs a warp). Nsight Compute showed the sectioned kernel bound by instruction issue
(docs/benchmarks.md), so this count is what a kernel change should lower; the seconds still
come from the GPU session (``benchmarks/device/``).

It needs numba-cuda, a numpy that numba-cuda supports, and NVIDIA's ``ptxas`` and ``nvdisasm``
(the pip wheels: no driver, no GPU)::

    python3 -m venv /tmp/sass
    /tmp/sass/bin/pip install 'numba-cuda==0.30.4' 'numpy<2.5' scipy nvidia-cuda-nvcc-cu12 \\
        nvidia-cuda-nvdisasm
    /tmp/sass/bin/python benchmarks/cuda_sass.py [--dtype float32] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FMA = re.compile(r"\b[DFH]FMA\d*\b")
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?);")
LABEL = re.compile(r"^\s*\.L_x_\d+:")
BLOCK_END = re.compile(r"\b(BRA|EXIT|RET|BRX|JMP|CALL)\b")


def nvidia_tool(name: str) -> str:
    """The path of NVIDIA's ``name`` (``ptxas``, ``nvdisasm``): on PATH, else in the pip wheels'
    ``nvidia/*/bin``; a copy with the executable bit when the wheel's file lacks it."""
    found = shutil.which(name)
    if found:
        return found
    import nvidia  # the namespace package of NVIDIA's wheels

    for root in nvidia.__path__:
        for path in sorted(Path(root).glob(f"*/bin/{name}")):
            if os.access(path, os.X_OK):
                return str(path)
            copy = Path(tempfile.mkdtemp()) / name
            shutil.copy(path, copy)
            copy.chmod(copy.stat().st_mode | stat.S_IXUSR)
            return str(copy)
    sys.exit(f"{name} not found: pip install nvidia-cuda-nvcc-cu12 nvidia-cuda-nvdisasm")


def kernels(dtype_name: str) -> dict:
    """The kernels to compile and their signatures (as the launches in ``infer_rows_cuda`` type
    them: float activations flat per group, uint8 flags, int64 offsets, uint16 indices)."""
    import numba.cuda.dispatcher as dispatcher
    from numba import types as t

    class Hopper:
        compute_capability = (9, 0)

    # numba-cuda compiles the device functions a kernel calls for the current device; with no
    # driver there is none, so name an sm_90 one
    dispatcher.get_current_device = Hopper

    from dasknn.kernels import cuda_inference as ci

    def array(dtype, ndim):
        return t.Array(dtype, ndim, "C")

    f = getattr(t, dtype_name)
    i64, u8, offsets, indices = t.int64, t.uint8, array(t.int64, 2), array(t.uint16, 1)
    layer = (array(f, 3), array(u8, 3), i64, offsets, indices, array(f, 1), i64, i64, f, f,
             array(u8, 1), array(u8, 1), array(i64, 1))
    window = (array(f, 3), array(u8, 3), i64, offsets, indices, array(f, 1), i64, i64, f, f,
              array(u8, 1), array(i64, 1))
    footprint = 32
    tiled = ci._tiled_kernel(dtype_name, footprint, ci._tile_warps(footprint, f.bitwidth // 8))
    tiled_sig = (array(f, 3), array(u8, 3), i64, offsets, array(f, 1), t.boolean,
                 array(i64, 1), array(i64, 1), indices, array(i64, 1), indices, array(u8, 1),
                 i64, i64, f, f, array(u8, 1), array(u8, 1), array(i64, 1))
    cap = ci._BLOCK_KERNEL.get("max_registers")
    return {
        "sectioned, one weight a layer": (ci._layer_kernel(True).py_func, layer, cap),
        "sectioned, a weight per nonzero": (ci._layer_kernel(False).py_func, layer, cap),
        "fused, one weight a layer": (ci._window_kernel(True).py_func, window, cap),
        "fused, a weight per nonzero": (ci._window_kernel(False).py_func, window, cap),
        f"tiled (footprint {footprint})": (tiled.py_func, tiled_sig, cap),
    }


def hot_block(sass: str) -> tuple[int, int]:
    """(instructions, multiply-adds) of the straight-line block with the most multiply-adds; a
    block ends at a label and after a branch (taken or not), and counts its branch."""
    best = (0, 0)
    count = fmas = 0
    for line in sass.splitlines():
        match = INSTRUCTION.match(line)
        if match:
            count += 1
            fmas += bool(FMA.search(match.group(1)))
        if LABEL.match(line) or (match and BLOCK_END.search(match.group(1))):
            if fmas > best[1]:
                best = (count, fmas)
            count = fmas = 0
    return best


def measure(name: str, func, signature, cap: int | None, work: Path) -> dict:
    """Compile one kernel to SASS for sm_90 and count its instructions."""
    from numba import cuda

    ptx, _ = cuda.compile_ptx(func, signature, cc=(9, 0))
    stem = work / re.sub(r"\W+", "_", name)
    stem.with_suffix(".ptx").write_text(ptx)
    command = [nvidia_tool("ptxas"), "-arch=sm_90", "-O3", "-v", str(stem.with_suffix(".ptx")),
               "-o", str(stem.with_suffix(".cubin"))]
    if cap is not None:
        command.insert(2, f"--maxrregcount={cap}")
    assembled = subprocess.run(command, check=True, capture_output=True, text=True)
    registers = int(re.search(r"Used (\d+) registers", assembled.stderr).group(1))
    sass = subprocess.run([nvidia_tool("nvdisasm"), "-c", str(stem.with_suffix(".cubin"))],
                          check=True, capture_output=True, text=True).stdout
    stem.with_suffix(".sass").write_text(sass)
    total = sum(1 for line in sass.splitlines() if INSTRUCTION.match(line))
    block, fmas = hot_block(sass)
    return {"kernel": name, "registers": registers, "instructions": total,
            "hot_block": block, "hot_fmas": fmas}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--keep", type=Path, help="write the PTX, cubin and SASS files here")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp())
    work.mkdir(parents=True, exist_ok=True)
    from importlib.metadata import version

    print(f"numba-cuda {version('numba-cuda')}, numpy {version('numpy')}, sm_90, {args.dtype}")
    print("\n| kernel | registers | instructions | hot block | its multiply-adds "
          "| instructions a kept entry |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (func, signature, cap) in kernels(args.dtype).items():
        row = measure(name, func, signature, cap, work)
        per = row["hot_block"] / row["hot_fmas"] if row["hot_fmas"] else float("nan")
        print(f"| {name} | {row['registers']} | {row['instructions']} | {row['hot_block']} "
              f"| {row['hot_fmas']} | {per:.1f} |", flush=True)
    if args.keep:
        print(f"\nPTX, cubin and SASS in {work}")


if __name__ == "__main__":
    main()
