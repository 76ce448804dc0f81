#!/usr/bin/env bash
# Issue 34's GPU run in one command, sized for one 10-minute call on one H200 (about 8 minutes of work):
#
#   bash benchmarks/gpu/session.sh OUT_DIR      # PYTHON=... (default python3); BUDGET=seconds (default 540)
#
# 0. The machine is offline: the Python packages its image lacks (datasets, dill, multiprocess, fsspec)
#    come as wheels in .whl/ (pyarrow and xxhash in .whl/fallback/, installed only when datasets will not
#    import without them) and go to /tmp/site with this project, installed from the checkout (what .whl/
#    holds: docs/performance.md, "On a GPU").
# 1. flash vs sdpa parity in bf16, host-device syncs of a training and a decoding step (check.py)
# 2. training MFU at ~124M, bf16, batch 8 x seq 1024, eager and torch.compile (mfu.py)
# 3. the README's training command at the base preset, bf16, sdpa, --torch_compile: steady
#    tokens/s, MFU, peak memory; then the same run stopped by SIGTERM and resumed, weights
#    against the straight run (train_check.py)
# 4. greedy decoding of the model trained in 3 at batch 1 and 8: dynamic, static and compiled static cache,
#    beside the bandwidth floor (check.py generate --model)
# Every step has a time limit inside one overall budget, so a hang costs its own step only. OUT_DIR gets the
# whole log (session.log), every result's JSON line (results.jsonl), the training runs' console output
# (pretrain.log) and the straight run's metrics.jsonl. Exit status 1 if a step failed.
set -u
OUT_DIR=${1:?usage: bash benchmarks/gpu/session.sh OUT_DIR}
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
cd "$(dirname "$0")/../.."  # the checkout: .whl/ and the project to install
PYTHON=${PYTHON:-python3}
DEADLINE=$((SECONDS + ${BUDGET:-540}))
LOG=$OUT_DIR/session.log RESULTS=$OUT_DIR/results.jsonl WORK=${WORK:-/tmp/tinytx_gpu_session} SITE=${SITE:-/tmp/site}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec > >(tee -a "$LOG") 2>&1

CONFIGS=$(pwd)/training/configs
if "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    DEVICE=(--device cuda) SYNCS=() MFU=(--config $CONFIGS/model-base.json --batch_size 8 --seq_len 1024)
    MFU+=(--dtype bf16 --repeats 10) GENERATE=()
elif [ "${DRY_RUN:-0}" = 1 ]; then  # every step on a tiny model on CPU: the session's code paths, before GPU time
    echo "gpu/session.sh: DRY_RUN=1 without a CUDA GPU: each step on a tiny model on CPU (no figures to quote)"
    DEVICE=(--device cpu) SYNCS=(--model_config $CONFIGS/model-tiny.json --seq_len 32 --vocab_size 512)
    MFU=(--config $CONFIGS/model-tiny.json --vocab_size 512 --batch_size 2 --seq_len 64 --quick)
    GENERATE=(--new_tokens 8 --repeats 1 --batch_sizes 1 2)
else
    echo "gpu/session.sh: no CUDA GPU here (torch.cuda.is_available() is False); DRY_RUN=1 runs the steps on CPU." \
        "Nothing run."
    exit 0
fi
if [ -d .whl ]; then  # the packages the machine lacks, beside (not over) its own torch and transformers
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl
    export PYTHONPATH=$SITE
    if ! "$PYTHON" -c 'import datasets' 2>/dev/null && [ -d .whl/fallback ]; then
        echo "datasets does not import with this image's pyarrow/xxhash: installing the carried ones"
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --upgrade .whl/fallback/*.whl
    fi
fi
# The project itself, built here from this checkout with the image's setuptools (offline: no build isolation)
"$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . || exit 1
export PYTHONPATH=$SITE
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null || true
"$PYTHON" - <<'PY' | tee -a "$RESULTS"
import json, platform, torch, transformers, accelerate, datasets
print(json.dumps({"check": "environment", "python": platform.python_version(), "torch": torch.__version__,
                  "cuda": torch.version.cuda, "transformers": transformers.__version__,
                  "accelerate": accelerate.__version__, "datasets": datasets.__version__,
                  "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU"}))
PY

failed=()
step() {  # step NAME SECONDS COMMAND...: at most SECONDS, and never past the overall deadline
    local name=$1 limit=$2 left=$((DEADLINE - SECONDS))
    shift 2
    [ "$left" -lt "$limit" ] && limit=$left
    echo; echo "== $name (at most ${limit} s; $((SECONDS / 60)) min $((SECONDS % 60)) s in)"
    if [ "$limit" -le 10 ]; then echo "gpu/session.sh: $name skipped: the budget is spent"; failed+=("$name"); return; fi
    local part=$OUT_DIR/.step.out
    timeout "$limit" "$@" > >(tee "$part") 2>&1
    local code=$?
    sleep 0.2  # the tee of the step's output finishes
    grep '^{' "$part" >> "$RESULTS"
    rm -f "$part"
    [ "$code" -eq 0 ] || { echo "gpu/session.sh: $name failed (exit $code)"; failed+=("$name"); }
}

# From the checkout's root, each benchmark as a module of the benchmarks package.
step "flash vs sdpa parity, bf16" 90 "$PYTHON" -m benchmarks.gpu.check parity "${DEVICE[@]}"
step "host-device syncs, training and decoding step" 90 "$PYTHON" -m benchmarks.gpu.check syncs "${DEVICE[@]}" \
    "${SYNCS[@]}"
step "training MFU, bf16, eager" 60 "$PYTHON" -m benchmarks.mfu "${DEVICE[@]}" "${MFU[@]}"
step "training MFU, bf16, torch.compile" 150 "$PYTHON" -m benchmarks.mfu "${DEVICE[@]}" "${MFU[@]}" --compile
rm -rf "$WORK"
step "pretrain (base on a GPU), bf16, compiled; SIGTERM and resume" 300 \
    "$PYTHON" -m benchmarks.gpu.train_check --output_dir "$WORK" "${DEVICE[@]}"
cp "$WORK/pretrain.log" "$OUT_DIR/pretrain.log" 2>/dev/null
cp "$WORK/straight/metrics.jsonl" "$OUT_DIR/metrics_straight.jsonl" 2>/dev/null
if [ -f "$WORK/straight/model.safetensors" ]; then
    step "generate, the trained model, dynamic/static/compiled cache" 150 \
        "$PYTHON" -m benchmarks.gpu.check generate --model "$WORK/straight" "${DEVICE[@]}" "${GENERATE[@]}"
else
    step "generate, random ~124M (no trained model), dynamic/static/compiled cache" 150 \
        "$PYTHON" -m benchmarks.gpu.check generate "${DEVICE[@]}" "${GENERATE[@]}"
fi

echo
echo "gpu/session.sh: $((SECONDS / 60)) min $((SECONDS % 60)) s"
if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu/session.sh: FAILED: ${failed[*]}"
    exit 1
fi
echo "gpu/session.sh: every step ran"
