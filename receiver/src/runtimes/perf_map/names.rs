//! JIT symbol names, as runtimes write them in perf maps and jitdumps,
//! split into the function, file and line a profile shows, for the formats
//! known (checked against Node.js 20 and .NET Core 3.1 output):
//!
//! - V8 (Node.js): `KIND:[TIER]NAME [LOCATION]`, e.g. `JS:*alpha
//!   /app/x.js:4:15`, `JS:~beta file:///app/y.mjs:2:14`, `LazyCompile:~f
//!   /app/x.js:4` (older V8). The tier mark (`~` interpreted, `^` baseline,
//!   `+` Maglev, `*` TurboFan) goes; an empty name is `(anonymous)`
//!   (`(eval)`, `(script)` for those kinds); `file://` URLs become paths;
//!   the line is the first number of `:LINE:COLUMN`. Runtime code
//!   (`Builtin:`, `BytecodeHandler:`, `Stub:`, `RegExp:`, …) keeps its name.
//! - .NET: `[RETURN TYPE] [Assembly] Namespace.Type::Method(args)[Tier]`
//!   (`instance` and the return type before, in 3.1): the function is
//!   `Namespace.Type::Method(args)`, with `class `, `valuetype ` and
//!   assembly qualifiers dropped from the arguments; the assembly is the
//!   file. Stubs (`stub<42> GenerateResolveStub<…>`) lose their counter.
//! - JVM (perf-map-agent): `Lpkg/Class;::method` is `pkg.Class.method`.
//!
//! Anything else (Erlang, Julia, LuaJIT, wasmtime, …) is kept as written.

use std::borrow::Cow;

/// A symbol name split into what a profile shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanName<'a> {
    /// The function.
    pub function: Cow<'a, str>,
    /// The source file (for .NET, the assembly), when the name tells.
    pub file: Option<Cow<'a, str>>,
    /// 1-based line; 0 when unknown.
    pub line: u32,
}

impl<'a> CleanName<'a> {
    fn plain(name: &'a str) -> Self {
        CleanName {
            function: Cow::Borrowed(name),
            file: None,
            line: 0,
        }
    }
}

/// The function, file and line of a JIT symbol's `name`. Never fails: a
/// name of no known format is the function as it is (trimmed), an empty
/// one `(unknown)`.
pub fn clean(name: &str) -> CleanName<'_> {
    let name = name.trim();
    if name.is_empty() {
        return CleanName::plain("(unknown)");
    }
    v8(name)
        .or_else(|| dotnet(name))
        .or_else(|| jvm(name))
        .unwrap_or_else(|| CleanName::plain(name))
}

/// A source location's path: `file://` URLs as paths (percent-decoded),
/// anything else (`/app/x.js`, `node:fs`, `https://…`) as it is.
pub fn source_path(location: &str) -> Cow<'_, str> {
    let Some(rest) = location.strip_prefix("file://") else {
        return Cow::Borrowed(location);
    };
    let rest = rest
        .strip_prefix("localhost")
        .filter(|r| r.starts_with('/'))
        .unwrap_or(rest);
    if !rest.contains('%') {
        return Cow::Borrowed(rest);
    }
    percent_decode(rest).map_or(Cow::Borrowed(rest), Cow::Owned)
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = |at: usize| bytes.get(at).and_then(|&h| (h as char).to_digit(16));
        match (b, hex(i + 1), hex(i + 2)) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// V8's code kinds of JavaScript functions.
const V8_FUNCTION_KINDS: [&str; 6] = [
    "JS",
    "LazyCompile",
    "Function",
    "InterpretedFunction",
    "Eval",
    "Script",
];
/// V8's code kinds of runtime code, whose names are kept as they are.
const V8_RUNTIME_KINDS: [&str; 6] = [
    "Builtin",
    "BytecodeHandler",
    "Stub",
    "Handler",
    "Callback",
    "RegExp",
];
/// How a V8 location starts, after the space that ends the name.
const V8_LOCATION_STARTS: [&str; 10] = [
    "/",
    "file://",
    "node:",
    "http://",
    "https://",
    "evalmachine.",
    "webpack:",
    "webpack-internal:",
    "ext:",
    "wasm://",
];

