//! Writes each batch as a gzipped pprof file into a directory.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::ExportError;
use crate::model::ProfileBatch;
use crate::pprof::encode_gzip;

/// Writes one `icecore-<UTC start>-<seq>.pb.gz` file per batch into a directory.
///
/// Files appear atomically: each is written to a hidden temporary file in the
/// same directory and renamed into place, so readers never see a partial file.
#[derive(Debug)]
pub struct PprofDirWriter {
    dir: PathBuf,
    seq: AtomicU64,
}

impl PprofDirWriter {
    /// Creates `dir` (and its parents) if needed and checks a file can be written there.
    pub fn new(dir: PathBuf) -> Result<Self, ExportError> {
        fs::create_dir_all(&dir).map_err(|source| ExportError::CreateDir {
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
        Ok(Self {
            dir,
            seq: AtomicU64::new(0),
        })
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
        let stamp = utc_stamp(batch.start_unix_nanos / 1_000_000_000);
        // Skip names already taken, e.g. by a previous run within the same second.
        let (name, path) = loop {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            let name = format!("icecore-{stamp}-{seq:06}.pb.gz");
            let path = self.dir.join(&name);
            if !path.exists() {
                break (name, path);
            }
        };
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let written = write_synced(&tmp, &bytes).and_then(|()| fs::rename(&tmp, &path));
        if let Err(source) = written {
            let _ = fs::remove_file(&tmp);
            return Err(ExportError::WriteFile { path, source });
        }
        Ok(Some(path))
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = File::create(path)?;
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
    use super::*;

    #[test]
    fn utc_stamp_formats_known_instants() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(1_795_324_440), "20261122T051400Z");
        assert_eq!(utc_stamp(4_107_542_399), "21000228T235959Z");
    }
}
