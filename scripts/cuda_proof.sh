#!/usr/bin/env bash
# The CUDA proof on a lent GPU machine, in stages:
#
#   bash scripts/cuda_proof.sh STAGE [STAGE ...]      (LOGS=folder for logs, default out/cuda)
#   WINDOW=SECONDS bash scripts/cuda_proof.sh STAGE ...   the stages within one deadline
#
# With WINDOW, each stage runs in turn until SECONDS from the start (each within its own cap,
# CAP below; one that cannot start with MIN_LEFT seconds left is skipped), and window.log
# says how each ended. Wherever PACK is set (default $OUT/cuda-proof.tgz where the device's
# $OUT is), the logs are packed there, whole, before and after every command: a call cut
# short still returns what it did.
#
#   pins      the pinned timm and transformers (scripts/pack_pins.sh, $PINS) installed into
#             $PINS_SITE, first on the path of every later stage and call: the GPU image has
#             older ones, and the suite must judge our code against our pins
#   env       the GPU, driver, versions; ONNX Runtime's CUDA provider loads (cuda_problem);
#             quick-test on the provider (PyTorch only)
#   export    the shipped digits model and ViT-B/16 exported here (fp32, optimized, fp16,
#             optimized fp16, model.e2e.onnx; EXPORT_AOTI=1 adds ViT-B/16's fp16 AOTInductor
#             package on CUDA)
#   staged    validate --provider P --require-provider P --layers on both bundles (every ONNX
#             model, model.e2e.onnx too, runs through the staging infer uses), then
#             scripts/staged_check.py: staged against ONNX Runtime's own run on the same
#             inputs (bit-equal for fp32), alone and with two threads sharing a runner
#   infer     infer on the shipped samples with each ONNX Runtime file and TorchScript: the
#             same top-1 on the provider as on the CPU
#   families  one tiny model of each ViT family exported and validated on the provider
#             (the model folders scripts/cuda_families.py writes, $FAMILIES), FAMILY_JOBS at
#             a time, logits and embedding
#   peers     ViT-B/16's ONNX models (fp32, fp16, fused fp16; the fp16 package where export
#             made one) and their CUDA graphs against timm's own model in fp16, eager and
#             torch.compile'd with reduce-overhead, batch 1 and 64, host and device input,
#             into peers.json; scripts/peers_summary.py prints the fastest validated one
#             against timm-compile-ro-fp16, its share of the fp16 GEMM peak, host against
#             device input and each lever's gain; benchmarks/patch_embed.py (Conv against one
#             GEMM) and benchmarks/host_input.py (ONNX Runtime's own run, staged, streamed,
#             uint8 through model.e2e.onnx, against device input), each in one run
#   cudatests the tests that touch CUDA (CUDA_TESTS), with the GPU visible
#   tests     the whole suite (--run-slow) with CUDA visible (the GPU image has no Ray: Serve
#             skips); refused unless timm and transformers are the pinned ones (pins)
#   precisions ViT-B/16 validated in TF32, and exported and validated with fp16 input/output
#   bench     bench --provider P at batch 1, 8, 64, 256 with the eager-amp and cuda-graph
#             peers; then eager, the fp16 models and torch.compile (max-autotune, autocast)
#   profile   the kernels of each ONNX model on the GPU, batch 1 and 64
#   embed     infer --embed on CUDA (ONNX Runtime and eager) against CPU: cosine per image
#             (after families: it embeds with the hf-clip family's bundle)
#   aoti      export --pt2 --aoti compiled for CUDA, validated, and infer --runtime aoti; then
#             --aoti-precision fp16, validated by the fp16 profile, run by infer and timed
#             against the fp32 package (a CPU rehearsal proves its refusal instead)
#   ray       Ray Serve from the parts scripts/pack_ray.sh makes (the GPU image has no Ray)
#   serve     tests/test_serve.py, the load test too, with that Ray, on CUDA
#
# Bundles are kept in $WORK (default /tmp/vit-cuda) from one stage to the next: the machine
# keeps /tmp while it stays warm. Each stage writes $LOGS/STAGE.log (every command and all it
# printed) and the JSON reports beside it. It needs onnxruntime-gpu (../shared/gpu/README.md).
# PROVIDER=cpu PRESET=vit_seed_tiny rehearses the stages on a machine without a GPU
# (tests/test_cuda_proof.py does, so that the commands here keep up with the CLI).
#
# Before a lent session, here (with PyPI):
#   mkdir -p .git/info && bash ../shared/gpu/pack.sh   .gpu/: onnxruntime-gpu in five parts
#   python scripts/cuda_families.py                     out/cuda-families (21 MiB)
#   bash scripts/pack_pins.sh                           out/gpu-pins (16 MiB)
#   bash scripts/pack_ray.sh                            out/gpu-ray, two parts (plan B2 only)
# A lent machine gives 15 minutes of device time in all (starting it, every call, idle waits:
# it goes back after ~30 s idle), 10 minutes a command, 64 MiB carried a call, 8 files back
# from $OUT. Make the calls back to back. Minutes below are budgets, from the H100 run of
# 2026-11-23 (16 cores; export of ViT-B/16 54 s, validate 23 s, 18 families ~3 min one at a
# time, the peers ~4 min with a second torch.compile) and estimates from it.
# The ort carry of calls 1-5 is .gpu/ort.partNN .gpu/manifest .gpu/assemble.sh; "start"
# begins every command: bash .gpu/assemble.sh >/dev/null && export PYTHONPATH=/tmp/ort-site:$PWD:$PYTHONPATH;
#
# Plan A: the proof, in one window
#   call  min  timeout_s  carry                                           command
#   boot  2.0  -          the machine starts on the first call            -
#   1     0.6  60         .gpu/ort.part00 (+ ort carry)                   bash .gpu/assemble.sh
#   2     0.6  60         .gpu/ort.part01 (+ ort carry)                   bash .gpu/assemble.sh
#   3     0.6  60         .gpu/ort.part02 (+ ort carry)                   bash .gpu/assemble.sh
#   4     0.6  60         .gpu/ort.part03 (+ ort carry)                   bash .gpu/assemble.sh
#   5     0.6  60         .gpu/ort.part04 (+ ort carry)                   bash .gpu/assemble.sh
#   6     8.5  480        out/gpu-pins out/cuda-families (+ ort carry)    start WINDOW=465 bash scripts/cuda_proof.sh env pins export staged infer families peers cudatests
#   total 13.5 of 15
#   (call 6: 8 minutes of command, 0.5 to carry 39 MiB in and the archive back; its stages
#   by their caps: env 30 s, pins 30, export 150, staged 100, infer 40, families 120, peers
#   240, cudatests what is left, once 60 s are left: the expected run is ~7 minutes, the
#   order puts what matters first)
#
# Plan B1: the whole suite, in a second window
#   call  min  timeout_s  carry                                           command
#   boot  2.0  -          the machine starts on the first call            -
#   1-5   3.0  60         .gpu/ort.part00 .. 04, one a call (+ ort carry) bash .gpu/assemble.sh
#   6     8.5  480        out/gpu-pins (+ ort carry)                      start WINDOW=465 bash scripts/cuda_proof.sh pins tests
#   total 13.5 of 15
#
# Plan B2: Ray Serve on CUDA and the profiles, in a third window (a Ray part is 58 MiB: it
# travels alone with the tree, so no pins here; the Serve tests do not need them)
#   call  min  timeout_s  carry                                           command
#   boot  2.0  -          the machine starts on the first call            -
#   1-5   3.0  60         .gpu/ort.part00 .. 04, one a call (+ ort carry) bash .gpu/assemble.sh
#   6     0.8  60         out/gpu-ray/ray.part00 out/gpu-ray/manifest     bash scripts/cuda_proof.sh ray
#   7     8.5  480        out/gpu-ray/ray.part01 out/gpu-ray/manifest (+ ort carry)  start WINDOW=465 bash scripts/cuda_proof.sh ray serve export profile
#   total 14.3 of 15
#
# Left for a window after these (each stage's log says how long it took): precisions,
# bench (four batch sizes and max-autotune), embed (after families), aoti, EXPORT_AOTI=1
# with peers.
set -uo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"  # run again for each stage of a window
cd "$(dirname "$0")/.."
LOGS=${LOGS:-out/cuda}
WORK=${WORK:-/tmp/vit-cuda}
BATCHES=${BATCHES:-1,8,64,256}
SECONDS_EACH=${SECONDS_EACH:-1}  # bench --min-seconds
PROVIDER=${PROVIDER:-cuda}
PRESET=${PRESET:-vit_base_patch16_224}
FAMILIES=${FAMILIES:-out/cuda-families}
FAMILY_JOBS=${FAMILY_JOBS:-4}  # families exported and validated at once (one GPU, 16 cores)
PINS=${PINS:-out/gpu-pins}  # the wheels scripts/pack_pins.sh writes
PINS_SITE=${PINS_SITE:-/tmp/pins-site}  # where the pins stage installs them
PACK=${PACK:-${OUT:+$OUT/cuda-proof.tgz}}  # the logs, packed after every command
WINDOW=${WINDOW:-}  # seconds for all the stages given (a window of device time), or none
MIN_LEFT=${MIN_LEFT:-30}  # a stage starts within a window only with this many seconds left
CAP_FACTOR=${CAP_FACTOR:-1}  # the caps times this (a CPU rehearsal's slower stages)
# a stage's most seconds within a window; cudatests, last, takes what is left once 60 are
declare -A CAP=([env]=30 [pins]=30 [export]=150 [staged]=100 [infer]=40 [families]=120
                [peers]=240 [tests]=465 [serve]=300 [profile]=120)
