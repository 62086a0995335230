//! Tests of the jitdump parser: records built the way V8 writes them (the
//! values are from a Node.js 20 `--perf-prof` dump), fed in every split,
//! corrupt and hostile input, limits, files, and a real Node.js dump.

use std::io::Write;

use super::*;

fn header(magic: u32, size: u32) -> Vec<u8> {
    let mut b = Vec::new();
    for v in [magic, 1, size, 62, 0xDEAD_BEEF, 4242] {
        b.extend_from_slice(&v.to_ne_bytes());
    }
    b.extend_from_slice(&1_700_000_000_000_000u64.to_ne_bytes());
    b.extend_from_slice(&0u64.to_ne_bytes());
    b.resize(size.max(40) as usize, 0);
    b
}

fn record(id: u32, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&id.to_ne_bytes());
    b.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    b.extend_from_slice(&0u64.to_ne_bytes());
    b.extend_from_slice(body);
    b
}

fn load(addr: u64, size: u64, name: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&4242u32.to_ne_bytes());
    body.extend_from_slice(&4243u32.to_ne_bytes());
    for v in [addr, addr, size, 7] {
        body.extend_from_slice(&v.to_ne_bytes());
    }
    body.extend_from_slice(name.as_bytes());
    body.push(0);
    body.resize(body.len() + size as usize, 0xcc);
    record(CODE_LOAD, &body)
}

