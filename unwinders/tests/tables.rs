//! Unwind tables built from real binaries, checked against binutils:
//! `readelf --debug-dump=frames-interp` for every FDE row, `objdump -d` for
//! every PLT instruction. Fixtures are compiled here with `cc`/`c++`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;

use icecore_unwinders::native::{CfaRule, RbpRule, dwarf::MAX_TABLE_ROWS};
use icecore_unwinders::table::{TableError, UnwindTable};
use support::{LIBC, check_against_readelf, check_invariants, compile};

/// A C program with frames of every shape the table distinguishes.
const C_FIXTURE: &str = r#"
#include <alloca.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }

/* alloca: GCC keeps a frame pointer here even with -fomit-frame-pointer (CFA = rbp + 16). */
__attribute__((noinline)) int with_alloca(int n) {
    char *p = alloca(n + 16);
    memset(p, n, n + 16);
    return p[n / 2] + leaf(n);
}

/* A frame larger than 64 KiB: its CFA offset does not fit the row (Unsupported). */
__attribute__((noinline)) int big_frame(int n) {
    volatile char big[70000];
    big[n % 70000] = (char)n;
    return big[(n * 7) % 70000] + leaf(n);
}

/* Enough live values that rbp is used (and saved) as a general register. */
__attribute__((noinline)) long many_registers(long a, long b, long c, long d) {
    long v[12];
    for (int i = 0; i < 12; i++) v[i] = leaf((int)(a + i)) * b + c * i + d;
    long s = 0;
    for (int i = 0; i < 12; i++) s += v[i] * leaf((int)v[(i + 5) % 12]);
    return s;
}

int main(int argc, char **argv) {
    long r = with_alloca(argc + 10) + big_frame(argc) + many_registers(argc, 2, 3, 4);
    printf("%ld %s\n", r, argv[0]);
    return (int)(r & 1);
}
"#;

const CPP_FIXTURE: &str = r#"
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

struct Shape { virtual ~Shape() = default; virtual double area() const = 0; };
struct Square : Shape { double s; explicit Square(double s) : s(s) {} double area() const override { return s * s; } };

template <typename T> __attribute__((noinline)) T sum(const std::vector<T> &v) {
    T t{};
    for (const auto &x : v) t += x;
    return t;
}

__attribute__((noinline)) int thrower(int n) {
    if (n > 3) throw std::runtime_error("too big: " + std::to_string(n));
    return n;
}

int main(int argc, char **) {
    std::vector<std::unique_ptr<Shape>> shapes;
    for (int i = 0; i < argc + 3; i++) shapes.push_back(std::make_unique<Square>(i));
    std::vector<double> areas;
    for (auto &s : shapes) areas.push_back(s->area());
    try { thrower(argc + 5); } catch (const std::exception &e) { std::puts(e.what()); }
    std::printf("%f %d\n", sum(areas), sum(std::vector<int>{1, 2, argc}));
}
"#;

fn build(path: &Path) -> UnwindTable {
    let data = std::fs::read(path).unwrap();
    let table = UnwindTable::from_elf(&data).unwrap();
    check_invariants(&table);
    table
}

/// Every row of every FDE agrees with readelf; returns the table.
fn check_all(path: &Path) -> UnwindTable {
    let table = build(path);
    assert_eq!(table.stats().overlapping_fdes, 0, "{table:?}");
    let (checked, _) = check_against_readelf(path, &table, |_| true);
    assert!(checked > 0);
    println!(
        "{}: {} rows ({} bytes), {} readelf rows checked, {:?}",
        path.display(),
        table.len(),
        table.size_bytes(),
        checked,
        table.stats()
    );
    table
}

/// The rows covering the function `name` of `path`.
fn function_rows(
    path: &Path,
    table: &UnwindTable,
    name: &str,
) -> Vec<icecore_unwinders::native::UnwindRow> {
    let symbols = support::symbols(path);
    let (start, size, _) = symbols
        .iter()
        .find(|s| s.2 == name)
        .unwrap_or_else(|| panic!("{name}"));
    (*start..start + size)
        .filter_map(|pc| table.lookup(pc))
        .collect()
}