declare -A NEEDS=([cudatests]=60)
# the tests that touch CUDA where a GPU is: providers, staging, IO binding, peers, TF32
CUDA_TESTS=(tests/test_runtime.py tests/test_bench.py tests/test_parity.py tests/test_cli.py
            tests/test_export.py -k "cuda or gpu or stag or provider or device or tf32")
mkdir -p "$LOGS" "$WORK"
export PYTHONUNBUFFERED=1
vx() { python3 cli.py "$@"; }

pack() {  # the logs so far into $PACK, whole: written aside, then renamed over the last one
    [ -n "$PACK" ] || return 0
    local part="$PACK.$BASHPID.part"  # families' jobs pack at once, each its own
    tar czf "$part" --warning=no-file-changed -C "$(dirname "$LOGS")" "$(basename "$LOGS")" \
        2>/dev/null
    if [ $? -le 1 ]; then mv -f "$part" "$PACK"; else rm -f "$part"; fi  # 1: a log grew
}

FAILED=0  # commands that failed in this stage (each stage runs in its own subshell)
step() {  # step CMD...: echo the command, run it, echo its exit code and time; a --report
    local start=$SECONDS arg previous=  # FILE is removed first, so none outlives its command
    for arg in "$@"; do
        [ "$previous" = --report ] && rm -f "$arg"
        previous=$arg
    done
    echo "\$ $*"
    pack
    "$@"
    local rc=$?
    echo "[exit $rc, $((SECONDS - start)) s]"
    echo
    pack
    [ "$rc" -eq 0 ] || FAILED=$((FAILED + 1))
    return "$rc"
}

