#!/bin/bash
# The operator suite and the ctypes suite on the clean-clone CI build's library (ABI 9, every step).
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
S=stage/ci2
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; date -u > $R/date.txt
ATTENTION_STEPS_BUILD_DIR=$S/lib python3 -m pip install --no-build-isolation --no-deps --target /tmp/site ./python > $R/pip.log 2>&1; echo "pip rc $?"
cp /tmp/site/attention_steps/_operator*.so python/attention_steps/
export PYTHONPATH=$PWD/python:$PWD/tests/python ATTENTION_STEPS_LIBRARY=$PWD/$S/lib/libattention_steps.so
timeout 200 python3 tests/python/test_torch_op.py > $R/test_torch_op.log 2>&1; echo "torch_op rc $?" >> $R/test_torch_op.log
tail -5 $R/test_torch_op.log
timeout 60 python3 tests/python/test_capi_ctypes.py > $R/test_capi_ctypes.log 2>&1; echo "ctypes rc $?" >> $R/test_capi_ctypes.log
tail -3 $R/test_capi_ctypes.log
cd $OUT && tar czf all.tgz r && rm -rf r
