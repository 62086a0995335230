//! Captured real stacks unwound by the host driver with tables built from
//! the process's own mappings: the same `search_rows` and `dwarf_step` the
//! BPF program runs, on code compiled without frame pointers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::arch::asm;
use std::hint::black_box;
use std::path::Path;

use icecore_unwinders::native::{CfaRule, RbpRule};
use icecore_unwinders::table::{AddressSpace, StopReason, Unwound, unwind, unwind_detailed};
use icecore_unwinders::{MemoryReader, Registers};

/// A copy of a stack: the bytes from `base` up.
struct CapturedStack<'a> {
    base: u64,
    bytes: &'a [u8],
}

impl MemoryReader for CapturedStack<'_> {
    fn read_u64(&mut self, address: u64) -> Option<u64> {
        let offset = usize::try_from(address.checked_sub(self.base)?).ok()?;
        let bytes = self.bytes.get(offset..offset.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }
}

struct Captured {
    regs: Registers,
    stack: Vec<u8>,
}

/// Captures this function's registers, then copies the stack from rsp to
/// the top of its mapping while every caller's frame is still live.
#[inline(never)]
fn capture() -> Captured {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers into outputs; touches no memory.
    unsafe {
        asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let (_, top) = support::mapping_containing(&maps, sp).unwrap();
    let len = usize::try_from(top - sp).unwrap();
    let mut stack = vec![0u8; len];
    // SAFETY: [sp, top) is this thread's mapped stack. The callers' frames
    // there do not change while this function runs (the calls it makes
    // use the stack below sp).
    unsafe { std::ptr::copy_nonoverlapping(sp as *const u8, stack.as_mut_ptr(), len) };
    Captured {
        regs: Registers { ip, sp, bp },
        stack,
    }
}

#[inline(never)]
fn chain_three(depth: u64) -> Captured {
    let pad = black_box([depth; 5]);
    let captured = if depth < 3 {
        chain_three(depth + 1)
    } else {
        capture()
    };
    black_box(&pad);
    captured
}

#[inline(never)]
fn chain_two(n: u64) -> Captured {
    let pad = black_box([n; 100]);
    let captured = chain_three(pad[7] - n);
    black_box(&pad);
    captured
}

#[inline(never)]
fn chain_one(n: u64) -> Captured {
    let pad = black_box([n as u8; 13]);
    let captured = chain_two(u64::from(pad[3]));
    black_box(&pad);
    captured
}

/// The bottom of the chain, kept out of the test function (which release
/// builds inline into the harness's closure).
#[inline(never)]
fn rust_chain_root() -> Captured {
    let pad = black_box([7u16; 21]);
    let captured = chain_one(u64::from(pad[2]) - 6);
    black_box(&pad);
    captured
}

/// Symbolizes every frame (caller frames at ip - 1): the name of its
/// function in `exe`, or the path of the other file it is in.
fn symbolize(
    unwound: &Unwound,
    space: &AddressSpace,
    mappings: &[(u64, u64, u64, String)],
    exe: &Path,
) -> Vec<String> {
    let symbols = support::symbols(exe);
    unwound
        .frames
        .iter()
        .enumerate()
        .map(|(i, frame)| {
            let address = if i == 0 { frame.ip } else { frame.ip - 1 };
            let Some(mapping) = space.find(address) else {
                return format!("?{address:#x}");
            };
            let (_, _, _, path) = mappings.iter().find(|m| m.0 == mapping.start).unwrap();
            if Path::new(path) != exe {
                return path.clone();
            }
            support::symbolize(&symbols, address - mapping.bias)
                .unwrap_or("?")
                .to_string()
        })
        .collect()
}

#[test]
fn captured_rust_stack_unwinds_to_the_harness() {
    let captured = rust_chain_root();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mappings = support::executable_mappings(&maps);
    let (space, biased) = support::address_space(&mappings);
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let mut memory = CapturedStack {
        base: captured.regs.sp,
        bytes: &captured.stack,
    };
    let unwound = unwind_detailed(captured.regs, &mut memory, &space, 512);
    let names = symbolize(&unwound, &space, &biased, &exe);
    for (frame, name) in unwound.frames.iter().zip(&names) {
        println!("{:#018x} {:?} {name}", frame.ip, frame.rule);
    }
    let expected = [
        "capture",
        "chain_three",
        "chain_three",
        "chain_three",
        "chain_three",
        "chain_two",
        "chain_one",
        "rust_chain_root",
    ];
    assert!(names.len() > expected.len(), "{names:#?}");
    for (i, want) in expected.iter().enumerate() {
        assert!(
            names[i].contains(want),
            "frame {i}: {} is not {want}\n{names:#?}",
            names[i]
        );
        // Stepped with DWARF rows, not the frame-pointer fallback.
        let rule = unwound.frames[i].rule;
        assert!(
            matches!(rule, CfaRule::Rsp | CfaRule::Rbp),
            "frame {i} ({want}): {rule:?}"
        );
    }
    assert!(
        names
            .iter()
            .any(|n| n.contains("__rust_begin_short_backtrace")),
        "the walk reaches the test harness: {names:#?}"
    );
    assert_eq!(unwound.stop, StopReason::EndOfStack, "{names:#?}");

    // rbp plays no part in these frames: a garbage rbp unwinds the same chain.
    let garbage = Registers {
        bp: 0xdead_beef_0000,
        ..captured.regs
    };
    let again = unwind(garbage, &mut memory, &space, expected.len());
    let first: Vec<u64> = unwound
        .frames
        .iter()
        .take(expected.len())
        .map(|f| f.ip)
        .collect();
    assert_eq!(again, first);
}

/// A C program compiled without frame pointers captures its own stack (rsp,
/// rip, rbp, its maps and the stack bytes) into a file; the test unwinds it.
/// `level1` uses alloca (CFA = rbp + 16) and `level2` saves rbp to use it as
/// a general register, so the walk needs both rbp rules.
const C_CAPTURE: &str = r#"
#include <alloca.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const char *out_path;
static char maps[1 << 20];
volatile long source[8] = {1, 2, 3, 4, 5, 6, 7, 8};

__attribute__((noinline)) void capture(void) {
    uint64_t ip, sp, bp;
    __asm__ volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2" : "=r"(ip), "=r"(sp), "=r"(bp));
    FILE *f = fopen("/proc/self/maps", "r");
    size_t used = fread(maps, 1, sizeof maps - 1, f);
    fclose(f);
    maps[used] = 0;
    uint64_t top = 0;
    for (char *line = maps; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : 0) {
        unsigned long start, end;
        if (sscanf(line, "%lx-%lx", &start, &end) == 2 && start <= sp && sp < end) top = end;
    }
    uint64_t header[5] = {ip, sp, bp, used, top - sp};
    FILE *out = fopen(out_path, "wb");
    fwrite(header, 8, 5, out);
    fwrite(maps, 1, used, out);
    fwrite((void *)sp, 1, top - sp, out);
    fclose(out);
}

__attribute__((noinline)) long level3(long n) { capture(); return n + source[1]; }

__attribute__((noinline)) long level2(long n) {
    long a = source[0], b = source[1], c = source[2], d = source[3], e = source[4], f = source[5], g = source[6];
    long r = level3(n + a);
    return r + a * b + c * d + e * f + g * a + b * c + d * e + f * g;
}

__attribute__((noinline)) long level1(int n) {
    char *p = alloca(n + 32);
    memset(p, n, n + 32);
    return level2(n) + p[n / 2];
}

int main(int argc, char **argv) {
    out_path = argv[1];
    return level1(argc + 8) > 0 ? 0 : 1;
}
"#;

#[test]
fn captured_c_stack_without_frame_pointers() {
    let dir = tempfile::tempdir().unwrap();
    let exe = support::compile(
        dir.path(),
        "cc",
        "capture",
        C_CAPTURE,
        &["-O2", "-fomit-frame-pointer", "-g"],
    );
    let out = dir.path().join("stack.bin");
    let status = std::process::Command::new(&exe).arg(&out).status().unwrap();
    assert!(status.success());
    let data = std::fs::read(&out).unwrap();
    let word = |i: usize| u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap());
    let regs = Registers {
        ip: word(0),
        sp: word(1),
        bp: word(2),
    };
    let maps_len = usize::try_from(word(3)).unwrap();
    let maps = std::str::from_utf8(&data[40..40 + maps_len]).unwrap();
    let stack = &data[40 + maps_len..];
    assert_eq!(stack.len() as u64, word(4));

    let mappings = support::executable_mappings(maps);
    let (space, biased) = support::address_space(&mappings);
    let mut memory = CapturedStack {
        base: regs.sp,
        bytes: stack,
    };
    let unwound = unwind_detailed(regs, &mut memory, &space, 64);
    let names = symbolize(&unwound, &space, &biased, &exe);
    for (frame, name) in unwound.frames.iter().zip(&names) {
        println!("{:#018x} {:?} {name}", frame.ip, frame.rule);
    }
    assert_eq!(
        names[..5],
        ["capture", "level3", "level2", "level1", "main"],
        "{names:#?}"
    );
    assert_eq!(
        unwound.frames[3].rule,
        CfaRule::Rbp,
        "level1's CFA is rbp-based (alloca)"
    );
    assert_eq!(
        names.last().map(String::as_str),
        Some("_start"),
        "{names:#?}"
    );
    assert_eq!(unwound.stop, StopReason::EndOfStack);

    // level2 saved rbp: its row restores it, and level1's CFA depends on it.
    let level2 = &unwound.frames[2];
    let mapping = space.find(level2.ip - 1).unwrap();
    let row = mapping.table.lookup(level2.ip - 1 - mapping.bias).unwrap();
    assert_eq!(row.rbp_rule(), RbpRule::CfaOffset, "{row:?}");
}
