//! `/proc/PID/maps` text, as `ProcessMappings::read` parses it (the file's
//! bytes taken as lossy UTF-8), then the lookups the symbolizer and the
//! unwinder make: the mapping and the anonymous (JIT) code at an address,
//! and an address's file offset. The same bytes also go through the
//! `/proc/PID/stat` field parsers (start time, parent PID).

use icecore_receiver::process_maps::{ProcessMappings, parse_parent_pid, parse_start_time};

/// Runs one input through the entry points above; panics are the bugs
/// looked for (errors are expected answers to bad input).
pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = parse_start_time(&text);
    let _ = parse_parent_pid(&text);
    let maps = match ProcessMappings::parse(&text) {
        Ok(maps) => maps,
        Err(e) => {
            let _ = e.to_string();
            let _ = e.is_gone();
            return;
        }
    };
    let _ = maps.len();
    let _ = maps.executable().count();
    let mut probes: Vec<u64> = Vec::new();
    for m in maps.mappings() {
        probes.extend([
            m.start,
            m.end,
            m.end.wrapping_sub(1),
            m.start.wrapping_sub(1),
        ]);
        let _ = m.is_vdso();
    }
    for code in maps.anonymous_code() {
        probes.extend([code.start, code.end, code.end.wrapping_sub(1)]);
    }
    probes.extend(crate::probe_addresses(0x7f00_0000_0000));
    for addr in probes {
        if let Some(m) = maps.find(addr) {
            let _ = m.file_offset_of(addr);
        }
        let _ = maps.find_anonymous_code(addr);
        let _ = maps.covers_code(addr);
    }
}