#[test]
fn libc_matches_readelf() {
    let table = check_all(Path::new(LIBC));
    assert!(table.len() > 10_000, "{}", table.len());
    // The outermost frames: clone3 and _start-like entries mark the end.
    assert!(
        table
            .rows()
            .iter()
            .any(|r| r.cfa_rule() == CfaRule::EndOfStack)
    );
    assert!(table.rows().iter().any(|r| r.cfa_rule() == CfaRule::Plt));
}

#[test]
fn own_executable_matches_readelf() {
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let table = check_all(&exe);
    assert!(table.len() > 1_000);
}

#[test]
fn c_program_matches_readelf() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(
        dir.path(),
        "cc",
        "frames",
        C_FIXTURE,
        &["-O2", "-fomit-frame-pointer", "-g"],
    );
    let table = check_all(&exe);
    let rules = |name| -> Vec<CfaRule> {
        function_rows(&exe, &table, name)
            .iter()
            .map(|r| r.cfa_rule())
            .collect()
    };
    assert!(rules("with_alloca").contains(&CfaRule::Rbp));
    assert!(rules("big_frame").contains(&CfaRule::Unsupported));
    assert!(rules("leaf").iter().all(|&r| r == CfaRule::Rsp));
    // main keeps values in rbx, rbp, r12 and r13, saving them first.
    let saves_rbp = function_rows(&exe, &table, "main")
        .iter()
        .any(|r| r.rbp_rule() == RbpRule::CfaOffset && r.cfa_rule() == CfaRule::Rsp);
    assert!(saves_rbp, "main saves rbp as a callee-saved register");
}

#[test]
fn cpp_program_matches_readelf() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "c++", "shapes", CPP_FIXTURE, &["-O2", "-g"]);
    check_all(&exe);
}

#[test]
fn debug_frame_alone_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "-O2",
        "-fomit-frame-pointer",
        "-g",
        "-fno-asynchronous-unwind-tables",
    ];
    let exe = compile(dir.path(), "cc", "debugframe", C_FIXTURE, &flags);
    let table = check_all(&exe);
    assert!(table.stats().debug_frame_fdes >= 4, "{:?}", table.stats());
    assert!(
        function_rows(&exe, &table, "with_alloca")
            .iter()
            .any(|r| r.cfa_rule() == CfaRule::Rbp)
    );
}

#[test]
fn debug_frame_wins_over_eh_frame() {
    let dir = tempfile::tempdir().unwrap();
    // Both sections describe every function of this file.
    let source = format!("__asm__(\".cfi_sections .eh_frame, .debug_frame\");\n{C_FIXTURE}");
    let flags = ["-O2", "-fomit-frame-pointer", "-g", "-fno-toplevel-reorder"];
    let exe = compile(dir.path(), "cc", "both", &source, &flags);
    let table = build(&exe);
    let stats = table.stats();
    assert!(
        stats.debug_frame_fdes >= 4 && stats.eh_frame_fdes > stats.debug_frame_fdes,
        "{stats:?}"
    );
    assert_eq!(stats.overlapping_fdes, stats.debug_frame_fdes, "{stats:?}");
    // The rows are .debug_frame's, and the .eh_frame FDEs they replaced say the same.
    let (from_debug_frame, _) = check_against_readelf(&exe, &table, |f| f.debug_frame);
    let (all, _) = check_against_readelf(&exe, &table, |_| true);
    assert!(from_debug_frame > 0 && all > from_debug_frame);
}

#[test]
fn compressed_debug_frame_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["-O2", "-g", "-gz", "-fno-asynchronous-unwind-tables"];
    let exe = compile(dir.path(), "cc", "compressed", C_FIXTURE, &flags);
    let table = build(&exe);
    assert!(table.stats().debug_frame_compressed, "{:?}", table.stats());
    assert_eq!(table.stats().debug_frame_fdes, 0);
    // main's rows are missing: its PCs fall back to frame pointers.
    let symbols = support::symbols(&exe);
    let main = symbols.iter().find(|s| s.2 == "main").unwrap();
    let row = table.lookup(main.0);
    assert!(
        row.is_none_or(|r| r.cfa_rule() == CfaRule::NoInfo),
        "{row:?}"
    );
}

