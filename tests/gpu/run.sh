#!/usr/bin/env bash
# The one command for the real-GPU validation (run as root on the GPU node, from the
# repository root): installs mps-health, runs every test marked gpu with its output,
# the benchmarks with the real MPS binaries, and records NVML facts. Captures go to
# $OUT (or ./gpu-out), bundled in one tarball. Never changes the card's settings.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT/captures"
export OUT PYTHONUNBUFFERED=1
# The GPU machine has no network: dependencies it lacks (nagiosplugin, for check_mps)
# are carried as wheels in tests/gpu/wheels/ and installed from there first.
for w in tests/gpu/wheels/*.whl; do
  [ -f "$w" ] && { python3 -m pip install -q --no-deps --no-index "$w" || exit 1; }
done
python3 -m pip install -q --no-deps --no-build-isolation . || exit 1
{
  date -u; uname -r
  nvidia-smi --query-gpu=name,driver_version,compute_mode,persistence_mode --format=csv
  python3 --version
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
python3 tests/gpu/record_nvml.py > "$OUT/captures/nvml__h200_default.json" 2>&1
timeout 900 python3 -m pytest -m gpu tests/gpu -v -s -p no:cacheprovider "$@" 2>&1 | tee "$OUT/gpu-tests.log"
rc=${PIPESTATUS[0]}
for b in check_speed wedged_instances; do
  [ -f "bench/$b.py" ] && timeout 300 python3 "bench/$b.py" --real 2>&1 | tee "$OUT/bench-$b.log"
done
tar -C "$OUT" -czf "$OUT/captures.tgz" captures 2>/dev/null && rm -rf "$OUT/captures"
exit "$rc"
