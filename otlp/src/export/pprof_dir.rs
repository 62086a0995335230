//! Writes each batch as a gzipped pprof file into a directory, keeping the
//! directory within a number of files and bytes.

use std::collections::VecDeque;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::ExportError;
use crate::model::{ProfileBatch, ProfileKind};
use crate::pprof::encode_gzip;

/// How much of its output a [`PprofDirWriter`] keeps; 0 means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PprofRetention {
    /// Most files kept.
    pub max_files: u64,
    /// Most bytes kept.
    pub max_bytes: u64,
}

/// What the writer removed to stay within its retention.
#[derive(Debug, Default)]
pub struct PprofDirStats {
    /// Files removed, oldest first.
    pub removed_files: AtomicU64,
    /// Bytes of the files removed.
    pub removed_bytes: AtomicU64,
}

/// Writes one `icecore-<UTC start>-<seq>.pb.gz` file per batch into a directory.
///
/// Files appear atomically: each is written to a hidden temporary file in the
/// same directory and renamed into place, so readers never see a partial file.
/// Profiles show what runs on a host, so the directory icecore creates is
/// its owner's only (0700) and each file too (0600). The oldest of icecore's
/// files (its earlier runs' included, by name) are removed once the
/// retention is exceeded; other files are never touched.
#[derive(Debug)]
pub struct PprofDirWriter {
    dir: PathBuf,
    seq: AtomicU64,
    retention: PprofRetention,
    /// icecore's files in the directory, oldest first, with their sizes.
    kept: Mutex<Kept>,
    stats: std::sync::Arc<PprofDirStats>,
}

#[derive(Debug, Default)]
struct Kept {
    files: VecDeque<(PathBuf, u64)>,
    bytes: u64,
}

impl PprofDirWriter {
    /// Creates `dir` (and its parents) if needed and checks a file can be
    /// written there; keeps no more than `retention`.
    pub fn new(dir: PathBuf, retention: PprofRetention) -> Result<Self, ExportError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| ExportError::CreateDir {
                path: dir.clone(),
                source,
            })?;
        let probe = dir.join(format!(".icecore-write-test-{}", std::process::id()));
        fs::write(&probe, b"").map_err(|source| ExportError::DirNotWritable {
            path: dir.clone(),
            source,
        })?;
        // Best effort: a leftover empty probe file is harmless.
        let _ = fs::remove_file(&probe);
        let kept = Mutex::new(existing_files(&dir));
        let writer = Self {
            dir,
            seq: AtomicU64::new(0),
            retention,
            kept,
            stats: std::sync::Arc::default(),
        };
        writer.enforce_retention();
        Ok(writer)
    }

    /// Files removed so far, live.
    pub fn stats(&self) -> std::sync::Arc<PprofDirStats> {
        self.stats.clone()
    }

    /// Removes the oldest files until the directory is within the retention.
    fn enforce_retention(&self) {
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        let over = |kept: &Kept| {
            let files = self.retention.max_files;
            let bytes = self.retention.max_bytes;
            (files > 0 && kept.files.len() as u64 > files) || (bytes > 0 && kept.bytes > bytes)
        };
        while over(&kept) {
            let Some((path, size)) = kept.files.pop_front() else {
                break;
            };
            kept.bytes = kept.bytes.saturating_sub(size);
            match fs::remove_file(&path) {
                Ok(()) => {
                    self.stats.removed_files.fetch_add(1, Ordering::Relaxed);
                    self.stats.removed_bytes.fetch_add(size, Ordering::Relaxed);
                }
                // Removed by someone else: it no longer counts either way.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("cannot remove old pprof file {}: {e}", path.display()),
            }
        }
    }

    /// The output directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `batch` and returns the new file's path, or `Ok(None)` without
    /// writing anything when the batch has no samples. The timestamp in the
    /// name is the batch window's start; the sequence number keeps names unique.
    pub fn write(&self, batch: &ProfileBatch) -> Result<Option<PathBuf>, ExportError> {
        if batch.sample_count() == 0 {
            return Ok(None);
        }
        let bytes = encode_gzip(batch)?;
        // CPU profiles keep the plain name; other kinds say theirs.
        let suffix = match batch.kind {
            ProfileKind::Cpu => String::new(),
            kind => format!("-{}", kind.name()),
        };
        self.store(batch.start_unix_nanos, &suffix, &bytes)
            .map(Some)
    }

    /// Writes a gzipped pprof profile from elsewhere (a scraped
    /// application's), named by its start time and by `source` (such as
    /// `job-profile`; characters other than `[A-Za-z0-9_.-]` become `_`).
    pub fn write_gzipped(
        &self,
        start_unix_nanos: u64,
        source: &str,
        gzipped: &[u8],
    ) -> Result<PathBuf, ExportError> {
        let safe: String = source
            .chars()
            .take(64)
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.store(start_unix_nanos, &format!("-{safe}"), gzipped)
    }

    /// Writes `bytes` as a new file, then removes the oldest past the limits.
    fn store(
        &self,
        start_unix_nanos: u64,
        suffix: &str,
        bytes: &[u8],
    ) -> Result<PathBuf, ExportError> {
        let stamp = utc_stamp(start_unix_nanos / 1_000_000_000);
        // Skip names already taken, e.g. by a previous run within the same second.
        let (name, path) = loop {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            let name = format!("icecore-{stamp}-{seq:06}{suffix}.pb.gz");
            let path = self.dir.join(&name);
            if !path.exists() {
                break (name, path);
            }
        };
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let written = write_synced(&tmp, bytes).and_then(|()| fs::rename(&tmp, &path));
        if let Err(source) = written {
            let _ = fs::remove_file(&tmp);
            return Err(ExportError::WriteFile { path, source });
        }
        if let Ok(mut kept) = self.kept.lock() {
            kept.bytes += bytes.len() as u64;
            kept.files.push_back((path.clone(), bytes.len() as u64));
        }
        self.enforce_retention();
        Ok(path)
    }
}