/// One FDE gimli refuses to evaluate (`DW_CFA_def_cfa_offset` after a CFA
/// expression, as in libgcrypt): its rows are `Unsupported` from there on,
/// and the rest of the file is unaffected.
#[test]
fn a_malformed_fde_costs_only_its_rows() {
    let source = r#"
__asm__(".globl odd_cfi\n.type odd_cfi, @function\nodd_cfi:\n.cfi_startproc\n"
        "push %rbx\n.cfi_adjust_cfa_offset 8\n"
        ".cfi_escape 0x0f, 0x02, 0x77, 0x10\n" /* DW_CFA_def_cfa_expression: rsp + 16 */
        "nop\n.cfi_def_cfa_offset 16\n"
        "pop %rbx\nret\n.cfi_endproc\n.size odd_cfi, .-odd_cfi\n");
void odd_cfi(void);
int main(void) { odd_cfi(); return 0; }
"#;
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "cc", "odd", source, &["-O2"]);
    let table = build(&exe);
    assert_eq!(table.stats().malformed_fdes, 1, "{:?}", table.stats());
    let symbols = support::symbols(&exe);
    let odd = symbols.iter().find(|s| s.2 == "odd_cfi").unwrap().0;
    let rule = |pc| table.lookup(pc).map(|r| (r.cfa_rule(), r.cfa_offset));
    assert_eq!(rule(odd), Some((CfaRule::Rsp, 8)));
    assert_eq!(
        rule(odd + 1),
        Some((CfaRule::Unsupported, 0)),
        "the expression"
    );
    assert_eq!(
        rule(odd + 2),
        Some((CfaRule::Unsupported, 0)),
        "the malformed rest"
    );
    let main = symbols.iter().find(|s| s.2 == "main").unwrap().0;
    assert_eq!(rule(main).map(|r| r.0), Some(CfaRule::Rsp));
}

/// For every instruction of every PLT section: the CFA offset the table
/// gives equals rsp + 8 × (1 + pushes so far in its 16-byte entry), PLT0
/// counting the entry's push; objdump decodes the instructions.
fn check_plt(path: &Path) -> usize {
    let table = build(path);
    let mut checked = 0;
    for (name, start, _) in support::plt_sections(path) {
        let mut pushes = 0u64;
        let mut entry = u64::MAX;
        for (address, mnemonic) in support::objdump_instructions(path, &name) {
            let this_entry = (address - start) / 16;
            if this_entry != entry || name != ".plt" {
                entry = this_entry;
                pushes = u64::from(name == ".plt" && entry == 0);
            }
            let want = 8 + 8 * pushes;
            let row = table
                .lookup(address)
                .unwrap_or_else(|| panic!("{name} {address:#x}: no row"));
            let got = match row.cfa_rule() {
                CfaRule::Rsp => u64::from(row.cfa_offset),
                CfaRule::Plt => 8 + if address & 15 >= 11 { 8 } else { 0 },
                other => panic!("{}: {name} {address:#x}: {other:?}", path.display()),
            };
            assert_eq!(
                got,
                want,
                "{}: {name} {address:#x} ({mnemonic})",
                path.display()
            );
            if mnemonic.starts_with("push") {
                pushes += 1;
            }
            checked += 1;
        }
    }
    checked
}

