//! Naming JavaScript functions from a live process's memory, as V8's
//! `SharedFunctionInfo::DebugName` does (and so `node --cpu-prof`): the
//! function's own name, else the name V8 inferred for it (`ns.a.b.c` for
//! `ns.a.b.c = function () {}`), else "".

use super::layout::V8Layout;
use crate::runtimes::memory::ProcessMemory;

/// Longest name read, in characters.
pub const MAX_NAME_CHARS: u64 = 1024;
/// Indirect strings (cons, thin, sliced) followed at most.
const MAX_STRING_HOPS: usize = 16;
/// Context locals inlined in a ScopeInfo up to this count; more are in a
/// hash table, one slot (`kScopeInfoMaxInlinedLocalNamesSize`).
const MAX_INLINED_LOCAL_NAMES: u64 = 75;

/// ScopeInfo flag bits (scope-info.tq, the same in V8 10 to 13).
mod scope_flags {
    /// The scope type, bits 0-3.
    pub const SCOPE_TYPE: u64 = 0xf;
    /// A saved class variable slot follows the context locals.
    pub const HAS_SAVED_CLASS_VARIABLE: u64 = 1 << 10;
    /// The function variable's kind, bits 12-13 (0: none).
    pub const FUNCTION_VARIABLE_SHIFT: u64 = 12;
    /// An inferred-name slot follows the function variable.
    pub const HAS_INFERRED_FUNCTION_NAME: u64 = 1 << 14;
}

/// Objects of one V8 process, read through its memory.
pub struct V8Objects<'a> {
    pub(super) layout: &'a V8Layout,
    pub(super) memory: &'a ProcessMemory,
}

impl<'a> V8Objects<'a> {
    /// Reads objects of the process whose memory is `memory`.
    pub fn new(layout: &'a V8Layout, memory: &'a ProcessMemory) -> Self {
        Self { layout, memory }
    }

    pub(super) fn word(&self, address: u64) -> Option<u64> {
        self.memory.read_u64(address).ok()
    }

    /// The field at `offset` of the tagged object `object`.
    pub(super) fn field(&self, object: u64, offset: u64) -> Option<u64> {
        self.word(untag(object)?.wrapping_add(offset))
    }

    /// The instance type of the tagged object `object`.
    pub fn instance_type(&self, object: u64) -> Option<u16> {
        let map = untag(self.field(object, 0)?)?;
        let at = map.wrapping_add(self.layout.map_instance_type);
        let word = self.word(at & !7)?;
        Some((word >> ((at & 7) * 8)) as u16)
    }

    /// The SharedFunctionInfo of the tagged JSFunction `function`.
    pub fn shared_of(&self, function: u64) -> Option<u64> {
        let (first, last) = self.layout.js_function_types;
        if !(first..=last).contains(&self.instance_type(function)?) {
            return None;
        }
        let shared = self.field(function, self.layout.js_function_shared)?;
        (self.instance_type(shared)? == self.layout.shared_function_info_type).then_some(shared)
    }

    /// The name of the tagged SharedFunctionInfo `shared`, as `--cpu-prof`
    /// shows it ("" for an anonymous function with nothing inferred).
    pub fn function_name(&self, shared: u64) -> Option<String> {
        let name_or_scope = self.field(shared, self.layout.sfi_name_or_scope_info)?;
        if is_smi(name_or_scope) {
            // No shared name; an uncompiled function's inferred name is in
            // its UncompiledData (not read: it has no frames).
            return Some(String::new());
        }
        let kind = self.instance_type(name_or_scope)?;
        if kind < self.layout.first_nonstring_type {
            return self.string(name_or_scope);
        }
        if kind != self.layout.scope_info_type {
            return None;
        }
        let (own, inferred) = self.scope_info_names(name_or_scope)?;
        Some(if own.is_empty() { inferred } else { own })
    }

    /// A ScopeInfo's function-variable name and inferred name ("" when
    /// absent): their slots come after the context locals.
    fn scope_info_names(&self, scope_info: u64) -> Option<(String, String)> {
        let l = &self.layout.scope_info;
        let flags_word = self.field(scope_info, 8)?;
        let flags = if l.raw_flags {
            flags_word & 0xffff_ffff
        } else {
            smi_value(flags_word)? as u64
        };
        let locals =
            u64::try_from(smi_value(self.field(scope_info, l.context_local_count)?)?).ok()?;
        let mut slot = l.first_variable;
        if l.module_variable_count
            && flags & scope_flags::SCOPE_TYPE == u64::from(l.module_scope_type)
        {
            slot += 8;
        }
        // The local names (or their hash table), then one info per local.
        slot += 8 * if locals < MAX_INLINED_LOCAL_NAMES {
            locals
        } else {
            1
        };
        slot += 8 * locals;
        if flags & scope_flags::HAS_SAVED_CLASS_VARIABLE != 0 {
            slot += 8;
        }
        let mut own = String::new();
        if (flags >> scope_flags::FUNCTION_VARIABLE_SHIFT) & 3 != 0 {
            let name = self.field(scope_info, slot)?;
            if !is_smi(name) {
                own = self.string(name)?;
            }
            slot += 16;
        }
        let mut inferred = String::new();
        if flags & scope_flags::HAS_INFERRED_FUNCTION_NAME != 0 {
            let name = self.field(scope_info, slot)?;
            if !is_smi(name)
                && self
                    .instance_type(name)
                    .is_some_and(|t| t < self.layout.first_nonstring_type)
            {
                inferred = self.string(name)?;
            }
        }
        Some((own, inferred))
    }

