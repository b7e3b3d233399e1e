#!/usr/bin/env bash
# The Graph Challenge on a GPU machine, every part in one call: run it in the repository root on
# a machine with an NVIDIA GPU (H100 or H200 class for the largest network), after prepare.sh has
# filled .whl/ and .gpu/ (README.md beside this says how, what runs and what it prints).
#
# Parts (PARTS: which run, default 1,6; main() sets their order), every file under $OUT:
#   1  the GPU tests on the card                        -> run.log
#   6  end to end: every network of challenge_gpu.py's  -> results.jsonl
#      default cases against SNIG's one-GPU rate, categories checked against .gpu/refs
#   2  kernel only: sectioned (one weight a layer, and  -> kernels.jsonl
#      one per nonzero) against tiled
#   5  Nsight Compute on three steady-state sectioned   -> profile.txt
#      launches of 65536 x 120 (skipped where `ncu` is absent)
#   3  row check of 65536 x 1920 on 1,000 images        -> rowcheck.json, rowcheck.log
#      against the CPU kernel, in the background on the cores the foreground leaves
#   4  end to end: 65536 x 120 tiled then sectioned,    -> results.jsonl
#      then 65536 x 1920 loaded by the GPU worker, in the faster mode
#   7  model-parallel challenge on the CPUs: 65536 x    -> placement.jsonl
#      1920 split by neurons over 16 workers with the
#      partition prepare.sh made, checked against scipy
# Each part is skipped, with a printed line, when its estimated seconds would pass BUDGET
# (default 540) counted from the start of this script. BASE (a folder holding another checkout's
# dasknn) makes part 2 run that code's kernels first, tagged "base", for an A/B in one call.
#
#   OUT=/tmp/out bash benchmarks/device/run.sh                    # on the GPU machine
#   PARTS=1,2,5,3,4 OUT=/tmp/out bash benchmarks/device/run.sh    # the kernel parts
#   PARTS=7 OUT=/tmp/out bash benchmarks/device/run.sh            # the model-parallel run
#   DRYRUN=1 OUT=/tmp/out bash benchmarks/device/run.sh           # any machine: tiny sizes under
#                                                                 # numba's CUDA simulator
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
: "${OUT:?set OUT to the folder for the results}"
DRYRUN=${DRYRUN:-0}
PARTS=${PARTS:-1,6}
export PYTHONUNBUFFERED=1
GPU_LOCK=/tmp/dasknn-gpu.lock

if [ "$DRYRUN" = 1 ]; then
    BUDGET=${BUDGET:-900}
    export NUMBA_ENABLE_CUDASIM=1
    TEST_ARGS=(-m gpu)
    KERNEL_ARGS=(--networks 64x2 --rows 32 --repeats 1 --footprints 64,32x6)
    ROWCHECK_ARGS=(--neurons 64 --layers 2 --rows 32)
    E2E_SMALL=64x2 E2E_BIG=64x4
    E2E_ARGS=(--images 32 --copies 1)
    ALL_ARGS=(--only 64x2,64x4)
    NEED_TESTS=60 NEED_KERNELS=120 NEED_E2E_SMALL=90 NEED_E2E_BIG=90 NEED_PROFILE=60
    NEED_ALL=180
    PROFILE_ARGS=(--networks 64x4 --rows 32)
    MP_ARGS=(--neurons 1024 --layers 8 --inputs 16 --workers 2 --check-processes 2)
    MP_SPEC=radixnet:1024:8 MP_PARTS=2 NEED_MP=120