fn debug(addr: u64, entries: &[(u64, u32, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&addr.to_ne_bytes());
    body.extend_from_slice(&(entries.len() as u64).to_ne_bytes());
    for (a, line, file) in entries {
        body.extend_from_slice(&a.to_ne_bytes());
        body.extend_from_slice(&line.to_ne_bytes());
        body.extend_from_slice(&9u32.to_ne_bytes());
        body.extend_from_slice(file);
        body.push(0);
    }
    body.resize(body.len().next_multiple_of(8), 0);
    record(CODE_DEBUG_INFO, &body)
}

fn moved(old: u64, new: u64, size: u64) -> Vec<u8> {
    let mut body = vec![0u8; 8];
    for v in [new, old, new, size, 7] {
        body.extend_from_slice(&v.to_ne_bytes());
    }
    record(CODE_MOVE, &body)
}

const CODE: u64 = 0x7f0c_6800_91c0;
const NAME: &str = "JS:^defineLazyProperties node:internal/util:598:30";

/// A dump as V8 writes it: debug info (addresses + 0x40, V8's repeated-file
/// marker), its load, an unwinding-info record, a load without lines, close.
fn dump() -> Vec<u8> {
    let mut b = header(MAGIC, 40);
    b.extend(debug(
        CODE,
        &[
            (CODE + 0x40, 598, b"node:internal/util"),
            (CODE + 0x67, 599, b"node:internal/util"),
            (CODE + 0x6c, 600, &[0xff]),
            (CODE + 0x7a, 634, b"node:internal/other"),
        ],
    ));
    b.extend(record(4, &[0u8; 40]));
    b.extend(load(CODE, 0x9e0, NAME));
    b.extend(load(0x2000, 0x20, "Builtin:ArrayPrototypePush"));
    b.extend(record(CODE_CLOSE, &[]));
    b
}

type Found = (String, Option<(String, u32)>);

fn at(dump: &JitDump, address: u64) -> Option<Found> {
    dump.lookup(address)
        .map(|(s, l)| (s.name.to_string(), l.map(|(f, n)| (f.to_string(), n))))
}

fn named(name: &str, line: Option<(&str, u32)>) -> Option<Found> {
    Some((name.into(), line.map(|(f, n)| (f.into(), n))))
}

fn check(dump: &JitDump) {
    let util = "node:internal/util";
    assert_eq!(at(dump, CODE), named(NAME, Some((util, 598))));
    assert_eq!(at(dump, CODE + 0x26), named(NAME, Some((util, 598))));
    assert_eq!(at(dump, CODE + 0x27), named(NAME, Some((util, 599))));
    assert_eq!(at(dump, CODE + 0x2c), named(NAME, Some((util, 600))));
    let other = Some(("node:internal/other", 634));
    assert_eq!(at(dump, CODE + 0x9df), named(NAME, other));
    assert_eq!(at(dump, CODE + 0x9e0), None);
    assert_eq!(at(dump, 0x2000), named("Builtin:ArrayPrototypePush", None));
    assert!(dump.closed());
    assert_eq!(dump.header().map(|h| (h.pid, h.elf_mach)), Some((4242, 62)));
}

#[test]
fn loads_with_lines_fed_in_any_pieces() {
    let bytes = dump();
    for split in 0..=bytes.len() {
        let mut dump = JitDump::new(100);
        let mut stats = dump.feed(&bytes[..split]).unwrap();
        stats += dump.feed(&bytes[split..]).unwrap();
        assert_eq!(
            stats,
            FeedStats {
                added: 2,
                ..FeedStats::default()
            },
            "split at {split}"
        );
        check(&dump);
    }
    let mut dump = JitDump::new(100);
    for byte in bytes.chunks(1) {
        dump.feed(byte).unwrap();
    }
    check(&dump);
    assert_eq!(dump.fed, bytes.len() as u64);
}

#[test]
fn code_bytes_are_not_buffered() {
    let mut bytes = header(MAGIC, 48);
    bytes.extend(load(0x10_0000, 4 << 20, "JS:*big /a.js:1:1"));
    bytes.extend(load(0x90_0000, 0x10, "JS:*after /a.js:9:1"));
    let mut dump = JitDump::new(100);
    for piece in bytes.chunks(64 << 10) {
        dump.feed(piece).unwrap();
        assert!(dump.unit.capacity() <= 2 * MAX_LINE_BYTES);
    }
    assert_eq!(dump.map().len(), 2);
    assert!(at(&dump, 0x4f_ffff).is_some_and(|f| f.0 == "JS:*big /a.js:1:1"));
}

#[test]
fn moved_code_keeps_its_name_and_lines() {
    let mut bytes = dump();
    bytes.extend(moved(CODE, 0x5000_0000, 0x9e0));
    bytes.extend(moved(0xdead, 0x6000_0000, 0x10));
    let mut dump = JitDump::new(100);
    dump.feed(&bytes).unwrap();
    assert_eq!(at(&dump, CODE), None);
    let to = 0x5000_0000;
    assert_eq!(
        at(&dump, to + 0x27),
        named(NAME, Some(("node:internal/util", 599)))
    );
    assert_eq!(at(&dump, 0x6000_0000), None);
}

#[test]
fn unbiased_debug_entries_are_taken_as_they_are() {
    let mut bytes = header(MAGIC, 40);
    bytes.extend(debug(
        0x1000,
        &[(0x1000, 10, b"/x.jl"), (0x1010, 11, b"/x.jl")],
    ));
    bytes.extend(load(0x1000, 0x40, "julia_f_1"));
    let mut dump = JitDump::new(100);
    dump.feed(&bytes).unwrap();
    assert_eq!(at(&dump, 0x100f), named("julia_f_1", Some(("/x.jl", 10))));
    assert_eq!(at(&dump, 0x1010), named("julia_f_1", Some(("/x.jl", 11))));
}

#[test]
fn corrupt_files_are_refused() {
    let mut dump = JitDump::new(100);
    assert!(matches!(
        dump.feed(&header(MAGIC.swap_bytes(), 40)),
        Err(JitDumpError::ForeignByteOrder(0x4454_694A))
    ));
    assert!(dump.failed());
    assert!(
        matches!(dump.feed(&load(0x1000, 0x10, "x")), Ok(s) if s == FeedStats::default()),
        "nothing more is parsed"
    );
    let mut dump = JitDump::new(100);
    assert!(matches!(
        dump.feed(b"\x7fELF"),
        Err(JitDumpError::NotJitDump(_))
    ));
    let mut dump = JitDump::new(100);
    assert!(matches!(
        dump.feed(&header(MAGIC, 8)),
        Err(JitDumpError::BadHeader(8))
    ));
    for size in [0u32, 15, (MAX_RECORD_BYTES + 1) as u32, u32::MAX] {
        let mut dump = JitDump::new(100);
        let mut bytes = header(MAGIC, 40);
        bytes.extend(load(0x1000, 0x10, "ok"));
        let offset = bytes.len() as u64;
        bytes.extend_from_slice(&CODE_LOAD.to_ne_bytes());
        bytes.extend_from_slice(&size.to_ne_bytes());
        let error = dump.feed(&bytes).unwrap_err();
        assert!(
            matches!(error, JitDumpError::BadRecord { size: s, offset: o } if s == size && o == offset),
            "{error}"
        );
        assert_eq!(dump.map().len(), 1, "what came before is kept");
    }
}

#[test]
fn malformed_records_are_skipped_and_counted() {
    let mut bytes = header(MAGIC, 40);
    // A load too short for its fields, one whose name is not terminated
    // within the record, one with an impossible code size, one nameless.
    bytes.extend(record(CODE_LOAD, &[1, 2, 3]));
    bytes.extend(record(CODE_LOAD, &[b'x'; 60]));
    let mut huge = load(0x3000, 0x10, "huge");
    huge[16 + 24..16 + 32].copy_from_slice(&(1u64 << 40).to_ne_bytes());
    bytes.extend(huge);
    bytes.extend(load(0x3100, 0x10, " "));
    // Debug info claiming 2^64-1 entries, then one cut in its file name.
    let mut lying = Vec::new();
    lying.extend_from_slice(&0x4000u64.to_ne_bytes());
    lying.extend_from_slice(&u64::MAX.to_ne_bytes());
    bytes.extend(record(CODE_DEBUG_INFO, &lying));
    let mut cut = debug(0x4000, &[(0x4040, 3, b"/f.js")]);
    cut.truncate(cut.len() - 8);
    let size = cut.len() as u32;
    cut[4..8].copy_from_slice(&size.to_ne_bytes());
    bytes.extend(cut);
    bytes.extend(record(CODE_MOVE, &[0; 8]));
    // A name longer than the limit.
    bytes.extend(load(0x5000, 0x10, &"n".repeat(MAX_LINE_BYTES + 10)));
    bytes.extend(load(0x4000, 0x10, "JS:*fine /f.js:1:1"));
    let mut dump = JitDump::new(100);
    let stats = dump.feed(&bytes).unwrap();
    assert_eq!(
        stats,
        FeedStats {
            added: 1,
            malformed: 7,
            dropped_over_limit: 0,
            too_long: 1
        }
    );
    assert_eq!(dump.map().len(), 1);
    assert_eq!(
        at(&dump, 0x4000).map(|f| f.0),
        Some("JS:*fine /f.js:1:1".into())
    );
}

#[test]
fn limits_are_kept() {
    let mut bytes = header(MAGIC, 40);
    for i in 0..10u64 {
        let code = 0x1000 * (i + 1);
        bytes.extend(debug(
            code,
            &[(code + 0x40, 1, b"/a.js"), (code + 0x48, 2, b"/a.js")],
        ));
        bytes.extend(load(code, 0x10, &format!("f{i}")));
    }
    let mut dump = JitDump::new(8).with_max_line_entries(6);
    let stats = dump.feed(&bytes).unwrap();
    assert_eq!((stats.added, stats.dropped_over_limit), (8, 2 + 7));
    assert_eq!(dump.map().line_entries(), 6);
    assert_eq!(at(&dump, 0x3008), named("f2", Some(("/a.js", 2))));
    assert_eq!(at(&dump, 0x4008), named("f3", None), "named without lines");
    // Orphaned debug info (no load follows) is bounded too.
    let mut dump = JitDump::new(8);
    let mut bytes = header(MAGIC, 40);
    for i in 0..3 * MAX_PENDING as u64 {
        bytes.extend(debug(i << 12, &[(i << 12, 1, b"/a.js")]));
    }
    dump.feed(&bytes).unwrap();
    assert!(dump.pending.len() <= MAX_PENDING && dump.pending_entries <= MAX_PENDING);
}

#[test]
fn mutated_dumps_never_panic() {
    let base = dump();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..3000 {
        let mut bytes = base.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % bytes.len();
            bytes[at] = next() as u8;
        }
        let mut dump = JitDump::new(16);
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let n = 1 + (next() as usize) % 300;
            let (piece, after) = rest.split_at(n.min(rest.len()));
            rest = after;
            if dump.feed(piece).is_err() {
                break;
            }
        }
        assert!(dump.map().len() <= 16);
        let _ = dump.lookup(CODE + next() % 0x1000);
    }
}

