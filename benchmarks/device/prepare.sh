#!/usr/bin/env bash
# Prepare run.sh's inputs on a machine with network access and ../shared, for a GPU machine that
# may have neither (see README.md beside this):
#   .whl/  the wheels a GPU image with numba, numpy, scipy, pandas and cuda-core lacks,
#   .gpu/neuron1024  the official 1024 x 120 network,
#   .gpu/refs  the CPU engine's categories of the 10,000 MNIST test images for the cases in REFS,
#   .gpu/partitions  the partitions run.sh's model-parallel part takes (PARTITIONS).
# Both folders are git-excluded; copy them with the checkout to the GPU machine.
#
#   bash benchmarks/device/prepare.sh             # REFS="official 1024x120 ..." to pick cases
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

# The versions installed here (pip list), pinned; dask-cuda: the newest for Python 3.12 that pip
# found (its rapids-dask-dependency metapackage only pins dask and is not imported: not carried).
WHEELS=(
    dask==2026.8.0 distributed==2026.8.0 sparse==0.19.3 tornado==6.6.1 tblib==3.2.2
    zict==3.0.0 locket==1.0.0 partd==1.4.2 dask-cuda==26.10.0 numpy==2.4.6
)
# What the wheels require and the GPU image is expected to hold already.
ON_DEVICE="click cloudpickle cuda-core fsspec jinja2 msgpack numba numpy nvidia-ml-py packaging
pandas psutil pyyaml sortedcontainers toolz urllib3"
NOT_NEEDED="rapids-dask-dependency"
# The cases whose references this 2-core machine computes (16384 x 1920 and the 65536-neuron
# ones need more memory than a small machine has); README.md gives the time each takes.
REFS=${REFS:-"official 1024x120 1024x480 4096x120 16384x120 1024x1920 4096x480 16384x480 4096x1920"}
OFFICIAL="$ROOT/../shared/data/graphchallenge/neuron1024"
# The streamed hypergraph partitions of part 7 (NxL-PPARTS; 65536x1920-P16: 8 minutes on 2 cores)
PARTITIONS=${PARTITIONS:-"65536x1920-P16"}

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
touch "$exclude"
for pattern in /.whl/ /.gpu/; do
    grep -qxF "$pattern" "$exclude" || echo "$pattern" >>"$exclude"
done

echo "== wheels into .whl/"
fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$fresh" "${WHEELS[@]}"
rm -rf .whl
mkdir .whl
cp "$fresh"/*.whl .whl/
ls -1 .whl

echo "== requirements of the wheels (not extras, Python 3.12) missing on the device"
python3 - "$ON_DEVICE $NOT_NEEDED" .whl/*.whl <<'EOF'
import re
import sys
import zipfile

from packaging.requirements import Requirement

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

covered = {norm(n) for n in sys.argv[1].split()}
wheels = sys.argv[2:]
carried = {norm(w.split("/")[-1].split("-")[0]) for w in wheels}
missing = set()
for wheel in wheels:
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(meta).decode().splitlines()
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        env = {"python_version": "3.12", "python_full_version": "3.12.3", "extra": ""}
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        if norm(req.name) not in covered | carried:
            missing.add(f"{req.name} (for {wheel.split('/')[-1]})")
if missing:
    sys.exit("missing on the device and not carried: " + ", ".join(sorted(missing)))
print("none")
EOF

echo "== the official network into .gpu/neuron1024"
if [ ! -d "$OFFICIAL" ]; then
    echo "no official network at $OFFICIAL" >&2
    exit 1
fi
mkdir -p .gpu
rm -rf .gpu/neuron1024
cp -r "$OFFICIAL" .gpu/neuron1024

echo "== CPU-engine references of the 10,000 MNIST test images into .gpu/refs"
for case in $REFS; do
    if [ -f ".gpu/refs/$case.npy" ]; then
        echo "$case: already there"
        continue
    fi
    start=$SECONDS
    python3 benchmarks/challenge_gpu.py --write-refs .gpu/refs --official .gpu/neuron1024 \
        --only "$case"
    echo "$case: $((SECONDS - start)) s with generation and cluster start"
done

echo "== partitions of the model-parallel part into .gpu/partitions"
mkdir -p .gpu/partitions
for case in $PARTITIONS; do
    if [ -f ".gpu/partitions/$case.npz" ]; then
        echo "$case: already there"
        continue
    fi
    network=${case%-P*} start=$SECONDS
    python3 -m dasknn partition "radixnet:${network/x/:}" --parts "${case##*-P}" --stream \
        --out ".gpu/partitions/$case.npz" --json ".gpu/partitions/$case.json" | tail -n 1
    echo "$case: $((SECONDS - start)) s"
done

echo "== sizes (what is copied to the GPU machine: the checkout and the two folders)"
du -sh .whl .gpu
tracked=$(python3 -c 'import os, subprocess
names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, check=True).stdout.split(b"\0")
print(sum(os.path.getsize(n) for n in names if n and os.path.isfile(n)))')
carried=$(du -sb .whl .gpu | awk '{s += $1} END {print s}')
echo "tracked and untracked-not-ignored files $((tracked / 1024)) KiB, .whl + .gpu" \
    "$((carried / 1024)) KiB, together $(((tracked + carried) / 1048576)) MiB of 64"
if [ $((tracked + carried)) -gt $((64 * 1048576)) ]; then
    echo "over the 64 MiB of a device call" >&2
    exit 1
fi
