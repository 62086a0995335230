//! Tests of [`Symbolizer`] against the running test process, compiled programs
//! and synthetic inputs.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use super::testutil::{C_SOURCE, compile_c, compile_cxx, oracle_file_offset, whole_file_mapping};
use super::*;
use crate::process_maps::ProcessMappings;

#[inline(never)]
fn marker_for_symbolizer_test(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(31).rotate_left(7)
}

fn is_send<T: Send>() {}

#[test]
fn symbolizer_is_send() {
    is_send::<Symbolizer>();
}

#[test]
fn own_function_in_running_process() {
    let pid = std::process::id();
    let maps = ProcessMappings::read(pid).unwrap();
    let address = marker_for_symbolizer_test as *const () as u64;
    assert_ne!(marker_for_symbolizer_test(address), 0);
    let mapping = maps.find(address).unwrap();
    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());

    let frame = symbolizer.native_frame(pid, mapping, address + 2, false);
    assert_eq!(frame.kind, FrameKind::Native);
    assert_eq!(frame.address, address + 2);
    // Inline chains are innermost first; in an optimised build `black_box`
    // can be inlined at this address, so the function that contains it is
    // the outermost entry.
    let line = frame.lines.last().unwrap();
    assert!(
        line.function_name.ends_with("marker_for_symbolizer_test"),
        "{line:?}"
    );
    assert!(
        !line.function_name.contains("::h"),
        "hash is hidden: {line:?}"
    );
    assert!(
        line.system_name.starts_with("_ZN") || line.system_name.starts_with("_R"),
        "{line:?}"
    );
    let frame_mapping = frame.mapping.as_ref().unwrap();
    assert_eq!(&*frame_mapping.filename, &*mapping.path);
    assert_eq!(
        (frame_mapping.memory_start, frame_mapping.file_offset),
        (mapping.start, mapping.file_offset)
    );
    assert!(frame_mapping.build_id.is_some());

    // A return address one past the call is looked up at the call.
    let again = symbolizer.native_frame(pid, mapping, address + 3, true);
    assert!(
        Arc::ptr_eq(&frame, &again),
        "frame cache hit returns the same Arc"
    );
    let stats = symbolizer.stats();
    assert_eq!((stats.frame_cache_hits, stats.frame_cache_misses), (1, 1));
    assert_eq!(
        (stats.files_loaded, stats.load_failures, stats.cached_files),
        (1, 0, 1)
    );

    // Another address of the same function shares the mapping and the names.
    let other = symbolizer.native_frame(pid, mapping, address + 1, false);
    assert!(Arc::ptr_eq(
        frame.mapping.as_ref().unwrap(),
        other.mapping.as_ref().unwrap()
    ));
    assert!(Arc::ptr_eq(
        &frame.lines[0].function_name,
        &other.lines[0].function_name
    ));
    assert_eq!(symbolizer.stats().file_cache_hits, 1);
}

#[test]
fn libc_malloc_via_dynsym() {
    let pid = std::process::id();
    // SAFETY: dlsym with a NUL-terminated name and the default handle.
    let malloc = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) } as u64;
    assert_ne!(malloc, 0);
    let maps = ProcessMappings::read(pid).unwrap();
    let mapping = maps.find(malloc).unwrap();
    assert!(mapping.path.contains("libc.so"), "{mapping:?}");
    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
    let frame = symbolizer.native_frame(pid, mapping, malloc + 4, false);
    assert_eq!(&*frame.lines[0].function_name, "malloc");
}

#[test]
fn cxx_template_is_demangled() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_cxx(dir.path(), "cxx");
    let symbols = ElfSymbols::load(&exe).unwrap();
    let mangled = symbols
        .symbols()
        .map(|s| s.name.into_owned())
        .find(|n| n.starts_with("_ZN2ns6worker"))
        .unwrap();
    let mangled = mangled.as_str();
    let offset = oracle_file_offset(&exe, mangled);
    let mapping = whole_file_mapping(&exe, 0x5555_0000_0000);
    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
    let frame = symbolizer.native_frame(
        std::process::id(),
        &mapping,
        mapping.start + offset + 4,
        false,
    );
    assert_eq!(&*frame.lines[0].function_name, "int ns::worker<int>(int)");
    assert_eq!(&*frame.lines[0].system_name, mangled);
}

