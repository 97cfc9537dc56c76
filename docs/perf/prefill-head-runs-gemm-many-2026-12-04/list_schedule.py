# Greedy list schedule of prefill_kernel's blocks on the H200's 264 block slots (2 blocks on
# each of 132 SMs), a block's time proportional to its key tiles (+1 for staging Q): the
# span over the ideal (total work / slots) for the grid layouts of docs/perf.md ("GPU: prefill
# and time to first token"). "saw": row blocks along x heaviest first, heads along y (the old layout); "global":
# heads fastest along x; "group": runs of `grp * ng` heads (ng KV heads' query heads).
# python3 list_schedule.py
import heapq
def sim(jobs, m=264):
    slots=[0.0]*m; heapq.heapify(slots)
    for j in jobs:
        t=heapq.heappop(slots); heapq.heappush(slots,t+j)
    return max(slots)
def run(n_new, ctx, heads=28, rows=128):
    R=(n_new+rows-1)//rows
    w=lambda rb: (ctx+min(rows*(rb+1),n_new))/64+1
    saw=[w(R-1-x) for h in range(heads) for x in range(R)]
    glob=[w(R-1-i//heads) for i in range(R*heads)]
    tot=sum(saw)/264
    print(n_new,ctx,"ideal %.0f saw %.0f (%.3f) global %.0f (%.3f)"%(tot,sim(saw),sim(saw)/tot,sim(glob),sim(glob)/tot))
run(16384,0); run(16384,16384); run(32768,0); run(4096,0); run(2048,0); run(2048,30720)
print("---")
def run2(n_new, ctx, heads=28, rows=128, grp=7, ng=1):
    R=(n_new+rows-1)//rows
    w=lambda rb: (ctx+min(rows*(rb+1),n_new))/64+1
    glob=[w(R-1-i//heads) for i in range(R*heads)]
    # group-major: ng KV groups at a time
    kvh=heads//grp
    C=[]
    for gs in range(0,kvh,ng):
        for rb in range(R):
            for h in range(grp*ng): C.append(w(R-1-rb))
    tot=sum(glob)/264
    print(n_new,ctx,ng,"global %.3f group %.3f"%(sim(glob)/tot,sim(C)/tot))
for ng in (1,2):
    run2(16384,0,ng=ng); run2(16384,16384,ng=ng); run2(32768,0,ng=ng)
