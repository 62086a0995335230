//! Empty: the BPF programs are the `icecore` binary target (src/main.rs).
#![no_std]