#[test]
fn a_file_is_read_as_it_grows_and_again_when_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jit-1.dump");
    let bytes = dump();
    let mut out = std::fs::File::create(&path).unwrap();
    // The runtime writes through a buffer: a record can be cut anywhere.
    out.write_all(&bytes[..100]).unwrap();
    let mut file = JitDumpFile::new(path.clone(), 100).with_max_read_per_refresh(64);
    assert_eq!(file.refresh().unwrap(), FeedStats::default());
    assert!(file.lookup(CODE).is_none());
    out.write_all(&bytes[100..]).unwrap();
    let mut added = 0;
    while file.offset() < bytes.len() as u64 {
        added += file.refresh().unwrap().added;
    }
    assert_eq!(added, 2);
    check(file.dump());
    // Replaced by another dump.
    drop(out);
    std::fs::remove_file(&path).unwrap();
    let mut other = header(MAGIC, 40);
    other.extend(load(0x9000, 0x10, "JS:*new /b.js:1:1"));
    std::fs::write(&path, &other).unwrap();
    file.refresh().unwrap();
    while file.offset() < other.len() as u64 {
        file.refresh().unwrap();
    }
    assert!(file.lookup(CODE).is_none());
    assert!(file.lookup(0x9000).is_some());
    // Corrupt: the error once, then what is appended is skipped unread.
    std::fs::write(&path, header(MAGIC.swap_bytes(), 40)).unwrap();
    let mut file = JitDumpFile::new(path.clone(), 100);
    assert!(matches!(
        file.refresh(),
        Err(JitDumpError::ForeignByteOrder(_))
    ));
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(&[0; 100])
        .unwrap();
    assert_eq!(file.refresh().unwrap(), FeedStats::default());
    assert_eq!(file.offset(), 140);
}