expect_exit() {  # expect_exit CODE CMD...: CMD must exit CODE (a refusal a CPU rehearsal
    local want=$1 rc  # proves, of a command that needs CUDA)
    shift
    "$@"
    rc=$?
    echo "(exit $rc, expected $want)"
    [ "$rc" -eq "$want" ]
}

to_file() {  # to_file FILE CMD...: CMD's stdout into FILE
    local file=$1
    shift
    "$@" > "$file"
}

check_pins() {  # timm and transformers are requirements-dev.txt's pins; say which and where
    step python3 -c "import importlib, re, sys
pins = dict(re.findall(r'^(timm|transformers)==(\S+)', open('requirements-dev.txt').read(), re.M))
bad = 0
for name, pin in sorted(pins.items()):
    module = importlib.import_module(name)
    ok = module.__version__ == pin
    bad += not ok
    print(name, module.__version__, 'from', module.__file__, 'ok' if ok else 'NOT the pin ' + pin)
sys.exit(int(bad > 0 or len(pins) != 2))"
}

stage_pins() {  # the pinned timm and transformers from $PINS (scripts/pack_pins.sh)
    if [ ! -f "$PINS/manifest" ]; then
        echo "no $PINS/manifest: run scripts/pack_pins.sh, and carry $PINS"; return 1
    fi
    step bash -c "cd '$PINS' && sha256sum --check --strict manifest" || return 1
    rm -rf "$PINS_SITE"
    step python3 -m pip install -q --no-index --no-deps --no-compile --target "$PINS_SITE" \
        "$PINS"/*.whl || { rm -rf "$PINS_SITE"; return 1; }
    PYTHONPATH="$PINS_SITE:${PYTHONPATH:-}" check_pins || { rm -rf "$PINS_SITE"; return 1; }
    touch "$PINS_SITE/.ready"
}

stage_env() {  # what the machine is, and whether ONNX Runtime really runs on its GPU
    if [ "$PROVIDER" = cuda ]; then
        step nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    fi
    step python3 -c "import sys, torch, onnx, numpy; print(sys.version.split()[0], 'torch', \
torch.__version__, 'cuda', torch.version.cuda, 'onnx', onnx.__version__, 'numpy', \
numpy.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
    step bash -c "lscpu | grep -m1 'Model name'"
    step python3 -c "import onnxruntime as o; print(o.__version__, o.__file__, \
o.get_available_providers())"
    if [ "$PROVIDER" = cuda ]; then  # get_providers() of a real session, not the list
        step python3 -c "from vit_export import runtime; problem = runtime.cuda_problem(); \
print('cuda problem:', problem); raise SystemExit(problem is not None)"
    fi
    step vx quick-test --provider "$PROVIDER"
}

stage_export() {  # the bundles the later stages use: made here, by this machine's torch
    step vx export "$WORK/digits" --from models/digits --optimize --precision fp16 \
        --embed-preprocessing --real-data models/digits/held_out.npz --provider "$PROVIDER" \
        --force --progress
    local aoti=()  # the fp16 package: peers times it beside the rest (minutes to compile)
    if [ "$PROVIDER" = cuda ] && [ "${EXPORT_AOTI:-0}" = 1 ]; then
        aoti=(--aoti --aoti-precision fp16)
    fi
    step vx export "$WORK/base" --preset "$PRESET" --optimize --precision fp16 \
        --embed-preprocessing "${aoti[@]}" --batch-sizes 1,3,7,64 --provider "$PROVIDER" \
        --force --progress
}

stage_staged() {  # the staged path: validate, and staged against ONNX Runtime's own run
    # every bundle here was exported by this run: its TorchScript and programs run too
    local common=(--provider "$PROVIDER" --require-provider "$PROVIDER" --layers --trust-code)
    step vx validate "$WORK/digits" --real-data models/digits/held_out.npz "${common[@]}" \
        --report "$LOGS/digits.json"
    step vx validate "$WORK/base" --batch-sizes 1,3,7,64 "${common[@]}" \
        --report "$LOGS/base.json"
    local bundle
    for bundle in digits base; do
        step python3 scripts/staged_check.py "$WORK/$bundle" --provider "$PROVIDER" \
            --files model.onnx,model.opt.fp16.onnx,model.e2e.onnx --batch-sizes 1,3,7,64
    done
}

stage_infer() {  # the shipped samples: the same top-1 on the provider as on the CPU
    local runtime files=()
    for runtime in onnxruntime "onnxruntime[model.opt.fp16.onnx]" \
                   "onnxruntime[model.e2e.onnx]" torchscript; do
        local name=${runtime#onnxruntime[}
        local file="$LOGS/infer-${name%]}-$PROVIDER.json"
        rm -f "$file"
        step to_file "$file" vx infer "$WORK/digits" models/digits/samples --top-k 1 \
            --provider "$PROVIDER" --runtime "$runtime" --json
        files+=("$file")
    done
    local cpu="$LOGS/infer-onnxruntime-cpu-reference.json"
    rm -f "$cpu"
    step to_file "$cpu" vx infer "$WORK/digits" models/digits/samples --top-k 1 \
        --provider cpu --json
    step python3 -c "import json, sys
def top1(path):
    found = json.load(open(path))
    return found['provider'], {r['input']: r['top'][0]['class'] for r in found['results']}
_, want = top1(sys.argv[1])
bad = 0
for path in sys.argv[2:]:
    device, got = top1(path)
    same = sum(got.get(k) == v for k, v in want.items())
    ok = device == '$PROVIDER' and same == len(want) == len(got)
    bad += not ok
    print(f'{path}: on {device}, top-1 as on the CPU for {same} of {len(want)} samples'
          + ('' if ok else '  DIFFERS'))
sys.exit(int(bad > 0))" "$cpu" "${files[@]}"
}

family() {  # family FOLDER: export and validate one family's model, into its own log
    local folder=$1 name
    name=$(basename "$folder")
    FAILED=0
    {
        step vx export "$WORK/families/$name" --from "$folder" --provider "$PROVIDER" \
            --batch-sizes 1,3,7 --precision fp16 --force --quiet
        step vx validate "$WORK/families/$name" --provider "$PROVIDER" \
            --require-provider "$PROVIDER" --batch-sizes 1,3,7 --layers --trust-code
    } > "$LOGS/families/$name.log" 2>&1
    return $((FAILED > 0))
}

stage_families() {  # FAMILY_JOBS at a time; each log whole, in order, once all are done
    local folder name
    if ! compgen -G "$FAMILIES/*/" >/dev/null; then
        echo "no model folders in $FAMILIES: run scripts/cuda_families.py, and carry them"
        return 1
    fi
    rm -rf "$LOGS/families" && mkdir -p "$LOGS/families"
    for folder in "$FAMILIES"/*/; do
        while [ "$(jobs -rp | wc -l)" -ge "$FAMILY_JOBS" ]; do wait -n; done
        family "$folder" &
    done
    wait
    for folder in "$FAMILIES"/*/; do
        name=$(basename "$folder")
        echo "--- $name"
        cat "$LOGS/families/$name.log"
        FAILED=$((FAILED + $(grep -c '^\[exit [1-9]' "$LOGS/families/$name.log")))
    done
    pack
}

