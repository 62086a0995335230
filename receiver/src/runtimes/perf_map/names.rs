//! JIT symbol names as runtimes write them in perf maps, cleaned into a
//! function, a file and a line where the format is known:
//!
//! - V8 (Node.js): `JS:*alpha file:///app/x.js:4:15`, `LazyCompile:~alpha
//!   /app/x.js:4`, `Function:^alpha …`; the tier marks (`*`, `~`, `^`, `+`)
//!   go, an empty name is `(anonymous)`, and `Builtin:`, `BytecodeHandler:`,
//!   `Stub:` and the like keep their kind as a prefix.
//! - .NET: `[Assembly] Namespace.Type::Method(args)[OptimizedTier1]`, and
//!   3.1's `instance void [Assembly] Type::Method()[Optimized]`: the return
//!   type, `instance` and the tier go; the assembly becomes the file.
//! - JVM (perf-map-agent style): `Lpkg/Class;::method` is `pkg.Class.method`.
//!
//! Anything else is kept as written.

use std::borrow::Cow;

/// A symbol name split into what a profile shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanName<'a> {
    /// The function.
    pub function: Cow<'a, str>,
    /// The source file (for .NET, the assembly), when the name says.
    pub file: Option<String>,
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

/// V8's code kinds that name a JavaScript function.
const V8_FUNCTION_KINDS: [&str; 5] = [
    "JS",
    "LazyCompile",
    "Function",
    "InterpretedFunction",
    "Script",
];
/// V8's code kinds that name runtime code, kept as a prefix.
const V8_RUNTIME_KINDS: [&str; 6] = [
    "Builtin",
    "BytecodeHandler",
    "Stub",
    "RegExp",
    "Handler",
    "Eval",
];

/// Cleans one perf-map symbol name.
pub fn clean(name: &str) -> CleanName<'_> {
    let name = name.trim();
    if let Some(cleaned) = v8(name) {
        return cleaned;
    }
    if let Some(cleaned) = dotnet(name) {
        return cleaned;
    }
    if let Some(cleaned) = jvm(name) {
        return cleaned;
    }
    CleanName::plain(name)
}

fn v8(name: &str) -> Option<CleanName<'_>> {
    let (kind, rest) = name.split_once(':')?;
    if V8_RUNTIME_KINDS.contains(&kind) {
        return Some(CleanName::plain(name));
    }
    if !V8_FUNCTION_KINDS.contains(&kind) {
        return None;
    }
    let rest = rest.trim_start_matches(['*', '~', '^', '+']);
    // `name location`: the location starts at the first word that is a
    // path or URL (a path may hold spaces; a name does not start with '/').
    let start = [" /", " file://", " node:"]
        .iter()
        .filter_map(|mark| rest.find(mark))
        .min();
    let (function, location) = match start {
        Some(at) => (rest[..at].trim(), rest[at + 1..].trim()),
        None if looks_like_location(rest) => ("", rest),
        None => match rest.rsplit_once(' ') {
            Some((function, location)) if looks_like_location(location) => {
                (function.trim(), location)
            }
            _ => (rest.trim(), ""),
        },
    };
    let function = if function.is_empty() {
        if kind == "Script" {
            "(script)"
        } else {
            "(anonymous)"
        }
    } else {
        function
    };
    let (file, line) = split_location(location);
    Some(CleanName {
        function: Cow::Borrowed(function),
        file,
        line,
    })
}

fn looks_like_location(word: &str) -> bool {
    // `:3:23`: code without a file (`new Function`, `eval`).
    word.starts_with(':')
        || word.starts_with('/')
        || word.starts_with("file://")
        || word.starts_with("node:")
        || word.contains(".js")
        || word.contains(".mjs")
        || word.contains(".cjs")
}

/// `file:///app/x.js:4:15` → (`/app/x.js`, 4).
fn split_location(location: &str) -> (Option<String>, u32) {
    if location.is_empty() {
        return (None, 0);
    }
    let mut path = location;
    let mut numbers = Vec::new();
    while let Some((head, tail)) = path.rsplit_once(':') {
        match tail.parse::<u32>() {
            Ok(n) if numbers.len() < 2 => {
                numbers.push(n);
                path = head;
            }
            _ => break,
        }
    }
    // `:line:col` or `:line`: the line is the first of them.
    let line = numbers.last().copied().unwrap_or(0);
    let path = path.strip_prefix("file://").unwrap_or(path);
    ((!path.is_empty()).then(|| path.to_owned()), line)
}