fn v8(name: &str) -> Option<CleanName<'_>> {
    let (kind, rest) = name.split_once(':')?;
    if V8_RUNTIME_KINDS.contains(&kind) {
        return Some(CleanName::plain(name));
    }
    if !V8_FUNCTION_KINDS.contains(&kind) {
        return None;
    }
    let rest = rest.strip_prefix(['*', '~', '^', '+']).unwrap_or(rest);
    let (function, location) = split_v8(rest);
    let function = match function.trim() {
        "" if kind == "Eval" => "(eval)",
        "" if kind == "Script" => "(script)",
        "" => "(anonymous)",
        function => function,
    };
    let (path, line) = split_line(location.trim());
    Some(CleanName {
        function: Cow::Borrowed(function),
        file: (!path.is_empty()).then(|| source_path(path)),
        line,
    })
}

/// `NAME LOCATION` → (NAME, LOCATION). Names may hold spaces (`get x`) and
/// so may paths: the location starts at the first space followed by what
/// starts a location (a path, a URL, `:LINE` for code without a script);
/// failing that, it is the last word if that ends with `:NUMBER`.
fn split_v8(rest: &str) -> (&str, &str) {
    for (space, _) in rest.match_indices(' ') {
        let after = &rest[space + 1..];
        let no_script = after
            .strip_prefix(':')
            .is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit()));
        if no_script || V8_LOCATION_STARTS.iter().any(|s| after.starts_with(s)) {
            return (&rest[..space], after);
        }
    }
    match rest.rsplit_once(' ') {
        Some((function, location)) if ends_with_number(location) => (function, location),
        _ => (rest, ""),
    }
}

fn ends_with_number(s: &str) -> bool {
    s.rsplit_once(':')
        .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// `PATH:LINE:COLUMN` or `PATH:LINE` → (PATH, LINE); (PATH, 0) without.
fn split_line(location: &str) -> (&str, u32) {
    let mut path = location;
    let mut line = 0;
    for _ in 0..2 {
        match path.rsplit_once(':') {
            Some((head, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                line = n.parse().unwrap_or(0);
                path = head;
            }
            _ => break,
        }
    }
    (path, line)
}

fn dotnet(name: &str) -> Option<CleanName<'_>> {
    if let Some(rest) = name.strip_prefix("stub<") {
        let (counter, what) = rest.split_once("> ")?;
        if counter.is_empty() || !counter.bytes().all(|b| b.is_ascii_digit()) || what.is_empty() {
            return None;
        }
        return Some(CleanName {
            function: Cow::Owned(format!("stub {what}")),
            file: None,
            line: 0,
        });
    }
    // `… [Assembly] Type::Method(args)[Tier]`: the assembly is the last
    // bracketed word before the `::` (the return type may hold brackets).
    let separator = name.find("::")?;
    let prefix = &name[..separator];
    let close = prefix.rfind("] ")?;
    let open = prefix[..close].rfind('[')?;
    let assembly = &prefix[open + 1..close];
    let type_name = &prefix[close + 2..];
    if (open > 0 && !prefix[..open].ends_with(' '))
        || assembly.is_empty()
        || assembly.contains(' ')
        || type_name.is_empty()
        || type_name.contains(' ')
    {
        return None;
    }
    let mut end = name.len();
    if name.ends_with(']')
        && let Some(tier) = name.rfind('[')
        && tier > separator
        && name[..tier].ends_with(')')
    {
        end = tier;
    }
    Some(CleanName {
        function: simplify_arguments(&name[close + 2..end]),
        file: Some(Cow::Borrowed(assembly)),
        line: 0,
    })
}

/// `M(class [System.Runtime]System.Func`2<!0,!1>,valuetype X)` →
/// `M(System.Func`2<!0,!1>,X)`.
fn simplify_arguments(method: &str) -> Cow<'_, str> {
    let Some(open) = method.find('(') else {
        return Cow::Borrowed(method);
    };
    let bytes = method.as_bytes();
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut i = open;
    while let Some(&b) = bytes.get(i) {
        let at_token = i > 0 && matches!(bytes[i - 1], b'(' | b',' | b'<' | b' ');
        let dropped = if at_token && bytes[i..].starts_with(b"class ") {
            "class ".len()
        } else if at_token && bytes[i..].starts_with(b"valuetype ") {
            "valuetype ".len()
        } else if b == b'[' {
            assembly_qualifier(&method[i..])
        } else {
            0
        };
        if dropped == 0 {
            i += 1;
            continue;
        }
        out.get_or_insert_with(|| String::with_capacity(method.len()))
            .push_str(&method[copied..i]);
        i += dropped;
        copied = i;
    }
    match out {
        None => Cow::Borrowed(method),
        Some(mut out) => {
            out.push_str(&method[copied..]);
            Cow::Owned(out)
        }
    }
}