stage_peers() {  # the fastest validated file against timm's own model in fp16, compiled
    local peers=timm-fp16,timm-compile-ro-fp16,cuda-graph
    if [ "$PROVIDER" != cuda ]; then  # fp16 PyTorch and CUDA graphs need CUDA
        peers=timm,timm-compile
    fi
    local files="onnxruntime,onnxruntime[model.fp16.onnx],onnxruntime[model.opt.fp16.onnx]"
    if [ -f "$WORK/base/model.aoti.pt2" ]; then files="$files,aoti"; fi  # CUDA's fp16 package
    step vx bench "$WORK/base" --provider "$PROVIDER" --batch-sizes 1,64 \
        --min-seconds "$SECONDS_EACH" --runtimes "$files" \
        --peers "$peers" --report "$LOGS/peers.json" --progress || return 1
    step python3 scripts/peers_summary.py "$LOGS/peers.json"
    # the patch embedding as one GEMM (export --patch-embed gemm) against Conv, one run
    step python3 benchmarks/patch_embed.py --provider "$PROVIDER" --batch-sizes 1,64 \
        --min-seconds "$SECONDS_EACH"
    # host input (staged, streamed, uint8 through model.e2e.onnx) against device input
    step python3 benchmarks/host_input.py "$WORK/base" --file model.opt.fp16.onnx \
        --provider "$PROVIDER" --batch-sizes 1,64 --min-seconds "$SECONDS_EACH"
}

