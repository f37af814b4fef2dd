# The step runner of bench/gpu_all.sh and bench/linear_native_check.sh, sourced from the
# repository root once STEPS_DIR names the (existing) output directory. The packages run from
# the tree: no install, no nox.
export PYTHONPATH="packages/attn-core/src:packages/engine-patch/src:packages/sim/src:hil/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

# step NAME LIMIT CMD...: CMD under a LIMIT-second timeout, its output in $STEPS_DIR/NAME.log,
# "NAME rc=N" appended to $STEPS_DIR/steps.txt and printed; a failing or hung step stops nothing.
step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s)"
    timeout -k 5 "$limit" "$@" >"$STEPS_DIR/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc" | tee -a "$STEPS_DIR/steps.txt"
}

# record_device PYTHON: the GPU's name, driver and memory, then PYTHON's torch and version,
# printed and written to $STEPS_DIR/device.txt.
record_device() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$STEPS_DIR/device.txt"
    "$1" -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])" | tee -a "$STEPS_DIR/device.txt"
}