#[test]
fn running_pie_child_process() {
    let dir = tempfile::tempdir().unwrap();
    let source = format!("{C_SOURCE}\nint wait_main(void) {{ return getchar(); }}\n");
    let source = source.replace("int main(", "int unused_main(").replace(
        "#include <stdio.h>",
        "#include <stdio.h>\nint wait_main(void);\nint main(void) { printf(\"ready\\n\"); fflush(stdout); return wait_main() + beta(1); }",
    );
    let exe = compile_c(dir.path(), "child", &source, &["-O0", "-fPIE", "-pie"]);
    let mut child = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready");

    let pid = child.id();
    let maps = ProcessMappings::read(pid).unwrap();
    let exe_str = exe.to_str().unwrap();
    let text = maps.executable().find(|m| &*m.path == exe_str).unwrap();
    let offset = oracle_file_offset(&exe, "beta");
    let address = text.start + offset - text.file_offset;
    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
    let frame = symbolizer.native_frame(pid, text, address + 5, true);
    assert_eq!(&*frame.lines[0].function_name, "beta");
    assert_eq!(frame.address, address + 4);
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn broken_file_is_negatively_cached() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.so");
    std::fs::write(&path, b"\x7fELF\x02\x01\x01 this is not really an ELF file").unwrap();
    let mapping = whole_file_mapping(&path, 0x7000_0000);
    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
    let first = symbolizer.native_frame(1, &mapping, 0x7000_0010, false);
    let second = symbolizer.native_frame(1, &mapping, 0x7000_0020, false);
    assert!(first.lines.is_empty() && second.lines.is_empty());
    assert_eq!(&*first.mapping.as_ref().unwrap().filename, &*mapping.path);
    assert!(first.mapping.as_ref().unwrap().build_id.is_none());
    let stats = symbolizer.stats();
    assert_eq!(
        (
            stats.load_failures,
            stats.file_cache_misses,
            stats.file_cache_hits
        ),
        (1, 1, 1)
    );

    // A deleted file is only read through map_files, which a fake mapping lacks:
    // unreachable, so neither the file nor the frame is remembered for good.
    let deleted = MappedFile {
        deleted: true,
        inode: mapping.inode + 1,
        ..mapping.clone()
    };
    let pid = std::process::id();
    for _ in 0..2 {
        let frame = symbolizer.native_frame(pid, &deleted, 0x7000_0010, false);
        assert!(frame.lines.is_empty());
    }
    let stats = symbolizer.stats();
    assert_eq!((stats.load_failures, stats.frame_cache_misses), (2, 4));

    let limits = SymbolizerLimits {
        retry_unreachable_after: std::time::Duration::ZERO,
        ..SymbolizerLimits::default()
    };
    let mut retrying = Symbolizer::new(limits);
    for _ in 0..3 {
        retrying.native_frame(pid, &deleted, 0x7000_0010, false);
    }
    assert_eq!(retrying.stats().load_failures, 3);
}

#[test]
fn file_cache_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let a = compile_c(dir.path(), "a", C_SOURCE, &["-O0"]);
    let b = compile_c(dir.path(), "b", C_SOURCE, &["-O0"]);
    let offset = oracle_file_offset(&a, "alpha");
    let (ma, mb) = (
        whole_file_mapping(&a, 0x1000_0000),
        whole_file_mapping(&b, 0x2000_0000),
    );
    let limits = SymbolizerLimits {
        max_files: 1,
        max_frames: 1,
        ..SymbolizerLimits::default()
    };
    let mut symbolizer = Symbolizer::new(limits);
    let pid = std::process::id();
    for _ in 0..2 {
        for m in [&ma, &mb] {
            let frame = symbolizer.native_frame(pid, m, m.start + offset, false);
            assert_eq!(&*frame.lines[0].function_name, "alpha");
        }
    }
    let stats = symbolizer.stats();
    assert_eq!(stats.files_loaded, 4, "each file evicts the other");
    assert_eq!((stats.cached_files, stats.cached_frames), (1, 1));
}