stage_cudatests() {  # verbose: a run cut short still names each test it finished
    step python3 -m pytest -v -p no:cacheprovider -n "${WORKERS:-8}" -rfEs "${CUDA_TESTS[@]}"
}

stage_tests() {
    check_pins || return 1  # judged against our pins, not the image's timm and transformers
    step python3 -m pytest -v -p no:cacheprovider -n "${WORKERS:-12}" --run-slow -rfEs \
        --durations=15 --junitxml="$LOGS/tests.xml"
}

stage_precisions() {  # TF32 on the fp32 models; fp16 input and output
    local common=(--provider "$PROVIDER" --require-provider "$PROVIDER" --layers --trust-code)
    if [ "$PROVIDER" = cuda ]; then  # TF32 is CUDA's alone: a CPU run refuses the profile
        step vx validate "$WORK/base" --batch-sizes 1,3,7,64 --profile tf32 "${common[@]}" \
            --report "$LOGS/base-tf32.json"
    fi
    step vx export "$WORK/base-io" --preset "$PRESET" --optimize --precision fp16 --fp16-io \
        --batch-sizes 1,3,7,64 --provider "$PROVIDER" --force --progress
    step vx validate "$WORK/base-io" --batch-sizes 1,3,7,64 "${common[@]}" \
        --report "$LOGS/base-io.json"
}

