//! Array maps created by user space to go into an array of maps.
//!
//! The kernel accepts an inner map only if it matches the outer map's
//! template, and the template of a BTF-defined array of maps is created
//! with BTF for its value. Linux 5.15 to 6.1 compare the templates'
//! `timer_off`, which is "none found" (`-ENOENT`) for a map with BTF and
//! "not looked for" (`-EINVAL`) for one without: there a plain inner array
//! is refused with `EINVAL`, and every process and unwind table with it.
//! Other kernels accept either. [`InnerArrays`] learns which kind the
//! kernel takes by one trial insert per outer map, and then creates that
//! kind: plain, or with a minimal BTF (an `int` key and a struct value of
//! one byte array, which declares no timer, lock or kernel pointer).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use aya::maps::{MapData, MapError};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_BTF_LOAD: libc::c_long = 18;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BTF_MAGIC: u16 = 0xeb9f;
const BTF_KIND_INT: u32 = 1;
const BTF_KIND_ARRAY: u32 = 3;
const BTF_KIND_STRUCT: u32 = 4;
/// Type IDs in the BTF [`btf_blob`] builds.
const KEY_TYPE_ID: u32 = 1;
const VALUE_TYPE_ID: u32 = 4;

/// Whether inner arrays of one outer map are created with BTF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InnerKind {
    /// Without BTF (the kernel takes either, or the template has none).
    Plain,
    /// With a minimal BTF for key and value.
    WithBtf,
}

/// Creates inner arrays, with BTF where the kernel needs it.
#[derive(Default)]
pub struct InnerArrays {
    /// A loaded BTF per value size.
    btf: HashMap<u32, OwnedFd>,
}

impl InnerArrays {
    /// Creates an array of `max_entries` values of `value_size` bytes.
    pub fn create(
        &mut self,
        kind: InnerKind,
        value_size: u32,
        max_entries: u32,
        flags: u32,
    ) -> Result<MapData, MapError> {
        let btf = match kind {
            InnerKind::Plain => None,
            InnerKind::WithBtf => Some(self.btf_for(value_size)?),
        };
        let fd = create_array(value_size, max_entries, flags, btf).map_err(|io_error| {
            MapError::SyscallError(aya::sys::SyscallError {
                call: "bpf_map_create",
                io_error,
            })
        })?;
        MapData::from_fd(fd)
    }

    /// Finds which kind `insert` (a trial insert of an inner map into a
    /// free slot, undone by the caller) accepts: plain first, then with BTF.
    /// The last error when neither is accepted.
    pub fn probe(
        &mut self,
        value_size: u32,
        max_entries: u32,
        flags: u32,
        mut insert: impl FnMut(MapData) -> Result<(), MapError>,
    ) -> Result<InnerKind, MapError> {
        let mut last = None;
        for kind in [InnerKind::Plain, InnerKind::WithBtf] {
            let attempt = self
                .create(kind, value_size, max_entries, flags)
                .and_then(&mut insert);
            match attempt {
                Ok(()) => return Ok(kind),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(MapError::InvalidName {
            name: "inner array".into(),
        }))
    }

    fn btf_for(&mut self, value_size: u32) -> Result<std::os::fd::BorrowedFd<'_>, MapError> {
        use std::collections::hash_map::Entry;
        let fd: &OwnedFd = match self.btf.entry(value_size) {
            Entry::Occupied(fd) => fd.into_mut(),
            Entry::Vacant(slot) => {
                let fd = load_btf(&btf_blob(value_size)).map_err(|io_error| {
                    MapError::SyscallError(aya::sys::SyscallError {
                        call: "bpf_btf_load",
                        io_error,
                    })
                })?;
                slot.insert(fd)
            }
        };
        Ok(fd.as_fd())
    }
}

/// A `BPF_F_MMAPABLE` array mapped read-write into this process; unmapped
/// when dropped.
pub struct MappedArray {
    address: NonNull<u8>,
    length: usize,
}

// SAFETY: the mapping is owned by this value and only reached through it.
unsafe impl Send for MappedArray {}

impl MappedArray {
    /// Maps the first `bytes` (rounded up to pages) of `map`.
    pub fn new(map: &MapData, bytes: usize) -> std::io::Result<Self> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let length = bytes.div_ceil(page) * page;
        // SAFETY: a fresh shared mapping of (at most) the array's whole
        // page-rounded size, which the kernel allows for mmapable arrays.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                length,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let address = NonNull::new(address.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(MappedArray { address, length })
    }

    /// The start of the mapping, page-aligned.
    pub fn as_ptr(&self) -> *mut u8 {
        self.address.as_ptr()
    }
}

