//! Criterion benchmarks live in benches/benches/.
