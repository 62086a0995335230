//! Reads struct member offsets from the kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! aya-ebpf has no CO-RE relocations, so the BPF programs take the few kernel
//! offsets they need as load-time constants, found here.

use std::path::Path;

/// Failure to find a member offset in BTF.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The BTF file could not be read.
    #[error("cannot read kernel BTF {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The data is not BTF or is cut short.
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    /// The type uses a BTF kind this reader does not know, so later types cannot be found.
    #[error("unsupported BTF kind {0}")]
    UnknownKind(u32),
    /// No struct of that name, or it has no such member.
    #[error("struct {structure} has no member {member} in kernel BTF")]
    NotFound {
        /// Struct name.
        structure: String,
        /// Member name.
        member: String,
    },
}

/// The standard location of the running kernel's BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Reads the byte offset of `structure.member` from a BTF file.
pub fn member_offset_in_file(path: &Path, structure: &str, member: &str) -> Result<u32, BtfError> {
    let data = std::fs::read(path).map_err(|source| BtfError::Read {
        path: path.display().to_string(),
        source,
    })?;
    member_offset(&data, structure, member)
}

fn u32_at(data: &[u8], at: usize) -> Result<u32, BtfError> {
    let bytes = data
        .get(at..at + 4)
        .ok_or(BtfError::Malformed("truncated"))?;
    Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

fn str_at(strings: &[u8], offset: u32) -> Result<&[u8], BtfError> {
    let tail = strings
        .get(offset as usize..)
        .ok_or(BtfError::Malformed("string offset out of range"))?;
    let end = tail
        .iter()
        .position(|&b| b == 0)
        .ok_or(BtfError::Malformed("unterminated string"))?;
    Ok(&tail[..end])
}

/// Reads the byte offset of `structure.member` from raw BTF (little-endian).
pub fn member_offset(data: &[u8], structure: &str, member: &str) -> Result<u32, BtfError> {
    const MAGIC: u16 = 0xeb9f;
    if data.len() < 24 || u16::from_le_bytes([data[0], data[1]]) != MAGIC {
        return Err(BtfError::Malformed("bad magic"));
    }
    let header_len = u32_at(data, 4)? as usize;
    let type_off = u32_at(data, 8)? as usize;
    let type_len = u32_at(data, 12)? as usize;
    let str_off = u32_at(data, 16)? as usize;
    let str_len = u32_at(data, 20)? as usize;
    let types = data
        .get(header_len + type_off..header_len + type_off + type_len)
        .ok_or(BtfError::Malformed("type section out of range"))?;
    let strings = data
        .get(header_len + str_off..header_len + str_off + str_len)
        .ok_or(BtfError::Malformed("string section out of range"))?;

    let mut at = 0;
    while at + 12 <= types.len() {
        let name_off = u32_at(types, at)?;
        let info = u32_at(types, at + 4)?;
        let vlen = (info & 0xffff) as usize;
        let kind = (info >> 24) & 0x1f;
        let kind_flag = info >> 31 == 1;
        at += 12;
        let trailing = match kind {
            1 | 14 | 17 => 4,             // INT, VAR, DECL_TAG
            3 => 12,                      // ARRAY
            4 | 5 | 15 | 19 => 12 * vlen, // STRUCT, UNION, DATASEC, ENUM64
            6 | 13 => 8 * vlen,           // ENUM, FUNC_PROTO
            2 | 7..=12 | 16 | 18 => 0,    // PTR, FWD, TYPEDEF, qualifiers, FUNC, FLOAT, TYPE_TAG
            other => return Err(BtfError::UnknownKind(other)),
        };
        if kind == 4 && str_at(strings, name_off)? == structure.as_bytes() {
            for i in 0..vlen {
                let m = at + 12 * i;
                if str_at(strings, u32_at(types, m)?)? == member.as_bytes() {
                    let raw = u32_at(types, m + 8)?;
                    let bits = if kind_flag { raw & 0x00ff_ffff } else { raw };
                    return Ok(bits / 8);
                }
            }
        }
        at += trailing;
    }
    Err(BtfError::NotFound {
        structure: structure.to_owned(),
        member: member.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_task_struct_stack_in_the_running_kernel() {
        let path = Path::new(VMLINUX_BTF);
        if !path.exists() {
            crate::test_support::missing_prerequisite(&format!("{VMLINUX_BTF} not present"));
            return;
        }
        let offset = member_offset_in_file(path, "task_struct", "stack");
        let offset = match offset {
            Ok(o) => o,
            Err(e) => panic!("{e}"),
        };
        // `stack` follows `thread_info` and `__state`: small but non-zero.
        assert!(offset > 0 && offset < 256, "offset {offset}");
        assert!(matches!(
            member_offset_in_file(path, "task_struct", "no_such_member"),
            Err(BtfError::NotFound { .. })
        ));
    }

    #[test]
    fn rejects_garbage() {
        assert!(matches!(
            member_offset(&[0u8; 10], "a", "b"),
            Err(BtfError::Malformed(_))
        ));
        let mut header = vec![0x9f, 0xeb, 1, 0, 24, 0, 0, 0];
        header.extend_from_slice(&[0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(matches!(
            member_offset(&header, "a", "b"),
            Err(BtfError::Malformed(_))
        ));
    }
}
