#!/usr/bin/env bash
# Pack Ray Serve for the lent GPU machine, whose image has no Ray (issue 24: `serve --provider
# cuda` under the load test). Run here, in the project's root, on a machine with PyPI. Writes
# out/gpu-ray/ (git-ignored):
#   ray.partNN   the wheels of requirements-dev's ray[serve,data] pin for Python 3.12, less
#                those the GPU image has and are heavy (numpy, pandas, pyarrow, grpcio), as
#                one tar in parts of PART_MB MiB: carry ONE per device call, with the tree
#   manifest     part count and the tar's sha256
# On the GPU machine `bash scripts/cuda_proof.sh ray` keeps each part it is given in
# /tmp/ray-parts and, once all are there, installs the wheels into /tmp/ray-site; the
# `serve` stage then runs the Serve tests with it.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PART_MB=${PART_MB:-58}  # two parts; one and the working tree stay under 64 MiB
HAVE="numpy pandas pyarrow grpcio"
out=out/gpu-ray
rm -rf "$out" && mkdir -p "$out/wheels"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d "$out/wheels" \
  "$(grep -m1 '^ray\[' requirements-dev.txt)" "$(grep -m1 '^protobuf==' requirements-dev.txt)" \
  2> >(grep -v "^WARNING: Location" >&2)  # this machine's mirror notes, not errors
for name in $HAVE; do rm -f "$out/wheels/$name"-*.whl; done
tar -C "$out" -cf "$out/ray.tar" wheels
rm -rf "$out/wheels"
split -b "${PART_MB}M" -d -a 2 "$out/ray.tar" "$out/ray.part"
{ echo "parts $(ls "$out"/ray.part* | wc -l)"; echo "sha256 $(sha256sum "$out/ray.tar" | cut -d' ' -f1)"; } > "$out/manifest"
rm -f "$out/ray.tar"
ls -la "$out"
