#!/usr/bin/env bash
# llama.cpp for the CPU peer rows of scripts/cpu_peers.sh: the copy vendored by the pinned
# llama-cpp-python source distribution, built for this machine's CPU.
#
#   scripts/build_llama_cpp.sh [DIR]        (DIR: target/llama.cpp)
#
# Downloads llama_cpp_python-0.3.36.tar.gz from PyPI into DIR (a copy already in DIR is
# reused; the sha256 is checked either way), extracts its vendor/llama.cpp into DIR/src and
# builds llama-bench, llama-speculative-simple and llama-simple into DIR/build/bin (static,
# Release, OpenMP). The instruction sets are the CPU's own (/proc/cpuinfo), each named
# (GGML_NATIVE=OFF): AVX-512 and the VNNI sets, and AMX where the CPU has AMX-INT8 (AMX=off
# leaves it out). An AMX build with GCC gets -fno-dse -fno-tree-dse: GCC 12's
# _tile_loadconfig tells the compiler it reads 8 bytes of the 64-byte tile configuration, so
# the stores of the tiles' shapes are dropped and the first tile instruction faults (SIGILL;
# docs/decisions.md). Needs cmake (`pip install cmake`), a C/C++ compiler and curl. JOBS
# (default 2) and NICE (default 15) set the build's parallelism and priority.
set -euo pipefail
dir=${1:-target/llama.cpp}
ver=0.3.36
sdist=llama_cpp_python-$ver.tar.gz
sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
urls=(
    "https://pypi.org/packages/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/$sdist"
    "https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/$sdist"
)
amx=${AMX:-auto}
jobs=${JOBS:-2}
nice=${NICE:-15}
targets=(llama-bench llama-speculative-simple llama-simple)

cmake=$(command -v cmake || true)
[ -n "$cmake" ] || { echo "no cmake on PATH: pip install cmake (or apt-get install cmake)" >&2; exit 1; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

if ! echo "$sha  $dir/$sdist" | sha256sum -c --status 2>/dev/null; then
    rm -f "$dir/$sdist.part"
    for url in "${urls[@]}"; do
        echo "fetching $url" >&2
        curl -fL --retry 3 -o "$dir/$sdist.part" "$url" && break
    done
    echo "$sha  $dir/$sdist.part" | sha256sum -c --status \
        || { echo "$sdist: sha256 is not $sha" >&2; exit 1; }
    mv "$dir/$sdist.part" "$dir/$sdist"
fi

# The vendored tree, without its .git (a submodule link into the sdist's own .git); the
# commit it was vendored at goes into the build info instead.
src=$dir/src
if [ ! -f "$src/.sdist-$sha" ]; then
    rm -rf "$src" && mkdir -p "$src"
    tar -xzf "$dir/$sdist" -C "$src" --strip-components=3 --exclude='llama.cpp/.git' \
        "llama_cpp_python-$ver/vendor/llama.cpp"
    tar -xzOf "$dir/$sdist" "llama_cpp_python-$ver/.git/modules/vendor/llama.cpp/HEAD" \
        > "$src/.vendored-commit" 2>/dev/null || echo unknown > "$src/.vendored-commit"
    touch "$src/.sdist-$sha"
fi
commit=$(head -c 12 "$src/.vendored-commit")

# One GGML_* option for each instruction set the CPU reports.
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { case $flags in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
case $amx in
    auto) has amx_tile && has amx_int8 && has avx512_vnni && amx=on || amx=off ;;
    on | off) ;;
    *) echo "AMX=$amx: auto, on or off" >&2; exit 1 ;;
esac
isa=()
sets="sse4_2:SSE42 avx:AVX avx2:AVX2 bmi2:BMI2 fma:FMA f16c:F16C avx_vnni:AVX_VNNI avx512f:AVX512
    avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16"
[ "$amx" = on ] && sets+=" amx_tile:AMX_TILE amx_int8:AMX_INT8 amx_bf16:AMX_BF16"
for pair in $sets; do
    has "${pair%%:*}" && isa+=("-DGGML_${pair#*:}=ON") || isa+=("-DGGML_${pair#*:}=OFF")
done
[ "$amx" = on ] || isa+=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
cxxflags=
if [ "$amx" = on ] && ! ${CXX:-c++} -dM -E -x c++ /dev/null | grep -q __clang__; then
    cxxflags="-fno-dse -fno-tree-dse"
fi

conf=(
    -S "$src" -B "$dir/build"
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=OFF "${isa[@]}" -DCMAKE_C_FLAGS= -DCMAKE_CXX_FLAGS="$cxxflags"
    -DGGML_OPENMP=ON -DGGML_CCACHE=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_COMMIT="$commit" -DLLAMA_BUILD_NUMBER=0
)
# GIT_CEILING_DIRECTORIES: ggml asks git for its commit, which would otherwise find the
# repository DIR sits in.
echo "+ $cmake ${conf[*]}" >&2
GIT_CEILING_DIRECTORIES=$dir "$cmake" "${conf[@]}"
start=$SECONDS
echo "+ nice -n $nice $cmake --build $dir/build -j $jobs --target ${targets[*]}" >&2
nice -n "$nice" "$cmake" --build "$dir/build" -j "$jobs" --target "${targets[@]}"
echo "built in $((SECONDS - start)) s (llama.cpp $commit from llama-cpp-python $ver, AMX $amx):" >&2
for t in "${targets[@]}"; do
    ls "$dir/build/bin/$t"
done
