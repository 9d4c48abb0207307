#!/bin/sh
# Fetch (here, where pip reaches a registry) the wheels `make gpu-check` installs on a lent GPU
# machine whose image lacks them: that machine runs Python 3.12 and reaches no network. Versions
# are the ones `make test PYTHON=python3.12` resolves (numba compiles f-gram counting, which
# training imports); pass the folder to `carry` (.whl).
set -e
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  grain==0.2.18 array_record==0.8.6 portpicker==1.6.0 importlib_resources==6.5.2 crc32c==2.9.post0 \
  tensorboardX==2.6.5 flax==0.12.12 numba==0.68.1 llvmlite==0.50.0
ls .whl
