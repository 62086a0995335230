"""The seeds of the jitdump and gopclntab targets, built the way the unit
tests build theirs (receiver/src/runtimes/perf_map/jitdump_tests.rs and
receiver/src/symbolize/go_tests.rs, `synthetic_table`).

    python3 make_seeds.py CORPUS_DIR [TEXT_ADDRESS_HEX OUT_FILE]

With a text address, also writes a Go 1.20 table for an ELF whose .text is
there (make_seeds.sh adds it to an ELF file as .gopclntab).
"""
import struct, sys, os
out = sys.argv[1]  # the corpus directory
def w(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, 'wb').write(data)

# --- jitdump (as receiver/src/runtimes/perf_map/jitdump_tests.rs builds them)
MAGIC = 0x4A695444
CODE_LOAD, CODE_MOVE, CODE_DEBUG_INFO, CODE_CLOSE = 0, 1, 2, 3
def header(magic, size):
    b = b''.join(struct.pack('<I', v) for v in [magic, 1, size, 62, 0xDEADBEEF, 4242])
    b += struct.pack('<QQ', 1_700_000_000_000_000, 0)
    return b.ljust(max(size, 40), b'\0')
def record(id_, body):
    return struct.pack('<IIQ', id_, 16 + len(body), 0) + body
def load(addr, size, name, code=True):
    body = struct.pack('<II', 4242, 4243) + struct.pack('<QQQQ', addr, addr, size, 7)
    body += name.encode() + b'\0'
    if code:
        body += b'\xcc' * size
    return record(CODE_LOAD, body)
def debug(addr, entries):
    body = struct.pack('<QQ', addr, len(entries))
    for a, line, f in entries:
        body += struct.pack('<QII', a, line, 9) + f + b'\0'
    body = body.ljust((len(body) + 7) // 8 * 8, b'\0')
    return record(CODE_DEBUG_INFO, body)
def moved(old, new, size):
    body = b'\0' * 8 + b''.join(struct.pack('<Q', v) for v in [new, old, new, size, 7])
    return record(CODE_MOVE, body)
CODE = 0x7f0c680091c0
NAME = 'JS:^defineLazyProperties node:internal/util:598:30'
d = header(MAGIC, 40)
d += debug(CODE, [(CODE + 0x40, 598, b'node:internal/util'), (CODE + 0x67, 599, b'node:internal/util'),
                  (CODE + 0x6c, 600, b'\xff'), (CODE + 0x7a, 634, b'node:internal/other')])
d += record(4, b'\0' * 40)
d += load(CODE, 0x60, NAME)
d += load(0x2000, 0x20, 'Builtin:ArrayPrototypePush')
d += record(CODE_CLOSE, b'')
w(f'{out}/jitdump/node-v8.dump', d)
d = header(MAGIC, 64)
d += load(0x1000, 0x10, 'Lcom/example/Main;::work')
d += moved(0x1000, 0x3000, 0x10)
d += debug(0x3000, [(0x3000, 10, b'Main.java'), (0x3008, 11, b'Main.java')])
d += load(0x3000, 0x10, 'instance int32 [busy] Demo.Work.Runner::Leaf(int32)[Optimized]')
w(f'{out}/jitdump/move-debug.dump', d)

# --- .gopclntab (as receiver/src/symbolize/go_tests.rs synthetic_table)
def synthetic_table(go116, text=0x1000, big=False):
    e = '>' if big else '<'
    names = b'\0main.a\0main.b\0'
    cutab = struct.pack(e + 'I', 0)
    filetab = b'a.go\0'
    pcfile = bytes([0, 2, 0x20, 0])
    pcln = bytes([22, 0x10, 4, 0x10, 0])
    pctab = pcfile
    pcfile_at, pcln_at = 1, len(pctab)
    pctab += pcln
    def func(entry, name):
        f = struct.pack(e + 'Q', text + entry) if go116 else struct.pack(e + 'I', entry)
        fields = [name, 0, 0, 0, pcfile_at, pcln_at, 0, 0] if go116 else [name, 0, 0, 0, pcfile_at, pcln_at, 0, 0, 0]
        for x in fields:
            f += struct.pack(e + 'I', x)
        return f + b'\0' * 4
    entry_size, func_size = (16, 44) if go116 else (8, 44)
    functab = b''
    funcs_at = 3 * entry_size
    for entry, funcoff in [(0, funcs_at), (0x20, funcs_at + func_size), (0x40, 0)]:
        if go116:
            functab += struct.pack(e + 'QQ', text + entry, funcoff)
        else:
            functab += struct.pack(e + 'II', entry, funcoff)
    functab += func(0, 1) + func(0x20, 8)
    header_words = [2, 1] if go116 else [2, 1, text]
    offsets = []
    at = 8 + 8 * (len(header_words) + 5)
    for part in [names, cutab, filetab, pctab]:
        offsets.append(at)
        at += len(part)
    offsets.append(at)
    magic = 0xfffffffa if go116 else 0xfffffff1
    t = struct.pack(e + 'I', magic) + bytes([0, 0, 1, 8])
    for word in header_words + offsets:
        t += struct.pack(e + 'Q', word)
    return t + names + cutab + filetab + pctab + functab
w(f'{out}/gopclntab/go120.bin', synthetic_table(False))
w(f'{out}/gopclntab/go116.bin', synthetic_table(True))
w(f'{out}/gopclntab/go120-big-endian.bin', synthetic_table(False, big=True))
if len(sys.argv) > 3:
    w(sys.argv[3], synthetic_table(False, text=int(sys.argv[2], 16)))