/// The CFA expressions beyond the PLT's: glibc's signal trampoline becomes a
/// `SignalFrame` row, and OpenSSL's saved-rsp expressions `RspDeref` or
/// `RbpDeref` rows whose (offset, addend) readelf also prints.
#[test]
fn expression_rules_of_system_libraries() {
    let libc = Path::new(LIBC);
    let table = build(libc);
    let trampolines: Vec<_> = support::readelf_fdes(libc)
        .into_iter()
        .filter(|f| {
            f.rows
                .iter()
                .any(|(_, e)| *e == support::Expected::Expression)
        })
        .filter_map(|f| {
            let row = table.lookup(f.start)?;
            (row.cfa_rule() == CfaRule::SignalFrame).then_some(f.start)
        })
        .collect();
    println!("{LIBC}: signal-frame rows at {trampolines:#x?}");
    assert_eq!(trampolines.len(), 1, "__restore_rt is one FDE");

    let crypto = Path::new("/usr/lib/x86_64-linux-gnu/libcrypto.so.3");
    if !crypto.exists() {
        println!(
            "{}: absent, OpenSSL's expressions not checked",
            crypto.display()
        );
        return;
    }
    let table = build(crypto);
    // Every (base, offset, addend) readelf prints for a dereferencing CFA.
    let raw = std::process::Command::new("readelf")
        .arg("--debug-dump=frames")
        .arg(crypto)
        .output()
        .unwrap();
    let raw = String::from_utf8_lossy(&raw.stdout);
    let printed: std::collections::BTreeSet<(String, i64, u64)> = raw
        .lines()
        .filter_map(|l| {
            let e = l
                .trim()
                .strip_prefix("DW_CFA_def_cfa_expression (DW_OP_breg")?;
            let (base, rest) = e.split_once(")")?;
            let base = base.split_once('(')?.1.to_string();
            let rest = rest.strip_prefix(": ")?;
            let (offset, rest) = rest.split_once("; DW_OP_deref")?;
            let addend = match rest.trim_end_matches(')') {
                "" => 0,
                r => r.strip_prefix("; DW_OP_plus_uconst: ")?.parse().ok()?,
            };
            Some((base, offset.parse().ok()?, addend))
        })
        .collect();
    let (mut deref, mut unsupported_expressions) = (0, 0);
    for fde in support::readelf_fdes(crypto) {
        for (address, e) in &fde.rows {
            if *e != support::Expected::Expression {
                continue;
            }
            let row = table.lookup(*address).unwrap();
            let base = match row.cfa_rule() {
                CfaRule::RspDeref => "rsp",
                CfaRule::RbpDeref => "rbp",
                CfaRule::Unsupported => {
                    unsupported_expressions += 1;
                    continue;
                }
                _ => continue,
            };
            let (offset, addend) = row.deref_parts();
            assert!(
                printed.contains(&(base.to_string(), offset, addend)),
                "{address:#x}: {base} {offset} {addend} is not an expression readelf prints"
            );
            deref += 1;
        }
    }
    println!(
        "{}: {deref} dereferencing CFA rows match readelf; {unsupported_expressions} \
         expression rows unsupported; {} distinct expressions printed",
        crypto.display(),
        printed.len()
    );
    assert!(deref >= 40, "only {deref} dereferencing rows");
    assert!(
        unsupported_expressions * 10 <= deref,
        "{unsupported_expressions} expression rows unsupported against {deref} supported"
    );
}

#[test]
fn plt_rows_match_objdump() {
    let dir = tempfile::tempdir().unwrap();
    let source = "#include <stdio.h>\n#include <stdlib.h>\nint main(int c, char **v) { printf(\"%d\\n\", c); puts(v[0]); return atoi(\"3\"); }\n";
    let variants: [(&str, &[&str]); 4] = [
        ("plain", &["-O2"]),
        // No FDE for the PLT: rows are synthesized from its bytes.
        ("nounwind", &["-O2", "-Wl,--no-ld-generated-unwind-info"]),
        // IBT: .plt's expression has threshold 9 (expanded), plus .plt.sec.
        ("ibt", &["-O2", "-fcf-protection=full", "-Wl,-z,ibtplt"]),
        (
            "ibt-nounwind",
            &[
                "-O2",
                "-fcf-protection=full",
                "-Wl,-z,ibtplt",
                "-Wl,--no-ld-generated-unwind-info",
            ],
        ),
    ];
    for (name, flags) in variants {
        let exe = compile(dir.path(), "cc", name, source, flags);
        let checked = check_plt(&exe);
        assert!(checked >= 8, "{name}: {checked}");
        let table = build(&exe);
        let synthesized = table.stats().synthesized_plt_sections;
        assert_eq!(
            synthesized > 0,
            name.ends_with("nounwind"),
            "{name}: {:?}",
            table.stats()
        );
    }
    // GNU ld's own FDE (libc) and lld's FDE-less PLT (this Rust test binary).
    assert!(check_plt(Path::new(LIBC)) > 100);
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    check_plt(&exe);
}