impl Drop for MappedArray {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` created, unmapped once.
        unsafe { libc::munmap(self.address.as_ptr().cast(), self.length) };
    }
}

/// A BTF with `[1] int` (4 bytes), `[2] u8`, `[3] u8[value_size]` and
/// `[4] struct { u8 b[value_size]; }`. The value must be a struct: for any
/// other type 6.1 records `timer_off` as for a map without BTF.
fn btf_blob(value_size: u32) -> Vec<u8> {
    let strings: &[u8] = b"\0int\0u8\0b\0";
    let mut types = Vec::new();
    let mut word = |w: u32| types.extend_from_slice(&w.to_le_bytes());
    // [1] int: name "int", 4 bytes, 32 bits, signed.
    word(1);
    word(BTF_KIND_INT << 24);
    word(4);
    word((1 << 24) | 32);
    // [2] u8: name "u8", 1 byte, 8 bits, unsigned.
    word(5);
    word(BTF_KIND_INT << 24);
    word(1);
    word(8);
    // [3] u8[value_size], indexed by int.
    word(0);
    word(BTF_KIND_ARRAY << 24);
    word(0);
    word(2);
    word(KEY_TYPE_ID);
    word(value_size);
    // [4] an anonymous struct of value_size bytes: one member "b" of
    // type [3] at bit offset 0.
    word(0);
    word((BTF_KIND_STRUCT << 24) | 1);
    word(value_size);
    word(8);
    word(3);
    word(0);
    let mut blob = Vec::with_capacity(24 + types.len() + strings.len());
    blob.extend_from_slice(&BTF_MAGIC.to_le_bytes());
    blob.push(1); // version
    blob.push(0); // flags
    blob.extend_from_slice(&24u32.to_le_bytes()); // header length
    blob.extend_from_slice(&0u32.to_le_bytes()); // type section offset
    blob.extend_from_slice(&(types.len() as u32).to_le_bytes());
    blob.extend_from_slice(&(types.len() as u32).to_le_bytes()); // string offset
    blob.extend_from_slice(&(strings.len() as u32).to_le_bytes());
    blob.extend_from_slice(&types);
    blob.extend_from_slice(strings);
    blob
}

/// `union bpf_attr` as `BPF_BTF_LOAD` reads it.
#[repr(C)]
#[derive(Default)]
struct BtfLoadAttr {
    btf: u64,
    btf_log_buf: u64,
    btf_size: u32,
    btf_log_size: u32,
    btf_log_level: u32,
    padding: [u32; 27],
}

/// `union bpf_attr` as `BPF_MAP_CREATE` reads it.
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
    map_ifindex: u32,
    btf_fd: u32,
    btf_key_type_id: u32,
    btf_value_type_id: u32,
    btf_vmlinux_value_type_id: u32,
    map_extra: u64,
    padding: [u64; 8],
}

fn bpf(cmd: libc::c_long, attr: *const u8, size: usize) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` points at a zero-padded attribute block of `size`
    // bytes that outlives the call; the kernel copies it.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr, size) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a successful BPF_MAP_CREATE or BPF_BTF_LOAD returns a new
    // descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as i32) })
}

fn load_btf(blob: &[u8]) -> std::io::Result<OwnedFd> {
    let attr = BtfLoadAttr {
        btf: blob.as_ptr() as u64,
        btf_size: blob.len() as u32,
        ..BtfLoadAttr::default()
    };
    bpf(
        BPF_BTF_LOAD,
        (&raw const attr).cast(),
        size_of::<BtfLoadAttr>(),
    )
}

fn create_array(
    value_size: u32,
    max_entries: u32,
    flags: u32,
    btf: Option<std::os::fd::BorrowedFd<'_>>,
) -> std::io::Result<OwnedFd> {
    let mut attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size,
        max_entries,
        map_flags: flags,
        ..MapCreateAttr::default()
    };
    attr.map_name[..11].copy_from_slice(b"icecore_tbl");
    if let Some(btf) = btf {
        attr.btf_fd = btf.as_raw_fd() as u32;
        attr.btf_key_type_id = KEY_TYPE_ID;
        attr.btf_value_type_id = VALUE_TYPE_ID;
    }
    bpf(
        BPF_MAP_CREATE,
        (&raw const attr).cast(),
        size_of::<MapCreateAttr>(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn btf_blob_lays_out_header_types_and_strings() {
        let blob = btf_blob(48);
        assert_eq!(&blob[..4], &[0x9f, 0xeb, 1, 0]);
        let type_len = u32::from_le_bytes(blob[12..16].try_into().unwrap());
        let str_off = u32::from_le_bytes(blob[16..20].try_into().unwrap());
        let str_len = u32::from_le_bytes(blob[20..24].try_into().unwrap());
        // Two ints of 4 words, an array of 6 and a struct of 6.
        assert_eq!(type_len, 20 * 4);
        assert_eq!(str_off, type_len);
        assert_eq!(blob.len(), 24 + (type_len + str_len) as usize);
        assert_eq!(&blob[blob.len() - 10..], b"\0int\0u8\0b\0");
        // The array's element count is the value size.
        let nelems = u32::from_le_bytes(blob[24 + 13 * 4..24 + 14 * 4].try_into().unwrap());
        assert_eq!(nelems, 48);
    }

    /// The kernel loads the BTF and creates both kinds of array (root only).
    #[test]
    fn kernel_creates_both_kinds() {
        // SAFETY: a plain libc call.
        if unsafe { libc::geteuid() } != 0 {
            crate::test_support::missing_prerequisite("creating BPF maps needs root");
            return;
        }
        let mut arrays = InnerArrays::default();
        for kind in [InnerKind::Plain, InnerKind::WithBtf] {
            let map = arrays.create(kind, 12304, 1, 0).expect("create");
            drop(map);
        }
    }
}
