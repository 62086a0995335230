//! Reading whole sections of ELF files into memory, decompressed, within a byte
//! budget: the shared ground of DWARF and Go table loading.
//!
//! Section contents are read with positioned reads straight into their final
//! buffer, not through `object`'s read cache, so a section costs its size once.
//! Compressed sections (`SHF_COMPRESSED` with zlib or zstd, GNU `.zdebug_*`) are
//! decompressed into a buffer of the size their header claims, which must fit the
//! budget first; a stream that does not produce exactly that many bytes is refused.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

use object::read::{CompressedFileRange, CompressionFormat, ReadCache};

/// Why a section could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SectionError {
    /// The file could not be opened or read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not an object file `object` understands, or its headers are corrupt.
    #[error("{path}: {reason}")]
    Malformed {
        /// The file.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// Reading the sections would exceed the byte budget.
    #[error("{path}: debug sections need more than {limit} bytes")]
    TooLarge {
        /// The file.
        path: String,
        /// The budget in bytes.
        limit: u64,
    },
}

/// An opened object file whose sections can be read by name.
pub struct SectionFile {
    path: String,
    file: File,
    /// Only the headers are read through this cache.
    cache: ReadCache<File>,
    /// Bytes that may still be read.
    remaining: u64,
    /// Bytes read so far.
    used: u64,
}

impl SectionFile {
    /// Opens a regular file of at most `max_file_size` bytes; sections read from
    /// it may take `budget` bytes in all.
    pub fn open(path: &Path, max_file_size: u64, budget: u64) -> Result<Self, SectionError> {
        let name = path.display().to_string();
        let io = |source| SectionError::Io {
            path: name.clone(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let metadata = file.metadata().map_err(io)?;
        if !metadata.is_file() || metadata.len() > max_file_size {
            return Err(SectionError::Malformed {
                path: name,
                reason: "not a regular file of acceptable size".to_owned(),
            });
        }
        let cache = ReadCache::new(file.try_clone().map_err(io)?);
        Ok(SectionFile {
            path: name,
            file,
            cache,
            remaining: budget,
            used: 0,
        })
    }

    /// The parsed object file (headers only).
    pub fn object(&self) -> Result<object::File<'_, &ReadCache<File>>, SectionError> {
        object::File::parse(&self.cache).map_err(|e| self.malformed(e.to_string()))
    }

    /// The path the file was opened with.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Bytes read into memory so far.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// An error about this file.
    pub fn malformed(&self, reason: String) -> SectionError {
        SectionError::Malformed {
            path: self.path.clone(),
            reason,
        }
    }

    /// Reads and decompresses a section given by its compressed file range.
    pub fn read(&mut self, range: CompressedFileRange) -> Result<Vec<u8>, SectionError> {
        if range.uncompressed_size > self.remaining {
            return Err(SectionError::TooLarge {
                path: self.path.clone(),
                limit: self.used.saturating_add(self.remaining),
            });
        }
        let raw = self.read_raw(range.offset, range.compressed_size)?;
        let data = match range.format {
            CompressionFormat::None => raw,
            CompressionFormat::Zlib => inflate(&raw, range.uncompressed_size)
                .ok_or_else(|| self.malformed("invalid zlib section".to_owned()))?,
            CompressionFormat::Zstandard => unzstd(&raw, range.uncompressed_size)
                .ok_or_else(|| self.malformed("invalid zstd section".to_owned()))?,
            _ => return Err(self.malformed("unknown section compression".to_owned())),
        };
        let size = data.len() as u64;
        self.remaining = self.remaining.saturating_sub(size);
        self.used = self.used.saturating_add(size);
        Ok(data)
    }

    /// Reads `size` bytes at `offset` into the budget.
    pub fn read_at(&mut self, offset: u64, size: u64) -> Result<Vec<u8>, SectionError> {
        let data = self.read_raw(offset, size)?;
        self.remaining = self.remaining.saturating_sub(size);
        self.used = self.used.saturating_add(size);
        Ok(data)
    }

    /// Reads `size` bytes at `offset`, refusing more than the budget allows.
    fn read_raw(&self, offset: u64, size: u64) -> Result<Vec<u8>, SectionError> {
        if size > self.remaining {
            return Err(SectionError::TooLarge {
                path: self.path.clone(),
                limit: self.used.saturating_add(self.remaining),
            });
        }
        let len = usize::try_from(size).map_err(|_| self.malformed("size".to_owned()))?;
        let mut buffer = Vec::new();
        buffer
            .try_reserve_exact(len)
            .map_err(|e| self.malformed(e.to_string()))?;
        buffer.resize(len, 0);
        self.file
            .read_exact_at(&mut buffer, offset)
            .map_err(|source| SectionError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(buffer)
    }
}

/// Inflates a zlib stream that must produce exactly `size` bytes.
fn inflate(input: &[u8], size: u64) -> Option<Vec<u8>> {
    let size = usize::try_from(size).ok()?;
    let mut out = Vec::new();
    out.try_reserve_exact(size).ok()?;
    let mut decompress = flate2::Decompress::new(true);
    // `decompress_vec` writes only into the spare capacity: the output is bounded.
    let status = decompress
        .decompress_vec(input, &mut out, flate2::FlushDecompress::Finish)
        .ok()?;
    (status == flate2::Status::StreamEnd && out.len() == size).then_some(out)
}

/// Decodes zstd frames that must produce exactly `size` bytes.
fn unzstd(mut input: &[u8], size: u64) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    out.try_reserve_exact(usize::try_from(size).ok()?).ok()?;
    while !input.is_empty() {
        let decoder = ruzstd::decoding::StreamingDecoder::new(&mut input).ok()?;
        let room = size.checked_sub(out.len() as u64)?;
        // One byte more than allowed tells an oversized stream apart.
        decoder
            .take(room.saturating_add(1))
            .read_to_end(&mut out)
            .ok()?;
        if out.len() as u64 > size {
            return None;
        }
    }
    (out.len() as u64 == size).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn zlib_must_match_claimed_size() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(&data).unwrap();
        let compressed = encoder.finish().unwrap();
        assert_eq!(inflate(&compressed, 10_000).as_deref(), Some(&data[..]));
        assert!(inflate(&compressed, 9_999).is_none(), "longer than claimed");
        assert!(
            inflate(&compressed, 10_001).is_none(),
            "shorter than claimed"
        );
        assert!(inflate(&compressed[..100], 10_000).is_none(), "truncated");
        assert!(inflate(b"not zlib at all", 10).is_none());
    }

    #[test]
    fn zstd_garbage_is_refused() {
        assert!(unzstd(b"\x28\xb5\x2f\xfd garbage", 100).is_none());
        assert!(unzstd(b"", 1).is_none());
        assert_eq!(unzstd(b"", 0), Some(Vec::new()));
    }
}
