//! The function names of one file, kept compressed when they are many: a
//! large C++ or Rust library has tens of megabytes of mangled names, read
//! only when a frame's name is not cached yet.

use std::borrow::Cow;
use std::io::{Read, Write};

/// Names stored in blocks of this many functions, each deflated, once a
/// file's names pass [`COMPRESS_NAMES_FROM`] bytes: mangled names compress
/// 4-6x, and a look-up (on a frame-cache miss only) inflates one block.
pub const NAMES_PER_BLOCK: usize = 64;
/// Names of one file above this many bytes are kept compressed.
pub const COMPRESS_NAMES_FROM: usize = 256 << 10;

/// The function names of one file: one plain arena, or deflated blocks of
/// [`NAMES_PER_BLOCK`] names (an entry's `name_start` is then relative to
/// its block).
#[derive(Debug, Default)]
pub(super) struct Names {
    plain: Box<str>,
    blocks: Box<[Box<[u8]>]>,
}

impl Names {
    /// The name of function `index`, at `start` for `len` bytes in the
    /// arena or in its block.
    pub(super) fn get(&self, index: usize, start: u32, len: u32) -> Cow<'_, str> {
        let start = start as usize;
        let range = start..start + len as usize;
        if self.blocks.is_empty() {
            return Cow::Borrowed(self.plain.get(range).unwrap_or(""));
        }
        let Some(block) = self.blocks.get(index / NAMES_PER_BLOCK) else {
            return Cow::Borrowed("");
        };
        let mut bytes = Vec::new();
        let mut inflate = flate2::read::DeflateDecoder::new(&block[..]);
        // A name is never cut: blocks were deflated whole from valid UTF-8.
        if inflate.read_to_end(&mut bytes).is_err() {
            return Cow::Borrowed("");
        }
        bytes
            .get(range)
            .and_then(|name| std::str::from_utf8(name).ok())
            .map_or(Cow::Borrowed(""), |name| Cow::Owned(name.to_owned()))
    }

    pub(super) fn heap_size(&self) -> usize {
        self.plain.len()
            + self.blocks.len() * std::mem::size_of::<Box<[u8]>>()
            + self.blocks.iter().map(|b| b.len()).sum::<usize>()
    }
}

/// Builds [`Names`] entry by entry.
pub(super) struct NamesBuilder {
    compress: bool,
    /// The arena (uncompressed), or the current block.
    current: String,
    blocks: Vec<Box<[u8]>>,
    count: usize,
}

impl NamesBuilder {
    pub(super) fn new(total_bytes: usize) -> Self {
        NamesBuilder {
            compress: total_bytes > COMPRESS_NAMES_FROM,
            current: String::new(),
            blocks: Vec::new(),
            count: 0,
        }
    }

    /// Appends a name; returns where it starts (in the arena or its block),
    /// `None` past 4 GiB of names.
    pub(super) fn push(&mut self, name: &str) -> Option<u32> {
        let start = u32::try_from(self.current.len()).ok()?;
        self.current.push_str(name);
        self.count += 1;
        if self.compress && self.count.is_multiple_of(NAMES_PER_BLOCK) {
            self.flush();
        }
        Some(start)
    }

    fn flush(&mut self) {
        let mut deflate =
            flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        // Writing to a Vec cannot fail.
        let _ = deflate.write_all(self.current.as_bytes());
        let block = deflate.finish().unwrap_or_default();
        self.blocks.push(block.into_boxed_slice());
        self.current.clear();
    }

    pub(super) fn finish(mut self) -> Names {
        if !self.compress {
            return Names {
                plain: self.current.into_boxed_str(),
                blocks: Box::default(),
            };
        }
        if !self.count.is_multiple_of(NAMES_PER_BLOCK) {
            self.flush();
        }
        Names {
            plain: Box::default(),
            blocks: self.blocks.into_boxed_slice(),
        }
    }
}
