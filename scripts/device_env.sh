#!/usr/bin/env bash
# Source this on the lent GPU machine (see docs/architecture.md, "Running on a GPU machine"): installs the carried
# wheels from .whl/, puts the four packages on PYTHONPATH and registers NVIDIA's OpenCL ICD.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/packages/netcl-core/src:$PWD/packages/netcl-runtime/src:$PWD/packages/netcl-autograd/src:$PWD/packages/netcl-jit/src:$PWD/benchmarks:/tmp/site
mkdir -p /tmp/icd
echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
export OCL_ICD_VENDORS=/tmp/icd
export NETCL_CACHE_DIR=/tmp/netcl-cache