/// A small deterministic generator for the corruption test.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Bit-flipped and truncated copies of real binaries: errors, never panics,
/// and what is built still holds the table invariants.
#[test]
fn corrupt_inputs_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "c++", "shapes", CPP_FIXTURE, &["-O2", "-g"]);
    let mut random = XorShift(0x1ce_c0de);
    for path in [exe.as_path(), Path::new(LIBC)] {
        let original = std::fs::read(path).unwrap();
        let file = object::File::parse(&*original).unwrap();
        use object::{Object, ObjectSection};
        // Flip bits mostly inside the CFI sections, sometimes anywhere.
        let ranges: Vec<(usize, usize)> = [".eh_frame", ".debug_frame", ".eh_frame_hdr", ".plt"]
            .iter()
            .filter_map(|n| file.section_by_name(n)?.file_range())
            .map(|(o, s)| (o as usize, s as usize))
            .collect();
        let rounds = if original.len() > 1 << 20 { 150 } else { 600 };
        let (mut ok, mut failed) = (0, 0);
        for round in 0..rounds {
            let mut data = original.clone();
            for _ in 0..1 + random.next() % 8 {
                let at = if round % 4 == 0 {
                    random.next() as usize % data.len()
                } else {
                    let (offset, size) = ranges[random.next() as usize % ranges.len()];
                    offset + random.next() as usize % size.max(1)
                };
                data[at] ^= 1 << (random.next() % 8);
            }
            if round % 10 == 0 {
                data.truncate(random.next() as usize % data.len());
            }
            match UnwindTable::from_elf(&data) {
                Ok(table) => {
                    check_invariants(&table);
                    assert!(table.len() <= MAX_TABLE_ROWS as usize);
                    ok += 1;
                }
                Err(_) => failed += 1,
            }
        }
        println!("{}: {ok} built, {failed} rejected", path.display());
    }
}

#[test]
fn rejects_non_elf_and_other_architectures() {
    assert!(matches!(
        UnwindTable::from_elf(b"not an ELF file"),
        Err(TableError::Elf(_))
    ));
    let mut data = std::fs::read(LIBC).unwrap();
    data[18] = 183; // e_machine = EM_AARCH64
    data[19] = 0;
    assert!(matches!(
        UnwindTable::from_elf(&data),
        Err(TableError::UnsupportedArchitecture)
    ));
}

/// Every shared library and executable of the system builds without error.
/// Slow in debug builds: `cargo test --release -- --ignored`.
#[test]
#[ignore]
fn every_system_binary_builds() {
    let mut totals = (0usize, 0usize, 0usize, 0usize, 0usize);
    let mut building = std::time::Duration::ZERO;
    let mut errors = Vec::new();
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/bin",
        "/usr/sbin",
        "/usr/libexec",
    ] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(data) = std::fs::read(&path) else {
                continue;
            };
            if !data.starts_with(b"\x7fELF") {
                continue;
            }
            let started = std::time::Instant::now();
            let built = UnwindTable::from_elf(&data);
            building += started.elapsed();
            match built {
                Ok(table) => {
                    check_invariants(&table);
                    totals.0 += 1;
                    totals.1 += table.len();
                    totals.2 += table.stats().eh_frame_bytes + table.stats().debug_frame_bytes;
                    totals.3 += table.stats().unsupported_rows;
                    totals.4 += table.stats().malformed_fdes;
                }
                Err(TableError::UnsupportedArchitecture) => {}
                Err(error) => errors.push(format!("{}: {error}", path.display())),
            }
        }
    }
    println!(
        "{} files, {} rows, {} bytes of CFI, {} unsupported rows, {} malformed FDEs; built in {building:?} ({:.1} MB/s)",
        totals.0,
        totals.1,
        totals.2,
        totals.3,
        totals.4,
        totals.2 as f64 / 1e6 / building.as_secs_f64()
    );
    assert!(errors.is_empty(), "{errors:#?}");
}