else
    BUDGET=${BUDGET:-540}
    TEST_ARGS=()
    KERNEL_ARGS=(--networks 65536x120,16384x120 --rows 10000 --footprints 64,32,32x6)
    ROWCHECK_ARGS=(--neurons 65536 --layers 1920 --rows 1000)
    E2E_SMALL=65536x120 E2E_BIG=65536x1920
    E2E_ARGS=(--wide-copies 6)
    ALL_ARGS=(--official .gpu/neuron1024)
    # seconds each part needs on an H100 / H200, with some margin
    NEED_TESTS=90 NEED_KERNELS=150 NEED_E2E_SMALL=60 NEED_E2E_BIG=${NEED_E2E_BIG:-260}
    NEED_PROFILE=90
    NEED_ALL=${NEED_ALL:-300}  # the timed calls take about 100 s, plus each generation
    PROFILE_ARGS=(--networks 65536x120 --rows 10000)
    MP_ARGS=(--neurons 65536 --layers 1920 --inputs 100 --workers 16 --check-processes 15)
    MP_SPEC=radixnet:65536:1920 MP_PARTS=16
    NEED_MP=${NEED_MP:-450}  # three passes over the network on the client, the run, the check
fi
# part 7's partition: prepare.sh makes it (DRYRUN: made here under $OUT, a second)
MP_NAME=${MP_SPEC#radixnet:}
MP_PARTITION=.gpu/partitions/${MP_NAME/:/x}-P$MP_PARTS.npz
if [ "$DRYRUN" = 1 ]; then MP_PARTITION=$OUT/partitions/${MP_NAME/:/x}-P$MP_PARTS.npz; fi
# the modes of the end-to-end A/B on E2E_SMALL (empty: none, BIG_MODE or sectioned for E2E_BIG)
E2E_SMALL_MODES=${E2E_SMALL_MODES-tiled sectioned}
KERNEL_MODES=${KERNEL_MODES:-sectioned,sectioned/per-entry,tiled}  # part 2's variants
ROWCHECK_MODES=${ROWCHECK_MODES:-sectioned,tiled}  # part 3's GPU kernels
# BASE: a folder holding an earlier dasknn (e.g. .gpu/base, from `git archive`): part 2 runs its
# kernels first, tagged "base", then this checkout's, for an A/B of two versions of the code
BASE=${BASE:-}

has_part() { [[ ",$PARTS," == *",$1,"* ]]; }

fits() {  # fits PART NEED: true when NEED more seconds stay inside BUDGET, else says so
    if [ $((SECONDS + $2)) -gt "$BUDGET" ]; then
        echo "== part $1: skipped (${SECONDS} s spent, about $2 s needed, budget $BUDGET s)"
        return 1
    fi
}

FOREGROUND=()  # taskset and thread count for the foreground while the row check runs

locked() {  # run a command holding the GPU lock that the background row check also takes
    if command -v flock >/dev/null; then
        flock "$GPU_LOCK" "${FOREGROUND[@]}" "$@"
    else
        "${FOREGROUND[@]}" "$@"
    fi
}

setup() {
    echo "== setup $(date -u +%FT%TZ), DRYRUN=$DRYRUN PARTS=$PARTS BUDGET=$BUDGET"
    if [ "$DRYRUN" = 1 ]; then
        export PYTHONPATH="$ROOT"
    else
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl
        export PYTHONPATH="/tmp/site:$ROOT"
    fi
    # tests/conftest.py reads the official network from ../shared, which does not travel
    local official="$ROOT/../shared/data/graphchallenge/neuron1024"
    if [ ! -e "$official" ]; then
        mkdir -p "$(dirname "$official")" && ln -s "$ROOT/.gpu/neuron1024" "$official" ||
            echo "could not link $official: the official-network tests will skip"
    fi
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm \
            --format=csv
    else
        echo "no nvidia-smi here"
    fi
    python3 --version
    python3 - <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

sys.path.insert(0, "benchmarks")
from harness import describe

found = []
for name in ("numba", "numba-cuda", "numpy", "scipy", "dask", "distributed", "dask-cuda"):
    try:
        found.append(f"{name} {version(name)}")
    except PackageNotFoundError:
        found.append(f"{name} absent")
print(", ".join(found))
print(f"machine: {describe()}")
EOF
}

ROWCHECK_PID=""

start_rowcheck() {  # part 3 in the background on cores 4 and up, the foreground on cores 0-3
    local prefix=() cores
    cores=$(nproc)
    if [ "$cores" -ge 8 ] && command -v taskset >/dev/null; then
        prefix=(env NUMBA_NUM_THREADS=$((cores - 4)) taskset -c "4-$((cores - 1))")
        FOREGROUND=(env NUMBA_NUM_THREADS=4 taskset -c 0-3)
    fi
    echo "== part 3: row check started in the background ${prefix[*]}"
    "${prefix[@]}" python3 benchmarks/challenge_gpu.py rowcheck "${ROWCHECK_ARGS[@]}" \
        --modes "$ROWCHECK_MODES" --out "$OUT/rowcheck.json" --gpu-lock "$GPU_LOCK" \
        >"$OUT/rowcheck.log" 2>&1 &
    ROWCHECK_PID=$!
}

finish_rowcheck() {  # wait for part 3 until the budget is spent, then show its log
    [ -n "$ROWCHECK_PID" ] || return 0
    local rc=0
    while kill -0 "$ROWCHECK_PID" 2>/dev/null && [ "$SECONDS" -lt "$BUDGET" ]; do sleep 2; done
    if kill -0 "$ROWCHECK_PID" 2>/dev/null; then
        echo "== part 3: stopped at the budget (${SECONDS} s)"
        kill "$ROWCHECK_PID"
        rc=124
    fi
    wait "$ROWCHECK_PID" || rc=$?
    ROWCHECK_PID=""
    FOREGROUND=()
    echo "== part 3: row check log (exit $rc, ${SECONDS} s)"
    cat "$OUT/rowcheck.log"
    return "$rc"
}

part_tests() {
    echo "== part 1: GPU test subset"
    locked python3 -m pytest tests/test_challenge_gpu.py tests/test_challenge_gpu_tiled.py \
        tests/test_challenge_gpu_layer_weight.py tests/test_cuda_compiler_check.py \
        tests/test_pack_layers.py -q -rs "${TEST_ARGS[@]}"
}

part_kernels() {
    echo "== part 2: kernel-only A/B"
    if [ -n "$BASE" ]; then
        echo "== part 2: the kernels of $BASE first (tag base)"
        locked env PYTHONPATH="$(realpath "$BASE"):$PYTHONPATH" python3 \
            benchmarks/challenge_gpu.py kernels "${KERNEL_ARGS[@]}" \
            --modes "$KERNEL_MODES" --tag base --out "$OUT/kernels.jsonl"
    fi
    locked python3 benchmarks/challenge_gpu.py kernels "${KERNEL_ARGS[@]}" \
        --modes "$KERNEL_MODES" --out "$OUT/kernels.jsonl"
}

part_profile() {  # three sectioned launches past the first layers, where few rows are live
    echo "== part 5: Nsight Compute on the sectioned kernel"
    if ! command -v ncu >/dev/null; then
        echo "== part 5: skipped (no ncu on this machine)"
        return 0
    fi
    ncu --version
    locked ncu --target-processes all --kernel-name regex:_layer_kernel --launch-skip 60 \
        --launch-count 3 --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section Occupancy --section WarpStateStats --section LaunchStats \
        python3 benchmarks/challenge_gpu.py kernels "${PROFILE_ARGS[@]}" --modes sectioned \
        --repeats 1 >"$OUT/profile.txt" 2>&1
    local rc=$?
    tail -n 120 "$OUT/profile.txt"
    return "$rc"
}

e2e() {  # e2e CASE MODE [ARGS...]: one end-to-end run of challenge_gpu.py
    echo "== part 4: end to end, $1, mode $2 ${*:3} (${SECONDS} s)"
    locked python3 benchmarks/challenge_gpu.py --refs .gpu/refs --only "$1" --mode "$2" \
        --batches-per-gpu 1 "${E2E_ARGS[@]}" "${@:3}" --budget "$((BUDGET - SECONDS))" \
        --out "$OUT"
}

part_all() {  # every default network, client-loaded, one batch a GPU
    echo "== part 6: the default networks end to end (${SECONDS} s)"
    local extra=()  # ALL_ONLY: some of the cases (comma-separated); ALL_MODE: the kernel mode
    if [ -n "${ALL_ONLY:-}" ]; then extra+=(--only "$ALL_ONLY"); fi
    if [ -n "${ALL_MODE:-}" ]; then extra+=(--mode "$ALL_MODE"); fi
    locked python3 benchmarks/challenge_gpu.py --refs .gpu/refs "${ALL_ARGS[@]}" "${extra[@]}" \
        --batches-per-gpu 1 "${E2E_ARGS[@]}" --budget "$((BUDGET - SECONDS))" --out "$OUT"
}

faster_mode() {  # the faster of tiled and sectioned on E2E_SMALL: end to end, else kernel only
    python3 - "$OUT" "$E2E_SMALL" <<'EOF'
import json
import sys
from pathlib import Path

out, case = Path(sys.argv[1]), sys.argv[2]

def rows(name):
    path = out / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

whole = {r["cuda_mode"]: r["seconds"] for r in rows("results.jsonl") if r.get("case") == case}
kernel = {r["variant"].split("/")[0]: r["best_seconds"] for r in rows("kernels.jsonl")
          if r["network"] == case and r["variant"] in ("sectioned", "tiled/64")
          and not r.get("tag")}
for source, seconds in (("end to end", whole), ("kernel only", kernel)):
    if {"tiled", "sectioned"} <= seconds.keys():
        mode = min(("sectioned", "tiled"), key=seconds.get)
        print(f"faster on {case} ({source}): {mode} {seconds}", file=sys.stderr)
        print(mode)
        break
else:
    print(f"no A/B on {case} to pick from: sectioned", file=sys.stderr)
    print("sectioned")
EOF
}

part_mp() {  # the model-parallel challenge on the CPUs, its categories checked against scipy
    echo "== part 7: model-parallel $MP_SPEC, $MP_PARTS parts (${SECONDS} s)"
    if [ "$DRYRUN" = 1 ] && [ ! -f "$MP_PARTITION" ]; then
        mkdir -p "$(dirname "$MP_PARTITION")"
        python3 -m dasknn partition "$MP_SPEC" --parts "$MP_PARTS" --stream \
            --out "$MP_PARTITION" >/dev/null
    fi
    if [ ! -f "$MP_PARTITION" ]; then
        echo "== part 7: no partition $MP_PARTITION (prepare.sh makes it)"
        return 1
    fi
    python3 benchmarks/placement.py --challenge --spec-only "${MP_ARGS[@]}" \
        --partition "$MP_PARTITION" --json "$OUT/placement.jsonl"
}

part_e2e() {
    local mode failed=0
    for mode in $E2E_SMALL_MODES; do
        if fits "4 ($E2E_SMALL $mode)" "$NEED_E2E_SMALL"; then
            e2e "$E2E_SMALL" "$mode" || failed=1
        fi
    done
    mode=${BIG_MODE:-$(faster_mode || echo sectioned)}
    # the largest network loaded by the GPU worker itself: no 8 GB trip through the client
    if fits "4 ($E2E_BIG $mode)" "$NEED_E2E_BIG"; then
        e2e "$E2E_BIG" "$mode" --load-on-workers --workers-only || failed=1
    fi
    return "$failed"
}

main() {
    local failed=()
    setup
    if has_part 3; then start_rowcheck; fi
    if has_part 1 && fits 1 "$NEED_TESTS"; then part_tests || failed+=(1); fi
    if has_part 6 && fits 6 "$NEED_ALL"; then part_all || failed+=(6); fi
    if has_part 2 && fits 2 "$NEED_KERNELS"; then part_kernels || failed+=(2); fi
    if has_part 5 && fits 5 "$NEED_PROFILE"; then part_profile || failed+=(5); fi
    if has_part 3; then finish_rowcheck || failed+=(3); fi
    if has_part 4; then part_e2e || failed+=(4); fi
    if has_part 7 && fits 7 "$NEED_MP"; then part_mp || failed+=(7); fi
    echo "== done in ${SECONDS} s (budget $BUDGET s); parts failed: ${failed[*]:-none}"
    echo "== files: $(cd "$OUT" && ls | tr '\n' ' ')"
    [ "${#failed[@]}" -eq 0 ]
}

mkdir -p "$OUT"
main 2>&1 | tee -a "$OUT/run.log"
