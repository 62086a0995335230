//! Unwind-table memory for the executables of this host: every distinct
//! executable file mapped by a running process, built as icecore would and
//! summed (rows × 8 bytes is what BPF holds).
//!
//! `cargo bench -p icecore-benches --bench host_tables` (root sees every process).

use std::{collections::HashMap, path::Path, time::Instant};

use icecore_receiver::{process_maps::ProcessMappings, unwind_table::build_table};

fn main() {
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && !"host_tables".contains(a.as_str()))
    {
        return;
    }
    let mut files = HashMap::new();
    let mut processes = 0;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        println!("host_tables: /proc unreadable");
        return;
    };
    for pid in entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        let Ok(maps) = ProcessMappings::read(pid) else {
            continue;
        };
        if maps.is_empty() {
            continue;
        }
        processes += 1;
        for m in maps
            .mappings()
            .iter()
            .filter(|m| m.executable && !m.is_vdso())
        {
            files
                .entry((m.dev, m.inode))
                .or_insert_with(|| (pid, m.start, m.end, m.path.clone()));
        }
    }
    let started = Instant::now();
    let (mut rows, mut built, mut failed) = (0usize, 0usize, 0usize);
    for (pid, start, end, path) in files.values() {
        let via_proc = format!("/proc/{pid}/map_files/{start:x}-{end:x}");
        match build_table(Path::new(&via_proc)).or_else(|_| build_table(Path::new(&**path))) {
            Ok(table) => {
                rows += table.rows.len();
                built += 1;
            }
            Err(_) => failed += 1,
        }
    }
    let elapsed = started.elapsed();
    println!(
        "host_tables: {processes} processes, {} distinct executable files ({built} with tables, {failed} without)",
        files.len()
    );
    println!(
        "host_tables: {rows} rows = {:.1} MiB of unwind tables in BPF; built in {:.2} s",
        (rows * 8) as f64 / (1024.0 * 1024.0),
        elapsed.as_secs_f64()
    );
}
