#!/usr/bin/env bash
# Backs BENCHMARKS.md's Ray figures: scripts/bench_ray.py on a GPU machine that cannot install packages.
# Prepares .raypkg/ray.tar.xz (git-ignored): Ray and the core dependencies the GPU device machine lacks,
# built for its Python (3.12, x86_64). That machine has no network and takes at most 64 MiB of carried
# files; Ray unpacked is about 160 MiB (three native binaries of 35-45 MiB each), so it travels as one
# xz archive (about 31 MiB) and is unpacked there with Python's own tarfile:
#
#     bash scripts/ray_wheels.sh            # RAY_VERSION=2.60.0 PY_VERSION=3.12 by default
#     # on the device, carrying .raypkg:
#     python3 -c "import tarfile; tarfile.open('.raypkg/ray.tar.xz').extractall('/tmp/raypkg')"
#     PYTHONPATH=/tmp/raypkg python3 scripts/bench_ray.py
#
# Left out: the Java jars and the dashboard's web client (the dashboard is off; its agent, which runtime
# environments need, stays).
set -euo pipefail
cd "$(dirname "$0")/.."
RAY_VERSION=${RAY_VERSION:-2.60.0}
PY_VERSION=${PY_VERSION:-3.12}
rm -rf .raypkg
mkdir -p .raypkg
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
# The device has click, filelock, msgpack, packaging, protobuf, pyyaml, requests, attrs and
# typing-extensions; jsonschema and its own dependencies are what Ray's core still needs.
python3 -m pip install -q --no-deps --target "$stage" --python-version "$PY_VERSION" --implementation cp \
    --only-binary=:all: --platform manylinux2014_x86_64 \
    "ray==$RAY_VERSION" jsonschema jsonschema-specifications referencing rpds-py
rm -rf "$stage/ray/jars" "$stage/ray/dashboard/client/build" "$stage/bin"
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
echo "unpacked: $(du -sh "$stage" | cut -f1)"
python3 - "$stage" <<'PY'
import os, sys, tarfile
with tarfile.open(".raypkg/ray.tar.xz", "w:xz", preset=6) as tar:
    for name in sorted(os.listdir(sys.argv[1])):
        tar.add(os.path.join(sys.argv[1], name), arcname=name)
PY
du -sh .raypkg
size=$(du -sm .raypkg | cut -f1)
if [ "$size" -ge 55 ]; then
    echo "ray_wheels.sh: .raypkg is ${size} MiB, over the 55 MiB the device's carry allows with room" >&2
    exit 1
fi
