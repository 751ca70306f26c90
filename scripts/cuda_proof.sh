#!/usr/bin/env bash
# The CUDA proof (issue 24) on a lent GPU machine, in stages that each fit one call there:
#
#   bash scripts/cuda_proof.sh STAGE [STAGE ...]      (OUT=folder for logs, default out/cuda)
#
#   env       the GPU, driver, versions; quick-test --provider cuda (PyTorch only)
#   ort       onnxruntime-gpu loads its CUDA provider here
#   tests     the whole test suite with CUDA visible
#   export    the shipped digits model and ViT-B/16 (fp32, optimized, fp16; fp16 I/O apart)
#   validate  validate --provider cuda --require-provider cuda --layers on each, TF32 on too
#   bench     bench --provider cuda at batch 1, 8, 64, 256 with the eager-amp and cuda-graph
#             peers; then eager, fp16 and torch.compile (max-autotune, fp16 autocast)
#   profile   the kernels of the fp32, optimized and fp16 models on the GPU, batch 1 and 64
#   infer     infer --provider cuda on the shipped samples
#
# Bundles are kept in $WORK (default /tmp/vit-cuda) from one stage to the next: the machine
# keeps /tmp while it stays warm. Each stage writes $OUT/STAGE.log (every command and all it
# printed) and the JSON reports beside it. It needs onnxruntime-gpu (../shared/gpu/README.md).
# PROVIDER=cpu PRESET=vit_seed_tiny rehearses the stages on a machine without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/cuda}
WORK=${WORK:-/tmp/vit-cuda}
BATCHES=1,8,64,256
PROVIDER=${PROVIDER:-cuda}
PRESET=${PRESET:-vit_base_patch16_224}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
vx() { python3 cli.py "$@"; }
step() {  # step CMD...: echo the command, run it, echo its exit code and time
    local start=$SECONDS
    echo "\$ $*"
    "$@"
    local rc=$?
    echo "[exit $rc, $((SECONDS - start)) s]"
    echo
}

stage_env() {
    step nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    step python3 -c "import sys, torch, onnx, numpy; print(sys.version.split()[0], 'torch', \
torch.__version__, 'cuda', torch.version.cuda, 'onnx', onnx.__version__, 'numpy', \
numpy.__version__, torch.cuda.get_device_name())"
    step python3 -c "import onnxruntime as o; print(o.__version__, o.__file__, \
o.get_available_providers())"
    step lscpu --parse=MODELNAME
    step vx quick-test --provider cuda
    step vx quick-test --provider cuda --preset vit_base_patch16_224 --batch-size 2
}

stage_ort() {  # onnxruntime-gpu really runs on CUDA: get_providers(), not the list
    step python3 -c "import onnxruntime as o; print(o.__version__, o.__file__, \
o.get_available_providers())"
    step python3 -c "from vit_export import runtime; print('cuda problem:', \
runtime.cuda_problem())"
}

stage_tests() {
    step python3 -m pytest -q -p no:cacheprovider -n "${WORKERS:-12}" -rfEs --durations=15 \
        --junitxml="$OUT/tests.xml"
}

stage_export() {
    step vx export "$WORK/digits" --from models/digits --optimize --precision fp16 \
        --real-data models/digits/held_out.npz --provider "$PROVIDER" --force --progress
    step vx export "$WORK/base" --preset "$PRESET" --optimize --precision fp16 \
        --batch-sizes 1,3,7,64 --provider "$PROVIDER" --force --progress
    step vx export "$WORK/base-io" --preset "$PRESET" --precision fp16 --fp16-io \
        --batch-sizes 1,3,7,64 --provider "$PROVIDER" --force --progress
    step vx info "$WORK/base"
}

stage_validate() {
    local common=(--provider "$PROVIDER" --require-provider "$PROVIDER" --layers)
    step vx validate "$WORK/digits" --real-data models/digits/held_out.npz "${common[@]}" \
        --report "$OUT/digits.json"
    step vx validate "$WORK/base" --batch-sizes 1,3,7,64 "${common[@]}" \
        --report "$OUT/base.json"
    step vx validate "$WORK/base" --batch-sizes 1,3,7,64 --profile tf32 "${common[@]}" \
        --report "$OUT/base-tf32.json"
    step vx validate "$WORK/base-io" --batch-sizes 1,3,7,64 "${common[@]}" \
        --report "$OUT/base-io.json"
}

stage_bench() {
    step vx bench "$WORK/base" --provider "$PROVIDER" --batch-sizes "$BATCHES" --min-seconds 1 \
        --peers eager-amp,cuda-graph --json "$OUT/bench.json" --progress
    step vx bench "$WORK/base" --provider "$PROVIDER" --batch-sizes "$BATCHES" --min-seconds 1 \
        --runtimes "eager,onnxruntime[model.fp16.onnx]" \
        --peers eager-amp,torch-compile-amp,cuda-graph --json "$OUT/bench-compile.json" --progress
}

stage_profile() {
    for model in model.onnx model.opt.onnx model.fp16.onnx; do
        for batch in 1 64; do
            step python3 benchmarks/ort_profile.py "$WORK/base/$model" --provider "$PROVIDER" \
                --batch "$batch" --runs 5
        done
    done
}

stage_infer() {
    step vx infer "$WORK/digits" models/digits/samples --top-k 1 --provider "$PROVIDER"
    step vx infer "$WORK/digits" models/digits/samples --top-k 1 --provider "$PROVIDER" \
        --runtime torchscript
}

for stage in "$@"; do
    if ! declare -F "stage_$stage" >/dev/null; then
        echo "unknown stage $stage" >&2
        exit 2
    fi
    echo "=== $stage ($(date -u +%H:%M:%S))" | tee -a "$OUT/$stage.log"
    "stage_$stage" 2>&1 | tee -a "$OUT/$stage.log"
done
