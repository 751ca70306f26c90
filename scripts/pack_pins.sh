#!/usr/bin/env bash
# Pack the pinned timm and transformers for the lent GPU machine (issue 37): its image has
# its own older ones (timm 1.0.29, transformers 5.17 on 2026-11-24), and the suite judged
# against them fails where our code is right for our pins. Both are pure Python wheels (16
# MiB together): they travel with the tree in one call, beside .gpu/'s onnxruntime-gpu.
# Run here, in the project's root, with PyPI. Writes $OUT (default out/gpu-pins, git-ignored):
#   *.whl      requirements-dev.txt's timm and transformers pins, without dependencies
#   manifest   their sha256s, as `sha256sum -c` reads them
# On the GPU machine `bash scripts/cuda_proof.sh pins` checks and installs them into
# /tmp/pins-site, and every later stage (tests above all) runs with them first on the path.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=${OUT:-out/gpu-pins}
pins=$(grep -E '^(timm|transformers)==' requirements-dev.txt)
if [ "$(echo "$pins" | wc -l)" -ne 2 ]; then
  echo "requirements-dev.txt does not pin both timm and transformers" >&2; exit 1
fi
rm -rf "$out" && mkdir -p "$out"
# shellcheck disable=SC2086  # one pin per word
python3 -m pip download -q --no-deps --only-binary=:all: -d "$out" $pins \
  2> >(grep -v "^WARNING: Location" >&2)  # this machine's mirror notes, not errors
(cd "$out" && sha256sum -- *.whl > manifest)
ls -la "$out"
