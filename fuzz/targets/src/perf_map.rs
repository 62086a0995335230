//! A runtime's perf map (`/tmp/perf-PID.map`: `START SIZE NAME` lines, as
//! Node.js, .NET and JVM agents write them), fed to `PerfMap::feed` whole
//! and, as the agent reads a growing file, in pieces (with a small symbol
//! limit, so that overlaps, replacement and the limit all happen); then
//! lookups and the cleaning of each name into function, file and line
//! (`names::clean`, `names::source_path`), as the perf-map plugin does.

use icecore_receiver::runtimes::perf_map::names::{clean, source_path};
use icecore_receiver::runtimes::perf_map::parse::PerfMap;

/// The plugin's limit (`MAX_SYMBOLS_PER_PROCESS`).
const MAX_SYMBOLS: usize = 1 << 20;

fn look_up(map: &PerfMap) {
    let mut probes: Vec<u64> = Vec::new();
    for symbol in map.symbols().take(256) {
        let end = symbol.start.wrapping_add(symbol.size);
        probes.extend([
            symbol.start,
            end.wrapping_sub(1),
            end,
            symbol.start.wrapping_sub(1),
        ]);
        let name = clean(&symbol.name);
        if let Some(file) = &name.file {
            let _ = source_path(file);
        }
    }
    probes.extend(crate::probe_addresses(0x7f00_0000_0000));
    for address in probes {
        if let Some(symbol) = map.lookup(address) {
            let _ = symbol.contains(address);
            let _ = symbol.line_at(address);
        }
    }
    let _ = map.len();
    let _ = map.heap_bytes();
    let _ = map.line_entries();
}

/// Runs one input through the entry points above; panics are the bugs
/// looked for (errors are expected answers to bad input).
pub fn run(data: &[u8]) {
    let mut whole = PerfMap::new(MAX_SYMBOLS);
    let _ = whole.feed(data);
    look_up(&whole);

    let mut pieces = PerfMap::new(8);
    let step = data.len() % 61 + 1;
    for piece in data.chunks(step) {
        let _ = pieces.feed(piece);
    }
    look_up(&pieces);
    pieces.clear();
    let _ = pieces.feed(data);
}
