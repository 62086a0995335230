//! Tests of the perf map parser: real lines fed in every split, overlaps,
//! shared names, bad and hostile input, and files that grow, get replaced
//! or are too big for one refresh.

use std::io::Write;

use super::*;

fn names(map: &PerfMap, addresses: &[u64]) -> Vec<Option<String>> {
    addresses
        .iter()
        .map(|&a| map.lookup(a).map(|s| s.name.to_string()))
        .collect()
}

fn some(names: &[&str]) -> Vec<Option<String>> {
    names
        .iter()
        .map(|n| (!n.is_empty()).then(|| (*n).to_owned()))
        .collect()
}

/// Lines as Node.js 20 and .NET Core 3.1 wrote them.
const REAL: &str = "\
18c5880 100 Builtin:CallFunction_ReceiverIsNullOrUndefined
10b090e2d36 26 JS:~alpha file:///tmp/pmx/y.mjs:1:15
7f6b9b7c5f80 1d8 JS:*alpha file:///tmp/pmx/y.mjs:1:15
10b090e223e 6 JS:~ file:///tmp/pmx/y.mjs:12:9
00007F315A231DA0 19 instance int32 [busy] Demo.Work.Runner::Leaf(int32)[Optimized]
00007F315A220078 48 stub<1> AllocateTemporaryEntryPoints<PRECODE_FIXUP>
0x7f0000001000 0x40 Lcom/example/Main;::work
";

#[test]
fn parses_real_lines_split_anywhere() {
    for split in 0..REAL.len() {
        let mut map = PerfMap::new(100);
        let mut stats = map.feed(&REAL.as_bytes()[..split]);
        stats += map.feed(&REAL.as_bytes()[split..]);
        assert_eq!(stats.added, 7, "split at {split}");
        assert_eq!(
            names(
                &map,
                &[0x010b_090e_2d36, 0x010b_090e_2d5b, 0x010b_090e_2d5c]
            ),
            some(&[
                "JS:~alpha file:///tmp/pmx/y.mjs:1:15",
                "JS:~alpha file:///tmp/pmx/y.mjs:1:15",
                ""
            ])
        );
        assert_eq!(
            names(
                &map,
                &[0x7F31_5A23_1DB8, 0x7f00_0000_103f, 0x010b_090e_223e]
            ),
            some(&[
                "instance int32 [busy] Demo.Work.Runner::Leaf(int32)[Optimized]",
                "Lcom/example/Main;::work",
                "JS:~ file:///tmp/pmx/y.mjs:12:9"
            ])
        );
    }
}

#[test]
fn later_symbols_replace_the_ones_they_overlap() {
    let mut map = PerfMap::new(100);
    map.feed(b"1000 100 old_a\n1100 100 old_b\n1200 100 old_c\n1300 10 old_d\n");
    // Reused memory: the end of old_a, all of old_b, the start of old_c.
    map.feed(b"1080 1a0 new\n");
    assert_eq!(
        names(&map, &[0x1000, 0x1080, 0x121f, 0x1220, 0x1250, 0x1300]),
        some(&["", "new", "new", "", "", "old_d"])
    );
    assert_eq!(map.len(), 2);
    // Exactly adjacent symbols do not overlap; zero-size ones are 1 byte.
    map.feed(b"1400 0 tiny\n1401 1 next\n12ff 1 before_d\n");
    assert_eq!(
        names(&map, &[0x1400, 0x1401, 0x1402, 0x12ff, 0x1300]),
        some(&["tiny", "next", "", "before_d", "old_d"])
    );
    assert_eq!(map.lookup(0x1400).map(|s| s.size), Some(1));
    // The top of the address space does not overflow.
    map.feed(b"ffffffffffffff00 1000 top\n");
    assert_eq!(names(&map, &[u64::MAX]), some(&["top"]));
}

#[test]
fn names_are_shared_and_released() {
    let mut map = PerfMap::new(100);
    map.feed(b"1000 10 JS:*hot /a.js:1:1\n2000 10 JS:*hot /a.js:1:1\n");
    let a = map.lookup(0x1000).map(|s| s.name.clone());
    let b = map.lookup(0x2000).map(|s| s.name.clone());
    assert!(matches!((a, b), (Some(a), Some(b)) if Arc::ptr_eq(&a, &b)));
    let before = map.heap_bytes();
    map.feed(b"1000 1001 other\n");
    assert_eq!(map.len(), 1);
    assert!(map.names.len() == 1, "unused names are forgotten");
    assert!(map.heap_bytes() < before);
}

#[test]
fn corner_cases_of_sharing_and_placing() {
    // A string whose hash another string holds is not shared, nor lost.
    let mut interner = Interner::default();
    let hash = interner.hasher.hash_one("a");
    interner.by_hash.insert(hash, Arc::from("b"));
    let a = interner.intern("a");
    assert_eq!(&*a, "a");
    interner.release(a);
    assert_eq!(interner.by_hash.get(&hash).map(|s| &**s), Some("b"));
    // At the top of the address space a symbol replaces one of the same start.
    let mut map = PerfMap::new(10);
    map.feed(b"ffffffffffffffff 10 first\nffffffffffffffff 1 second\n");
    assert_eq!(map.len(), 1);
    assert_eq!(names(&map, &[u64::MAX]), some(&["second"]));
    assert_eq!(map.names.len(), 1);
}

