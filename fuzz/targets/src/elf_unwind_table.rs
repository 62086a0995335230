//! An ELF file's `.eh_frame` / `.debug_frame` (and `.eh_frame_hdr`, PLT
//! sections) to unwind-table rows, both ways the agent builds them:
//! `unwind_table::build_table` on a file (read through `object::ReadCache`,
//! streamed into packed rows, with the load segments that give a mapping's
//! bias) and `UnwindTable::from_elf` on the bytes (the whole table, looked
//! up with the chunked search BPF runs).

use std::sync::Arc;

use icecore_receiver::process_maps::MappedFile;
use icecore_receiver::unwind_table::build_table;
use icecore_unwinders::table::UnwindTable;

/// Runs one input through the entry points above; panics are the bugs
/// looked for (errors are expected answers to bad input).
pub fn run(data: &[u8]) {
    let path = crate::scratch_file("elf", data);
    match build_table(&path) {
        Ok(built) => {
            let _ = built.rows.len();
            let _ = built.rows.iter().count();
            for (offset, executable) in [(0, false), (0, true), (0x1000, true), (0x2000, false)] {
                let mapping = MappedFile {
                    start: 0x5555_0000_0000 + offset,
                    end: 0x5555_0000_0000 + offset + 0x10_0000,
                    file_offset: offset,
                    dev: (8, 1),
                    inode: 42,
                    path: Arc::from("/fuzz"),
                    executable,
                    deleted: false,
                };
                let _ = built.load_bias(&mapping);
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    if let Ok(table) = UnwindTable::from_elf(data) {
        let _ = table.size_bytes();
        let first = table.rows().first().map_or(0, |r| u64::from(r.pc));
        let last = table.rows().last().map_or(0, |r| u64::from(r.pc));
        for pc in crate::probe_addresses(first).chain(crate::probe_addresses(last)) {
            let _ = table.lookup(pc);
        }
    }
}
