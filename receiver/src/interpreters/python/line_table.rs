//! CPython line tables: from a bytecode offset to a source line.