stage_bench() {
    local common=(--provider "$PROVIDER" --batch-sizes "$BATCHES" --min-seconds "$SECONDS_EACH"
                  --trust-code)
    local peers=(--peers eager-amp,cuda-graph)
    local compiled=(--peers eager-amp,torch-compile-amp,cuda-graph)
    if [ "$PROVIDER" != cuda ]; then  # these peers need CUDA; torch.compile alone takes minutes
        peers=() compiled=()
    fi
    step vx bench "$WORK/base" "${common[@]}" "${peers[@]}" --report "$LOGS/bench.json" \
        --progress
    step vx bench "$WORK/base" "${common[@]}" \
        --runtimes "eager,onnxruntime[model.fp16.onnx],onnxruntime[model.opt.fp16.onnx]" \
        "${compiled[@]}" --report "$LOGS/bench-compile.json" --progress
}

stage_profile() {
    for model in model.onnx model.opt.onnx model.fp16.onnx model.opt.fp16.onnx; do
        for batch in 1 64; do
            step python3 benchmarks/ort_profile.py "$WORK/base/$model" --provider "$PROVIDER" \
                --batch "$batch" --runs 5
        done
    done
}

stage_embed() {  # the hf-clip family's bundle (the families stage makes it)
    local bundle="$WORK/families/hf-clip" runtime device file files=()
    local devices=("$PROVIDER")
    [ "$PROVIDER" = cpu ] || devices+=(cpu)
    for device in "${devices[@]}"; do
        for runtime in onnxruntime eager; do
            file="$WORK/embed-$runtime-$device.npy"
            rm -f "$file"  # a failed infer leaves none to compare
            step vx infer "$bundle" models/digits/samples --embed --runtime "$runtime" \
                --provider "$device" --output "$file" --force
            files+=("$file")
        done
    done
    step python3 -c "import sys, numpy as n
a, *rest = [n.load(f).astype(n.float64) for f in sys.argv[1:]]
worst = 1.0
for f, b in zip(sys.argv[2:], rest):
    c = ((a * b).sum(1) / n.linalg.norm(a, axis=1) / n.linalg.norm(b, axis=1)).min()
    print(f'worst cosine, {sys.argv[1]} to {f}: {c:.7f}')
    worst = min(worst, c)
sys.exit(int(worst < 0.99999))  # the fp32 profile's cosine" "${files[@]}"
}

