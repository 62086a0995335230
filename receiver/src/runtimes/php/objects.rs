//! Reading the engine's objects from a PHP process: a `zend_function`'s
//! kind, name, class, file and line table. Everything read is checked
//! (lengths bounded, pointers aligned), so hostile or half-freed memory
//! gives `None` rather than a wild name.

use super::layouts::PhpLayout;
use crate::runtimes::memory::ProcessMemory;

/// Longest name or path read.
const MAX_STRING: u64 = 4096;
/// Most opcodes of one function whose line table is read (a 32-byte
/// `zend_op` each: 2 MiB at most).
const MAX_OPCODES: u64 = 65_536;
/// `zend_function.type` of a user function (`ZEND_USER_FUNCTION`).
const USER_FUNCTION: u8 = 2;
/// `zend_function.type` of a C function (`ZEND_INTERNAL_FUNCTION`).
const INTERNAL_FUNCTION: u8 = 1;
/// `zend_function.type` of `eval`'d code (`ZEND_EVAL_CODE`).
const EVAL_CODE: u8 = 4;

/// What a function is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionKind {
    /// PHP code with opcodes.
    User,
    /// Code `eval` compiled.
    Eval,
    /// A function written in C (the engine's or an extension's).
    Internal,
}

/// The pointers that tell one function from another that took its
/// address after it was freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fingerprint {
    /// `function_name`.
    pub name: u64,
    /// `scope`.
    pub scope: u64,
    /// `opcodes` (0 for an internal function).
    pub opcodes: u64,
    /// `filename` (0 for an internal function).
    pub filename: u64,
}

/// One function, as symbolizing needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionInfo {
    /// What it is.
    pub kind: FunctionKind,
    /// Its name (`leaf`, `{closure}`); `None` for a file's top-level code.
    pub name: Option<String>,
    /// Its class's name, for a method.
    pub class: Option<String>,
    /// Whether it is a closure (`ZEND_ACC_CLOSURE`).
    pub closure: bool,
    /// The file of user code.
    pub file: Option<String>,
    /// The line it starts at (user code).
    pub line_start: u32,
    /// Where its opcodes are (user code).
    pub opcodes: u64,
    /// The line of each opcode (user code).
    pub lines: Vec<u32>,
    /// What it was read from.
    pub fingerprint: Fingerprint,
}

impl FunctionInfo {
    /// The line of the opcode at `opline`, if it is one of this function's.
    pub fn line_at(&self, opline: u64, op_size: u64) -> Option<u32> {
        let offset = opline.checked_sub(self.opcodes)?;
        if op_size == 0 || !offset.is_multiple_of(op_size) {
            return None;
        }
        self.lines
            .get(usize::try_from(offset / op_size).ok()?)
            .copied()
    }
}

/// The fields of a function's head.
struct Head {
    kind: FunctionKind,
    flags: u32,
    fingerprint: Fingerprint,
    /// Opcodes (user code).
    last: u32,
    /// First line (user code).
    line_start: u32,
}

/// A process's objects under one layout.
pub struct Objects<'a> {
    memory: &'a ProcessMemory,
    layout: &'a PhpLayout,
}

impl<'a> Objects<'a> {
    /// Objects of the process whose memory is `memory`.
    pub fn new(memory: &'a ProcessMemory, layout: &'a PhpLayout) -> Self {
        Objects { memory, layout }
    }

