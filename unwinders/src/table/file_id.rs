//! File identity by content.
//!
//! A [`FileId`] mirrors the OpenTelemetry eBPF profiler's "htlhash": SHA-256
//! over the file's first 4 KiB, its last 4 KiB (the two overlap in files
//! under 8 KiB) and its length as a big-endian u64. For ELF files the head
//! covers the ELF and program headers (and usually the build ID note) and
//! the tail the section headers, so the hash tells files apart while
//! reading at most 8 KiB of files of any size. The 128-bit prefix of the
//! digest is the htlhash ([`htlhash_of_file`]); the [`FileId`] is its high
//! 64 bits, the key the BPF maps use. Every process mapping the same file
//! (by any path, in any mount namespace) shares one ID and so one table.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use sha2::{Digest, Sha256};

/// Bytes hashed at each end of a file.
const CHUNK: u64 = 4096;

/// A u64 naming a file's content (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FileId(pub u64);

impl FileId {
    /// The ID of a file whose whole content is `data`.
    pub fn from_bytes(data: &[u8]) -> Self {
        Self::from_htlhash(htlhash_of_bytes(data))
    }

    /// The ID of an open file, reading at most 8 KiB of it (the file
    /// position is not moved).
    pub fn from_file(file: &File) -> io::Result<Self> {
        htlhash_of_file(file).map(Self::from_htlhash)
    }

    /// The ID of the file at `path`.
    pub fn from_path(path: impl AsRef<Path>) -> io::Result<Self> {
        Self::from_file(&File::open(path)?)
    }

    /// The high 64 bits of a 128-bit htlhash.
    pub const fn from_htlhash(hash: [u8; 16]) -> Self {
        let mut high = [0u8; 8];
        let mut i = 0;
        while i < 8 {
            high[i] = hash[i];
            i += 1;
        }
        FileId(u64::from_be_bytes(high))
    }
}

impl core::fmt::Display for FileId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

fn finish(hasher: Sha256) -> [u8; 16] {
    let digest = hasher.finalize();
    let mut hash = [0u8; 16];
    hash.copy_from_slice(&digest[..16]);
    hash
}

/// The 128-bit htlhash of a file whose whole content is `data`.
pub fn htlhash_of_bytes(data: &[u8]) -> [u8; 16] {
    let len = data.len() as u64;
    let chunk = CHUNK.min(len) as usize;
    let mut hasher = Sha256::new();
    hasher.update(&data[..chunk]);
    hasher.update(&data[data.len() - chunk..]);
    hasher.update(len.to_be_bytes());
    finish(hasher)
}

/// The 128-bit htlhash of an open file, reading at most 8 KiB of it.
pub fn htlhash_of_file(file: &File) -> io::Result<[u8; 16]> {
    let len = file.metadata()?.len();
    let chunk = CHUNK.min(len);
    let mut buffer = [0u8; CHUNK as usize];
    let buffer = &mut buffer[..chunk as usize];
    let mut hasher = Sha256::new();
    file.read_exact_at(buffer, 0)?;
    hasher.update(&*buffer);
    file.read_exact_at(buffer, len - chunk)?;
    hasher.update(&*buffer);
    hasher.update(len.to_be_bytes());
    Ok(finish(hasher))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::{format, vec, vec::Vec};

    #[test]
    fn file_and_bytes_agree_and_differ_by_content() {
        for len in [0usize, 1, 100, 4096, 5000, 8192, 100_000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let mut file = tempfile::tempfile().unwrap();
            file.write_all(&data).unwrap();
            assert_eq!(
                FileId::from_file(&file).unwrap(),
                FileId::from_bytes(&data),
                "len {len}"
            );
        }
        let a: Vec<u8> = vec![1; 10_000];
        let mut b = a.clone();
        b[9_999] = 2; // in the tail
        let mut c = a.clone();
        c.push(1); // only the length differs
        let ids = [
            FileId::from_bytes(&a),
            FileId::from_bytes(&b),
            FileId::from_bytes(&c),
        ];
        assert_ne!(ids[0], ids[1]);
        assert_ne!(ids[0], ids[2]);
        // The middle is not hashed: that is the point (and the known blind spot).
        let mut d = a.clone();
        d[5_000] = 3;
        assert_eq!(FileId::from_bytes(&d), ids[0]);
    }

    #[test]
    fn id_is_the_high_half_of_the_htlhash() {
        let hash = htlhash_of_bytes(b"icecore");
        assert_eq!(FileId::from_htlhash(hash).0.to_be_bytes(), hash[..8]);
        assert_eq!(format!("{}", FileId(0xab)), "00000000000000ab");
    }
}