    /// The tagged string `string`, up to [`MAX_NAME_CHARS`] characters.
    pub fn string(&self, string: u64) -> Option<String> {
        let mut out = String::new();
        self.append_string(string, 0, MAX_NAME_CHARS, &mut out, 0)?;
        Some(out)
    }

    /// Appends characters `start..start + count` of `string` to `out`.
    pub(super) fn append_string(
        &self,
        string: u64,
        start: u64,
        count: u64,
        out: &mut String,
        hops: usize,
    ) -> Option<()> {
        if hops > MAX_STRING_HOPS {
            return None;
        }
        let s = &self.layout.strings;
        let kind = self.instance_type(string)?;
        if kind >= self.layout.first_nonstring_type {
            return None;
        }
        let length = u64::from(self.field(string, s.length)? as u32);
        let count = count.min(length.saturating_sub(start));
        if count == 0 {
            return Some(());
        }
        match kind & STRING_REPRESENTATION {
            SEQ => self.append_chars(
                untag(string)? + s.seq_chars,
                kind & ONE_BYTE != 0,
                start,
                count,
                out,
            ),
            CONS => {
                let first = self.field(string, s.cons_first)?;
                let first_length = u64::from(self.field(first, s.length)? as u32);
                if start < first_length {
                    self.append_string(first, start, count, out, hops + 1)?;
                }
                let taken = first_length.saturating_sub(start).min(count);
                if taken < count {
                    let second = self.field(string, s.cons_second)?;
                    let from = start.saturating_sub(first_length);
                    self.append_string(second, from, count - taken, out, hops + 1)?;
                }
                Some(())
            }
            THIN => {
                let actual = self.field(string, s.thin_actual)?;
                self.append_string(actual, start, count, out, hops + 1)
            }
            SLICED => {
                let parent = self.field(string, s.sliced_parent)?;
                let offset =
                    u64::try_from(smi_value(self.field(string, s.sliced_offset)?)?).ok()?;
                self.append_string(parent, offset + start, count, out, hops + 1)
            }
            EXTERNAL if kind & UNCACHED_EXTERNAL == 0 => {
                // The characters live outside the heap (a builtin module's
                // source, embedded in the binary); the string keeps a
                // pointer to them. An uncached one keeps only its resource,
                // whose data only a virtual call finds.
                let data = self.field(string, s.external_data)?;
                self.append_chars(data, kind & ONE_BYTE != 0, start, count, out)
            }
            _ => None,
        }
    }
}

impl V8Objects<'_> {
    /// Appends characters `start..start + count` of the one-byte (Latin-1)
    /// or two-byte (UTF-16) characters at `chars`.
    fn append_chars(
        &self,
        chars: u64,
        one_byte: bool,
        start: u64,
        count: u64,
        out: &mut String,
    ) -> Option<()> {
        let width = if one_byte { 1 } else { 2 };
        let at = chars.checked_add(start.checked_mul(width)?)?;
        let bytes = self
            .memory
            .read_vec(at, count * width, count * width)
            .ok()?;
        if one_byte {
            out.extend(bytes.iter().map(|&b| char::from(b)));
        } else {
            let units: Vec<u16> = bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            out.extend(char::decode_utf16(units).map(|c| c.unwrap_or('\u{fffd}')));
        }
        Some(())
    }
}

/// `StringRepresentationMask` and its tags, and `OneByteStringTag`
/// (instance-type.h; the same in every version).
const STRING_REPRESENTATION: u16 = 7;
const SEQ: u16 = 0;
const CONS: u16 = 1;
const SLICED: u16 = 3;
const THIN: u16 = 5;
const EXTERNAL: u16 = 2;
/// `kUncachedExternalStringMask`: the string has no data pointer.
const UNCACHED_EXTERNAL: u16 = 0x10;
const ONE_BYTE: u16 = 8;

/// The address of a tagged heap object.
pub(super) fn untag(tagged: u64) -> Option<u64> {
    (tagged & 3 == 1).then(|| tagged - 1)
}

pub(super) fn is_smi(word: u64) -> bool {
    word & 1 == 0
}

/// A Smi's value (in the upper half: no pointer compression).
pub(super) fn smi_value(word: u64) -> Option<i64> {
    is_smi(word).then_some((word as i64) >> 32)
}