fn dotnet(name: &str) -> Option<CleanName<'_>> {
    // The method: `Type::Method(args)`, after `[Assembly] ` and before a
    // `[Tier]` suffix.
    let open = name.find('[')?;
    let close = open + name[open..].find("] ")?;
    let assembly = &name[open + 1..close];
    let method = name[close + 2..].trim();
    if !method.contains("::") || assembly.is_empty() || assembly.contains(' ') {
        return None;
    }
    let method = match method.rfind(")[") {
        Some(at) if method.ends_with(']') => &method[..=at],
        _ => method,
    };
    Some(CleanName {
        function: Cow::Borrowed(method),
        file: Some(assembly.to_owned()),
        line: 0,
    })
}

fn jvm(name: &str) -> Option<CleanName<'_>> {
    let class = name.strip_prefix('L')?;
    let (class, method) = class.split_once(";::")?;
    if class.is_empty() || method.is_empty() || class.contains(' ') {
        return None;
    }
    Some(CleanName {
        function: Cow::Owned(format!("{}.{method}", class.replace('/', "."))),
        file: None,
        line: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(name: &str) -> (String, Option<String>, u32) {
        let c = clean(name);
        (c.function.into_owned(), c.file, c.line)
    }

    fn named(function: &str, file: Option<&str>, line: u32) -> (String, Option<String>, u32) {
        (function.to_owned(), file.map(str::to_owned), line)
    }

    #[test]
    fn v8_names() {
        assert_eq!(
            parts("JS:*alpha file:///app/x.js:4:15"),
            named("alpha", Some("/app/x.js"), 4)
        );
        assert_eq!(
            parts("LazyCompile:*alpha /app/x.js:4"),
            named("alpha", Some("/app/x.js"), 4)
        );
        assert_eq!(
            parts("JS:~beta /tmp/jit split.js:10:3"),
            named("beta", Some("/tmp/jit split.js"), 10)
        );
        assert_eq!(
            parts("JS:^ /app/x.js:7:1"),
            named("(anonymous)", Some("/app/x.js"), 7)
        );
        assert_eq!(
            parts("Function:~ node:internal/main:1:1"),
            named("(anonymous)", Some("node:internal/main"), 1)
        );
        assert_eq!(
            parts("Script:~ /app/x.js"),
            named("(script)", Some("/app/x.js"), 0)
        );
        assert_eq!(parts("JS:*Foo.bar"), named("Foo.bar", None, 0));
        assert_eq!(parts("JS:~late_0 :3:23"), named("late_0", None, 3));
        assert_eq!(
            parts("Builtin:ArrayPrototypePush"),
            named("Builtin:ArrayPrototypePush", None, 0)
        );
        assert_eq!(
            parts("BytecodeHandler:Add"),
            named("BytecodeHandler:Add", None, 0)
        );
    }

    #[test]
    fn dotnet_names() {
        assert_eq!(
            parts("[System.Private.CoreLib] System.String::Concat(string,string)[OptimizedTier1]"),
            named(
                "System.String::Concat(string,string)",
                Some("System.Private.CoreLib"),
                0
            )
        );
        assert_eq!(
            parts("instance void [jit_split] P::Alpha()[Optimized]"),
            named("P::Alpha()", Some("jit_split"), 0)
        );
        assert_eq!(
            parts("void [jit_split] P::Leaf(int32)[QuickJitted]"),
            named("P::Leaf(int32)", Some("jit_split"), 0)
        );
        assert_eq!(
            parts("stub<1> AllocateTemporaryEntryPoints<PRECODE_STUB>"),
            named(
                "stub<1> AllocateTemporaryEntryPoints<PRECODE_STUB>",
                None,
                0
            )
        );
    }

    #[test]
    fn jvm_and_other_names() {
        assert_eq!(
            parts("Lcom/example/Main;::work"),
            named("com.example.Main.work", None, 0)
        );
        assert_eq!(parts("Interpreter"), named("Interpreter", None, 0));
        assert_eq!(parts("$erlang:apply/2"), named("$erlang:apply/2", None, 0));
        assert_eq!(
            parts("TRACE_1::x.lua:3"),
            named("TRACE_1::x.lua:3", None, 0)
        );
    }

    #[test]
    fn odd_input_never_panics() {
        for name in [
            "",
            " ",
            ":",
            "JS:",
            "JS:*",
            "[",
            "[]",
            "[] ",
            "[a] ",
            "[a] b",
            "L;::",
            "L;::x",
            "La;::",
            "JS:* :",
            "JS:* a:b:c:",
            "x:1:2:3:4",
            "[a] ::[",
            "[a] x::y)[",
        ] {
            let _ = clean(name);
        }
        let long = "JS:*".to_owned() + &"x".repeat(100_000) + " /a.js:1:1";
        assert_eq!(clean(&long).line, 1);
    }
}