/// icecore's pprof files already in `dir`, oldest first: their names start
/// with the UTC time of their window, so the name order is the time order.
fn existing_files(dir: &Path) -> Kept {
    let mut files: Vec<(PathBuf, u64)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name.starts_with("icecore-") && name.ends_with(".pb.gz")
        })
        .filter_map(|entry| {
            let meta = entry.metadata().ok()?;
            meta.is_file().then(|| (entry.path(), meta.len()))
        })
        .collect();
    files.sort();
    Kept {
        bytes: files.iter().map(|(_, size)| size).sum(),
        files: files.into(),
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    // Flush to disk before the rename publishes the file.
    file.sync_all()
}

/// `YYYYMMDDTHHMMSSZ` for Unix seconds `secs`.
fn utc_stamp(secs: u64) -> String {
    let (year, month, day) = civil_from_days(secs / 86_400);
    let rem = secs % 86_400;
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn files_are_private_and_the_oldest_go_first() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("new/pprof");
        // An earlier run's file, and a file that is not icecore's.
        let retention = PprofRetention {
            max_files: 3,
            max_bytes: 0,
        };
        let writer = PprofDirWriter::new(dir.clone(), retention).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        fs::write(dir.join("icecore-19990101T000000Z-000000.pb.gz"), b"old").unwrap();
        fs::write(dir.join("notes.txt"), b"keep me").unwrap();
        drop(writer);
        let writer = PprofDirWriter::new(dir.clone(), retention).unwrap();
        let batch = crate::test_fixtures::batch();
        let mut written = Vec::new();
        for _ in 0..4 {
            written.push(writer.write(&batch).unwrap().unwrap());
        }
        assert_eq!(mode(&written[3]), 0o600);
        let mut left: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left.len(), 4, "{left:?}");
        assert!(left.contains(&"notes.txt".to_owned()));
        assert!(
            !left.iter().any(|n| n.starts_with("icecore-1999")),
            "{left:?}"
        );
        assert!(!written[0].exists() && written[3].exists());
        assert_eq!(writer.stats().removed_files.load(Ordering::Relaxed), 2);

        let size = fs::metadata(&written[3]).unwrap().len();
        let by_bytes = PprofDirWriter::new(
            dir.clone(),
            PprofRetention {
                max_files: 0,
                max_bytes: size + 1,
            },
        )
        .unwrap();
        assert_eq!(by_bytes.stats().removed_files.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn utc_stamp_formats_known_instants() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(1_795_324_440), "20261122T051400Z");
        assert_eq!(utc_stamp(4_107_542_399), "21000228T235959Z");
    }
}
