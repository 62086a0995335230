// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of the Pyroscope push sink: the real `icecore` binary
//! profiles a fixture and pushes to an in-test Pyroscope endpoint that
//! decodes each request from the wire format by Pyroscope's own field
//! numbers (`support/pyroscope.rs`); what arrives is compared with the
//! pprof files written in the same run.
//!
//! Needs root (it loads BPF programs); without root it prints why it is
//! skipped and passes.
//!
//!     sudo -E cargo test --release --test integration -- pyroscope:: --nocapture

use crate::support;

use std::time::Duration;

use support::fixture::{FIXTURE_FUNCTIONS, Mode};
use support::pprof::all_samples;
use support::pyroscope::{Push, PyroscopeServer};
use support::run::{EXIT_GRACE, Target, base_args_at, duration_args, s};
use support::summary::{DecodedSample, count_where, total};
use support::{HZ, Icecore, pprof, require_root, serial};

/// Every sample of every series of `pushes`, with the series' pid label.
pub(crate) fn pushed_samples(pushes: &[Push]) -> Vec<DecodedSample> {
    pushes
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|series| all_samples(&series.profiles))
        .collect()
}

#[test]
fn pyroscope_receives_labelled_series_with_credentials_and_tenant() {
    const TEST: &str = "pyroscope_receives_labelled_series_with_credentials_and_tenant";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let server = PyroscopeServer::start_on("127.0.0.1:0".parse().unwrap());
    let target = Target::start(Mode::Cycle);
    let pprof_dir = target.make_subdir("pprof");
    let mut args = base_args_at(target.pid(), HZ);
    args.extend([
        s("--pyroscope-endpoint"),
        format!("http://alice:s3cret@{}", server.address()),
        s("--pyroscope-tenant-id"),
        s("team-a"),
        s("--pprof-dir"),
        s(pprof_dir.display()),
    ]);
    args.extend(duration_args(Duration::from_secs(5)));
    let mut icecore = Icecore::spawn(&args, target.dir());
    icecore.wait_success(Duration::from_secs(5) + EXIT_GRACE);

    let pushes = server.pushes();
    let written = pprof::read_valid(&pprof_dir, HZ);
    let pushed = pushed_samples(&pushes);
    println!(
        "{TEST}: {} pushes, {} series, {} samples; pprof {} samples in {} files",
        pushes.len(),
        pushes.iter().map(|p| p.series.len()).sum::<usize>(),
        total(&pushed),
        total(&written.samples),
        written.profiles.len()
    );
    assert!(
        !pushes.is_empty(),
        "{TEST}: nothing pushed\n{}",
        icecore.logs()
    );
    for push in &pushes {
        assert_eq!(push.header("content-type"), Some("application/proto"));
        assert_eq!(push.header("connect-protocol-version"), Some("1"));
        assert_eq!(push.header("x-scope-orgid"), Some("team-a"));
        // base64("alice:s3cret")
        assert_eq!(push.header("authorization"), Some("Basic YWxpY2U6czNjcmV0"));
        for series in &push.series {
            assert_eq!(series.label("__name__"), Some("process_cpu"), "{series:?}");
            assert_eq!(series.label("__delta__"), Some("false"));
            assert_eq!(series.label("service_name"), Some("busy"));
            assert_eq!(series.label("pid"), Some(target.pid().to_string().as_str()));
            let names: Vec<&str> = series.labels.iter().map(|(n, _)| n.as_str()).collect();
            let mut unique = names.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(
                unique.len(),
                names.len(),
                "{TEST}: duplicate labels {names:?}"
            );
        }
    }
    assert_eq!(
        total(&pushed),
        total(&written.samples),
        "{TEST}: Pyroscope and the pprof files got different samples"
    );
    let named = count_where(&pushed, |s| {
        s.stack
            .iter()
            .any(|f| FIXTURE_FUNCTIONS.contains(&f.function.as_str()))
    });
    assert!(
        named * 10 >= total(&pushed) * 9,
        "{TEST}: {named} of {} pushed samples name the fixture's functions",
        total(&pushed)
    );
    assert!(
        !icecore.logs().contains("s3cret"),
        "{TEST}: the password leaked into the logs"
    );
}
