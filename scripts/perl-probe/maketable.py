#!/usr/bin/env python3
"""maketable.py OUTDIR... : merge out/<ver>/layout.txt files (written by run.sh) into one markdown table."""
import re, sys, os
here = os.path.dirname(os.path.abspath(__file__))
vs = sys.argv[1:] or ['v5.36.0', 'v5.40.1', 'v5.42.3', 'v5.44.0']
data, keys = {}, []
for v in vs:
    for line in open(os.path.join(here, 'out', v, 'layout.txt')):
        m = re.match(r'(\S+)\s+(.*)$', line.rstrip('\n'))
        if not m:
            continue
        k, rest = m.group(1), re.sub(r'\s+', ' ', m.group(2).strip())
        if k.startswith('off.rcpv.len'):
            k, rest = 'off.rcpv.len (includes the NUL)', rest.replace('NUL) ', '')
        rest = re.sub(r'^(\d+) size (\d+)$', r'\1 (\2)', rest)
        m2 = re.match(r'^(0x[0-9a-f]+) \((-?\d+)\)$', rest)
        if m2:
            rest = '%s = %s' % (m2.group(1), m2.group(2))
        rest = rest.replace(' (bitfield op_type:9, low 9 bits of the U16 at this offset)', ' (bitfield :9)')
        rest = rest.replace(' (PERL_GET_CONTEXT is the TLS var PL_current_context)', '')
        rest = rest.replace('absent (RCPV_LEN not defined): cop_file is a plain savesharedpv() string', 'no struct rcpv')
        if k not in keys:
            keys.append(k)
        data[(v, k)] = rest
print('| item | ' + ' | '.join(v.lstrip('v') for v in vs) + ' |')
print('|---' * (len(vs) + 1) + '|')
for k in keys:
    vals = [data.get((v, k), '—') for v in vs]
    kind, _, name = k.partition('.')
    if kind == 'sizeof':
        name = 'sizeof(' + name + ')'
    if len(set(vals)) > 1 and k != 'hdr.PERL_VERSION_STRING':
        name = '**' + name + '** ⚠'
    print('| %s | %s |' % (name, ' | '.join(vals)))
