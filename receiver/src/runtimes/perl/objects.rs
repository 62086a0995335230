//! Reading Perl's objects from another process: a sub's name (from its
//! CV: the GV it was defined through, or the name a `CVf_NAMED` sub keeps
//! itself, with its package's name from the stash), and a statement's file
//! and line (from its COP). Every read is bounded and checked: the process
//! may be changing (or freeing) what is read.

use super::layouts::PerlLayout;
use crate::runtimes::memory::{MemoryError, ProcessMemory};

/// Longest name or path read.
const MAX_STRING_BYTES: u64 = 4096;
/// Bytes read at once when looking for a C string's end.
const STRING_CHUNK: u64 = 256;
/// Ops followed from a sub's start to its first statement at most (a
/// sub's first op is its first statement's COP, or a few ops before it).
const MAX_OPS_TO_FIRST_STATEMENT: usize = 16;

/// A sub, as Perl's `caller` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubName {
    /// `Package::sub` (`main::__ANON__` for an anonymous sub, the bare
    /// name for a lexical `my sub`).
    pub name: String,
    /// An XS (C) function's.
    pub is_xsub: bool,
}

/// A statement: where a frame is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// The file (`-e`, `(eval 12)`, a path).
    pub file: String,
    /// Its line.
    pub line: u32,
}

/// Why an object could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// Memory could not be read.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A pointer that must not be null was.
    #[error("null {0}")]
    Null(&'static str),
    /// A length out of all proportion.
    #[error("{0} of {1} bytes")]
    TooLong(&'static str, u64),
}

/// Reads Perl objects of one process with one version's layout.
pub struct PerlObjects<'a> {
    /// The layout.
    pub layout: &'a PerlLayout,
    /// The process's memory.
    pub memory: &'a ProcessMemory,
}

