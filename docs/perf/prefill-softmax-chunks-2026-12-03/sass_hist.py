# opcode histogram of a cuobjdump -sass listing (all functions), biggest first
import re, sys, collections
c = collections.Counter()
for line in open(sys.argv[1]):
    m = re.match(r'\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)', line)
    if m:
        c[m.group(2).split('.')[0]] += 1
tot = sum(c.values())
print("total", tot)
for k, v in c.most_common(45):
    print(f"{k:12s} {v:6d}")
