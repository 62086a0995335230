//! The symbol caches against objects laid out in this process's own
//! memory (read through `/proc/self/mem`, as a Node's would be): a
//! SharedFunctionInfo address V8 reuses for another function is renamed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use super::names::V8Objects;
use super::symbols::{JsFrame, V8Symbols};
use super::tests::expected;
use crate::runtimes::memory::ProcessMemory;

/// Node 20's instance types: SHARED_FUNCTION_INFO_TYPE, and a sequential
/// one-byte string.
const SFI_TYPE: u64 = 262;
const ONE_BYTE_STRING: u64 = 8;

/// A one-byte string's characters, in one word.
fn chars(text: &str) -> u64 {
    let mut bytes = [0u8; 8];
    bytes[..text.len()].copy_from_slice(text.as_bytes());
    u64::from_le_bytes(bytes)
}

#[test]
fn a_function_address_reused_by_another_function_is_renamed() {
    let layout = expected(20);
    // Words: a SharedFunctionInfo at 0, its map at 40, a string map at 44,
    // the strings "first" at 48 and "second" at 56.
    let mut heap = vec![0u64; 64];
    let base = heap.as_ptr() as u64;
    let tagged = |word: usize| base + 8 * word as u64 + 1;
    heap[0] = tagged(40);
    heap[2] = tagged(48); // name_or_scope_info (16): "first"
    heap[41] = SFI_TYPE << 32; // the map's instance type (byte 12)
    heap[45] = ONE_BYTE_STRING << 32;
    for (at, name) in [(48, "first"), (56, "second")] {
        heap[at] = tagged(44);
        heap[at + 1] = (name.len() as u64) << 32; // length (byte 12)
        heap[at + 2] = chars(name);
    }
    let pid = std::process::id();
    let memory = ProcessMemory::open(pid).unwrap();
    let objects = V8Objects::new(&layout, &memory);
    let frame = JsFrame::Interpreted {
        shared: tagged(0),
        offset: 0,
    };
    let mut symbols = V8Symbols::default();
    let name = |symbols: &mut V8Symbols| {
        symbols.frame(pid, frame, None, &[]).lines[0]
            .function_name
            .to_string()
    };
    symbols.observe(pid, frame, &objects, &[], None);
    assert_eq!(name(&mut symbols), "first");
    // The garbage collector moved the function and placed another one at
    // its address: another name.
    // SAFETY: a plain write to this test's own vector, read back through
    // /proc/self/mem.
    unsafe { std::ptr::write_volatile(heap.as_mut_ptr().add(2), tagged(56)) };
    symbols.observe(pid, frame, &objects, &[], None);
    assert_eq!(
        name(&mut symbols),
        "first",
        "checked at most every 200 ms: still the name read"
    );
    std::thread::sleep(Duration::from_millis(250));
    symbols.observe(pid, frame, &objects, &[], None);
    assert_eq!(name(&mut symbols), "second");
    drop(heap);
}