#[test]
fn same_code_in_two_processes_shares_lines() {
    let dir = tempfile::tempdir().unwrap();
    let lib = compile_c(
        dir.path(),
        "libx.so",
        C_SOURCE,
        &["-O0", "-fPIC", "-shared"],
    );
    let offset = oracle_file_offset(&lib, "beta");
    let (m1, m2) = (
        whole_file_mapping(&lib, 0x1000_0000),
        whole_file_mapping(&lib, 0x3000_0000),
    );
    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
    let pid = std::process::id();
    let f1 = symbolizer.native_frame(pid, &m1, m1.start + offset, false);
    let f2 = symbolizer.native_frame(pid, &m2, m2.start + offset, false);
    assert_eq!(f2.address, m2.start + offset);
    assert_eq!(f2.mapping.as_ref().unwrap().memory_start, m2.start);
    assert_eq!(f1.lines, f2.lines);
    assert_eq!(
        f1.mapping.as_ref().unwrap().build_id,
        f2.mapping.as_ref().unwrap().build_id
    );
    let stats = symbolizer.stats();
    assert_eq!((stats.frame_cache_hits, stats.files_loaded), (1, 1));
}

#[test]
fn vdso_and_unknown_frames() {
    let vdso = MappedFile {
        start: 0x7ffd_0000_0000,
        // Sized unlike this host's vDSO, so it is treated as another one's.
        end: 0x7ffd_0004_0000,
        file_offset: 0,
        dev: (0, 0),
        inode: 0,
        path: Arc::from(crate::process_maps::VDSO_NAME),
        executable: true,
        deleted: false,
    };
    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
    let frame = symbolizer.native_frame(1, &vdso, 0x7ffd_0000_0100, true);
    assert_eq!(frame.address, 0x7ffd_0000_00ff);
    assert_eq!(&*frame.mapping.as_ref().unwrap().filename, "[vdso]");
    assert!(frame.lines.is_empty());
    assert_eq!(symbolizer.stats().file_cache_misses, 0);

    // An address outside the given mapping has no mapping.
    let outside = symbolizer.native_frame(1, &vdso, 0x10, false);
    assert!(outside.mapping.is_none());

    let unknown = Symbolizer::unknown_frame(FrameKind::Native, 0x1234);
    assert_eq!((unknown.kind, unknown.address), (FrameKind::Native, 0x1234));
    assert!(unknown.mapping.is_none() && unknown.lines.is_empty());
}

#[test]
fn kernel_frames_from_given_symbols() {
    let text = "ffffffff81000000 T _stext\nffffffff81001000 T do_sys_open\nffffffff81002000 t _RNvCs1234_6kernel5rusty\n";
    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
    symbolizer.set_kernel_symbols(KernelSymbols::parse(text).unwrap());
    let frame = symbolizer.kernel_frame(0xffffffff81001010);
    assert_eq!(frame.kind, FrameKind::Kernel);
    assert_eq!(&*frame.lines[0].function_name, "do_sys_open");
    let mapping = frame.mapping.as_ref().unwrap();
    assert_eq!(&*mapping.filename, KERNEL_MAPPING_NAME);
    assert_eq!(mapping.memory_start, 0xffffffff81000000);
    assert!(Arc::ptr_eq(
        &frame,
        &symbolizer.kernel_frame(0xffffffff81001010)
    ));
    let rusty = symbolizer.kernel_frame(0xffffffff81002004);
    assert_eq!(&*rusty.lines[0].function_name, "kernel::rusty");
    assert_eq!(&*rusty.lines[0].system_name, "_RNvCs1234_6kernel5rusty");
    assert!(symbolizer.kernel_frame(0x1000).lines.is_empty());
    assert_eq!(symbolizer.stats().kernel_symbols, 3);
}

#[test]
fn kernel_frames_from_proc() {
    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
    let Ok(symbols) = KernelSymbols::load() else {
        return;
    };
    let Some(address) = symbols.first_address() else {
        return;
    };
    let frame = symbolizer.kernel_frame(address + 1);
    assert_eq!(frame.lines.len(), 1, "{frame:?}");
    assert!(symbolizer.stats().kernel_symbols > 0);
}
