#!/bin/bash
# Sourced at the start of a device-machine command (`run` tool; the machine has no LLVM and
# no network), from the repository root as it travelled, with `build` and `.device` carried:
#   .device/src.tar.gz      git archive of the tree the objects in build/ were built from
#                           (plus new files), unpacked at /work/main: the build stamps hash
#                           absolute source paths, so the tree must sit where it was built,
#                           and must be the tree build/ was built from, or the test modules
#                           that build kernels fail their setup (stamps differ, no clang)
#   .device/objdump         `python3 bench/objdump_standin.py record .device/objdump build`
#   .device/clang-version.txt   `clang-22 --version` of the build machine (the stamps hash it)
# build/pydeps holds pure-Python packages the device image lacks (pyelftools).
# Used for docs/emulator-scale.md's device measurements: bench/emu_scaling_control.py,
# bench/emu_parallel.py and `pytest -p suite_sample -m full -n 16`.
set -e
SRC=$PWD
mkdir -p /work/main /tmp/shim
tar -xzf .device/src.tar.gz -C /work/main
[ "$SRC" = /work/main ] || cp -a build .device /work/main/
ln -sfn /work/main/loader /tmp/shim/gfxasm
ln -sf /work/main/.device/objdump/bin/llvm-objdump-22 /usr/bin/llvm-objdump-22
cat > /usr/bin/clang-22 <<'EOS'
#!/bin/sh
if [ "$1" = "--version" ]; then cat /work/main/.device/clang-version.txt; exit 0; fi
echo "stand-in clang-22: no LLVM on this machine (cannot assemble $*)" >&2; exit 1
EOS
for t in llvm-mc-22 ld.lld-22; do printf '#!/bin/sh\necho "stand-in %s: no LLVM on this machine" >&2; exit 1\n' $t > /usr/bin/$t; done
chmod +x /usr/bin/clang-22 /usr/bin/llvm-mc-22 /usr/bin/ld.lld-22
export PYTHONPATH=/tmp/shim:/work/main:/work/main/build/pydeps PYTHONUNBUFFERED=1
cd /work/main