stage_aoti() {  # an AOTInductor package is machine code for one device: compiled there
    step vx export "$WORK/aoti" --preset vit_seed_tiny --pt2 --aoti --provider "$PROVIDER" \
        --batch-sizes 1,3,7 --force --progress
    step vx validate "$WORK/aoti" --provider "$PROVIDER" --require-provider "$PROVIDER" \
        --batch-sizes 1,3,7,64 --trust-code --report "$LOGS/aoti.json"
    step vx infer "$WORK/aoti" models/digits/samples --runtime aoti --provider "$PROVIDER" \
        --top-k 1
    local fp16=(vx export "$WORK/aoti-fp16" --preset vit_seed_tiny --aoti --aoti-precision fp16
                --provider "$PROVIDER" --batch-sizes 1,3,7 --force --progress)
    if [ "$PROVIDER" != cuda ]; then  # compiled for CUDA: refused before any work
        rm -rf "$WORK/aoti-fp16"
        step expect_exit 1 "${fp16[@]}"
        return
    fi
    step "${fp16[@]}" || return 1
    step vx validate "$WORK/aoti-fp16" --provider "$PROVIDER" --require-provider "$PROVIDER" \
        --batch-sizes 1,3,7,64 --trust-code --report "$LOGS/aoti-fp16.json"
    step vx infer "$WORK/aoti-fp16" models/digits/samples --runtime aoti \
        --provider "$PROVIDER" --top-k 1
    local bundle
    for bundle in aoti aoti-fp16; do  # each package beside eager, on the fp32 or fp16 peak
        step vx bench "$WORK/$bundle" --provider "$PROVIDER" --runtimes aoti --batch-sizes 1,64 \
            --min-seconds "$SECONDS_EACH" --report "$LOGS/bench-$bundle.json"
    done
}

