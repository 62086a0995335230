//! A bearer token kept in a file and re-read while the agent runs, so a
//! rotated token (Kubernetes projected service-account tokens expire within
//! hours) is picked up without a restart.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tonic::metadata::AsciiMetadataValue;

use super::ExportError;

/// How often the file is read again.
pub const TOKEN_REFRESH: Duration = Duration::from_secs(60);
/// Longest accepted token file.
const MAX_TOKEN_BYTES: u64 = 64 << 10;

/// The `authorization` value `Bearer <file contents>`, refreshed from the file.
#[derive(Debug)]
pub(crate) struct TokenFile {
    path: PathBuf,
    refresh: Duration,
    current: Mutex<(Instant, AsciiMetadataValue)>,
}

impl TokenFile {
    /// Reads the file once; an unreadable or empty file is an error now,
    /// when the user can still fix it.
    pub(crate) fn open(path: &Path, refresh: Duration) -> Result<Self, ExportError> {
        let value = read(path)?;
        Ok(Self {
            path: path.to_owned(),
            refresh,
            current: Mutex::new((Instant::now(), value)),
        })
    }

    /// The header value to send; reads the file again when the last read is
    /// older than the refresh period. A failed read keeps the last token
    /// (the file may be mid-rotation) and is logged.
    pub(crate) fn value(&self) -> AsciiMetadataValue {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.0.elapsed() >= self.refresh {
            current.0 = Instant::now();
            match read(&self.path) {
                Ok(value) => current.1 = value,
                Err(e) => tracing::warn!("keeping the previous bearer token: {e}"),
            }
        }
        current.1.clone()
    }
}

fn read(path: &Path) -> Result<AsciiMetadataValue, ExportError> {
    let error = |reason: String| ExportError::TokenFile {
        path: path.to_owned(),
        reason,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(|e| error(e.to_string()))?
        .take(MAX_TOKEN_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| error(e.to_string()))?;
    if text.len() as u64 > MAX_TOKEN_BYTES {
        return Err(error(format!("over {MAX_TOKEN_BYTES} bytes")));
    }
    let token = text.trim();
    if token.is_empty() {
        return Err(error("empty".into()));
    }
    if !token.chars().all(|c| c.is_ascii_graphic()) {
        return Err(error("holds characters other than printable ASCII".into()));
    }
    format!("Bearer {token}")
        .parse()
        .map_err(|_| error("not a valid header value".into()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn rotation_is_picked_up_and_a_bad_read_keeps_the_old_token() {
        let dir = std::env::temp_dir().join(format!("icecore-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "first\n").unwrap();
        let token = TokenFile::open(&path, Duration::ZERO).unwrap();
        assert_eq!(token.value(), "Bearer first");
        std::fs::write(&path, "second").unwrap();
        assert_eq!(token.value(), "Bearer second");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            token.value(),
            "Bearer second",
            "kept while the file is gone"
        );
        std::fs::write(&path, "  \n").unwrap();
        assert_eq!(
            token.value(),
            "Bearer second",
            "kept while the file is empty"
        );
        // Not re-read within the refresh period.
        std::fs::write(&path, "third").unwrap();
        let slow = TokenFile::open(&path, Duration::from_secs(3600)).unwrap();
        std::fs::write(&path, "fourth").unwrap();
        assert_eq!(slow.value(), "Bearer third");
        std::fs::write(&path, "").unwrap();
        let err = TokenFile::open(&path, TOKEN_REFRESH).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
