//! CPython 3.8–3.13.

pub mod layouts;
pub mod line_table;
