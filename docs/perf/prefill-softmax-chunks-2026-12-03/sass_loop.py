# opcode histogram of the SASS between two addresses (a loop body) of a cuobjdump -sass
# listing: python3 sass_loop.py FILE START_HEX END_HEX [skip-hex START2 END2]
import re, sys, collections
lo, hi = int(sys.argv[2], 16), int(sys.argv[3], 16)
skip = (int(sys.argv[4], 16), int(sys.argv[5], 16)) if len(sys.argv) > 5 else (0, 0)
c = collections.Counter()
for l in open(sys.argv[1]):
    m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)', l)
    if not m:
        continue
    a = int(m.group(1), 16)
    if lo <= a < hi and not (skip[0] <= a < skip[1]):
        c[m.group(3).split('.')[0]] += 1
print("instructions", sum(c.values()))
for k, v in c.most_common(24):
    print(f"{k:10s}{v:5d}")
