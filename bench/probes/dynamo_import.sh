#!/usr/bin/env bash
# Where the proof's import of Dynamo goes on a machine (issue 39): each probe in a fresh HOME, as a new
# container has, then again in the same HOME (a warm ~/.triton): `import triton`, `import torch._dynamo`, and
# the proof's own imports. Prints the seconds of each step; `python -X importtime` of each probe is left in
# $OUT (default: a new temp folder).
#     bash bench/probes/dynamo_import.sh                 on the device, after `source bench/gpu_setup.sh`
#     DEVICE=cpu bash bench/probes/dynamo_import.sh      here
OUT=${OUT:-$(mktemp -d)}
DEVICE=${DEVICE:-cuda}

probe() {  # probe HOME STATEMENT NAME
  env HOME="$1" TMPDIR="$1" XDG_CACHE_HOME="$1/.cache" python3 -X importtime -c "
import time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
x = torch.ones(1, device='$DEVICE')
if '$DEVICE' != 'cpu':
    torch.cuda.synchronize()
t2 = time.perf_counter()
$2
t3 = time.perf_counter()
print('  import torch %.3f s, device init %.3f s, the step %.3f s' % (t1 - t0, t2 - t1, t3 - t2))
" 2> "$OUT/importtime-$3.txt" || echo "  failed: $(grep -v '^import time' "$OUT/importtime-$3.txt" | tail -1)"
  echo "  ~/.triton/cache: $(ls "$1/.triton/cache" 2>/dev/null | wc -l) entries"
}

n=0
for step in "import triton" "import torch._dynamo" \
            "from torch._dynamo.guards import CheckFunctionManager; from torch._dynamo.package import load_guards_state"; do
    n=$((n + 1)); home=$(mktemp -d)
    echo "== $step (a fresh HOME)"; probe "$home" "$step" "$n-cold"
    echo "== $step (the same HOME again)"; probe "$home" "$step" "$n-warm"
done
echo "importtime files: $OUT"
