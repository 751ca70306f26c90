#!/usr/bin/env bash
# The CUDA proof (issue 24) on a lent GPU machine, in stages that each fit one call there:
#
#   bash scripts/cuda_proof.sh STAGE [STAGE ...]      (LOGS=folder for logs, default out/cuda)
#
#   pins      the pinned timm and transformers (scripts/pack_pins.sh, $PINS) installed into
#             $PINS_SITE, first on the path of every later stage and call: the GPU image has
#             older ones, and the suite must judge our code against our pins
#   env       the GPU, driver, versions; quick-test --provider cuda (PyTorch only)
#   ort       onnxruntime-gpu loads its CUDA provider here
#   tests     the whole test suite with CUDA visible (the GPU image has no Ray: Serve skips);
#             refused unless timm and transformers are the pinned ones (the pins stage)
#   export    the shipped digits model and ViT-B/16 (fp32, optimized, fp16, optimized fp16,
#             the preprocessing graph, on CUDA the fp16 AOTInductor package; fp16 I/O apart)
#   validate  validate --provider cuda --require-provider cuda --layers on each, TF32 on too
#   bench     bench --provider cuda at batch 1, 8, 64, 256 with the eager-amp and cuda-graph
#             peers; then eager, the fp16 models and torch.compile (max-autotune, autocast)
#   peers     issue 38: the fused fp16 model and on CUDA the fp16 AOTInductor package
#             (eager too, the reference) against timm's own
#             model in fp16, torch.compile'd (default, reduce-overhead) and with ONNX Runtime's
#             CUDA graph, batch 1 and 64, into peers.json; then scripts/peers_summary.py
#             prints it against timm-compile-ro-fp16 and the issue's goals (after export);
#             benchmarks/patch_embed.py: the patch embedding as Conv and as one GEMM
#             (export --patch-embed gemm) on ONNX Runtime, in one run; and
#             benchmarks/host_input.py: the fp16 model fed from host memory (ONNX Runtime's
#             own run, staged, streamed; uint8 images through model.e2e.onnx) against
#             input on the GPU, in one run
#   profile   the kernels of each ONNX model on the GPU, batch 1 and 64
#   infer     infer --provider cuda on the shipped samples
#   families  one tiny model of each ViT family exported and validated on CUDA, logits and
#             embedding (the model folders scripts/cuda_families.py writes, $FAMILIES)
#   embed     infer --embed on CUDA (ONNX Runtime and eager) against CPU: cosine per image
#             (after families: it embeds with the hf-clip family's bundle)
#   aoti      export --pt2 --aoti compiled for CUDA, validated, and infer --runtime aoti; then
#             --aoti-precision fp16 (the .half() model compiled for CUDA), validated by the
#             fp16 profile, run by infer and timed against the fp32 package (a CPU rehearsal
#             proves its refusal instead: one line, exit 1, nothing written)
#   ray       Ray Serve from the parts scripts/pack_ray.sh makes (the GPU image has no Ray)
#   serve     tests/test_serve.py, the load test too, with that Ray, on CUDA
#
# Bundles are kept in $WORK (default /tmp/vit-cuda) from one stage to the next: the machine
# keeps /tmp while it stays warm. Each stage writes $LOGS/STAGE.log (every command and all it
# printed) and the JSON reports beside it. It needs onnxruntime-gpu (../shared/gpu/README.md).
# PROVIDER=cpu PRESET=vit_seed_tiny rehearses the stages on a machine without a GPU
# (tests/test_cuda_proof.py does, so that the commands here keep up with the CLI).
#
# Plan for a lent machine (30 minutes of device time; it goes back after ~30 s idle, and
# at most 8 files come back from the device's $OUT: each call packs $LOGS into one archive).
# Minutes are the H100 run's of 2026-11-23 (16 cores) or estimates from it (~):
#   here   mkdir -p .git/info && bash ../shared/gpu/pack.sh      (.gpu/: the wheel in parts)
#          python scripts/cuda_families.py                       (out/cuda-families)
#          bash scripts/pack_ray.sh                              (out/gpu-ray, for the last)
#          bash scripts/pack_pins.sh                             (out/gpu-pins, 16 MiB)
#   1-5    the five calls pack.sh prints, back to back; the fifth also runs `env ort`
#   6      carry .gpu/manifest, .gpu/assemble.sh, out/gpu-pins and out/cuda-families; the
#          command:
#            bash .gpu/assemble.sh >/dev/null && export PYTHONPATH=/tmp/ort-site:$PWD:$PYTHONPATH;
#            bash scripts/cuda_proof.sh pins export families; tar czf $OUT/proof-1.tgz out/cuda
#          (pins installs in seconds and stays in /tmp while the machine is warm; a call on a
#          fresh machine carries out/gpu-pins and begins with `pins` again)
#          (export ~4 with ViT-B/16's fp16 AOTInductor package, families ~3)
#   7      the same start, stages `peers embed aoti` (peers ~4: eager, the fused fp16 model,
#          the fp16 package, timm's fp16 model eager and compiled twice at two batch sizes;
#          the 11-24 run compiled it in ~31 s (default) and ~20 s (reduce-overhead); then the
#          host-input benchmark ~1; embed and aoti ~3). Issue 38's figures: first, as the
#          machine may go back
#   8      the same start, stages `validate infer bench profile` (validate 1.5, bench and its
#          torch.compile peer at four batch sizes the most: split it off if it nears 10)
#   9      the same start, stages `pins tests` (6.5)
#   10-11  the same start, carrying out/gpu-ray/manifest and one out/gpu-ray part each
#          (not the families), stage `ray`; the second also runs `serve`
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${LOGS:-out/cuda}
WORK=${WORK:-/tmp/vit-cuda}
BATCHES=${BATCHES:-1,8,64,256}
SECONDS_EACH=${SECONDS_EACH:-1}  # bench --min-seconds
PROVIDER=${PROVIDER:-cuda}
PRESET=${PRESET:-vit_base_patch16_224}
FAMILIES=${FAMILIES:-out/cuda-families}
PINS=${PINS:-out/gpu-pins}  # the wheels scripts/pack_pins.sh writes
PINS_SITE=${PINS_SITE:-/tmp/pins-site}  # where the pins stage installs them
mkdir -p "$LOGS" "$WORK"
export PYTHONUNBUFFERED=1
vx() { python3 cli.py "$@"; }
FAILED=0  # commands that failed in this stage (each stage runs in its own subshell)
step() {  # step CMD...: echo the command, run it, echo its exit code and time; a --report
    local start=$SECONDS arg previous=  # FILE is removed first, so none outlives its command
    for arg in "$@"; do
        [ "$previous" = --report ] && rm -f "$arg"
        previous=$arg
    done
    echo "\$ $*"
    "$@"
    local rc=$?
    echo "[exit $rc, $((SECONDS - start)) s]"
    echo
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

stage_env() {
    step nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    step python3 -c "import sys, torch, onnx, numpy; print(sys.version.split()[0], 'torch', \
torch.__version__, 'cuda', torch.version.cuda, 'onnx', onnx.__version__, 'numpy', \
numpy.__version__, torch.cuda.get_device_name())"
    step python3 -c "import onnxruntime as o; print(o.__version__, o.__file__, \
o.get_available_providers())"
    step bash -c "lscpu | grep -m1 'Model name'"
    step python3 -c "import grpc, pandas, pyarrow; print('for Ray: grpc', grpc.__version__, \
'pandas', pandas.__version__, 'pyarrow', pyarrow.__version__)"
    step vx quick-test --provider "$PROVIDER"
    step vx quick-test --provider "$PROVIDER" --preset "$PRESET" --batch-size 2
}

stage_ort() {  # onnxruntime-gpu really runs on CUDA: get_providers(), not the list
    step python3 -c "import onnxruntime as o; print(o.__version__, o.__file__, \
o.get_available_providers())"
    step python3 -c "from vit_export import runtime; print('cuda problem:', \
runtime.cuda_problem())"
}

stage_tests() {
    check_pins || return 1  # judged against our pins, not the image's timm and transformers
    step python3 -m pytest -q -p no:cacheprovider -n "${WORKERS:-12}" -rfEs --durations=15 \
        --junitxml="$LOGS/tests.xml"
}

stage_export() {
    step vx export "$WORK/digits" --from models/digits --optimize --precision fp16 \
        --real-data models/digits/held_out.npz --provider "$PROVIDER" --force --progress
    local aoti=()  # on CUDA the fp16 package too: the peers stage times it beside the rest
    if [ "$PROVIDER" = cuda ]; then aoti=(--aoti --aoti-precision fp16); fi
    step vx export "$WORK/base" --preset "$PRESET" --optimize --precision fp16 \
        --embed-preprocessing "${aoti[@]}" --batch-sizes 1,3,7,64 --provider "$PROVIDER" \
        --force --progress
    step vx export "$WORK/base-io" --preset "$PRESET" --optimize --precision fp16 --fp16-io \
        --batch-sizes 1,3,7,64 --provider "$PROVIDER" --force --progress
    step vx info "$WORK/base"
}

stage_validate() {
    # every bundle here was exported by this run: its TorchScript and programs run too
    local common=(--provider "$PROVIDER" --require-provider "$PROVIDER" --layers --trust-code)
    step vx validate "$WORK/digits" --real-data models/digits/held_out.npz "${common[@]}" \
        --report "$LOGS/digits.json"
    step vx validate "$WORK/base" --batch-sizes 1,3,7,64 "${common[@]}" \
        --report "$LOGS/base.json"
    if [ "$PROVIDER" = cuda ]; then  # TF32 is CUDA's alone: a CPU run refuses the profile
        step vx validate "$WORK/base" --batch-sizes 1,3,7,64 --profile tf32 "${common[@]}" \
            --report "$LOGS/base-tf32.json"
    fi
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

stage_peers() {  # issue 38: the fastest fp16 file against timm's own model, fp16, compiled
    local peers=timm-fp16,timm-compile-fp16,timm-compile-ro-fp16,cuda-graph
    if [ "$PROVIDER" != cuda ]; then  # fp16 PyTorch and CUDA graphs need CUDA
        peers=timm,timm-compile
    fi
    local files="onnxruntime[model.opt.fp16.onnx]"
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

stage_profile() {
    for model in model.onnx model.opt.onnx model.fp16.onnx model.opt.fp16.onnx; do
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

stage_families() {  # export validates each on the provider; validate adds the stages
    local folder name
    if ! compgen -G "$FAMILIES/*/" >/dev/null; then
        echo "no model folders in $FAMILIES: run scripts/cuda_families.py, and carry them"
        return 1
    fi
    for folder in "$FAMILIES"/*/; do
        name=$(basename "$folder")
        step vx export "$WORK/families/$name" --from "$folder" --provider "$PROVIDER" \
            --batch-sizes 1,3,7 --precision fp16 --force --quiet
        step vx validate "$WORK/families/$name" --provider "$PROVIDER" \
            --require-provider "$PROVIDER" --batch-sizes 1,3,7 --layers --trust-code
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

for stage in "$@"; do
    if ! declare -F "stage_$stage" >/dev/null; then
        echo "unknown stage $stage" >&2
        exit 2
    fi
done
status=0
for stage in "$@"; do
    # once installed (this call or an earlier one on the same machine), the pins come first
    if [ -f "$PINS_SITE/.ready" ] && [[ ":${PYTHONPATH:-}:" != *":$PINS_SITE:"* ]]; then
        export PYTHONPATH="$PINS_SITE${PYTHONPATH:+:$PYTHONPATH}"
    fi
    echo "=== $stage ($(date -u +%H:%M:%S))" | tee -a "$LOGS/$stage.log"
    # a stage fails where it returned non-zero or any of its commands failed
    (stage_"$stage"; rc=$?; exit $((rc != 0 || FAILED > 0))) 2>&1 | tee -a "$LOGS/$stage.log" \
        || { status=1; echo "=== $stage failed" | tee -a "$LOGS/$stage.log"; }
done
exit "$status"
