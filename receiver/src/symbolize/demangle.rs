//! Human-readable names for Rust and C++ symbols.
//!
//! Rust legacy (`_ZN...17h<hash>E`) and v0 (`_R...`) names are demangled by
//! `rustc-demangle` without the hash; other `_Z` names by `cpp_demangle`. ELF
//! symbol versions (`memcpy@GLIBC_2.14`, `malloc@@GLIBC_2.2.5`) are dropped.
//! Anything else, C names included, is returned unchanged.

use std::borrow::Cow;

use cpp_demangle::{DemangleOptions, Symbol};

/// Longest name handed to the C++ demangler; longer ones are shown mangled
/// (its cost grows with the input, and such names are unreadable anyway).
const MAX_CXX_MANGLED_LEN: usize = 8192;

/// The display name of a symbol.
pub fn demangle(name: &str) -> Cow<'_, str> {
    let base = strip_version(name);
    // `{:#}` omits the trailing hash of legacy names.
    if (base.starts_with("_R") || base.starts_with("_ZN"))
        && let Ok(demangled) = rustc_demangle::try_demangle(base)
    {
        return Cow::Owned(format!("{demangled:#}"));
    }
    if base.starts_with("_Z")
        && base.len() <= MAX_CXX_MANGLED_LEN
        && let Ok(symbol) = Symbol::new(base)
        && let Ok(demangled) = symbol.demangle(&DemangleOptions::default())
    {
        return Cow::Owned(demangled);
    }
    Cow::Borrowed(base)
}

/// `name` without an ELF symbol version suffix (`@VER` or `@@VER`).
pub fn strip_version(name: &str) -> &str {
    match name.find('@') {
        Some(at) if at > 0 => &name[..at],
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_legacy_without_hash() {
        assert_eq!(
            demangle("_ZN4core3fmt5write17h4b0a1f6c1f7f6d4eE"),
            "core::fmt::write"
        );
        assert_eq!(
            demangle(
                "_ZN60_$LT$alloc..vec..Vec$LT$T$GT$$u20$as$u20$core..ops..Drop$GT$4drop17h0123456789abcdefE"
            ),
            "<alloc::vec::Vec<T> as core::ops::Drop>::drop"
        );
    }

    #[test]
    fn rust_v0() {
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
        assert_eq!(
            demangle("_RNvNtCs1234_7mycrate5inner3bar"),
            "mycrate::inner::bar"
        );
    }

    #[test]
    fn cxx() {
        assert_eq!(
            demangle("_ZN2ns6workerIiEET_S1_"),
            "int ns::worker<int>(int)"
        );
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(demangle("_Z5alphai"), "alpha(int)");
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"),
            "std::vector<int, std::allocator<int> >::push_back(int const&)"
        );
    }

    #[test]
    fn plain_and_versioned() {
        assert_eq!(demangle("malloc"), "malloc");
        assert!(matches!(demangle("malloc"), Cow::Borrowed(_)));
        assert_eq!(demangle("malloc@@GLIBC_2.2.5"), "malloc");
        assert_eq!(demangle("memcpy@GLIBC_2.14"), "memcpy");
        assert_eq!(demangle("_Z5alphai@@LIB_1.0"), "alpha(int)");
        assert_eq!(demangle("@"), "@");
        assert_eq!(demangle(""), "");
    }

    #[test]
    fn invalid_mangling_is_unchanged() {
        assert_eq!(demangle("_Z"), "_Z");
        assert_eq!(demangle("_ZN"), "_ZN");
        assert_eq!(demangle("_R"), "_R");
        assert_eq!(demangle("_Zgarbage!!"), "_Zgarbage!!");
        let long = format!("_Z{}", "N".repeat(MAX_CXX_MANGLED_LEN));
        assert_eq!(demangle(&long), long);
        // Deep nesting must not overflow the stack.
        let deep = format!("_Z1f{}i", "PF".repeat(5000));
        let _ = demangle(&deep);
    }
}
