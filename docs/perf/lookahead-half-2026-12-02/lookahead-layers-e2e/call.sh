# dustin's lookahead from all / every 2nd / the later half of the draft's
# layers, 7B and 72B shapes (20 layers, with ar), 32k, B 8, phases synced
set -o pipefail
D=.device
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
LA='all;stride:2;half' OUT=$OUT bash $D/gpu_e2e.sh lalayers 2>&1 | grep -v "^\s*$" | tail -60
