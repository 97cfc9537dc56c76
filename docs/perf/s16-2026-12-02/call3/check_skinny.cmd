D=.device; . .device/gpu_mem.sh; timeout 200 ./.device/dustin-kernels-gpu check --op skinny > $OUT/check_skinny.txt 2>&1 (call 5, same binary, warm machine)
