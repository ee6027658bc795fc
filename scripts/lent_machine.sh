#!/usr/bin/env bash
# The checks run on a lent machine of many cores and a CUDA device, in one go (device time is short):
#   OUT=/some/dir scripts/lent_machine.sh
# with the repository's dependencies importable by `python3` (torch and Pillow too). Each step has its
# own time limit and writes its results under $OUT as it goes, so a step cut short loses only itself:
#   machine.txt     cores, CPU model, GPU, versions
#   images-N.jsonl  scripts/bench_images.py --workers N (RecordIO and folders, ours and torch; its progress
#                   and where each run's CPU went are in errors.log as it goes)
#   decode.txt      scripts/decode_parallel.py (the image mapper alone in 1, 8 and 14 processes at once)
#   gpu.log         scripts/gpu_check.py (device placement through a daemon, copy/compute overlap)
#   scaling.log     scripts/bench_scaling.py (CPU-heavy mapper and small samples, 1 to 14 workers)
#   errors.log      the steps' standard error
# QUICK=1 GPU_DEVICE=torch:cpu IMAGE_WORKERS=2 SCALING_WORKERS=1,2 SMALL_WORKERS= is a dry run anywhere.
set -u
: "${OUT:?set OUT to the folder for the results}"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
PY=${PYTHON:-python3}
"$PY" -m compileall -q loader workers scripts >/dev/null
{
    nproc
    lscpu | grep -E '^(Model name|Socket|Core|Thread|CPU\(s\)|CPU max MHz)'
    nvidia-smi -L
    "$PY" -c 'import sys, numpy, zmq, msgpack, torch, PIL; print(sys.version.split()[0], "numpy", numpy.__version__, "pyzmq", zmq.__version__, "libzmq", zmq.zmq_version(), "msgpack", msgpack.version, "torch", torch.__version__, "Pillow", PIL.__version__)'
    df -h /dev/shm
} >"$OUT/machine.txt" 2>&1
# The tests that need a CUDA device (skipped everywhere else); their summary goes to standard output.
timeout 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/unit/test_device.py \
    tests/unit/provider/test_acceptance_feeder.py 2>&1 | tail -3
for n in ${IMAGE_WORKERS:-4 8 14}; do
    # One trial each: two of both sides at 4 workers ran past 95 s on the H200 (2026-11-29).
    timeout "${IMAGE_LIMIT_S:-120}" "$PY" scripts/bench_images.py --workers "$n" --trials "${IMAGE_TRIALS:-1}" \
        ${QUICK:+--quick} --json \
        >"$OUT/images-$n.jsonl" 2>>"$OUT/errors.log"
    echo "images $n workers: rc $?"
done
timeout 60 "$PY" scripts/decode_parallel.py 1 8 14 >"$OUT/decode.txt" 2>>"$OUT/errors.log"
echo "decode_parallel: rc $?"
timeout "${GPU_LIMIT_S:-100}" "$PY" scripts/gpu_check.py --device "${GPU_DEVICE:-cuda}" >"$OUT/gpu.log" 2>>"$OUT/errors.log"
echo "gpu_check: rc $?"
timeout "${SCALING_LIMIT_S:-140}" "$PY" scripts/bench_scaling.py --workers "${SCALING_WORKERS:-1,4,14}" \
    --small-workers "${SMALL_WORKERS-1,14}" >"$OUT/scaling.log" 2>>"$OUT/errors.log"
echo "bench_scaling: rc $?"