#[test]
fn implausible_file_names_end_the_table() {
    let mut bytes = header(MAGIC, 40);
    // As Node.js 20 writes them for a CommonJS script: the first entry's
    // name is garbage with a NUL inside, so what follows is misaligned.
    bytes.extend(debug(
        0x1000,
        &[
            (0x1040, 3, b"/ok.js"),
            (0x1050, 4, b"\xa5R\x01\0\0garbage"),
            (0x1060, 5, b"x"),
        ],
    ));
    bytes.extend(load(0x1000, 0x40, "JS:^baz /tmp/pmx/x.js:3:52"));
    bytes.extend(debug(0x2000, &[(0x2040, 1, b"")]));
    bytes.extend(load(0x2000, 0x40, "JS:^alpha /tmp/pmx/x.js:1:15"));
    bytes.extend(debug(0x3000, &[(0x3040, 7, b"file:///srv/my%20app/y.mjs")]));
    bytes.extend(load(0x3000, 0x40, "JS:*f file:///srv/my%20app/y.mjs:7:1"));
    let mut dump = JitDump::new(100);
    let stats = dump.feed(&bytes).unwrap();
    assert_eq!((stats.added, stats.malformed), (3, 2));
    assert_eq!(
        at(&dump, 0x1030).and_then(|f| f.1),
        Some(("/ok.js".into(), 3))
    );
    assert_eq!(at(&dump, 0x2010).map(|f| f.1), Some(None));
    assert_eq!(
        at(&dump, 0x3000).and_then(|f| f.1),
        Some(("/srv/my app/y.mjs".into(), 7))
    );
}

/// A real dump: Node.js `--perf-prof` on a hot function of an ES module
/// (skipped without `/usr/bin/node`). Checks the layout, V8's names, and
/// that its debug entries (biased by 0x40) give the function's own lines.
#[test]
fn a_real_node_dump() {
    let node = std::path::Path::new("/usr/bin/node");
    if !node.exists() {
        crate::test_support::missing_prerequisite("no /usr/bin/node");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("hot.mjs");
    std::fs::write(
        &script,
        "function hot(n) {\n  let s = 0;\n  for (let i = 0; i < n; i++) s += i % 7;\n  return s;\n}\n\
         const end = Date.now() + 300; let z = 0;\n\
         while (Date.now() < end) z += hot(10000);\n",
    )
    .unwrap();
    let output = std::process::Command::new(node)
        .current_dir(dir.path())
        .args(["--perf-prof", "--interpreted-frames-native-stack"])
        .arg(&script)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let path = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "dump"))
        .expect("node wrote no jit-PID.dump");
    let mut file = JitDumpFile::new(path, 1 << 20);
    while file.refresh().unwrap() != FeedStats::default() {}
    let dump = file.dump();
    assert!(dump.header().is_some_and(|h| h.version == 1));
    assert!(dump.map().len() > 100, "{} symbols", dump.map().len());
    let script = script.to_string_lossy();
    let hot: Vec<&PerfMapSymbol> = dump
        .map()
        .symbols()
        .filter(|s| s.name.starts_with("JS:") && s.name.ends_with(&format!("{script}:1:13")))
        .collect();
    assert!(!hot.is_empty(), "no symbol of hot()");
    let with_lines = hot
        .iter()
        .find(|s| s.lines.is_some())
        .expect("no line table for hot()");
    let mut lines = std::collections::BTreeSet::new();
    for offset in 0..with_lines.size {
        let (symbol, line) = dump.lookup(with_lines.start + offset).unwrap();
        assert!(Arc::ptr_eq(&symbol.name, &with_lines.name));
        if let Some((file, line)) = line {
            assert_eq!(*file, *script);
            lines.insert(line);
        }
    }
    assert!(
        lines.iter().all(|l| (1..=5).contains(l)) && lines.len() > 1,
        "{lines:?}"
    );
}