stage_ray() {  # Ray Serve from out/gpu-ray's parts (scripts/pack_ray.sh), one part a call
    local store=/tmp/ray-parts site=/tmp/ray-site wheels=/tmp/ray-wheels want have sha
    if [ -f "$site/.ready" ]; then echo "ray ready"; return 0; fi
    if [ ! -d "$wheels" ]; then  # parts kept in /tmp while the machine stays warm
        if [ ! -f out/gpu-ray/manifest ]; then
            echo "no out/gpu-ray/manifest: run scripts/pack_ray.sh, and carry it"; return 1
        fi
        mkdir -p "$store"
        cp -f out/gpu-ray/ray.part* "$store/" 2>/dev/null
        want=$(awk '$1=="parts"{print $2}' out/gpu-ray/manifest)
        sha=$(awk '$1=="sha256"{print $2}' out/gpu-ray/manifest)
        have=$(ls "$store"/ray.part* 2>/dev/null | wc -l)
        if [ "$have" -lt "$want" ]; then echo "have $have of $want Ray parts"; return 0; fi
        cat "$store"/ray.part* > /tmp/ray.tar
        if [ "$(sha256sum /tmp/ray.tar | cut -d' ' -f1)" != "$sha" ]; then
            echo "Ray parts: sha256 mismatch; pack again"; rm -f "$store"/ray.part*; return 1
        fi
        mkdir -p "$wheels" && tar -C "$wheels" --strip-components=1 -xf /tmp/ray.tar
        rm -rf /tmp/ray.tar "$store"
    fi
    step python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
        "$wheels"/*.whl || { rm -rf "$site"; return 1; }
    # after the image's own packages on the path, as stage_serve puts it: Serve must import
    PYTHONPATH="${PYTHONPATH:-}:$site" step python3 -c "import ray, ray.serve, ray.data; \
print('ray', ray.__version__, ray.__file__)" || { rm -rf "$site"; return 1; }
    touch "$site/.ready"
    rm -rf "$wheels"
}

stage_serve() {  # the Serve tests, the load test among them, on CUDA where auto finds it
    if [ ! -f /tmp/ray-site/.ready ]; then
        echo "Ray is not installed here: run the ray stage with every part first"; return 1
    fi
    if [ "$PROVIDER" = cuda ]; then  # else auto would serve on CPU and the tests still pass
        step python3 -c "from vit_export import runtime; problem = runtime.cuda_problem(); \
print('cuda problem:', problem); raise SystemExit(problem is not None)" || return 1
    fi
    PYTHONPATH="${PYTHONPATH:-}:/tmp/ray-site" step python3 -m pytest -q -p no:cacheprovider \
        --run-slow -n 0 -rfEs tests/test_serve.py
}

run_stages() {  # each stage in turn, its output into $LOGS/STAGE.log; 1 where one failed
    local stage status=0
    for stage in "$@"; do
        # once installed (this call or an earlier one on the same machine), the pins come first
        if [ -f "$PINS_SITE/.ready" ] && [[ ":${PYTHONPATH:-}:" != *":$PINS_SITE:"* ]]; then
            export PYTHONPATH="$PINS_SITE${PYTHONPATH:+:$PYTHONPATH}"
        fi
        echo "=== $stage ($(date -u +%H:%M:%S))" | tee -a "$LOGS/$stage.log"
        # a stage fails where it returned non-zero or any of its commands failed
        (stage_"$stage"; rc=$?; exit $((rc != 0 || FAILED > 0))) 2>&1 \
            | tee -a "$LOGS/$stage.log" \
            || { status=1; echo "=== $stage failed" | tee -a "$LOGS/$stage.log"; }
        pack
    done
    return "$status"
}

run_window() {  # the stages within $WINDOW seconds: each under the time left and its cap
    local deadline=$((SECONDS + WINDOW)) stage left budget start rc status=0
    local log="$LOGS/window.log"
    echo "window of $WINDOW s: $* ($(date -u +%H:%M:%S))" | tee -a "$log"
    for stage in "$@"; do
        left=$((deadline - SECONDS))
        if [ "$left" -lt "${NEEDS[$stage]:-$MIN_LEFT}" ]; then
            echo "=== $stage skipped: $left s left" | tee -a "$log"
            pack
            continue
        fi
        budget=$left
        if [ -n "${CAP[$stage]:-}" ] && [ $((CAP[$stage] * CAP_FACTOR)) -lt "$budget" ]; then
            budget=$((CAP[$stage] * CAP_FACTOR))
        fi
        echo "=== $stage begun, $budget s at most ($left s left)" | tee -a "$log"
        pack
        start=$SECONDS
        # its own process group: timeout ends the stage and every process it started
        WINDOW= timeout --kill-after=5 "$budget" bash "$SELF" "$stage"
        rc=$?
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            echo "=== $stage cut at $budget s" | tee -a "$log" "$LOGS/$stage.log"
        else
            echo "=== $stage exit $rc, $((SECONDS - start)) s" | tee -a "$log"
        fi
        [ "$rc" -eq 0 ] || status=1
        # a stage's pins hold for the stages after it
        if [ -f "$PINS_SITE/.ready" ] && [[ ":${PYTHONPATH:-}:" != *":$PINS_SITE:"* ]]; then
            export PYTHONPATH="$PINS_SITE${PYTHONPATH:+:$PYTHONPATH}"
        fi
        pack
    done
    echo "window done: $((SECONDS)) s of $WINDOW" | tee -a "$log"
    pack
    return "$status"
}

for stage in "$@"; do
    if ! declare -F "stage_$stage" >/dev/null; then
        echo "unknown stage $stage" >&2
        exit 2
    fi
done
if [ -n "$WINDOW" ]; then
    run_window "$@"
else
    run_stages "$@"
fi
