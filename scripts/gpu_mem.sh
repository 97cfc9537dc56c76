# GPU memory sampling shared by the gpu_*.sh scripts (sourced, not run). Needs OUT.
#   unpack DIR       gunzip the binaries xtask staged as DIR/*.gz (run on sourcing with DIR=$D)
#   mem_watch NAME   start sampling every GPU's used memory every 100 ms into $OUT/mem_NAME.txt
#   mem_peak NAME    stop sampling; print the peak MiB per GPU as "gpu:MiB gpu:MiB"
mem_watch() {
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 100 > "$OUT/mem_$1.txt" 2>/dev/null &
    MEM_WATCH=$!
}
mem_peak() {
    kill "$MEM_WATCH" 2>/dev/null
    wait "$MEM_WATCH" 2>/dev/null
    awk -F', ' '{ if ($2 > m[$1]) m[$1] = $2 } END { s = ""; for (g in m) s = s (s == "" ? "" : " ") g ":" m[g]; printf "%s", s }' "$OUT/mem_$1.txt"
}
#   mem_peak_max NAME  stop sampling; print the peak MiB of the fullest GPU
mem_peak_max() {
    kill "$MEM_WATCH" 2>/dev/null
    wait "$MEM_WATCH" 2>/dev/null
    awk -F', ' '{ if ($2 > m) m = $2 } END { printf "%d", m }' "$OUT/mem_$1.txt"
}
unpack() {
    local z
    for z in "$1"/*.gz; do
        [ -e "$z" ] || continue
        gunzip -f "$z" && chmod +x "${z%.gz}"
    done
}
if [ -n "${D:-}" ]; then
    unpack "$D"
fi
