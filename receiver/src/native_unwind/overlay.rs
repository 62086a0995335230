//! Runtime code laid over a process's file mappings, so that BPF hands
//! frames in it to the runtime's program.

use icecore_unwinders::native::MappingEntry;

use crate::runtimes::RuntimeCode;

/// `entries` (a process's file mappings, sorted, disjoint) with the
/// runtimes' code laid over them: an entry overlapping runtime code is split
/// so that the code's part names the runtime's program; runtime code no
/// file entry covers (JIT code, or a file whose table is not built yet)
/// gets an entry without a table, so that dispatch never depends on it.
pub fn overlay_runtime_code(
    entries: Vec<MappingEntry>,
    code: &[(RuntimeCode, u8)],
) -> Vec<MappingEntry> {
    let mut out = entries;
    for &(code, program) in code {
        if code.start >= code.end {
            continue;
        }
        let mut next = Vec::with_capacity(out.len() + 2);
        let mut covered = Vec::new();
        for entry in out {
            if entry.end <= code.start || entry.start >= code.end {
                next.push(entry);
                continue;
            }
            if entry.start < code.start {
                next.push(MappingEntry {
                    end: code.start,
                    ..entry
                });
            }
            let start = entry.start.max(code.start);
            let end = entry.end.min(code.end);
            next.push(MappingEntry {
                start,
                end,
                program,
                dispatch: code.dispatch as u8,
                ..entry
            });
            covered.push((start, end));
            if entry.end > code.end {
                next.push(MappingEntry {
                    start: code.end,
                    ..entry
                });
            }
        }
        let gap = |start, end| MappingEntry {
            start,
            end,
            program,
            dispatch: code.dispatch as u8,
            ..MappingEntry::default()
        };
        let mut at = code.start;
        covered.sort_unstable();
        for (start, end) in covered {
            if start > at {
                next.push(gap(at, start));
            }
            at = at.max(end);
        }
        if at < code.end {
            next.push(gap(at, code.end));
        }
        next.sort_unstable_by_key(|e| e.start);
        out = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use icecore_unwinders::Dispatch;

    use super::*;

    fn file(start: u64, end: u64, file_id: u64) -> MappingEntry {
        MappingEntry {
            start,
            end,
            bias: start - 0x1000,
            file_id,
            table_rows: 10,
            table_slot: file_id as u32,
            ..MappingEntry::default()
        }
    }

    fn code(start: u64, end: u64, dispatch: Dispatch) -> (RuntimeCode, u8) {
        (
            RuntimeCode {
                start,
                end,
                dispatch,
            },
            2,
        )
    }

    fn shape(entries: &[MappingEntry]) -> Vec<(u64, u64, u64, u8, u8)> {
        entries
            .iter()
            .map(|e| (e.start, e.end, e.file_id, e.program, e.dispatch))
            .collect()
    }

    #[test]
    fn runtime_code_splits_its_file_entry_and_keeps_the_table() {
        let entries = vec![file(0x1000, 0x9000, 1), file(0xa000, 0xb000, 2)];
        let out = overlay_runtime_code(entries, &[code(0x3000, 0x4000, Dispatch::Deferred)]);
        assert_eq!(
            shape(&out),
            [
                (0x1000, 0x3000, 1, 0, 0),
                (0x3000, 0x4000, 1, 2, 2),
                (0x4000, 0x9000, 1, 0, 0),
                (0xa000, 0xb000, 2, 0, 0),
            ]
        );
        assert!(
            out.iter()
                .take(3)
                .all(|e| e.bias == 0 && e.table_rows == 10)
        );
    }

    #[test]
    fn uncovered_runtime_code_gets_a_table_less_entry() {
        // JIT code between two files, and code straddling a file's end.
        let entries = vec![file(0x1000, 0x2000, 1), file(0x8000, 0x9000, 2)];
        let out = overlay_runtime_code(
            entries,
            &[
                code(0x4000, 0x6000, Dispatch::Handover),
                code(0x1800, 0x2800, Dispatch::Deferred),
            ],
        );
        assert_eq!(
            shape(&out),
            [
                (0x1000, 0x1800, 1, 0, 0),
                (0x1800, 0x2000, 1, 2, 2),
                (0x2000, 0x2800, 0, 2, 2),
                (0x4000, 0x6000, 0, 2, 1),
                (0x8000, 0x9000, 2, 0, 0),
            ]
        );
        assert_eq!(out[2].table_rows, 0);
        let sorted = out.windows(2).all(|w| w[0].end <= w[1].start);
        assert!(sorted, "entries stay sorted and disjoint");
        assert_eq!(overlay_runtime_code(Vec::new(), &[]), Vec::new());
    }
}
