//! A jitdump file (`jit-PID.dump`, the binary format `perf inject` reads:
//! a file header, then code-load, code-move, debug-info and close records),
//! fed to `JitDump::feed` whole and, as the agent reads a growing file, in
//! pieces (with small symbol and line-entry limits); then lookups with
//! their lines and the cleaning of each name, as the perf-map plugin does.

use icecore_receiver::runtimes::perf_map::jitdump::JitDump;
use icecore_receiver::runtimes::perf_map::names::{clean, source_path};

/// The plugin's limit (`MAX_SYMBOLS_PER_PROCESS`).
const MAX_SYMBOLS: usize = 1 << 20;

fn look_up(dump: &JitDump) {
    let _ = dump.header();
    let _ = dump.closed();
    let _ = dump.failed();
    let mut probes: Vec<u64> = Vec::new();
    for symbol in dump.map().symbols().take(256) {
        let end = symbol.start.wrapping_add(symbol.size);
        probes.extend([
            symbol.start,
            end.wrapping_sub(1),
            end,
            symbol.start.wrapping_sub(1),
        ]);
        for entry in symbol.lines.iter().flat_map(|l| l.iter()).take(64) {
            probes.push(entry.address);
        }
        let _ = clean(&symbol.name);
    }
    probes.extend(crate::probe_addresses(0x7f00_0000_0000));
    for address in probes {
        if let Some((_, Some((file, _)))) = dump.lookup(address) {
            let _ = source_path(&file);
        }
    }
}

/// Runs one input through the entry points above; panics are the bugs
/// looked for (errors are expected answers to bad input).
pub fn run(data: &[u8]) {
    let mut whole = JitDump::new(MAX_SYMBOLS);
    if let Err(e) = whole.feed(data) {
        let _ = e.to_string();
    }
    look_up(&whole);

    let mut pieces = JitDump::new(8).with_max_line_entries(16);
    let step = data.len() % 61 + 1;
    for piece in data.chunks(step) {
        if pieces.feed(piece).is_err() {
            break;
        }
    }
    look_up(&pieces);
    pieces.reset();
    let _ = pieces.feed(data);
}