impl PerlObjects<'_> {
    fn pointer(&self, at: u64, what: &'static str) -> Result<u64, ObjectError> {
        match self.memory.read_u64(at)? {
            0 => Err(ObjectError::Null(what)),
            p => Ok(p),
        }
    }

    /// The name of the sub whose CV is at `cv`.
    pub fn sub_name(&self, cv: u64) -> Result<SubName, ObjectError> {
        let l = self.layout;
        let body = self.pointer(cv.wrapping_add(u64::from(l.sv_any)), "CV body")?;
        let flags = self
            .memory
            .read_u32(body.wrapping_add(u64::from(l.xcv_flags)))?;
        let is_xsub = flags & l.cvf_isxsub != 0;
        let name_or_gv = self.pointer(body.wrapping_add(u64::from(l.xcv_gv)), "CV name")?;
        let name = if flags & l.cvf_named != 0 {
            // The sub keeps its name's HEK itself, its package in its stash.
            let name = self.hek(name_or_gv)?;
            if flags & l.cvf_lexical != 0 {
                name
            } else {
                let stash = self
                    .memory
                    .read_u64(body.wrapping_add(u64::from(l.xcv_stash)))?;
                format!("{}::{name}", self.package(stash))
            }
        } else {
            // A glob's: the one it aliases, if any (`gv_efullname`).
            let gp = self
                .memory
                .read_u64(name_or_gv.wrapping_add(u64::from(l.sv_u)))?;
            let effective = if gp == 0 {
                0
            } else {
                self.memory.read_u64(gp.wrapping_add(u64::from(l.gp_egv)))?
            };
            let gv = if effective != 0 {
                effective
            } else {
                name_or_gv
            };
            let gv_body = self.pointer(gv.wrapping_add(u64::from(l.sv_any)), "GV body")?;
            let name = self
                .hek(self.pointer(gv_body.wrapping_add(u64::from(l.xgv_name_hek)), "GV name")?)?;
            let stash = self
                .memory
                .read_u64(gv_body.wrapping_add(u64::from(l.xgv_stash)))?;
            format!("{}::{name}", self.package(stash))
        };
        Ok(SubName { name, is_xsub })
    }

    /// A stash's package name; `__ANON__` for none, as Perl names it.
    fn package(&self, stash: u64) -> String {
        self.stash_name(stash)
            .ok()
            .flatten()
            .unwrap_or_else(|| "__ANON__".to_owned())
    }

    /// `HvNAME`: the name of the stash at `hv`, if it has one.
    fn stash_name(&self, hv: u64) -> Result<Option<String>, ObjectError> {
        let l = self.layout;
        if hv == 0 {
            return Ok(None);
        }
        let flags = self
            .memory
            .read_u32(hv.wrapping_add(u64::from(l.sv_flags)))?;
        if flags & l.hv_has_aux == 0 {
            return Ok(None);
        }
        let body = self.pointer(hv.wrapping_add(u64::from(l.sv_any)), "stash body")?;
        let name = self
            .memory
            .read_u64(body.wrapping_add(u64::from(l.hv_aux_name)))?;
        if name == 0 {
            return Ok(None);
        }
        let count = self
            .memory
            .read_u32(body.wrapping_add(u64::from(l.hv_aux_name_count)))?;
        // With several names (a renamed package), the first is the name.
        let hek = if count != 0 {
            self.pointer(name, "stash name")?
        } else {
            name
        };
        self.hek(hek).map(Some)
    }

    /// The key of the HEK at `hek`.
    fn hek(&self, hek: u64) -> Result<String, ObjectError> {
        let l = self.layout;
        let len = u64::from(
            self.memory
                .read_u32(hek.wrapping_add(u64::from(l.hek_len)))?,
        );
        let bytes = self
            .memory
            .read_vec(
                hek.wrapping_add(u64::from(l.hek_key)),
                len,
                MAX_STRING_BYTES,
            )
            .map_err(|e| match e {
                MemoryError::TooLarge(n) => ObjectError::TooLong("name", n),
                e => ObjectError::Memory(e),
            })?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The file and line of the COP at `cop`.
    pub fn statement(&self, cop: u64) -> Result<Statement, ObjectError> {
        let l = self.layout;
        let line = self
            .memory
            .read_u32(cop.wrapping_add(u64::from(l.cop_line)))?;
        let file = self.pointer(cop.wrapping_add(u64::from(l.cop_file)), "COP file")?;
        Ok(Statement {
            file: self.c_string(file)?,
            line,
        })
    }

    /// The first statement of the sub whose CV is at `cv`: where a sub
    /// just entered is.
    pub fn first_statement(&self, cv: u64) -> Result<Statement, ObjectError> {
        let l = self.layout;
        let body = self.pointer(cv.wrapping_add(u64::from(l.sv_any)), "CV body")?;
        let mut op = self.pointer(body.wrapping_add(u64::from(l.xcv_start)), "CV start")?;
        for _ in 0..MAX_OPS_TO_FIRST_STATEMENT {
            let kind = self
                .memory
                .read_u32(op.wrapping_add(u64::from(l.op_type)))? as u16
                & 0x1ff;
            if kind == l.op_nextstate || kind == l.op_dbstate {
                return self.statement(op);
            }
            op = self.pointer(op.wrapping_add(u64::from(l.op_next)), "next op")?;
        }
        Err(ObjectError::Null("first statement"))
    }

    /// The NUL-terminated string at `at`, read a chunk at a time (never
    /// across a page it does not need).
    fn c_string(&self, at: u64) -> Result<String, ObjectError> {
        let mut bytes = Vec::new();
        let mut next = at;
        while (bytes.len() as u64) < MAX_STRING_BYTES {
            let to_page_end = 4096 - (next % 4096);
            let mut chunk = vec![0u8; STRING_CHUNK.min(to_page_end) as usize];
            self.memory.read_exact(next, &mut chunk)?;
            if let Some(end) = chunk.iter().position(|&b| b == 0) {
                bytes.extend_from_slice(&chunk[..end]);
                return Ok(String::from_utf8_lossy(&bytes).into_owned());
            }
            next += chunk.len() as u64;
            bytes.extend_from_slice(&chunk);
        }
        Err(ObjectError::TooLong("path", bytes.len() as u64))
    }
}
