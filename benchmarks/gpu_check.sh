#!/usr/bin/env bash
# The GPU checks in one go (under 5 minutes on one recent GPU); on a machine without CUDA it says so and exits 0.
#
#   bash benchmarks/gpu_check.sh            # PYTHON=/path/to/python to pick the interpreter (default: python)
#
# 1. flash-attention vs sdpa parity in bf16 on a TinyTx (gpu_check.py parity: flash-attn package, else the
#    kernels-community kernel, else sdpa's own flash kernel)
# 2. bf16 training MFU at ~124M parameters (training/configs/model-base.json), batch 8 x seq 1024 (mfu.py)
# 3. greedy generation tokens/s of the same ~124M model, batch 1 and 8, dynamic and static cache (gpu_check.py)
# Each step prints a table and a JSON line; one failing step does not stop the others; the exit status is 1 if any
# step failed.
set -u
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python}
export PYTHONPATH="$(cd .. && pwd)${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check.sh: no CUDA GPU here (torch.cuda.is_available() is False); these checks need one. Nothing run."
    exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

failed=()
run() {  # run NAME SECONDS COMMAND...: a time limit per step, so one hang cannot eat the whole budget
    local name=$1 limit=$2
    shift 2
    echo; echo "== $name"
    timeout "$limit" "$@" || { echo "gpu_check.sh: $name failed (exit $?)"; failed+=("$name"); }
}

run "flash parity (bf16)" 90 "$PYTHON" gpu_check.py parity
if [ -f ../training/configs/model-base.json ]; then
    run "training MFU, ~124M, bf16, seq 1024" 120 "$PYTHON" mfu.py --config ../training/configs/model-base.json \
        --batch_size 8 --seq_len 1024 --device cuda --dtype bf16 --repeats 10
else
    run "training MFU, 10M shape, bf16, seq 1024" 120 "$PYTHON" mfu.py --shape 10M --batch_size 8 --seq_len 1024 \
        --device cuda --dtype bf16 --repeats 10
fi
run "generation tokens/s, ~124M, bf16" 90 "$PYTHON" gpu_check.py generate

echo
if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_check.sh: FAILED: ${failed[*]}"
    exit 1
fi
echo "gpu_check.sh: all checks ran"