/// The length of `[Assembly]` at the start of `s` when a type name follows
/// it (`[System.Runtime]System.Func`), else 0 (`[]`, `[0...,0...]`).
fn assembly_qualifier(s: &str) -> usize {
    let Some(close) = s.find(']') else {
        return 0;
    };
    let name = &s[1..close];
    let qualifies = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && s[close + 1..].starts_with(|c: char| c.is_alphabetic() || c == '_');
    if qualifies { close + 1 } else { 0 }
}

fn jvm(name: &str) -> Option<CleanName<'_>> {
    let (class, method) = name.strip_prefix('L')?.split_once(";::")?;
    if class.is_empty() || method.is_empty() || class.contains([' ', ';']) {
        return None;
    }
    let mut function = String::with_capacity(class.len() + 1 + method.len());
    function.extend(class.chars().map(|c| if c == '/' { '.' } else { c }));
    function.push('.');
    function.push_str(method);
    Some(CleanName {
        function: Cow::Owned(function),
        file: None,
        line: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(name: &str) -> (String, Option<String>, u32) {
        let c = clean(name);
        (c.function.into_owned(), c.file.map(Cow::into_owned), c.line)
    }

    fn named(function: &str, file: Option<&str>, line: u32) -> (String, Option<String>, u32) {
        (function.to_owned(), file.map(str::to_owned), line)
    }

    #[test]
    fn v8_names_as_node_20_writes_them() {
        for (name, function, file, line) in [
            (
                "JS:~alpha /tmp/pmx/x.js:1:15",
                "alpha",
                Some("/tmp/pmx/x.js"),
                1,
            ),
            (
                "JS:*alpha file:///tmp/pmx/y.mjs:1:15",
                "alpha",
                Some("/tmp/pmx/y.mjs"),
                1,
            ),
            (
                "JS:^bar /tmp/pmx/x.js:3:16",
                "bar",
                Some("/tmp/pmx/x.js"),
                3,
            ),
            (
                "JS:^ /tmp/pmx/x.js:11:17",
                "(anonymous)",
                Some("/tmp/pmx/x.js"),
                11,
            ),
            ("JS:* :1:1", "(anonymous)", None, 1),
            ("JS:~evald :1:16", "evald", None, 1),
            ("Eval:~ :1:1", "(eval)", None, 1),
            (
                "Eval:~ /tmp/pmx/x.js:1:1",
                "(eval)",
                Some("/tmp/pmx/x.js"),
                1,
            ),
            (
                "Script:~ file:///tmp/pmx/y.mjs:1:1",
                "(script)",
                Some("/tmp/pmx/y.mjs"),
                1,
            ),
            (
                "JS:~writeSync node:fs:898:19",
                "writeSync",
                Some("node:fs"),
                898,
            ),
            (
                "JS:^defineLazyProperties node:internal/util:598:30",
                "defineLazyProperties",
                Some("node:internal/util"),
                598,
            ),
            ("RegExp:a(b+)c", "RegExp:a(b+)c", None, 0),
            (
                "Builtin:ArrayPrototypePush",
                "Builtin:ArrayPrototypePush",
                None,
                0,
            ),
            ("BytecodeHandler:Add", "BytecodeHandler:Add", None, 0),
        ] {
            assert_eq!(parts(name), named(function, file, line), "{name}");
        }
    }

    #[test]
    fn other_v8_forms() {
        for (name, function, file, line) in [
            (
                "LazyCompile:*alpha /app/x.js:4",
                "alpha",
                Some("/app/x.js"),
                4,
            ),
            ("Function:~alpha /app/x.js:4", "alpha", Some("/app/x.js"), 4),
            (
                "JS:*  file:///app/x.js:10:3",
                "(anonymous)",
                Some("/app/x.js"),
                10,
            ),
            ("JS:+maglevved /a.js:7:1", "maglevved", Some("/a.js"), 7),
            (
                "JS:~get size /srv/my app/x.js:3:70",
                "get size",
                Some("/srv/my app/x.js"),
                3,
            ),
            (
                "JS:*f file:///my%20dir/x%C3%A9.mjs:2:1",
                "f",
                Some("/my dir/xé.mjs"),
                2,
            ),
            (
                "JS:~run evalmachine.<anonymous>:1:1",
                "run",
                Some("evalmachine.<anonymous>"),
                1,
            ),
            (
                "JS:~handler src/app.js:9:2",
                "handler",
                Some("src/app.js"),
                9,
            ),
            ("JS:*Foo.bar", "Foo.bar", None, 0),
            (
                "Script:~ node:internal/main",
                "(script)",
                Some("node:internal/main"),
                0,
            ),
            (
                "Stub:CEntry_Return1_ArgvOnStack_NoBuiltinExit",
                "Stub:CEntry_Return1_ArgvOnStack_NoBuiltinExit",
                None,
                0,
            ),
        ] {
            assert_eq!(parts(name), named(function, file, line), "{name}");
        }
    }

    #[test]
    fn dotnet_names_as_core_3_1_writes_them() {
        let lib = Some("System.Private.CoreLib");
        for (name, function, file) in [
            (
                "int32 [busy] P::Leaf(int32)[Optimized]",
                "P::Leaf(int32)",
                Some("busy"),
            ),
            (
                "int32 [busy] P::Main(string[])[Optimized]",
                "P::Main(string[])",
                Some("busy"),
            ),
            (
                "instance int32 [busy] Demo.Work.Runner::Leaf(int32)[Optimized]",
                "Demo.Work.Runner::Leaf(int32)",
                Some("busy"),
            ),
            (
                "instance !0 [busy] Demo.Work.Box`1[System.__Canon]::Get()[QuickJitted]",
                "Demo.Work.Box`1[System.__Canon]::Get()",
                Some("busy"),
            ),
            (
                "int32 [busy] P::<Main>m__0(int32)[OptimizedTier1]",
                "P::<Main>m__0(int32)",
                Some("busy"),
            ),
            (
                "void [System.Private.CoreLib] System.Threading.Thread::Sleep(int32)[PreJIT]",
                "System.Threading.Thread::Sleep(int32)",
                lib,
            ),
            (
                "string[] [busy] P::Split(string)[QuickJitted]",
                "P::Split(string)",
                Some("busy"),
            ),
            (
                "class [System.Runtime]Microsoft.Win32.SafeHandles.SafeFileHandle [System.Console] \
                 dynamicClass::IL_STUB_PInvoke(class [System.Runtime]Microsoft.Win32.SafeHandles.SafeFileHandle)[Optimized]",
                "dynamicClass::IL_STUB_PInvoke(Microsoft.Win32.SafeHandles.SafeFileHandle)",
                Some("System.Console"),
            ),
            (
                "class [System.Runtime]System.Collections.Generic.IEnumerable`1<!!1> [System.Linq] \
                 System.Linq.Enumerable::Select(class [System.Runtime]System.Collections.Generic.IEnumerable`1<!!0>,\
                 class [System.Runtime]System.Func`2<!!0,!!1>)[QuickJitted]",
                "System.Linq.Enumerable::Select(System.Collections.Generic.IEnumerable`1<!!0>,System.Func`2<!!0,!!1>)",
                Some("System.Linq"),
            ),
            (
                "instance bool [System.Private.CoreLib] System.Collections.Generic.Dictionary`2[System.__Canon,System.Int32]\
                 ::TryInsert(!0,!1,valuetype System.Collections.Generic.InsertionBehavior)[OptimizedTier1]",
                "System.Collections.Generic.Dictionary`2[System.__Canon,System.Int32]::TryInsert(!0,!1,System.Collections.Generic.InsertionBehavior)",
                lib,
            ),
            // Newer runtimes: no return type.
            (
                "[System.Private.CoreLib] System.String::Concat(string,string)[OptimizedTier1]",
                "System.String::Concat(string,string)",
                lib,
            ),
            ("[busy] P::Leaf()[QuickJitted]", "P::Leaf()", Some("busy")),
            (
                "[busy] P::Leaf(int32[0...,0...])",
                "P::Leaf(int32[0...,0...])",
                Some("busy"),
            ),
        ] {
            assert_eq!(parts(name), named(function, file, 0), "{name}");
        }
        for (name, function) in [
            (
                "stub<1> AllocateTemporaryEntryPoints<PRECODE_FIXUP>",
                "stub AllocateTemporaryEntryPoints<PRECODE_FIXUP>",
            ),
            (
                "stub<641> GenerateResolveStub<GenerateResolveStub>",
                "stub GenerateResolveStub<GenerateResolveStub>",
            ),
            ("stub<x> odd", "stub<x> odd"),
        ] {
            assert_eq!(parts(name), named(function, None, 0), "{name}");
        }
    }

    #[test]
    fn jvm_and_other_names() {
        for (name, function) in [
            ("Lcom/example/Main;::work", "com.example.Main.work"),
            ("Ljava/lang/String;::hashCode", "java.lang.String.hashCode"),
            ("Interpreter", "Interpreter"),
            ("StubRoutines (1)", "StubRoutines (1)"),
            ("$erlang:apply/2", "$erlang:apply/2"),
            ("TRACE_1::x.lua:3", "TRACE_1::x.lua:3"),
            ("julia_fib_1234", "julia_fib_1234"),
            ("wasm[0]::function[3]", "wasm[0]::function[3]"),
            ("  padded  ", "padded"),
            ("", "(unknown)"),
            ("   ", "(unknown)"),
        ] {
            assert_eq!(parts(name), named(function, None, 0), "{name}");
        }
    }

    #[test]
    fn source_paths() {
        assert_eq!(source_path("file:///a/b.mjs"), "/a/b.mjs");
        assert_eq!(source_path("file://localhost/a.mjs"), "/a.mjs");
        assert_eq!(source_path("file:///a%2"), "/a%2");
        assert_eq!(source_path("file:///a%ff"), "/a%ff", "not UTF-8: kept");
        assert_eq!(source_path("node:fs"), "node:fs");
    }

    #[test]
    fn odd_input_never_panics() {
        let samples = [
            "JS:*alpha file:///tmp/pmx/y.mjs:1:15",
            "JS:~get é /ü dir/x.js:3:70",
            "instance !0 [busy] Demo.Work.Box`1[System.__Canon]::Get()[QuickJitted]",
            "class [A]B [C] D::E(class [F]G,valuetype [H]I)[J]",
            "stub<1> X<Y>",
            "Lcom/example/Main;::work",
            "[a] ::[",
            "[a] x::y)[",
            "] [::",
            "JS:~ :99999999999999999999:1",
            "file://%%%ü",
        ];
        for sample in samples {
            for (at, _) in sample.char_indices() {
                let _ = clean(&sample[..at]);
                let _ = clean(&sample[at..]);
                let _ = source_path(&sample[at..]);
            }
        }
        assert_eq!(clean("JS:~ :99999999999999999999:1").line, 0);
        let long = "JS:*".to_owned() + &"x".repeat(100_000) + " /a.js:1:1";
        assert_eq!(clean(&long).line, 1);
        let long = "[a] T::M(".to_owned() + &"class [b]C,".repeat(10_000) + ")";
        assert!(clean(&long).function.len() < 80_000);
    }

    /// A real perf map: Node.js `--perf-basic-prof` (skipped without
    /// `/usr/bin/node`): every symbol of the script is named, with its file
    /// and the line the function starts on.
    #[test]
    fn a_real_node_perf_map() {
        let node = std::path::Path::new("/usr/bin/node");
        if !node.exists() {
            crate::test_support::missing_prerequisite("no /usr/bin/node");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("named.js");
        std::fs::write(
            &script,
            "function alpha(n) { let s = 0; for (let i = 0; i < n; i++) s += i % 7; return s; }\n\
             const beta = (n) => alpha(n) + 1;\n\
             const end = Date.now() + 200; let z = 0;\n\
             while (Date.now() < end) z += beta(1000) + [1].map(function (x) { return x; })[0];\n",
        )
        .unwrap();
        let child = std::process::Command::new(node)
            .current_dir(dir.path())
            .arg("--perf-basic-prof")
            .arg(&script)
            .spawn()
            .unwrap();
        let pid = child.id();
        let status = child.wait_with_output().unwrap().status;
        let map = std::path::PathBuf::from(format!("/tmp/perf-{pid}.map"));
        let text = std::fs::read(&map);
        let _ = std::fs::remove_file(&map);
        assert!(status.success());
        let mut file = super::super::parse::PerfMap::new(1 << 20);
        let stats = file.feed(&text.unwrap());
        assert_eq!(stats.malformed, 0);
        let path = script.to_string_lossy();
        let mut seen = std::collections::BTreeSet::new();
        for symbol in file.symbols().filter(|s| s.name.contains(&*path)) {
            let c = clean(&symbol.name);
            assert_eq!(c.file.as_deref(), Some(&*path), "{}", symbol.name);
            seen.insert((c.function.into_owned(), c.line));
        }
        for wanted in [("alpha", 1), ("beta", 2), ("(anonymous)", 4)] {
            assert!(
                seen.contains(&(wanted.0.to_owned(), wanted.1)),
                "{wanted:?} not in {seen:?}"
            );
        }
    }
}
