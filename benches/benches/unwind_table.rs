//! Native unwind tables: building them from ELF files (per MB of CFI), and
//! the per-frame cost of the BPF-side steps (`find_row` + `dwarf_step`)
//! on real tables and a real captured stack.

use std::arch::asm;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use icecore_unwinders::native::{chunks::to_chunks, dwarf_step, find_row};
use icecore_unwinders::table::{AddressSpace, Mapping, UnwindTable, elf_load_bias, unwind};
use icecore_unwinders::{MemoryReader, Registers};

const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

/// libc and the bench executable itself (a large Rust binary).
fn inputs() -> Vec<(&'static str, Vec<u8>)> {
    let mut inputs = Vec::new();
    if let Ok(data) = std::fs::read(LIBC) {
        inputs.push(("libc", data));
    }
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
    if let Ok(data) = std::fs::read(exe) {
        inputs.push(("own_executable", data));
    }
    inputs
}

fn build(c: &mut Criterion) {
    let mut group = c.benchmark_group("unwind_table_build");
    group.sample_size(10);
    for (name, data) in inputs() {
        let Ok(table) = UnwindTable::from_elf(&data) else {
            continue;
        };
        let stats = table.stats();
        eprintln!(
            "{name}: {} rows ({} KiB) from {} KiB of CFI",
            table.len(),
            table.size_bytes() / 1024,
            (stats.eh_frame_bytes + stats.debug_frame_bytes) / 1024
        );
        // Throughput in bytes of CFI: criterion reports MiB/s of .eh_frame.
        group.throughput(Throughput::Bytes(
            (stats.eh_frame_bytes + stats.debug_frame_bytes) as u64,
        ));
        group.bench_function(name, |b| {
            b.iter(|| UnwindTable::from_elf(black_box(&data)).map(|t| t.len()))
        });
    }
    group.finish();
}

/// A copy of a stack from `base` up.
struct Stack {
    base: u64,
    bytes: Vec<u8>,
}

impl MemoryReader for Stack {
    fn read_u64(&mut self, address: u64) -> Option<u64> {
        let offset = usize::try_from(address.checked_sub(self.base)?).ok()?;
        let bytes = self.bytes.get(offset..offset.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }
}

/// Registers and a copy of the stack above them, taken here.
#[inline(never)]
fn capture() -> Option<(Registers, Stack)> {
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
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let top = maps.lines().find_map(|line| {
        let (start, end) = line.split_whitespace().next()?.split_once('-')?;
        let (start, end) = (
            u64::from_str_radix(start, 16).ok()?,
            u64::from_str_radix(end, 16).ok()?,
        );
        (start <= sp && sp < end).then_some(end)
    })?;
    let len = usize::try_from(top - sp).ok()?;
    let mut bytes = vec![0u8; len];
    // SAFETY: [sp, top) is this thread's mapped stack; the callers' frames
    // there are not modified while this function runs.
    unsafe { std::ptr::copy_nonoverlapping(sp as *const u8, bytes.as_mut_ptr(), len) };
    Some((Registers { ip, sp, bp }, Stack { base: sp, bytes }))
}

/// Tables for every executable file mapping of this process.
fn own_address_space() -> AddressSpace {
    let mut space = AddressSpace::new();
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return space;
    };
    let mut tables: Vec<(String, Vec<u8>, Arc<UnwindTable>)> = Vec::new();
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(range), Some(perms), Some(offset), Some(path)) =
            (fields.first(), fields.get(1), fields.get(2), fields.get(5))
        else {
            continue;
        };
        if !perms.contains('x') || !path.starts_with('/') {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(offset)) = (
            u64::from_str_radix(start, 16),
            u64::from_str_radix(end, 16),
            u64::from_str_radix(offset, 16),
        ) else {
            continue;
        };
        if !tables.iter().any(|t| t.0 == *path) {
            let Ok(data) = std::fs::read(path) else {
                continue;
            };
            let Ok(table) = UnwindTable::from_elf(&data) else {
                continue;
            };
            tables.push((path.to_string(), data, Arc::new(table)));
        }
        let Some((_, data, table)) = tables.iter().find(|t| t.0 == *path) else {
            continue;
        };
        if let Some(bias) = elf_load_bias(data, start, offset) {
            space.insert(Mapping {
                start,
                end,
                bias,
                table: table.clone(),
            });
        }
    }
    space
}

#[inline(never)]
fn deep(n: u32) -> Option<(Registers, Stack)> {
    let pad = black_box([n; 9]);
    let captured = if n == 0 { capture() } else { deep(n - 1) };
    black_box(&pad);
    captured
}

fn steps(c: &mut Criterion) {
    let mut group = c.benchmark_group("unwind_step");
    if let Ok(data) = std::fs::read(LIBC)
        && let Ok(table) = UnwindTable::from_elf(&data)
    {
        // PCs spread over the table, as samples would be.
        let rows = table.rows();
        let pcs: Vec<u32> = (0..1024u64)
            .map(|i| {
                rows[(i.wrapping_mul(2654435761) % rows.len() as u64) as usize].pc + (i % 7) as u32
            })
            .collect();
        let len = rows.len() as u32;
        let chunks = to_chunks(rows).unwrap_or_default();
        group.throughput(Throughput::Elements(pcs.len() as u64));
        group.bench_function("find_row/libc", |b| {
            b.iter(|| {
                pcs.iter()
                    .filter_map(|&pc| find_row(len, black_box(pc), 0, |i| chunks.get(i as usize)))
                    .count()
            })
        });
        // One step with a found row, on a stack where every read succeeds.
        let mut stack = Stack {
            base: 0x7000_0000,
            bytes: vec![0x11; 1 << 16],
        };
        group.throughput(Throughput::Elements(1));
        group.bench_function("find_row+dwarf_step/libc", |b| {
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 1) % pcs.len();
                let row = table.lookup(u64::from(pcs[i]));
                let mut regs = Registers {
                    ip: u64::from(pcs[i]),
                    sp: 0x7000_1000,
                    bp: 0x7000_2000,
                };
                row.map(|row| dwarf_step(&mut regs, row, &mut stack))
            })
        });
    }
    // A real stack of this process: mapping look-up, search and step per frame.
    let space = own_address_space();
    if let Some((regs, mut stack)) = deep(20) {
        let frames = unwind(regs, &mut stack, &space, 512).len();
        eprintln!("captured stack: {frames} frames");
        group.throughput(Throughput::Elements(frames as u64));
        group.bench_function("unwind_captured_stack", |b| {
            b.iter(|| unwind(black_box(regs), &mut stack, &space, 512).len())
        });
    }
    group.finish();
}

criterion_group!(benches, build, steps);
criterion_main!(benches);
