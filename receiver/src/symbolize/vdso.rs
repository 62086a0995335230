//! The kernel's vDSO, read from icecore's own address space.
//!
//! Every 64-bit process on a host maps the same vDSO image, so the copy in this
//! process (found with `getauxval(AT_SYSINFO_EHDR)`) symbolizes `[vdso]` frames
//! of all of them. Its size comes from its ELF headers; it is copied once and
//! parsed like any ELF file.

use std::sync::OnceLock;

use super::elf::ElfSymbols;

/// Largest vDSO image accepted (real ones are two to four pages).
pub const MAX_VDSO_SIZE: u64 = 1 << 20;

/// The vDSO image of this process.
#[derive(Debug)]
pub struct Vdso {
    /// Its symbols.
    pub symbols: ElfSymbols,
    /// Its size in bytes (from its headers), before page rounding.
    pub size: u64,
    /// The image itself (its `.eh_frame` makes the vDSO's unwind table).
    pub image: Vec<u8>,
}

impl Vdso {
    /// Whether a `[vdso]` mapping of `mapping_size` bytes holds this image: a
    /// 32-bit process maps another, differently sized one.
    pub fn fits(&self, mapping_size: u64) -> bool {
        self.size.next_multiple_of(4096) == mapping_size
    }
}

/// This process's vDSO, parsed on first use; `None` when there is none or it is
/// unreadable.
pub fn own() -> Option<&'static Vdso> {
    static VDSO: OnceLock<Option<Vdso>> = OnceLock::new();
    VDSO.get_or_init(load).as_ref()
}

fn load() -> Option<Vdso> {
    // SAFETY: getauxval only reads the auxiliary vector.
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    if base == 0 {
        return None;
    }
    // The ELF header fits in the first page, which the kernel maps readable.
    // SAFETY: `base` is the start of the vDSO mapping, at least one page long,
    // mapped for the life of the process and never written.
    let header = unsafe { std::slice::from_raw_parts(base as *const u8, 64) };
    let size = image_size(header)?;
    if size > MAX_VDSO_SIZE || size.next_multiple_of(4096) > vdso_mapping_size(base)? {
        return None;
    }
    // SAFETY: as above; `size` lies within the mapping, checked against
    // /proc/self/maps.
    let image = unsafe { std::slice::from_raw_parts(base as *const u8, size as usize) }.to_vec();
    let symbols = ElfSymbols::parse(&image).ok()?;
    Some(Vdso {
        symbols,
        size,
        image,
    })
}

/// The size of an ELF image from its 64-bit header: the end of the section
/// header table (which comes last in the vDSO), or of the program headers.
pub fn image_size(header: &[u8]) -> Option<u64> {
    if header.get(..4)? != b"\x7fELF" || *header.get(4)? != 2 || *header.get(5)? != 1 {
        return None;
    }
    let u16_at = |at: usize| {
        Some(u64::from(u16::from_le_bytes(
            header.get(at..at + 2)?.try_into().ok()?,
        )))
    };
    let u64_at = |at: usize| Some(u64::from_le_bytes(header.get(at..at + 8)?.try_into().ok()?));
    let (phoff, shoff) = (u64_at(0x20)?, u64_at(0x28)?);
    let (phentsize, phnum) = (u16_at(0x36)?, u16_at(0x38)?);
    let (shentsize, shnum) = (u16_at(0x3a)?, u16_at(0x3c)?);
    let sections_end = shoff.checked_add(shentsize.checked_mul(shnum)?)?;
    let programs_end = phoff.checked_add(phentsize.checked_mul(phnum)?)?;
    Some(sections_end.max(programs_end).max(64))
}

/// The size of the `[vdso]` mapping starting at `base`, from /proc/self/maps.
fn vdso_mapping_size(base: u64) -> Option<u64> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        let range = line.split_whitespace().next()?;
        let (start, end) = range.split_once('-')?;
        let start = u64::from_str_radix(start, 16).ok()?;
        let end = u64::from_str_radix(end, 16).ok()?;
        (start == base && line.trim_end().ends_with("[vdso]")).then(|| end - start)
    })
}
