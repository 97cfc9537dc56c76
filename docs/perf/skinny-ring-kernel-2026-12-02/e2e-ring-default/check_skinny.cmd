D=.device; . .device/gpu_mem.sh; timeout 200 ./.device/dustin-kernels-gpu check --op skinny > $OUT/check_skinny.txt 2>&1 (run again later on the same binary and warm machine)