#[test]
fn bad_lines_are_counted_and_memory_is_bounded() {
    let mut map = PerfMap::new(2);
    let stats = map.feed(
        b"zz 10 bad\n\n  \r\n10 nothex name\n10 10\n+1 1 sign\n11111111111111111 1 wide\n\
          1 1 a\n2 1 b\n3 1 c\n4 0 zero-size\n",
    );
    assert_eq!(
        stats,
        FeedStats {
            added: 2,
            malformed: 5,
            dropped_over_limit: 2,
            too_long: 0
        }
    );
    let mut long = vec![b'x'; MAX_LINE_BYTES * 3];
    long.push(b'\n');
    let mut map = PerfMap::new(10);
    let mut stats = FeedStats::default();
    for piece in long.chunks(1000) {
        stats += map.feed(piece);
        assert!(map.heap_bytes() <= 2 * MAX_LINE_BYTES, "not buffered");
    }
    stats += map.feed(b"5 1 after\n");
    assert_eq!((stats.added, stats.too_long, stats.malformed), (1, 1, 0));
    assert_eq!(names(&map, &[5]), some(&["after"]));
    // A long line completed in one feed, after a partial start.
    map.feed(b"6 1 ");
    let stats = map.feed(&long);
    assert_eq!((stats.too_long, stats.malformed), (1, 0));
    assert_eq!(map.feed(b"\xff\xfe 1 x\n").malformed, 1);
    assert_eq!(map.feed(b"7 1 caf\xc3\xa9 \xff\n").added, 1);
    assert_eq!(names(&map, &[7]), some(&["café \u{fffd}"]));
}

#[test]
fn arbitrary_bytes_never_panic() {
    let mut seed = 0x1234_5678_u64;
    let mut next = move || {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) as u8
    };
    let alphabet = b"0123456789abcdefxX \t\n\r:JS*~[]\xff";
    let mut map = PerfMap::new(64);
    for _ in 0..2000 {
        let len = usize::from(next()) % 200;
        let bytes: Vec<u8> = (0..len)
            .map(|_| alphabet[usize::from(next()) % alphabet.len()])
            .collect();
        map.feed(&bytes);
        assert!(map.len() <= 64);
        let _ = map.lookup(u64::from(next()) << 8);
    }
}

#[test]
fn a_file_is_read_as_it_grows_and_again_when_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("perf-1.map");
    let mut file = PerfMapFile::new(path.clone(), 100);
    assert!(file.refresh().is_err(), "not there yet");
    let mut out = std::fs::File::create(&path).unwrap();
    write!(out, "100 10 first\n200 10 sec").unwrap();
    assert_eq!(file.refresh().unwrap().added, 1);
    writeln!(out, "ond").unwrap();
    assert_eq!(file.refresh().unwrap().added, 1);
    assert_eq!(file.refresh().unwrap(), FeedStats::default());
    assert_eq!(file.lookup(0x205).map(|s| &*s.name), Some("second"));
    assert_eq!(file.totals().added, 2);
    // Truncated in place (same inode): read again from the start.
    out.set_len(0).unwrap();
    drop(out);
    std::fs::write(&path, "150 10 again\n").unwrap();
    file.refresh().unwrap();
    assert!(file.lookup(0x100).is_none(), "a truncated file starts over");
    assert_eq!(file.lookup(0x150).map(|s| &*s.name), Some("again"));
    // Replaced by another file (another inode), even a longer one.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, "300 10 third\n400 10 fourth, a longer line\n").unwrap();
    file.refresh().unwrap();
    assert!(file.lookup(0x150).is_none(), "a new file starts over");
    assert_eq!(file.lookup(0x300).map(|s| &*s.name), Some("third"));
    assert_eq!(file.offset(), 42);
}

#[test]
fn a_huge_file_is_read_over_several_refreshes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("perf-2.map");
    let text: String = (0..20_000)
        .map(|i| format!("{:x} 10 JS:*f{i} /srv/app.js:{i}:1\n", 0x1000 + i * 0x10))
        .collect();
    std::fs::write(&path, &text).unwrap();
    let mut file = PerfMapFile::new(path, 1 << 20).with_max_read_per_refresh(100_000);
    let mut refreshes = 0;
    while file.offset() < text.len() as u64 {
        let stats = file.refresh().unwrap();
        assert!(stats.added > 0 && stats.malformed == 0);
        refreshes += 1;
    }
    assert_eq!(refreshes, text.len().div_ceil(100_000));
    assert_eq!(file.map().len(), 20_000);
    assert_eq!(
        file.lookup(0x1000 + 19_999 * 0x10 + 0xf).map(|s| &*s.name),
        Some("JS:*f19999 /srv/app.js:19999:1")
    );
}
