#!/usr/bin/env python3
# Where a soak's agent spent its own CPU, third by third: it profiles the
# whole host, itself included, so its pprof files hold its own stacks. A
# creep in its CPU shows here as the functions whose samples grew.
#
#   scripts/soak-self-profile.py PPROF_DIR AGENT_PID [TOP]
#
# Reads the gzipped pprof files icecore writes (--pprof-dir) with a decoder
# of its own (the protobuf wire format; no packages needed).
import gzip
import os
import sys
from collections import Counter


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def fields(buf):
    """(field number, wire type, value) of one message, in order."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            size, i = varint(buf, i)
            value, i = buf[i:i + size], i + size
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def ints(wire, value):
    """A repeated integer field's values, packed or not."""
    if wire == 0:
        return [value]
    out, i = [], 0
    while i < len(value):
        v, i = varint(value, i)
        out.append(v)
    return out


def decode(data):
    """(time_nanos, [(count, pid, [function names, leaf first])])."""
    strings, functions, locations, samples, time_nanos = [], {}, {}, [], 0
    for number, wire, value in fields(data):
        if number == 6:
            strings.append(value.decode("utf-8", "replace"))
        elif number == 9:
            time_nanos = value
        elif number == 5:
            f = dict((n, v) for n, _, v in fields(value) if n in (1, 2))
            functions[f.get(1, 0)] = f.get(2, 0)
        elif number == 4:
            loc_id, funcs = 0, []
            for n, _, v in fields(value):
                if n == 1:
                    loc_id = v
                elif n == 4:
                    line = dict((ln, lv) for ln, _, lv in fields(v) if ln == 1)
                    funcs.append(line.get(1, 0))
            locations[loc_id] = funcs
        elif number == 2:
            loc_ids, values, labels = [], [], []
            for n, w, v in fields(value):
                if n == 1:
                    loc_ids += ints(w, v)
                elif n == 2:
                    values += ints(w, v)
                elif n == 3:
                    labels.append(dict((ln, lv) for ln, _, lv in fields(v)))
            samples.append((loc_ids, values[0] if values else 0, labels))
    pid_key = strings.index("pid") if "pid" in strings else -1
    out = []
    for loc_ids, count, labels in samples:
        pid = next((l.get(3, 0) for l in labels if l.get(1) == pid_key), None)
        names = []
        for loc in loc_ids:
            # A location's lines are innermost first, as its frames.
            for fn in locations.get(loc, []):
                names.append(strings[functions.get(fn, 0)] or "?")
        out.append((count, pid, names))
    return time_nanos, out


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: soak-self-profile.py PPROF_DIR AGENT_PID [TOP]")
    directory, agent, top = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 15
    profiles = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
            if data[:2] == b"\x1f\x8b":
                data = gzip.decompress(data)
            profiles.append(decode(data))
        except (OSError, ValueError, IndexError, EOFError) as e:
            print(f"skipped {name}: {e}", file=sys.stderr)
    if not profiles:
        sys.exit(f"no pprof files in {directory}")
    profiles.sort(key=lambda p: p[0])
    n = len(profiles)
    thirds = [profiles[: n // 3], profiles[n // 3: 2 * n // 3], profiles[2 * n // 3:]]
    inclusive, leaf, own = [], [], []
    for part in thirds:
        inc, lf, total = Counter(), Counter(), 0
        for _, samples in part:
            for count, pid, names in samples:
                if pid != agent:
                    continue
                total += count
                if names:
                    lf[names[0]] += count
                for name in set(names):
                    inc[name] += count
        inclusive.append(inc)
        leaf.append(lf)
        own.append(total / max(len(part), 1))
    print(f"{n} profiles; the agent's own samples per profile, by third: "
          + " / ".join(f"{x:.1f}" for x in own))
    for title, counters in (("inclusive", inclusive), ("leaf", leaf)):
        per = [{k: v / max(len(part), 1) for k, v in c.items()} for c, part in zip(counters, thirds)]
        keys = set(per[0]) | set(per[2])
        growth = sorted(keys, key=lambda k: per[2].get(k, 0) - per[0].get(k, 0), reverse=True)
        print(f"\n{title}: samples per profile, first / second / last third, most grown first")
        for k in growth[:top]:
            print(f"  {per[0].get(k, 0):7.2f} {per[1].get(k, 0):7.2f} {per[2].get(k, 0):7.2f}  {k[:140]}")


if __name__ == "__main__":
    main()
