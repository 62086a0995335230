#!/bin/sh
# run.sh CHROOT [OUTNAME]
#   Rebuild and run the perl layout probe against the perl installed in CHROOT
#   ("/" = this host). Needs perl, libperl-dev, gcc, binutils inside CHROOT.
#   Results go to out/OUTNAME beside this script (default: the perl version).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
C=${1:?usage: run.sh CHROOT [OUTNAME]}
C=${C%/}
if [ -z "$C" ]; then RUN="sh -c"; else RUN="chroot $C sh -c"; fi
mkdir -p "$C/tmp/perl-probe"
cp "$HERE/probe.c" "$HERE/test.pl" "$C/tmp/perl-probe/"
cat > "$C/tmp/perl-probe/inner.sh" <<'INNER'
set -eu
cd /tmp/perl-probe
export LC_ALL=C
echo "### perl -V:useithreads -V:usemultiplicity -V:version -V:archname -V:useshrplib -V:libperl"
perl -V:useithreads -V:usemultiplicity -V:version -V:archname -V:useshrplib -V:libperl
echo "### dpkg -l perl libperl-dev gcc"
dpkg-query -W -f='${Package} ${Version}\n' perl perl-base libperl-dev gcc 2>/dev/null || true
CCOPTS=$(perl -MExtUtils::Embed -e ccopts)
LDOPTS=$(perl -MExtUtils::Embed -e ldopts)
echo "### ccopts: $CCOPTS"
echo "### ldopts: $LDOPTS"
echo "### gcc: $(gcc --version | head -1)"
gcc -O0 -Wall -Wno-unused-variable -o probe probe.c $CCOPTS $LDOPTS
echo "### ./probe (layout)"
./probe
echo "### ./probe --runtime test.pl"
./probe --runtime test.pl
LIBPERL=$(perl -MConfig -e 'print "$Config{archlibexp}/CORE/$Config{libperl}"')
echo "### libperl (Config): $LIBPERL -> $(readlink -f "$LIBPERL" 2>/dev/null || echo missing)"
for f in /usr/lib/x86_64-linux-gnu/libperl.so*; do echo "### file $f -> $(readlink -f $f)"; done
SO=$(ls /usr/lib/x86_64-linux-gnu/libperl.so.5.* | grep -v '\.so\.5\.[0-9]*$' | head -1)
[ -n "$SO" ] || SO=$(readlink -f /usr/lib/x86_64-linux-gnu/libperl.so)
PERLBIN=$(readlink -f /usr/bin/perl)
for B in "$SO" "$PERLBIN"; do
  echo "### readelf --dyn-syms $B | PL_curinterp PL_current_context PL_thr_key Perl_runops_standard Perl_pp_entersub"
  readelf -W --dyn-syms "$B" | awk 'NR<=3 || /[ ](PL_curinterp|PL_current_context|PL_thr_key|Perl_runops_standard|Perl_runops_debug|Perl_pp_entersub|PL_runops_std|PL_op_name)$/'
  echo "### nm -D $B (same symbols)"
  nm -D "$B" | grep -E ' (PL_curinterp|PL_current_context|PL_thr_key|Perl_runops_standard|Perl_pp_entersub)$' || true
  echo "### readelf -S $B | .tbss/.tdata"
  readelf -W -S "$B" | grep -E '\.tbss|\.tdata|\.symtab' || echo "(no .tbss/.tdata/.symtab)"
  echo "### readelf -lW $B | TLS"
  readelf -W -l "$B" | grep -E 'TLS' || echo "(no PT_TLS)"
  echo "### file-type: $(readelf -h "$B" | awk '/Type:/{print $2}')"
done
echo "### ldd $PERLBIN"
ldd "$PERLBIN"
INNER
VER=$($RUN "perl -e 'print \$^V'")
OUT="$HERE/out/${2:-$VER}"
mkdir -p "$OUT"
$RUN "sh /tmp/perl-probe/inner.sh" > "$OUT/report.txt" 2>&1
# The layout part alone, for maketable.py.
awk '/^### \.\/probe \(layout\)/{f=1;next} /^### /{f=0} f' "$OUT/report.txt" > "$OUT/layout.txt"
echo "wrote $OUT/report.txt and $OUT/layout.txt"
