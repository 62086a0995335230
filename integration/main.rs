// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! icecore's end-to-end tests: each loads the real BPF programs through the
//! real `icecore` binary, profiles real processes and decodes what it wrote
//! with decoders of its own (`support/`).
//!
//! They need root; without it each prints why it skipped and passes, unless
//! `ICECORE_REQUIRE_ALL=1` makes a missing prerequisite a failure. They are one
//! test binary so the support code is compiled and linked once; a module is a
//! group, selected with a filter:
//!
//!     sudo -E cargo test --release --test integration -- native:: --test-threads=1 --nocapture
//!
//! One test thread: each test samples the whole machine, and two at once
//! would disturb each other's proportions.

// Test code: a panic is how a helper reports a failed expectation.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

mod crowded;
mod deploy;
mod export;
mod flamegraph;
mod forward;
mod jit;
mod jvm;
mod lifecycle;
mod metadata;
mod native;
mod off_cpu;
mod outage;
mod perl;
mod php;
mod privilege;
mod profiles;
mod pyroscope;
mod python;
mod receiver_abuse;
mod ruby;
mod scrape;
mod short_lived;
mod targets;
mod telemetry;
mod v8;
