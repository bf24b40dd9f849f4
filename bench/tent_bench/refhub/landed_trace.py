# ruff: noqa
"""DIAG (burstrx; reverted in the next commit): from the traces of a pipeline_ab run with
TENT_TCP_TRACE and REFHUB_TRACE set (as a configuration's env), per hop and round: how long after
its bytes landed in order the hop's progress word covered them, and of the time its reader's waiting
READs sat parked at it, how much came after their bytes had landed (what a word stored as bytes land
could cut). ``python -m tent_bench.refhub.landed_trace <dir>``"""
import bisect, glob, os, statistics, sys
from collections import defaultdict

d = sys.argv[1]
MASK = (1 << 40) - 1
def pct(xs, q):
    xs = sorted(xs); return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float('nan')
procs = {}
for f in glob.glob(f"{d}/py-*.trace"):
    pid = f.split("-")[-1].split(".")[0]
    B, P, L, S = [], [], [], []
    for ln in open(f):
        x = ln.split()
        if x[0] == "B": B.append((int(x[1]), int(x[2]), int(x[3]), int(x[4]), int(x[5]), x[6], x[7]))
        elif x[0] == "P": P.append((int(x[1]), int(x[2])))
    tf = f"{d}/tcp-{pid}.trace"
    if os.path.exists(tf):
        for ln in open(tf):
            x = ln.split()
            if x[0] == "L": L.append((int(x[1]), int(x[2]), int(x[3])))
            elif x[0] == "S": S.append(tuple(int(v) for v in x[1:]))
    procs[pid] = (B, P, L, S)
# rounds: B bursts separated by > 1 s
out = []
for pid, (B, P, L, S) in procs.items():
    if not B:
        continue
    B.sort(); L.sort(); P.sort(); S.sort()
    rounds, cur = [], [B[0]]
    for b in B[1:]:
        if b[0] - cur[-1][0] > 1e9: rounds.append(cur); cur = [b]
        else: cur.append(b)
    rounds.append(cur)
    for ri, rb in enumerate(rounds):
        t_lo = rb[0][0]; t_hi = rb[-1][0] + 3e9
        name, src = rb[0][5], rb[0][6]
        # READ landing: L events by address within [addr, addr+len), after the READ's submit
        Ls = [l for l in L if t_lo <= l[0] <= t_hi]
        land = {}
        byaddr = defaultdict(list)
        for t, a, n in Ls: byaddr[a].append((t, n))
        ends = []
        for (tb, a, e, n, w, _, _) in rb:
            # covering L pieces: start addr in [a, a+n)
            got, tmax = 0, None
            for aa in [k for k in byaddr if a <= k < a + n]:
                for t, nn in byaddr[aa]:
                    if t >= tb: got += nn; tmax = max(tmax or 0, t)
            if tmax is not None and got >= n:
                ends.append((e, tmax))
        ends.sort()
        # in-order landed time of stream end e
        inorder, m = [], 0
        for e, t in ends:
            m = max(m, t); inorder.append((e, m))
        Pr = [(t, v) for t, v in P if t_lo <= t <= t_hi]
        Pt = [t for t, _ in Pr]; Pv = [v for _, v in Pr]
        lags = []
        for e, t in inorder:
            # first P at or after t? no: first P time with value >= e
            tw = next((tp for tp, vp in Pr if vp >= e), None)
            if tw is not None: lags.append((tw - t) / 1e6)
        word_moves = sum(1 for i in range(1, len(Pv)) if Pv[i] > Pv[i - 1])
        # served READs of downstream readers, in this round's window
        Sr = [s for s in S if t_lo <= s[0] <= t_hi]
        parked = [s for s in Sr if (s[3] & MASK) < (s[2] & MASK) and (s[3] >> 40) == (s[2] >> 40)]
        park_ms = [(s[1] - s[0]) / 1e6 for s in parked]
        gain = []
        ie = [e for e, _ in inorder]
        for s in parked:
            need = s[2] & MASK
            k = bisect.bisect_left(ie, need)
            if k < len(inorder):
                t_l = inorder[k][1]
                gain.append((s[1] - max(s[0], t_l)) / 1e6)
        sum_park = sum(park_ms); sum_gain = sum(g for g in gain if g > 0)
        tail = lags[-1] if lags else float('nan')
        tot = (max(t for _, t in inorder) - t_lo) / 1e9 if inorder else 0
        print(f"pid {pid} {name}<-{src} round {ri}: reads {len(rb)} landed {len(ends)} waiting {rb[-1][4]} dur {tot:.3f}s "
              f"word moves {word_moves}; landed->word lag ms med {pct(lags,.5):.1f} p90 {pct(lags,.9):.1f} max {max(lags) if lags else 0:.1f} mean {statistics.mean(lags) if lags else 0:.1f}; last byte landed->word {tail:.1f} ms")
        if Sr:
            print(f"    served waiting READs {len(Sr)}, parked {len(parked)} ({100*len(parked)/len(Sr):.0f}%); park ms med {pct(park_ms,.5):.1f} p90 {pct(park_ms,.9):.1f}; "
                  f"of a park, after in-order landing (what C progress could cut) ms med {pct(gain,.5):.1f} p90 {pct(gain,.9):.1f} mean {statistics.mean(gain) if gain else 0:.1f}; sum parked {sum_park:.0f} ms, sum cuttable {sum_gain:.0f} ms")