    /// The head of the function at `function` (its common part and, for
    /// user code, the op array's fields icecore reads), in one read.
    fn head(&self, function: u64) -> Option<Head> {
        let l = self.layout;
        if function == 0 || !function.is_multiple_of(8) {
            return None;
        }
        let end = |offsets: &[u16], width: u64| {
            offsets
                .iter()
                .map(|&o| u64::from(o) + width)
                .max()
                .unwrap_or(0)
        };
        let common = end(&[l.fn_name, l.fn_scope], 8).max(end(&[l.fn_type, l.fn_flags], 4));
        let user = end(&[l.op_opcodes, l.op_filename], 8)
            .max(end(&[l.op_last, l.op_line_start], 4))
            .max(common);
        // A C function's struct is shorter than an op array; one lying at
        // the end of its mapping is read again, shorter.
        let bytes = self
            .memory
            .read_vec(function, user, user)
            .or_else(|_| self.memory.read_vec(function, common, common))
            .ok()?;
        let u32_at = |offset: u16| {
            let at = usize::from(offset);
            let b = bytes.get(at..at + 4)?;
            Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let u64_at = |offset: u16| {
            let at = usize::from(offset);
            let b: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
            Some(u64::from_le_bytes(b))
        };
        let kind = match *bytes.get(usize::from(l.fn_type))? {
            USER_FUNCTION => FunctionKind::User,
            EVAL_CODE => FunctionKind::Eval,
            INTERNAL_FUNCTION => FunctionKind::Internal,
            _ => return None,
        };
        let mut head = Head {
            kind,
            flags: u32_at(l.fn_flags)?,
            fingerprint: Fingerprint {
                name: u64_at(l.fn_name)?,
                scope: u64_at(l.fn_scope)?,
                ..Fingerprint::default()
            },
            last: 0,
            line_start: 0,
        };
        if kind != FunctionKind::Internal {
            head.fingerprint.opcodes = u64_at(l.op_opcodes)?;
            head.fingerprint.filename = u64_at(l.op_filename)?;
            head.last = u32_at(l.op_last)?;
            head.line_start = u32_at(l.op_line_start)?;
        }
        Some(head)
    }

    /// The fingerprint and kind of the function at `function`: one small read.
    pub fn fingerprint(&self, function: u64) -> Option<(FunctionKind, Fingerprint)> {
        self.head(function).map(|h| (h.kind, h.fingerprint))
    }

    /// The function at `function`, read whole.
    pub fn function(&self, function: u64) -> Option<FunctionInfo> {
        let l = self.layout;
        let Head {
            kind,
            flags,
            fingerprint,
            last,
            line_start,
        } = self.head(function)?;
        let name = match fingerprint.name {
            0 => None,
            at => Some(self.string(at)?),
        };
        let class = match fingerprint.scope {
            0 => None,
            scope => {
                let name = self
                    .memory
                    .read_u64(scope.wrapping_add(u64::from(l.class_name)))
                    .ok()?;
                Some(self.string(name)?)
            }
        };
        let mut info = FunctionInfo {
            kind,
            name,
            class,
            closure: flags & l.acc_closure != 0,
            file: None,
            line_start,
            opcodes: 0,
            lines: Vec::new(),
            fingerprint,
        };
        if kind == FunctionKind::Internal {
            return Some(info);
        }
        info.file = Some(self.string(fingerprint.filename)?);
        let last = u64::from(last);
        info.opcodes = fingerprint.opcodes;
        if last > MAX_OPCODES || !info.opcodes.is_multiple_of(8) {
            return Some(info);
        }
        let size = u64::from(l.op_size);
        if let Ok(bytes) = self
            .memory
            .read_vec(info.opcodes, last * size, MAX_OPCODES * size)
        {
            let lineno = usize::from(l.op_lineno);
            info.lines = bytes
                .chunks_exact(usize::from(l.op_size))
                .filter_map(|op| op.get(lineno..lineno + 4))
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
        }
        Some(info)
    }

    /// The `zend_string` at `at`, if it reads as UTF-8 of a sane length.
    fn string(&self, at: u64) -> Option<String> {
        let l = self.layout;
        if at == 0 || !at.is_multiple_of(8) {
            return None;
        }
        let len = self
            .memory
            .read_u64(at.wrapping_add(u64::from(l.str_len)))
            .ok()?;
        if len > MAX_STRING {
            return None;
        }
        let bytes = self
            .memory
            .read_vec(at.wrapping_add(u64::from(l.str_val)), len, MAX_STRING)
            .ok()?;
        String::from_utf8(bytes).ok()
    }
}
