# split cubecl's compilation log into one .cu file per distinct kernel entry point
import os, re, sys
s = open(sys.argv[1], errors="replace").read()
out = sys.argv[2]
os.makedirs(out, exist_ok=True)
# each compiled kernel's source starts at an include block and holds one extern "C" __global__
starts = [m.start() for m in re.finditer(r'(?m)^#include', s)]
# group: a source begins at the first #include after the previous kernel's end
chunks, i = [], 0
for m in re.finditer(r'extern "C" __global__ void\s+__launch_bounds__\(\d+\)\s*(?:__cluster_dims__\([^)]*\)\s*)?(\w+)\s*\(', s):
    name = m.group(1)
    # source start: last run of #include lines before this kernel and after the previous chunk
    st = s.rfind("\n\n", i, m.start())
    j = m.start()
    # walk back to the first #include after i
    inc = [p for p in starts if i <= p < j]
    st = inc[0] if inc else st
    # kernel end: next "\n}\n" at depth zero after the signature
    depth, k, started = 0, m.end(), False
    while k < len(s):
        c = s[k]
        if c == '{':
            depth += 1; started = True
        elif c == '}':
            depth -= 1
            if started and depth == 0:
                k += 1; break
        k += 1
    chunks.append((name, s[st:k]))
    i = k
seen = {}
for name, src in chunks:
    base = re.sub(r'_[0-9a-f]{6,}$', '', name)
    if not (base.startswith("prefill_kernel") or base.startswith("flash_kernel")):
        continue
    n = seen.get(base, 0); seen[base] = n + 1
    with open(os.path.join(out, f"{base}_{n}.cu"), "w") as f:
        f.write(src)
print("kernels:", {k: v for k, v in seen.items()})
