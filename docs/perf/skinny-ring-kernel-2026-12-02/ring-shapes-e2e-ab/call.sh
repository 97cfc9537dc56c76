set -u
D=.device
. $D/gpu_mem.sh
C=$D/configs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
date +%s > $OUT/t0
el() { echo "after $(( $(date +%s) - $(cat $OUT/t0) )) s"; }
timeout 150 ./$D/dustin-kernels-gpu gemm --decode-only --no-burn --ring-configs 64x32x4,128x32x4,64x64x4,64x64x3,128x64x3,128x32x3 --json $OUT/gemm.jsonl > $OUT/gemm.txt 2>&1
echo "gemm rc=$?"; el
BEST=$(python3 - $OUT/gemm.jsonl <<'PY'
import json,sys,collections
t=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    try: r=json.loads(l)
    except Exception: continue
    if 'us' in r: t[(r['model'],r['proj'],r['m'])][r['op']]=r['us']
ops=sorted({o for v in t.values() for o in v})
sys.stderr.write('model proj m ' + ' '.join(ops) + '\n')
for key in sorted(t):
    if key[2] >= 16: sys.stderr.write(' '.join(map(str,key)) + ' ' + ' '.join(str(t[key].get(o,'-')) for o in ops) + '\n')
score=collections.Counter()
for (mo,pr,m),v in t.items():
    if m in (40,80) and pr != 'lm_head':
        for o,us in v.items():
            if o.startswith('skinny_ring_'): score[o]+=us
sys.stderr.write('sum over 40/80 rows: ' + str(sorted(score.items(), key=lambda x:x[1])) + '\n')
print(min(score, key=score.get)[len('skinny_ring_'):] if score else '64x32x4')
PY
)
echo "BEST=$BEST"
timeout 150 ./$D/dustin-kernels-gpu check --op skinny --ring-config $BEST > $OUT/check_skinny.txt 2>&1
echo "check rc=$?"; el
grep -E "FAIL|check:|rror|panic" $OUT/check_skinny.txt | head -20
mkdir -p $OUT/sync
SYNC=1 SKMMA=no-ring LIMIT=120 OUT=$OUT/sync bash $D/gpu_e2e.sh run 72b_noring --target $C/Qwen2.5-72B-Instruct.config.json --target-layers 20 --ctx 32768 --batch 16,8 --modes dense | grep -E "^\| (dense|dustin|ar)|peak|rror"
el
SYNC=1 SKMMA=auto RING=$BEST LIMIT=120 OUT=$OUT/sync bash $D/gpu_e2e.sh run 72b_ring --target $C/Qwen2.5-72B-Instruct.config.json --target-layers 20 --ctx 32768 --batch 16,8 --modes dense | grep -E "^\| (dense|dustin|ar)|peak|rror"
el
