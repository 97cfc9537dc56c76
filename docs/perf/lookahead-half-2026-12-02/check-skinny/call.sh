set -o pipefail; D=.device; . $D/gpu_mem.sh; timeout 330 $D/dustin-kernels-gpu check --op skinny > $OUT/check_skinny.txt 2>&1
