set -u
D=.device
. $D/gpu_mem.sh
C=$D/configs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
date +%s > $OUT/t0
timeout 200 ./$D/dustin-kernels-gpu check --op skinny > $OUT/check_skinny.txt 2>&1
echo "check rc=$? after $(( $(date +%s) - $(cat $OUT/t0) )) s"
grep -E "FAIL|check:|rror|panic" $OUT/check_skinny.txt | head -30
timeout 150 ./$D/dustin-kernels-gpu gemm --decode-only --no-burn --json $OUT/gemm.jsonl > $OUT/gemm.txt 2>&1
echo "gemm rc=$? after $(( $(date +%s) - $(cat $OUT/t0) )) s"
python3 - $OUT/gemm.jsonl <<'PY'
import json,sys,collections
t=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    try: r=json.loads(l)
    except Exception: continue
    if 'us' in r: t[(r['model'],r['proj'],r['m'])][r['op']]=r['us']
ops=['cublas','skinny_mma','skinny_ring','skinny']
print('model proj m', *ops)
for key in sorted(t): print(*key, *[t[key].get(o,'-') for o in ops])
PY
mkdir -p $OUT/sync
SYNC=1 SKMMA=no-ring LIMIT=110 OUT=$OUT/sync bash $D/gpu_e2e.sh run 72b_noring --target $C/Qwen2.5-72B-Instruct.config.json --target-layers 20 --ctx 32768 --batch 8,16 --modes dense,dustin | grep -E "^\| (dense|dustin|ar)|peak|rror"
echo "after $(( $(date +%s) - $(cat $OUT/t0) )) s"
SYNC=1 SKMMA=auto LIMIT=110 OUT=$OUT/sync bash $D/gpu_e2e.sh run 72b_ring --target $C/Qwen2.5-72B-Instruct.config.json --target-layers 20 --ctx 32768 --batch 8,16 --modes dense,dustin | grep -E "^\| (dense|dustin|ar)|peak|rror"
echo "after $(( $(date +%s) - $(cat $OUT/t0) )) s"
