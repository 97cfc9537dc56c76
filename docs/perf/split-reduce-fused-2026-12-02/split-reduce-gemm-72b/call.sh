set -u
D=.device
. $D/gpu_mem.sh
C=$D/configs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
date +%s > $OUT/t0
el() { echo "after $(( $(date +%s) - $(cat $OUT/t0) )) s"; }
timeout 210 ./$D/dustin-kernels-gpu check --op skinny > $OUT/check_skinny.txt 2>&1; echo "check rc=$?"; grep -E "FAIL|check:|rror|panic" $OUT/check_skinny.txt | head -30
el
timeout 120 ./$D/dustin-kernels-gpu gemm --decode-only --no-burn --json $OUT/gemm.jsonl > $OUT/gemm.txt 2>&1; echo "gemm rc=$?"
python3 - $OUT/gemm.jsonl <<'EOP'
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
t={}
for r in rows:
    if 'us' in r: t.setdefault((r['model'],r['proj'],r['m']),{})[r['op']]=r['us']
ops=['cublas','skinny_mma','skinny_mma_rk','skinny_ring','skinny_ring_rk','skinny']
print('model proj m | '+' | '.join(ops))
for k,v in t.items():
    print(k[0],k[1],k[2],'|',' | '.join(('%.1f'%v[o]) if o in v else '-' for o in ops))
EOP
el
T72="--target $C/Qwen2.5-72B-Instruct.config.json --target-layers 20 --ctx 32768"
mkdir -p $OUT/sync
SYNC=1 LIMIT=170 OUT=$OUT/sync bash $D/gpu_e2e.sh run 72b_sync $T72 --batch 8 --modes ar,dense,dustin --split-reduce kernel,fused | grep -E "^\| (dense|dustin|ar)|peak|rror"
el
A2="--target $C/Qwen2.5-7B-Instruct.config.json --target-layers 2 --ctx 32768 --batch 8 --modes dense"
mkdir -p $OUT/l2
SYNC=1 WARMUP=2 ITERS=8 ROUNDS=3 LIMIT=75 OUT=$OUT/l2 bash $D/gpu_e2e.sh run l2 $A2 --split-reduce kernel,fused | grep -E "^\| (dense|dustin|ar)|rror"
el
