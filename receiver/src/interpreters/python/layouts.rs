//! Per-version CPython struct layouts (x86-64), as data.
