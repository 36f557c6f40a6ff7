"""Sums Nsight Compute's source page (--page source --csv --print-source
sass) of one kernel: its SASS size, the instructions it ran, its warp-state
samples by stall reason, the instructions run and samples of each stretch
of code between two barriers (a kernel's phases), and its most sampled
instructions.
usage: python3 gpu_stalls.py page.csv [top]"""
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main(path, top):
    rows = list(csv.reader(open(path, errors="replace")))
    start = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if start is None:
        print("no source page in ncu's output; its first lines:")
        for line in open(path, errors="replace").read().splitlines()[:8]:
            print("  " + line)
        return
    head = rows[start]
    source, executed = head.index("Source"), head.index("Instructions Executed")
    sampled = head.index("Warp Stall Sampling (All Samples)")
    reasons = [i for i, c in enumerate(head) if c.startswith("stall_") and "Not Issued" not in c]
    body = [r for r in rows[start + 1:] if len(r) == len(head)]
    ran = [number(r[executed]) for r in body]
    print(f"SASS instructions {len(body)}, of them run {sum(1 for v in ran if v > 0)}, "
          f"warp-instructions run {sum(ran):.0f}")
    totals = {head[i][len("stall_"):]: sum(number(r[i]) for r in body) for i in reasons}
    all_samples = sum(totals.values()) or 1
    print(f"samples {all_samples:.0f} by reason: " + ", ".join(
        f"{k} {100 * v / all_samples:.0f}%" for k, v in sorted(totals.items(), key=lambda kv: -kv[1]) if v))
    print("stretches between barriers (first index, last, warp-instructions run, samples, share):")
    first = 0
    for i, r in enumerate(body):
        words = [w for w in r[source].split() if not w.startswith("@")]   # the opcode first, its guard left out
        opcode = words[0] if words else ""
        if i == len(body) - 1 or opcode.startswith(("BAR", "UCGABAR")):   # a block's or a cluster's barrier
            stretch = range(first, i + 1)
            run = sum(ran[j] for j in stretch)
            samples = sum(number(body[j][sampled]) for j in stretch)
            if run or samples:
                print(f"  {first:5d} {i:5d} {run:10.0f} {samples:6.0f} {100 * samples / all_samples:5.1f}%")
            first = i + 1
    print("most sampled instructions (index, samples, share, SASS):")
    order = sorted(range(len(body)), key=lambda i: -number(body[i][sampled]))[:top]
    for i in sorted(order):
        v = number(body[i][sampled])
        if v > 0:
            print(f"  {i:5d} {v:5.0f} {100 * v / all_samples:5.1f}%  {body[i][source].strip()[:80]}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12)
