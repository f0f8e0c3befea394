# Sourced by the device scripts (benchmarks/*/device.sh), run from the repo root on the device
# machine with .whl carried (../shared/device.md): installs the wheels, sets the environment and
# makes the results folder $R (packed into $OUT/res.tgz by the caller: only 8 files come back).
set -u
rm -rf /tmp/site  # a warm machine keeps the last install, which pip --target would not replace
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
# infermux itself runs from the working tree sent (src/), never from a wheel .whl may still hold
# from an older tree (device-wheels.sh builds one; a stale one ran last session's code once).
rm -rf /tmp/site/infermux /tmp/site/infermux-*.dist-info
export PYTHONPATH=$PWD/src:/tmp/site:$PWD PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
R=${OUT:-/tmp/out}/res
mkdir -p "$R"
nproc >"$R/nproc.txt"
