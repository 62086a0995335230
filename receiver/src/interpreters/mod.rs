//! Interpreter plugins: the user-space halves of the interpreter unwinders
//! (detection, BPF map data, symbolization of interpreter frames).

pub mod python;
